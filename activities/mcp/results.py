"""An MCP ``CallToolResult`` as the text the model reads.

Text content goes to the model as it is, redacted of configured secrets as one text: a secret split over
two items is redacted in both (:func:`~activities.redaction.redact_parts`), before anything is stored.
Images, audio and binary resources are stored in the run store (content-addressed) and the model gets a
one-line description naming the blob. Text beyond the server's ``max_result_chars`` is cut for the model
and stored whole (redacted) as a blob.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from activities.redaction import redact_parts

if TYPE_CHECKING:
    from mcp.types import CallToolResult

MAX_BINARY_BYTES = 16 * 1024 * 1024  # one decoded image/audio/blob resource
MAX_STRUCTURED_CHARS = 200_000

PutBlob = Callable[[bytes], Awaitable[str]]


async def result_text(result: CallToolResult, put_blob: PutBlob, max_chars: int, secrets: Iterable[str] = ()) -> str:
    """The model's view of ``result`` (``is_error`` is the caller's to act on), ``secrets`` redacted."""
    from mcp.types import (  # the mcp extra, which produced ``result``
        AudioContent,
        BlobResourceContents,
        EmbeddedResource,
        ImageContent,
        ResourceLink,
        TextContent,
        TextResourceContents,
    )

    parts: list[str] = []
    for item in result.content:
        if isinstance(item, TextContent):
            parts.append(item.text)
        elif isinstance(item, ImageContent):
            parts.append(await _binary("image", item.mime_type, item.data, put_blob))
        elif isinstance(item, AudioContent):
            parts.append(await _binary("audio", item.mime_type, item.data, put_blob))
        elif isinstance(item, EmbeddedResource):
            resource = item.resource
            if isinstance(resource, TextResourceContents):
                parts.append(f"[resource {resource.uri}]\n{resource.text}")
            elif isinstance(resource, BlobResourceContents):
                kind = f"resource {resource.uri}"
                parts.append(
                    await _binary(kind, resource.mime_type or "application/octet-stream", resource.blob, put_blob)
                )
        elif isinstance(item, ResourceLink):
            parts.append(f"[resource link {item.name}: {item.uri}]")
        else:
            parts.append(f"[{getattr(item, 'type', type(item).__name__)} content, not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False)[:MAX_STRUCTURED_CHARS])
    text = "\n".join(redact_parts(parts, secrets))
    if len(text) <= max_chars:
        return text
    digest = await put_blob(text.encode())
    return (
        f"{text[:max_chars]}\n[... {len(text) - max_chars} more characters not shown; "
        f"the whole result ({len(text)} characters) is stored in the run store as {digest}]"
    )


async def _binary(kind: str, mime_type: str, data: str, put_blob: PutBlob) -> str:
    if len(data) > MAX_BINARY_BYTES * 4 // 3 + 4:
        return f"[{kind} {mime_type}, over {MAX_BINARY_BYTES} bytes, not stored]"
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{kind} {mime_type}: the server sent data that is not base64, not stored]"
    digest = await put_blob(raw)
    return f"[{kind} {mime_type}, {len(raw)} bytes, stored in the run store as {digest}]"
