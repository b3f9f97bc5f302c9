"""A custom tool module: ``AGENT_TOOL_MODULES=examples.custom_tool.inventory_tools``."""
