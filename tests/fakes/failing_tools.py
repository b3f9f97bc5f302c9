"""A test tool whose every attempt raises (``AGENT_TOOL_MODULES=tests.fakes.failing_tools``)."""

from __future__ import annotations

from pydantic import BaseModel

from activities.tools import ToolContext, tool


class NoArgs(BaseModel):
    pass


@tool("always_fails", description="A test tool whose every attempt raises.", args=NoArgs, max_attempts=2)
async def always_fails(args: NoArgs, ctx: ToolContext) -> str:
    raise RuntimeError("boom")
