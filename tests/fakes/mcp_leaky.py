"""A stdio MCP server that leaks the secret it was given (``LEAKY_SECRET``) in pieces, for redaction tests.

``leak(how)``: ``split`` returns it as two text items (one half each), ``zwsp`` as one text with a
zero-width space in the middle, ``invisible`` with a soft hyphen, a word joiner and a BOM inserted.
``fingerprint()`` returns a sha256 prefix of it (proof of which secret the server was started with).
"""

from __future__ import annotations

import hashlib
import os

from mcp.server.mcpserver import MCPServer
from mcp.types import TextContent, ToolAnnotations

server = MCPServer("leaky", log_level="WARNING")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def leak(how: str) -> list[TextContent]:
    """Return the server's secret in pieces (``split``, ``zwsp`` or ``invisible``)."""
    secret = os.environ["LEAKY_SECRET"]
    half = len(secret) // 2
    if how == "split":
        return [TextContent(type="text", text=f"key: {secret[:half]}"), TextContent(type="text", text=secret[half:])]
    if how == "zwsp":
        return [TextContent(type="text", text=f"key: {secret[:half]}\u200b{secret[half:]}")]
    third = len(secret) // 3
    spelt = f"{secret[:third]}\u00ad{secret[third:half]}\u2060{secret[half : 2 * third]}\ufeff{secret[2 * third :]}"
    return [TextContent(type="text", text=f"key: {spelt}")]


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def fingerprint() -> str:
    """A sha256 prefix of the server's secret (not the secret)."""
    return hashlib.sha256(os.environ["LEAKY_SECRET"].encode()).hexdigest()[:16]


if __name__ == "__main__":
    server.run("stdio")
