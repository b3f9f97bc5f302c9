"""A side-effecting test tool that answers with what it was sent (``AGENT_TOOL_MODULES=tests.fakes.echo_tools``).

Side-effecting, so the default policy asks for approval and its result goes through the ledger: the
encryption tests use it to put a marker into tool arguments, tool outputs and ledger results.
"""

from __future__ import annotations

from pydantic import BaseModel

from activities.tools import ToolContext, tool


class EchoArgs(BaseModel):
    text: str


@tool(
    "echo",
    description="Answers with the text it was sent.",
    args=EchoArgs,
    side_effect=True,
    recovery="idempotent_by_key",
)
async def echo(args: EchoArgs, ctx: ToolContext) -> str:
    return f"echoed: {args.text}"
