"""Server-Sent Events from a model provider: one streamed ``POST``, its events as ``(event, data)``.

The same error mapping as ``http_errors.post_json`` before the first byte of the body (a non-2xx status
is read whole and mapped by ``status_error``); afterwards a connection lost mid-stream is a
``RetryableProviderError`` (the activity's retry asks again, and its deltas are marked as a restart).
A line longer than ``MAX_LINE_BYTES`` or a body past ``MAX_STREAM_BYTES`` is malformed: a hostile or
broken server cannot make the worker buffer without bound.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator
from typing import Any

import httpx

from activities.models.base import FatalProviderError, RetryableProviderError
from activities.models.http_errors import malformed, status_error
from activities.redaction import redact

MAX_LINE_BYTES = 1024 * 1024
MAX_STREAM_BYTES = 32 * 1024 * 1024


async def post_sse(
    client: httpx.AsyncClient,
    provider: str,
    url: str,
    *,
    headers: dict[str, str],
    body: dict[str, Any],
    secrets: list[str],
) -> AsyncIterator[tuple[str, str]]:
    """POST ``body`` and yield each event's ``(event name or "", data)``; the caller stops at its end marker."""
    request = client.build_request("POST", url, json=body, headers={**headers, "Accept": "text/event-stream"})
    try:
        response = await client.send(request, stream=True)
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise FatalProviderError(redact(f"{provider}: bad base URL: {exc}", secrets)) from None
    except httpx.RequestError as exc:
        raise RetryableProviderError(redact(f"{provider} request failed: {_detail(exc)}", secrets)) from None
    try:
        if not 200 <= response.status_code < 300:
            try:
                await response.aread()
            except httpx.RequestError as exc:
                raise RetryableProviderError(redact(f"{provider} request failed: {_detail(exc)}", secrets)) from None
            raise status_error(provider, response, secrets)
        event, total = "", 0
        data: list[str] = []
        try:
            async for line in _lines(response):
                total += len(line) + 1
                if total > MAX_STREAM_BYTES:
                    raise malformed(provider, "event stream over the size limit", secrets)
                if not line:
                    if data:
                        yield event, "\n".join(data)
                    event, data = "", []
                elif line.startswith(":"):
                    continue  # a comment (keep-alive)
                else:
                    name, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if name == "event":
                        event = value
                    elif name == "data":
                        data.append(value)
            if data:
                yield event, "\n".join(data)
        except httpx.RequestError as exc:
            raise RetryableProviderError(redact(f"{provider} stream broke off: {_detail(exc)}", secrets)) from None
    finally:
        await response.aclose()


async def _lines(response: httpx.Response) -> AsyncIterator[str]:
    """The body's lines (``\\n`` or ``\\r\\n``), never buffering more than ``MAX_LINE_BYTES`` of one."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending = ""
    async for chunk in response.aiter_bytes():
        pending += decoder.decode(chunk)
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line.removesuffix("\r")
        if len(pending) > MAX_LINE_BYTES:
            raise RetryableProviderError("event stream line over the size limit", status=200)
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending.removesuffix("\r")


def _detail(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def ended_early(provider: str) -> RetryableProviderError:
    """The stream closed before its end marker: a cut connection or a proxy's timeout."""
    return RetryableProviderError(f"{provider} stream ended before the reply was complete", status=200)
