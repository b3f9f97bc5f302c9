"""The agent loop against a real Temporal dev server and a real OpenAI-speaking HTTP server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import REPLAY_MODES, WorkerFactory, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.agent import AgentWorkflow
from workflows.types import Limits


@pytest.fixture(params=REPLAY_MODES)
def cache_mode(request: pytest.FixtureRequest) -> str:
    """The loop itself: each test runs cached and again with no workflow cache (every task replays)."""
    return str(request.param)


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["body"]["messages"] if m["role"] == "tool"]


async def test_tool_round_trip_completes(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(
        Scripted(tool_calls=[("write_file", json.dumps({"path": "a.txt", "content": "hello"}))]),
        Scripted(tool_calls=[("read_file", json.dumps({"path": "a.txt"}))]),
        Scripted(text="the file says hello", input_tokens=100, output_tokens=7),
    )
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, task="write and read a file")
        result = await handle.result()
        status = await handle.query(AgentWorkflow.status)

    assert result.status == "completed"
    assert result.output == "the file says hello"
    assert result.steps == 3
    assert result.usage.input_tokens == 10 + 10 + 100
    assert result.usage.output_tokens == 5 + 5 + 7
    chat = [r for r in llm.requests if r["path"].endswith("/chat/completions")]
    assert len(chat) == 3
    first = chat[0]["body"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == "write and read a file"
    assert {t["function"]["name"] for t in first["tools"]} >= {"read_file", "write_file", "http_request"}
    last = chat[2]["body"]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert last[5]["content"] == "hello"
    assert last[3]["tool_call_id"] == last[2]["tool_calls"][0]["id"]
    assert status.state == "completed" and status.step == 3


async def test_bad_model_output_becomes_tool_errors(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(
        Scripted(
            tool_calls=[
                ("read_file", '{"path": "a.txt"'),  # not JSON
                ("launch_rockets", "{}"),  # unknown tool
                ("write_file", json.dumps({"path": "x"})),  # schema: content missing
                ("read_file", json.dumps({"path": "missing.txt"})),  # tool raises
                ("read_file", "[1, 2]"),  # JSON but not an object
                ("always_fails", "{}"),  # raises every attempt
            ]
        ),
        Scripted(text="recovered"),
    )
    async with run_worker(dev_env.client, runtime) as tq:
        result = await (await start_agent(dev_env.client, tq)).result()

    assert result.status == "completed" and result.output == "recovered"
    second = llm.requests[1]["body"]["messages"]
    assistant = second[2]
    results = tool_messages(llm.requests[1])
    # Every call the model made got exactly one result, in order.
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in assistant["tool_calls"]]
    texts = [r["content"] for r in results]
    assert "not valid JSON" in texts[0]
    assert "unknown tool 'launch_rockets'" in texts[1]
    assert "content: Field required" in texts[2]
    assert texts[3].startswith("Error:") and "missing.txt" in texts[3]
    assert "must be a JSON object" in texts[4]
    assert "always_fails failed after 2 attempts" in texts[5] and "boom" in texts[5]


async def test_max_steps_limit_keeps_partial_transcript(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = Scripted(tool_calls=[("launch_rockets", "{}")])
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, limits=Limits(max_steps=3))
        result = await handle.result()
    assert result.status == "limit_exceeded"
    assert "max_steps=3" in result.output
    assert result.steps == 3
    assert len(llm.requests) == 3
    # The last turn's tool error was flushed to the store although no model turn followed.
    info = await handle.describe()
    transcript = await runtime.store.messages(f"{handle.id}/{info.run_id}", 2 + 3 * 2)
    assert transcript[-1].message.role == "tool" and transcript[-1].message.is_error


async def test_token_and_cost_limits(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = Scripted(tool_calls=[("launch_rockets", "{}")], input_tokens=600, output_tokens=100)
    async with run_worker(dev_env.client, runtime) as tq:
        by_tokens = await (await start_agent(dev_env.client, tq, limits=Limits(max_tokens=1500))).result()
        # gpt-4o: $2.50 / $10 per million → 600 in + 100 out = $0.0025 per turn.
        by_cost = await (
            await start_agent(dev_env.client, tq, model="openai:gpt-4o", limits=Limits(max_cost_usd=0.006))
        ).result()
    assert by_tokens.status == "limit_exceeded" and "max_tokens=1500" in by_tokens.output
    assert by_tokens.steps == 3 and by_tokens.usage.input_tokens == 1800
    assert by_cost.status == "limit_exceeded" and "max_cost_usd" in by_cost.output
    assert by_cost.steps == 3 and abs(by_cost.usage.cost_usd - 0.0075) < 1e-9


async def test_fatal_model_error_fails_the_run_without_retry(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(status=401, text="Incorrect API key provided"))
    async with run_worker(dev_env.client, runtime) as tq:
        result = await (await start_agent(dev_env.client, tq)).result()
    assert result.status == "failed"
    assert "Incorrect API key provided" in result.output
    assert len(llm.requests) == 1


async def test_server_errors_are_retried(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(
        Scripted(status=500, text="upstream broke"),
        Scripted(status=429, text="slow down", headers={"Retry-After": "1"}),
        Scripted(text="third time lucky"),
    )
    async with run_worker(dev_env.client, runtime) as tq:
        result = await (await start_agent(dev_env.client, tq)).result()
    assert result.status == "completed" and result.output == "third time lucky"
    assert len(llm.requests) == 3
    assert result.steps == 1


async def test_unknown_model_is_refused_at_start(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    from temporalio.client import WorkflowFailureError

    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, model="gpt-4o")
        try:
            await handle.result()
        except WorkflowFailureError as err:
            assert "unknown model 'gpt-4o'" in str(err.cause)
        else:
            raise AssertionError("a malformed model string must fail the run")
