"""Tools the model can call: the public API for tool authors.

A tool is an async function of a pydantic argument model and a :class:`ToolContext`,
declared with :func:`tool`; the text it returns goes to the model, and a
:class:`ToolError` it raises becomes an error result the model can read::

    from pydantic import BaseModel, Field

    from activities.tools import ToolContext, ToolError, tool


    class LookupArgs(BaseModel):
        sku: str = Field(description="The article number, e.g. A-1001")


    @tool("stock_lookup", description="How many units of an article are in stock.", args=LookupArgs)
    async def stock_lookup(args: LookupArgs, ctx: ToolContext) -> str:
        if not args.sku.startswith("A-"):
            raise ToolError(f"unknown article {args.sku!r}")
        return f"{args.sku}: 12 in stock"

Operators load such a module with ``AGENT_TOOL_MODULES=my_package.my_tools``; side
effects declare ``side_effect=True`` and a ``recovery`` mode (see :func:`tool`).
"""

from activities.tools.registry import ToolRegistry
from activities.tools.spec import Recovery, ToolContext, ToolError, ToolSpec, tool

__all__ = ["Recovery", "ToolContext", "ToolError", "ToolRegistry", "ToolSpec", "tool"]
