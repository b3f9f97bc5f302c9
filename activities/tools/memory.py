"""The built-in memory tools: ``memory_save``, ``memory_search``, ``memory_delete``.

They work in the namespace of the run that calls them, (``invocation.tenant``, ``invocation.user``),
which the workflow sets from the run's input: no argument names a namespace, so a model cannot reach
another tenant's or user's entries whatever it writes. ``memory_save`` and ``memory_delete`` change
what outlives the run, so they are side effects (ledgered; the default policy asks, like every side
effect; an operator allows them with a rule for ``memory_*``). A save is keyed by the call's
idempotency key: a retry after a crash stores one entry (``recovery="idempotent_by_key"``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, Field

from activities.memory.base import (
    MAX_KEY_CHARS,
    MAX_QUERY_CHARS,
    MAX_TEXT_BYTES,
    MemoryEntry,
    MemoryStoreError,
)
from activities.memory.run_memory import RunMemory
from activities.memory.terms import query_terms
from activities.tools.spec import ToolContext, ToolError, tool

MAX_SEARCH_LIMIT = 20
SHOWN_CHARS = 2000  # of each entry's text in a search result: 20 entries stay well inside one tool result


class MemorySaveArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(
        description=f"What to remember (at most {MAX_TEXT_BYTES} bytes): one self-contained fact or note.",
        max_length=MAX_TEXT_BYTES,
    )
    key: str = Field(
        default="",
        description="A short name for the entry; saving under an existing key replaces it. Omit for a new entry.",
        max_length=MAX_KEY_CHARS,
    )


class MemorySearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(description="Words to look for in what was remembered.", max_length=MAX_QUERY_CHARS)
    limit: int = Field(default=5, ge=1, le=MAX_SEARCH_LIMIT, description="How many entries to return, best first.")


class MemoryDeleteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="The key of the entry to forget.", min_length=1, max_length=MAX_KEY_CHARS)


def _memory(ctx: ToolContext) -> RunMemory:
    if ctx.memory is None:
        raise RuntimeError(f"tool {ctx.invocation.tool!r} needs the memory store but none is attached")
    return ctx.memory


@contextmanager
def _refusals_to_model() -> Iterator[None]:
    """A bound or a bad key is the model's to fix; a store outage is not, and fails the attempt (retried)."""
    try:
        yield
    except MemoryStoreError as exc:
        raise ToolError(str(exc)) from None


def render(entries: list[MemoryEntry]) -> str:
    """What the model reads of ``entries``: key and text of each, best first."""
    if not entries:
        return "No memory entries matched."
    lines = [f"{len(entries)} memory entr{'y' if len(entries) == 1 else 'ies'}, best match first:"]
    for entry in entries:
        text = entry.text if len(entry.text) <= SHOWN_CHARS else entry.text[:SHOWN_CHARS] + " [...]"
        lines.append(f"- [{entry.key}] {text}")
    return "\n".join(lines)


@tool(
    "memory_save",
    description=(
        "Remember a fact or note beyond this run (for later runs of the same user). Returns the entry's key; "
        "saving again under that key replaces the entry."
    ),
    args=MemorySaveArgs,
    side_effect=True,
    recovery="idempotent_by_key",
    timeout_s=30,
    max_attempts=3,
)
async def memory_save(args: MemorySaveArgs, ctx: ToolContext) -> str:
    inv = ctx.invocation
    with _refusals_to_model():
        entry = await _memory(ctx).save(args.text, idempotency_key=inv.idempotency_key, key=args.key)
    return f"saved memory entry [{entry.key}] ({len(entry.text.encode())} bytes)"


@tool(
    "memory_search",
    description="Search what was remembered in earlier runs (of this user) for entries matching some words.",
    args=MemorySearchArgs,
    side_effect=False,
    timeout_s=30,
    max_attempts=3,
)
async def memory_search(args: MemorySearchArgs, ctx: ToolContext) -> str:
    if not query_terms(args.query):
        raise ToolError("the query has no words to search for: give some words the entry would contain")
    with _refusals_to_model():
        found = await _memory(ctx).search(args.query, args.limit)
    return render(found)


@tool(
    "memory_delete",
    description="Forget the memory entry with this key.",
    args=MemoryDeleteArgs,
    side_effect=True,
    recovery="idempotent_by_key",  # deleting twice leaves what deleting once does
    timeout_s=30,
    max_attempts=3,
)
async def memory_delete(args: MemoryDeleteArgs, ctx: ToolContext) -> str:
    with _refusals_to_model():
        deleted = await _memory(ctx).delete(args.key)
    return f"deleted memory entry [{args.key}]" if deleted else f"no memory entry has the key [{args.key}]"
