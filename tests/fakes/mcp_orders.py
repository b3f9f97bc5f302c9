"""A real MCP server modelling a shop's order API: the test destination for MCP tools.

Built with the official SDK's ``MCPServer``; run it as

    python -m tests.fakes.mcp_orders              # stdio
    python -m tests.fakes.mcp_orders --http PORT  # Streamable HTTP on http://127.0.0.1:PORT/mcp

Every delivered write (``place_order``, ``slow_order``) appends one JSON line to
the file named by ``$ORDERS_LEDGER`` (flushed and fsynced), so a test can count
effects even after the server process was killed. A write whose request
``_meta`` carries ``io.durable-agents/idempotency-key`` is applied once per
key: a repeat appends nothing and returns the first result. The dedupe state is
the ledger itself, so it survives a server restart. ``slow_order`` appends an
``{"event": "started"}`` line before it sleeps, which lets a test kill the
server mid-call and see that the effect never happened.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import struct
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent, ToolAnnotations

IDEMPOTENCY_META_KEY = "io.durable-agents/idempotency-key"
READ_ONLY = ToolAnnotations(readOnlyHint=True)
WRITE = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False)

server = MCPServer("orders", log_level="WARNING")


def _ledger_path() -> Path:
    path = os.environ.get("ORDERS_LEDGER")
    if not path:
        raise ToolError("ORDERS_LEDGER is not set: the orders server has nowhere to record deliveries")
    return Path(path)


@contextmanager
def _locked_ledger() -> Iterator[IO[str]]:
    """The ledger opened for read + append under an exclusive lock (one check-then-append at a time,
    across requests and across server processes sharing the file)."""
    with _ledger_path().open("a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _append(f: IO[str], record: dict[str, Any]) -> None:
    f.seek(0, os.SEEK_END)
    f.write(json.dumps(record) + "\n")
    f.flush()
    os.fsync(f.fileno())


def _delivered(f: IO[str], tool: str, key: str | None) -> str | None:
    """The result of an earlier delivery of ``tool`` under idempotency ``key``, if there was one."""
    if key is None:
        return None
    f.seek(0)
    for line in f:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line from a killed writer
        if "event" not in record and record.get("tool") == tool and record.get("key") == key:
            return str(record["result"])
    return None


def _idempotency_key(ctx: Context) -> str | None:
    """The idempotency key from the request's ``_meta`` (``ctx.request_context.meta``), if any."""
    meta = ctx.request_context.meta or {}
    key = meta.get(IDEMPOTENCY_META_KEY)
    return None if key is None else str(key)


def _deliver(tool: str, key: str | None, result: str, **fields: Any) -> str:
    with _locked_ledger() as f:
        earlier = _delivered(f, tool, key)
        if earlier is not None:
            return earlier
        _append(f, {"tool": tool, **fields, "key": key, "pid": os.getpid(), "result": result})
    return result


@server.tool(annotations=READ_ONLY)
def lookup_order(order_id: str) -> str:
    """Look up an order by id."""
    return f"order {order_id}: 1 x widget, shipped"


@server.tool(annotations=WRITE)
def place_order(item: str, quantity: int, ctx: Context) -> str:
    """Place an order (a side effect: applied once per idempotency key)."""
    key = _idempotency_key(ctx)
    return _deliver("place_order", key, f"placed order: {quantity} x {item}", item=item, quantity=quantity)


@server.tool(annotations=WRITE)
async def slow_order(item: str, seconds: float, ctx: Context) -> str:
    """Place an order that takes ``seconds`` to go through (a side effect, like place_order)."""
    key = _idempotency_key(ctx)
    with _locked_ledger() as f:
        earlier = _delivered(f, "slow_order", key)
        if earlier is not None:
            return earlier
        _append(f, {"event": "started", "tool": "slow_order", "item": item, "key": key, "pid": os.getpid()})
    await anyio.sleep(seconds)
    return _deliver("slow_order", key, f"placed slow order: {item}", item=item, seconds=seconds)


def _png_2x2() -> bytes:
    """A valid 2x2 RGB PNG (red, green / blue, white)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"\x00\xff\x00\x00\x00\xff\x00" + b"\x00\x00\x00\xff\xff\xff\xff"  # filter byte + 2 RGB pixels per row
    header = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@server.tool(annotations=READ_ONLY)
def chart() -> list[ImageContent | TextContent]:
    """A sales chart (a small PNG) with a caption."""
    return [
        ImageContent(type="image", data=base64.b64encode(_png_2x2()).decode(), mime_type="image/png"),
        TextContent(type="text", text="sales by quarter"),
    ]


@server.tool(annotations=READ_ONLY)
def big_report(kb: int) -> str:
    """A report of ``kb`` KiB of text."""
    line = "report line: all orders nominal\n"
    return (line * (kb * 1024 // len(line) + 1))[: kb * 1024]


@server.tool(annotations=READ_ONLY)
def always_fails() -> str:
    """Always fails (the SDK answers with isError true)."""
    raise ToolError("the order database is unavailable")


@server.tool(annotations=READ_ONLY)
def show_env(name: str) -> str:
    """The value of environment variable ``name`` in the server process (empty when unset)."""
    return os.environ.get(name, "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve Streamable HTTP on 127.0.0.1:PORT/mcp")
    args = parser.parse_args(argv)
    print(f"orders server ready pid={os.getpid()}", file=sys.stderr, flush=True)
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http, streamable_http_path="/mcp")


if __name__ == "__main__":
    main()
