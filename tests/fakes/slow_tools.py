"""A slow read-only test tool (``AGENT_TOOL_MODULES=tests.fakes.slow_tools``)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from activities.tools import ToolContext, tool

SLOW_S = 1.0


class LookupArgs(BaseModel):
    key: str


@tool("slow_lookup", description="Look a key up (slowly, read-only).", args=LookupArgs)
async def slow_lookup(args: LookupArgs, ctx: ToolContext) -> str:
    await asyncio.sleep(SLOW_S)
    return f"value of {args.key}"


class BigArgs(BaseModel):
    n: int = 0


@tool("big_lookup", description="Return 10 KB of text (read-only).", args=BigArgs)
async def big_lookup(args: BigArgs, ctx: ToolContext) -> str:
    return (f"row {args.n} " * 2000)[: 10 * 1024]
