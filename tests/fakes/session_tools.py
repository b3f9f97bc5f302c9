"""A slow side-effecting test tool for sessions (``AGENT_TOOL_MODULES=tests.fakes.session_tools``)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

from activities.tools import ToolContext, tool

CALLS: list[str] = []  # idempotency keys of the calls this process ran, in order


class Sleep(BaseModel):
    seconds: float = Field(ge=0, le=60)


@tool(
    "slow_side_effect",
    description="A test side effect that takes a while.",
    args=Sleep,
    side_effect=True,
    recovery="idempotent_by_key",
    heartbeat_s=1,
)
async def slow_side_effect(args: Sleep, ctx: ToolContext) -> str:
    CALLS.append(ctx.invocation.idempotency_key)
    await asyncio.sleep(args.seconds)
    return f"slept {args.seconds} s"


BULKY_BYTES = 10 * 1024


class Bulky(BaseModel):
    label: str = Field(default="", max_length=100)


@tool("bulky_read", description="A test read that answers with 10 KB of text.", args=Bulky)
async def bulky_read(args: Bulky, ctx: ToolContext) -> str:
    head = f"bulky output {args.label}: "
    return head + "x" * (BULKY_BYTES - len(head))
