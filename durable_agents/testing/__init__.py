"""A test kit for agent authors: test your tools, providers and workflows the way a worker runs them.

::

    from durable_agents.testing import AgentTestEnvironment, ScriptedModel, call, say

    async def test_stock_lookup() -> None:
        model = ScriptedModel("test", [call("stock_lookup", {"item": "A-1"}), say("There are 42.")])
        async with AgentTestEnvironment(models=[model], tool_modules=["my_project.tools"]) as env:
            result = await env.run("How many A-1 are in stock?")
        assert result.status == "completed" and result.output == "There are 42."
        assert "42" in model.requests[-1].tool_result("stock_lookup").content

- :class:`ScriptedModel` is a model provider that plays a script of :class:`Turn` (text, tool calls, usage,
  provider errors, delays) and records every request it was sent (:class:`ModelCall`).
- :class:`AgentTestEnvironment` starts a Temporal server and a worker built with ``DurableAgentsPlugin`` on
  your tool modules and models, with a temporary run store; ``run`` / ``start`` run agents on it.
- :func:`replay` replays captured histories against today's workflow code with the plugin's data converter,
  and raises :class:`ReplayFailed` naming each run that would break.
- :func:`eventually` / :func:`eventually_sync` wait for an event instead of sleeping a fixed time.

Import it explicitly (``import durable_agents`` does not load it); workflow code never imports it.
"""

from durable_agents.testing._environment import AgentTestEnvironment, temporal_binary
from durable_agents.testing._replay import (
    HistorySource,
    Replayed,
    ReplayFailed,
    ReplayFailure,
    load_history,
    replay,
    replay_converter,
)
from durable_agents.testing._scripted_model import (
    ModelCall,
    Responder,
    ScriptedModel,
    ScriptExhausted,
    ToolCall,
    Turn,
    call,
    fail,
    say,
)
from durable_agents.testing._waiting import NeverHappened, eventually, eventually_sync

__all__ = [
    "AgentTestEnvironment",
    "HistorySource",
    "ModelCall",
    "NeverHappened",
    "ReplayFailed",
    "ReplayFailure",
    "Replayed",
    "Responder",
    "ScriptExhausted",
    "ScriptedModel",
    "ToolCall",
    "Turn",
    "call",
    "eventually",
    "eventually_sync",
    "fail",
    "load_history",
    "replay",
    "replay_converter",
    "say",
    "temporal_binary",
]
