"""``my_tools.inventory`` on a real worker: a scripted model calls the tool, and the agent answers with it.

Run from this directory: ``pytest``. Each test starts a Temporal dev server (the ``temporal`` CLI that
comes with durable-agents) and a worker with this project's tool module and a :class:`ScriptedModel`.
"""

import importlib
from pathlib import Path

from durable_agents.testing import AgentTestEnvironment, ModelCall, ScriptedModel, Turn, call, say

HERE = Path(__file__).resolve().parent


def test_the_tool_module_is_this_projects_own() -> None:
    module = importlib.import_module("my_tools.inventory")  # the way the worker loads its tool modules
    assert Path(str(module.__file__)).resolve() == HERE / "my_tools" / "inventory.py"


def answer_with_the_count(request: ModelCall) -> Turn:
    """The model's second turn: it answers with what the tool told it."""
    return say(f"The count: {request.tool_result('stock_count').content}")


async def test_the_model_gets_the_stock_count_and_answers_with_it() -> None:
    model = ScriptedModel("test", [call("stock_count", {"item": "A-7"}), answer_with_the_count])
    async with AgentTestEnvironment(models=[model], tool_modules=["my_tools.inventory"]) as env:
        result = await env.run({"task": "How many A-7 are in stock?", "tools": ["stock_count"]})

    assert result.status == "completed", result.output
    assert result.output == "The count: A-7: 7 in stock"
    first, second = model.requests
    assert first.tool_names == ["stock_count"]
    assert first.last_user_message == "How many A-7 are in stock?"
    reached = second.tool_result("stock_count")
    assert reached.content == "A-7: 7 in stock" and not reached.is_error


async def test_an_unknown_item_is_an_error_the_model_reads() -> None:
    model = ScriptedModel("test", [call("stock_count", {"item": "Z-9"}), say("There is no Z-9.")])
    async with AgentTestEnvironment(models=[model], tool_modules=["my_tools.inventory"]) as env:
        result = await env.run({"task": "How many Z-9?", "tools": ["stock_count"]})

    assert result.output == "There is no Z-9."
    error = model.requests[-1].tool_result("stock_count")
    assert error.is_error and "no item 'Z-9'" in error.content
