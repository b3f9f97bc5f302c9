"""An MCP server of your own that is safe to retry: ``add_note`` dedupes by the runtime's idempotency key.

Run by the worker as a stdio server (see ``mcp.json``). Durable Agents sends every side-effecting
MCP call's idempotency key in the request's ``_meta`` as ``io.durable-agents/idempotency-key``, on
every attempt. A server that keeps the first result per key, as this one does, can be marked
``"recovery": "idempotent_by_key"``: a call whose worker or server died mid-call is then sent
again with the same key instead of pausing the run for a human.

Notes live in the JSON file named by ``NOTES_FILE`` (default ``.agent/notes.json``).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

IDEMPOTENCY_KEY = "io.durable-agents/idempotency-key"

server = MCPServer("notes")


def _book() -> Path:
    return Path(os.environ.get("NOTES_FILE", ".agent/notes.json"))


def _load(path: Path) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded
    except (OSError, json.JSONDecodeError):
        return {"notes": [], "by_key": {}}


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def list_notes() -> str:
    """List every note, oldest first."""
    notes = _load(_book())["notes"]
    return "\n".join(f"{i + 1}. {text}" for i, text in enumerate(notes)) or "(no notes)"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False))
def add_note(text: str, ctx: Context) -> str:
    """Add a note. A repeated request with the same idempotency key adds nothing and returns the first answer."""
    meta = ctx.request_context.meta or {}
    key = str(meta.get(IDEMPOTENCY_KEY) or "")
    path = _book()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # check-then-write as one step, across server processes
        book = _load(path)
        if key and key in book["by_key"]:
            return str(book["by_key"][key])
        book["notes"].append(text)
        answer = f"added note {len(book['notes'])}: {text}"
        if key:
            book["by_key"][key] = answer
        path.write_text(json.dumps(book))
    return answer


if __name__ == "__main__":
    print("notes server ready", file=sys.stderr, flush=True)
    server.run()
