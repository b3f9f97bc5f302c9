"""What bounds a tree of runs: its budget under concurrency, its size, its depth, and its start inputs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities.models.anthropic import AnthropicProvider
from activities.models.base import ProviderReply, complete_capped, prompt_tokens_bound
from activities.models.openai import OpenAIProvider
from activities.runtime import Runtime
from tests.conftest import WorkerFactory, start_agent, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.agent import AgentWorkflow
from workflows.types import AgentResult, Limits, Message, SubagentDef

RESULT_DEADLINE_S = 300  # generous: a run that dies never completes, so its result is awaited with a bound


async def child_ids(client: Client, workflow_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]


async def tree(client: Client, root: str) -> list[str]:
    """Every workflow of the tree under ``root`` (itself included), from the histories."""
    found, queue = [root], [root]
    while queue:
        children = await child_ids(client, queue.pop())
        found += children
        queue += children
    return found


async def history_bytes(client: Client, workflow_id: str) -> tuple[int, int]:
    """(total, largest event) of a run's history, in bytes."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    sizes = [e.ByteSize() for e in history.events]
    return sum(sizes), max(sizes)


def tool_results(llm: FakeLLMServer, system_prefix: str) -> list[str]:
    return [
        m["content"]
        for r in llm.requests
        if r["body"]["messages"][0]["content"].startswith(system_prefix)
        for m in r["body"]["messages"]
        if m["role"] == "tool"
    ]


# --- item 4: the tree's budget under concurrency ------------------------------------------


def thirty_counters(body: dict[str, Any]) -> Scripted:
    """A cheap parent turn that calls 30 sub-agents at once; each child's one turn is far dearer (and slow, so
    that all of them ask for the budget before the first one settles, as with a real model)."""
    messages = body["messages"]
    if messages[0]["content"] == "You are a counter.":
        return Scripted(text="counted", output_tokens=5000, honest_usage=True, delay_s=0.5)
    if any(m["role"] == "tool" for m in messages):
        return Scripted(text="parent done", output_tokens=5, honest_usage=True)
    calls = [("counter", json.dumps({"task": f"count {i}"})) for i in range(30)]
    return Scripted(tool_calls=calls, output_tokens=5, honest_usage=True)


