"""Test-only tools with compensations (``AGENT_TOOL_MODULES=tests.fakes.compensable_tools``)."""

from __future__ import annotations

import httpx
from pydantic import BaseModel, Field

from activities.tools import ToolContext, tool


class ReserveArgs(BaseModel):
    url: str = Field(description="the resource to reserve")


async def _release(args: ReserveArgs, ctx: ToolContext, result: str) -> str:
    async with httpx.AsyncClient() as client:
        response = await client.delete(args.url, headers={"Idempotency-Key": ctx.invocation.idempotency_key})
    return f"released ({response.status_code}) after {result!r}"


@tool(
    "reserve",
    description="Reserve a resource (test tool with a compensation).",
    args=ReserveArgs,
    side_effect=True,
    recovery="idempotent_by_key",
    compensate=_release,
)
async def reserve(args: ReserveArgs, ctx: ToolContext) -> str:
    async with httpx.AsyncClient() as client:
        response = await client.post(args.url, headers={"Idempotency-Key": ctx.invocation.idempotency_key})
    return f"reserved ({response.status_code})"
