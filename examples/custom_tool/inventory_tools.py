"""Example tools: a read-only stock lookup and a side-effecting reservation.

Load them into a worker with ``AGENT_TOOL_MODULES=examples.custom_tool.inventory_tools``.

- ``stock_lookup`` (read-only, allowed by the default policy) answers from the in-module
  ``CATALOGUE`` minus what is reserved.
- ``reserve_stock`` (``side_effect=True``, so the default policy asks a human first) writes
  a reservation to a small SQLite "reservation book" under ``AGENT_STATE_DIR``. The book
  is keyed by the call's idempotency key, so a retried call (``recovery="idempotent_by_key"``)
  returns the first attempt's answer instead of reserving twice. ``release_reservation``
  is its compensation: it deletes the reservation when the run is cancelled.

Everything is local: no network, no sandbox.
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

from pydantic import BaseModel, Field

from durable_agents import Settings, ToolContext, ToolError, tool

# Article number -> (name, units on hand).
CATALOGUE: dict[str, tuple[str, int]] = {
    "A-1001": ("blue widget", 42),
    "A-1002": ("red widget", 0),
    "B-2001": ("gear box", 7),
}
BOOK_FILE = "inventory.sqlite3"


class StockArgs(BaseModel):
    sku: str = Field(description="Article number, e.g. A-1001")


class ReserveArgs(BaseModel):
    sku: str = Field(description="Article number, e.g. A-1001")
    quantity: int = Field(ge=1, le=1000, description="Units to reserve")


def book_path(settings: Settings) -> Path:
    """Where the reservation book lives: ``$AGENT_STATE_DIR/inventory.sqlite3``."""
    return settings.state_dir / BOOK_FILE


def _article(sku: str) -> tuple[str, str, int]:
    """``(sku, name, on_hand)``; ``ToolError`` (which the model reads) for an unknown article."""
    key = sku.strip().upper()
    if key not in CATALOGUE:
        raise ToolError(f"unknown article {sku!r}; known articles: {', '.join(sorted(CATALOGUE))}")
    name, on_hand = CATALOGUE[key]
    return key, name, on_hand


def _reserved(db: sqlite3.Connection, sku: str) -> int:
    row = db.execute("SELECT COALESCE(SUM(quantity), 0) FROM reservations WHERE sku = ?", (sku,)).fetchone()
    return int(row[0])


def _read_reserved(path: Path, sku: str) -> int:
    """Units of ``sku`` reserved so far (0 when nothing was ever reserved); opens the book read-only."""
    if not path.exists():
        return 0
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
        return _reserved(db, sku)


def _open_book(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=10, isolation_level=None)
    db.execute(
        "CREATE TABLE IF NOT EXISTS reservations"
        " (key TEXT PRIMARY KEY, sku TEXT NOT NULL, quantity INTEGER NOT NULL, result TEXT NOT NULL)"
    )
    return db


def _write_reservation(path: Path, key: str, sku: str, quantity: int, on_hand: int) -> str:
    """Reserve once per idempotency key; a repeated key returns the first answer unchanged."""
    with closing(_open_book(path)) as db:
        db.execute("BEGIN IMMEDIATE")  # one writer at a time, across worker processes
        try:
            row = db.execute("SELECT result FROM reservations WHERE key = ?", (key,)).fetchone()
            if row is not None:
                db.execute("COMMIT")
                return str(row[0])
            available = on_hand - _reserved(db, sku)
            if quantity > available:
                raise ToolError(f"cannot reserve {quantity} of {sku}: only {available} available")
            result = f"reserved {quantity} of {sku}; {available - quantity} left"
            db.execute("INSERT INTO reservations VALUES (?, ?, ?, ?)", (key, sku, quantity, result))
            db.execute("COMMIT")
            return result
        except BaseException:
            db.execute("ROLLBACK")
            raise


def _delete_reservation(path: Path, key: str) -> int:
    with closing(_open_book(path)) as db:
        return db.execute("DELETE FROM reservations WHERE key = ?", (key,)).rowcount


@tool("stock_lookup", description="How many units of an article are available (read-only).", args=StockArgs)
async def stock_lookup(args: StockArgs, ctx: ToolContext) -> str:
    """``"A-1001 (blue widget): 42 available (42 on hand, 0 reserved)"``; unknown articles are a ``ToolError``."""
    sku, name, on_hand = _article(args.sku)
    reserved = await asyncio.to_thread(_read_reserved, book_path(ctx.settings), sku)
    return f"{sku} ({name}): {on_hand - reserved} available ({on_hand} on hand, {reserved} reserved)"


async def release_reservation(args: ReserveArgs, ctx: ToolContext, result: str) -> str:
    """Compensation of ``reserve_stock``: delete the reservation made under this call's idempotency key."""
    deleted = await asyncio.to_thread(_delete_reservation, book_path(ctx.settings), ctx.invocation.idempotency_key)
    return f"released the reservation ({result})" if deleted else "nothing to release"


@tool(
    "reserve_stock",
    description="Reserve units of an article for an order.",
    args=ReserveArgs,
    side_effect=True,  # goes through the idempotency ledger; asks for approval by default
    recovery="idempotent_by_key",  # a retry sends the same key again and the book dedupes it
    compensate=release_reservation,  # undoes a completed reservation when the run is cancelled
)
async def reserve_stock(args: ReserveArgs, ctx: ToolContext) -> str:
    """Reserve ``quantity`` units; ``ToolError`` when fewer are available. Idempotent per call."""
    sku, _, on_hand = _article(args.sku)
    key = ctx.invocation.idempotency_key  # identical on every retry of this call
    return await asyncio.to_thread(_write_reservation, book_path(ctx.settings), key, sku, args.quantity, on_hand)