async def test_thirty_concurrent_children_overshoot_the_tree_budget_by_one_turn_at_most(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = thirty_counters
    rt = with_settings(runtime, max_subagent_calls_per_turn=30, max_output_tokens=2000)
    counter = SubagentDef(description="Counts.", system_prompt="You are a counter.", tools=[])
    cap = 10_000
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start_agent(dev_env.client, tq, subagents={"counter": counter}, limits=Limits(max_tokens=cap))
        result = await asyncio.wait_for(handle.result(), RESULT_DEADLINE_S)
        status = await handle.query(AgentWorkflow.status)
        root = f"{handle.id}/{(await handle.describe()).run_id}"
        spent = await rt.store.budget_spent(root)

    turns = [sum(r["usage"]) for r in llm.requests if "usage" in r]
    one_turn = max(turns)
    assert spent.tokens == sum(turns) and spent.in_flight == 0
    assert spent.tokens <= cap + one_turn, (spent.tokens, turns)
    assert status.usage.total_tokens <= cap + one_turn, status.usage
    # Every turn asked for at most 2000 output tokens (the honest server cuts the 5000 at the request's cap).
    assert {r["body"].get("max_tokens") for r in llm.requests} == {2000}
    assert one_turn < 2500, turns
    assert result.usage.total_tokens == spent.tokens
    assert spent.tokens >= cap  # the budget was really used, not refused early
    assert result.status == "limit_exceeded", result.output
    await rt.aclose()


# --- item 11: how many runs, how deep, how many steps ------------------------------------


def spawner_model(body: dict[str, Any]) -> Scripted:
    """A sub-agent that delegates to five copies of itself; a bystander that just answers."""
    messages = body["messages"]
    system = messages[0]["content"]
    if system == "You are the bystander.":
        return Scripted(text="bystander done")
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if results:
        return Scripted(text=f"{len(results)} results")
    return Scripted(tool_calls=[("spawner", json.dumps({"task": "spawn more"})) for _ in range(5)])


SPAWNER = SubagentDef(
    description="Spawns.", system_prompt="You spawn.", tools=[], limits=Limits(max_depth=10, max_steps=8)
)


async def test_a_self_delegating_tree_stops_at_the_tree_cap_while_a_run_beside_it_completes(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = spawner_model
    cap = 12  # of 155 runs the tree would make under the default AGENT_MAX_DEPTH (5 + 25 + 125)
    rt = with_settings(runtime, max_tree_runs=cap)
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start_agent(
            dev_env.client, tq, subagents={"spawner": SPAWNER}, limits=Limits(max_depth=10, max_steps=20)
        )
        bystander = await start_agent(dev_env.client, tq, system_prompt="You are the bystander.", subagents=[])
        beside = await asyncio.wait_for(bystander.result(), RESULT_DEADLINE_S)
        result = await asyncio.wait_for(handle.result(), RESULT_DEADLINE_S)
        runs = await tree(dev_env.client, handle.id)
        counted = await rt.store.tree_runs(f"{handle.id}/{(await handle.describe()).run_id}")

    assert beside.status == "completed" and beside.output == "bystander done"
    assert result.status == "completed", result.output
    assert len(runs) == cap, runs  # the root and cap - 1 children, at every depth together
    assert counted == cap - 1
    refusals = [
        t for t in tool_results(llm, "You spawn.") + tool_results(llm, "You are an agent") if "AGENT_MAX_TREE_RUNS" in t
    ]
    assert refusals and all("spawner was not started" in t for t in refusals)
    # The operator's ceiling (AGENT_MAX_DEPTH=3) holds over the run's and the sub-agent's max_depth of 10.
    assert max(r.count("/spawner/") for r in runs) <= 3
    await rt.aclose()


def stubborn_model(body: dict[str, Any]) -> Scripted:
    """The parent delegates once, then answers; its sub-agents try to delegate again at every turn."""
    messages = body["messages"]
    if messages[0]["content"] != "You spawn." and any(m["role"] == "tool" for m in messages):
        return Scripted(text="parent done")
    return Scripted(tool_calls=[("spawner", json.dumps({"task": "spawn more"})) for _ in range(5)])


async def test_per_turn_calls_depth_and_steps_are_capped_by_the_operator_and_the_parent(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = stubborn_model
    rt = with_settings(runtime, max_depth=1, max_subagent_calls_per_turn=2)
    async with run_worker(dev_env.client, rt) as tq:
        # The run asks for depth 5 and its sub-agent for 8 steps and depth 10: the operator allows depth 1,
        # and the parent (3 steps, 2 left after the delegating turn) leaves its children two steps.
        handle = await start_agent(
            dev_env.client, tq, subagents={"spawner": SPAWNER}, limits=Limits(max_depth=5, max_steps=3)
        )
        result = await asyncio.wait_for(handle.result(), RESULT_DEADLINE_S)
        children = await child_ids(dev_env.client, handle.id)
        grandchildren = [c for child in children for c in await child_ids(dev_env.client, child)]
        child_results = [
            await dev_env.client.get_workflow_handle(c, result_type=AgentResult).result() for c in children
        ]

    assert result.status == "completed", result.output
    assert len(children) == 2 and grandchildren == []
    parent_results = tool_results(llm, "You are an agent")
    assert sum("AGENT_MAX_SUBAGENT_CALLS_PER_TURN" in t for t in parent_results) == 3
    assert [r.status for r in child_results] == ["limit_exceeded", "limit_exceeded"]
    assert all(r.steps == 2 and "max_steps=2 reached" in r.output for r in child_results), child_results
    # Each child's second turn saw its first turn's five calls refused: two by depth, three by the per-turn cap.
    child_errors = tool_results(llm, "You spawn.")
    assert sum("max_depth reached (1)" in t for t in child_errors) == 4
    assert sum("AGENT_MAX_SUBAGENT_CALLS_PER_TURN" in t for t in child_errors) == 6
    await rt.aclose()


# --- item 12: fat sub-agent definitions -----------------------------------------------------


FAT_PROMPT_CHARS = 99_000


def fat_definitions(filler: str) -> dict[str, SubagentDef]:
    return {
        f"fat{i}": SubagentDef(
            description=f"Fat helper {i}.", system_prompt=f"You are fat {i}. " + filler * FAT_PROMPT_CHARS, tools=[]
        )
        for i in range(8)
    }


def fat_model(body: dict[str, Any]) -> Scripted:
    messages = body["messages"]
    system = messages[0]["content"]
    if system.startswith("You are fat"):
        return Scripted(text=f"{system.split('.')[0]} did {messages[1]['content']}")
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if results:
        return Scripted(text=" | ".join(results))
    return Scripted(tool_calls=[(f"fat{i}", json.dumps({"task": f"part {i}"})) for i in range(5)])


async def test_eight_fat_definitions_delegating_five_times_pass_by_reference(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = fat_model
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, subagents=fat_definitions("x"))
        result = await asyncio.wait_for(handle.result(), RESULT_DEADLINE_S)
        children = await child_ids(dev_env.client, handle.id)
        parent_size = await history_bytes(dev_env.client, handle.id)
        child_sizes = [await history_bytes(dev_env.client, c) for c in children]

    assert result.status == "completed", result.output
    assert result.output == " | ".join(f"You are fat {i} did part {i}" for i in range(5))
    assert len(children) == 5
    # The input (~800 KB) is in the start event once; nothing else of the parent's carries the prompts.
    input_event = parent_size[1]
    assert input_event < 900_000 and parent_size[0] - input_event < 200_000, parent_size
    # Each child's history holds its own prompt once (its first model turn's input), not the eight definitions.
    assert all(total < 300_000 for total, _ in child_sizes), child_sizes
    # Each child saw its own system prompt, from the definitions in the run store.
    prompts = {r["body"]["messages"][0]["content"][:10] for r in llm.requests}
    assert {f"You are fat {i}"[:10] for i in range(5)} <= prompts


async def test_a_run_input_over_the_size_limit_is_refused_at_start(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = fat_model
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, subagents=fat_definitions("é"))  # 2 bytes a character
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), RESULT_DEADLINE_S)

    message = str(failure.value.cause)
    assert "invalid run input: the input is " in message and "bytes, over the limit of 1048576 bytes" in message
    assert llm.requests == []  # nothing ran


async def test_sub_agent_definitions_by_digest_are_refused_from_outside(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, subagents_ref="sha256:" + "0" * 64, as_subagent="fat0")
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), RESULT_DEADLINE_S)
    assert "invalid run input: subagents_ref: only a sub-agent" in str(failure.value.cause)


