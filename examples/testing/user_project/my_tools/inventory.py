"""``stock_count``: how many of an item are in stock (``AGENT_TOOL_MODULES=my_tools.inventory``)."""

from pydantic import BaseModel, Field

from durable_agents import ToolContext, ToolError, tool

STOCK = {"A-7": 7, "B-2": 0}


class StockArgs(BaseModel):
    item: str = Field(description="The item's number, e.g. A-7")


@tool("stock_count", description="How many of an item are in stock.", args=StockArgs)
async def stock_count(args: StockArgs, ctx: ToolContext) -> str:
    if args.item not in STOCK:
        raise ToolError(f"no item {args.item!r}; known items: {', '.join(sorted(STOCK))}")
    return f"{args.item}: {STOCK[args.item]} in stock"