# --- the output cap reaches the providers that take it, and only those -----------------------


class OldStyleProvider:
    """A custom provider written before the output cap existed."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        self.calls += 1
        return ProviderReply(text="old", output_tokens=7)


class CappedStyleProvider:
    def __init__(self) -> None:
        self.caps: list[int] = []

    async def complete(
        self, model: str, messages: list[Message], tools: list[dict[str, Any]], **options: Any
    ) -> ProviderReply:
        self.caps.append(options["max_output_tokens"])
        return ProviderReply(text="new")


async def test_the_output_cap_is_sent_only_to_providers_that_take_it(llm: FakeLLMServer) -> None:
    old, new = OldStyleProvider(), CappedStyleProvider()
    messages = [Message(role="user", content="hi")]
    assert (await complete_capped(old, "m", messages, [], 123)).text == "old" and old.calls == 1
    assert (await complete_capped(new, "m", messages, [], 123)).text == "new" and new.caps == [123]
    async with AnthropicProvider(llm.anthropic_url) as anthropic, OpenAIProvider(llm.openai_url) as openai:
        await complete_capped(anthropic, "claude", messages, [], 321)
        await complete_capped(openai, "gpt", messages, [], 321)
        await openai.complete("gpt", messages, [])  # called directly, without a cap: none is sent
    assert llm.requests[0]["body"]["max_tokens"] == 321 and llm.requests[1]["body"]["max_tokens"] == 321
    assert "max_tokens" not in llm.requests[2]["body"]


def test_a_prompt_bound_counts_every_byte_of_the_request() -> None:
    text = "é" * 3000  # 6000 UTF-8 bytes
    bound = prompt_tokens_bound([Message(role="user", content=text)], [{"name": "t", "description": text}])
    assert bound >= 12_000 // 3
