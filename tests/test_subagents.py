"""Sub-agents: definitions validated at start, delegation as child workflows, fan-out, depth."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import ConfigurationError, ExtensionSettings
from durable_agents.cli.approvals import cmd_approve, cmd_pending
from durable_agents.cli.watch import watch
from tests.conftest import WorkerFactory, require_bwrap, start_agent, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.agent import AgentWorkflow
from workflows.delegation import child_policy
from workflows.identity import sandbox_id_for
from workflows.types import AgentInput, AgentResult, Limits, SubagentDef, TreeBudget

CHILD_DELAY_S = 1.5
DEFINITIONS = {
    "researcher": {"description": "Finds facts.", "system_prompt": "You are the researcher.", "tools": ["read_file"]},
    "writer": {"description": "Writes prose.", "system_prompt": "You are the writer.", "tools": []},
}


def write_definitions(tmp_path: Path, definitions: Any = DEFINITIONS) -> str:
    path = tmp_path / "subagents.json"
    path.write_text(json.dumps(definitions))
    return str(path)


def fan_out_model(body: dict[str, Any]) -> Scripted:
    """The parent delegates to both sub-agents in one turn; each child answers after a delay."""
    messages = body["messages"]
    system = messages[0]["content"]
    for name in ("researcher", "writer"):
        if system == f"You are the {name}.":
            return Scripted(text=f"{name} did: {messages[1]['content']}", delay_s=CHILD_DELAY_S)
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if results:
        return Scripted(text=" | ".join(results))
    return Scripted(
        tool_calls=[
            ("researcher", json.dumps({"task": "find the facts"})),
            ("writer", json.dumps({"task": "write the report"})),
        ]
    )


async def events(client: Client, workflow_id: str) -> list[Any]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return list(history.events)


async def model_activity_span(client: Client, workflow_id: str) -> tuple[float, float]:
    """When this run's (only) model activity started and completed."""
    found = await events(client, workflow_id)
    started = [e for e in found if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    completed = [e for e in found if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]
    assert started and completed
    return started[0].event_time.ToDatetime().timestamp(), completed[-1].event_time.ToDatetime().timestamp()


async def test_parent_delegates_to_two_subagents_in_one_turn(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    tmp_path: Path,
    cache_mode: str,
) -> None:
    llm.default = fan_out_model
    rt = with_settings(runtime, subagents_file=write_definitions(tmp_path))
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start_agent(dev_env.client, tq, task="research and write")
        result = await handle.result()
        status = await handle.query(AgentWorkflow.status)

    assert result.status == "completed"
    # Both results, in call order.
    assert result.output == "researcher did: find the facts | writer did: write the report"
    parent_events = await events(dev_env.client, handle.id)
    initiated = [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in parent_events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert initiated == [f"{handle.id}/researcher/s1c0", f"{handle.id}/writer/s1c1"]
    # Concurrent: each child's model call started before the other one's finished. (With no workflow
    # cache, a worker running two new runs' local activities at once can lose one workflow task to
    # a 10 s timeout, which delays that child; both still complete.)
    if cache_mode == "cached":
        spans = [await model_activity_span(dev_env.client, child) for child in initiated]
        assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans
    # The children's usage is the parent's too, and shown apart in the status view.
    assert status.children_usage.input_tokens == 20 and status.children_usage.output_tokens == 10
    assert status.own_usage.input_tokens == 20
    assert result.usage.input_tokens == 40
    # The child ran with the sub-agent's definition and one level deeper.
    child = await dev_env.client.get_workflow_handle(initiated[0], result_type=AgentResult).result()
    assert child.status == "completed"
    child_requests = [r for r in llm.requests if r["body"]["messages"][0]["content"] == "You are the researcher."]
    assert [t["function"]["name"] for t in child_requests[0]["body"]["tools"]] == ["read_file", "researcher", "writer"]
    description = await dev_env.client.get_workflow_handle(initiated[1]).describe()
    assert description.parent_id == handle.id
    assert await description.static_summary() == f"writer for {handle.id}: write the report"


async def test_max_depth_stops_delegation_with_a_tool_error(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(tool_calls=[("helper", json.dumps({"task": "go deeper"}))]), Scripted(text="gave up"))
    subagents = {"helper": SubagentDef(description="Helps.")}
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, subagents=subagents, limits=Limits(max_depth=0))
        result = await handle.result()

    assert result.status == "completed"
    tool_results = [m for m in llm.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert "max_depth reached" in tool_results[0]["content"]
    parent_events = await events(dev_env.client, handle.id)
    started = EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    assert not [e for e in parent_events if e.event_type == started]


async def test_bad_arguments_to_a_subagent_are_a_tool_error(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(tool_calls=[("helper", json.dumps({"job": "x"}))]), Scripted(text="ok"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, subagents={"helper": SubagentDef(description="Helps.")})
        result = await handle.result()

    assert result.status == "completed"
    tool_results = [m for m in llm.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert "invalid arguments for helper" in tool_results[0]["content"]


async def test_unknown_subagent_names_fail_the_run_at_start(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, subagents=["nobody"])
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    assert "unknown sub-agents ['nobody']" in str(failure.value.cause)


@pytest.mark.parametrize(
    ("definitions", "problem"),
    [
        ({"read_file": {"description": "x"}}, "has the name of a tool"),
        ({"a": {"description": "x", "tools": ["nope"]}}, "unknown tools ['nope']"),
        ({"a": {"description": "x", "modle": "y"}}, "a.modle: unknown key 'modle' (did you mean 'model'?)"),
        ({"1bad": {"description": "x"}}, "1bad.[key]"),
        ({"a": {}}, "a.description: Field required"),
    ],
)
def test_bad_definitions_stop_the_worker(
    runtime: Runtime, tmp_path: Path, definitions: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigurationError) as err:
        with_settings(runtime, subagents_file=write_definitions(tmp_path, definitions))
    assert str(err.value).startswith("AGENT_SUBAGENTS_FILE=")
    assert problem in str(err.value)
    assert "\n" not in str(err.value)


def test_run_input_bounds_subagents() -> None:
    with pytest.raises(ValueError):
        AgentInput(task="t", subagents={"no spaces": SubagentDef(description="x")})
    with pytest.raises(ValueError):
        AgentInput(task="t", depth=11)


def test_child_policy_is_never_looser() -> None:
    parent = {"rules": [{"tool": "write_file", "decision": "deny"}], "approval_timeout_s": 100}
    own = {"rules": [{"tool": "write_file", "decision": "allow"}, {"tool": "read_file", "decision": "ask"}]}
    merged = child_policy(parent, own)
    assert merged["rules"] == [{"tool": "write_file", "decision": "deny"}, {"tool": "read_file", "decision": "ask"}]
    deny = child_policy({}, {"rules": [{"tool": "*", "decision": "deny"}]})
    assert deny["rules"][0]["decision"] == "deny"


def activity_spans(found: list[Any], activity_type: str) -> list[tuple[float, float]]:
    """(started, completed) of each activity of this type, in scheduling order."""
    scheduled = {
        e.event_id: e
        for e in found
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity_type
    }
    started = {
        e.activity_task_started_event_attributes.scheduled_event_id: e.event_time.ToDatetime().timestamp()
        for e in found
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    }
    completed = {
        e.activity_task_completed_event_attributes.scheduled_event_id: e.event_time.ToDatetime().timestamp()
        for e in found
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    }
    return [(started[i], completed[i]) for i in sorted(scheduled)]


async def test_read_only_tools_of_one_turn_run_concurrently(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(
        Scripted(
            tool_calls=[
                ("slow_lookup", json.dumps({"key": "a"})),
                ("slow_lookup", json.dumps({"key": "b"})),
                ("write_file", json.dumps({"path": "x.txt", "content": "x"})),
                ("slow_lookup", json.dumps({"key": "c"})),
            ]
        ),
        Scripted(text="done"),
    )
    modules = (*runtime.settings.extensions.tool_modules, "tests.fakes.slow_tools")
    rt = with_settings(runtime, extensions=ExtensionSettings(tool_modules=modules))
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start_agent(dev_env.client, tq, tools=["slow_lookup", "write_file"])
        result = await handle.result()

    assert result.status == "completed"
    results = [m["content"] for m in llm.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert results[0] == "value of a" and results[1] == "value of b" and results[3] == "value of c"
    found = await events(dev_env.client, handle.id)
    lookups = activity_spans(found, "slow_lookup")
    (write,) = activity_spans(found, "write_file")
    assert len(lookups) == 3
    # a and b together; the write after both; c after the write (side effects and the sandbox keep call order).
    assert lookups[0][0] < lookups[1][1] and lookups[1][0] < lookups[0][1], lookups
    assert write[0] >= max(lookups[0][1], lookups[1][1]) and lookups[2][0] >= write[1]
    markers = [e for e in found if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert any(b"parallel-tool-calls-v1" in e.SerializeToString() for e in markers)


PRICE_PER_TURN = 0.01  # 1000 input tokens at $10 per million


def priced_fan_out(body: dict[str, Any]) -> Scripted:
    """A parent that asks three sub-agents at once; each child works turn after turn until stopped."""
    messages = body["messages"]
    system = messages[0]["content"]
    if system.startswith("You are worker"):
        step = sum(1 for m in messages if m["role"] == "tool")
        return Scripted(
            tool_calls=[("always_fails", "{}")], input_tokens=1000, output_tokens=0, delay_s=0.05 * (step % 3)
        )
    if any(m["role"] == "tool" for m in messages):
        return Scripted(text="parent done", input_tokens=1000, output_tokens=0)
    return Scripted(
        tool_calls=[(f"w{i}", json.dumps({"task": f"job {i}"})) for i in range(3)], input_tokens=1000, output_tokens=0
    )


async def test_the_tree_shares_one_budget(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    tmp_path: Path,
) -> None:
    llm.default = priced_fan_out
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai:test-model": {"input": 10.0, "output": 0.0}}))
    rt = with_settings(runtime, prices_file=str(prices))
    workers = {
        f"w{i}": SubagentDef(description="Works.", system_prompt=f"You are worker {i}.", tools=["always_fails"])
        for i in range(3)
    }
    cap = 0.105  # ten turns and a half; each child alone would use up to 20 turns
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start_agent(
            dev_env.client, tq, subagents=workers, limits=Limits(max_cost_usd=cap, max_steps=20, max_tokens=10**6)
        )
        result = await handle.result()
        status = await handle.query(AgentWorkflow.status)

    assert result.status == "limit_exceeded", result.output
    turns = [r for r in llm.requests if r["path"].endswith("/chat/completions")]
    spent = len(turns) * PRICE_PER_TURN
    # Never more than one model turn of one agent over the cap, across the whole tree.
    assert spent <= cap + PRICE_PER_TURN + 1e-9, (len(turns), spent)
    assert spent >= cap  # the budget was really used, not refused early
    assert status.children_usage.cost_usd > 0
    assert abs(result.usage.cost_usd - spent) < 1e-6
    store_spent = await rt.store.budget_spent(f"{handle.id}/{(await handle.describe()).run_id}")
    assert abs(store_spent.cost_usd - spent) < 1e-6
    await rt.aclose()


def approval_model(body: dict[str, Any]) -> Scripted:
    messages = body["messages"]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if messages[0]["content"] == "You are the poster.":
        if results:
            return Scripted(text=f"poster: {results[0]}")
        return Scripted(tool_calls=[("write_file", json.dumps({"path": "note.txt", "content": "hi"}))])
    if results:
        return Scripted(text=results[0])
    return Scripted(tool_calls=[("poster", json.dumps({"task": "write the note"}))])


async def test_a_subagents_approval_is_listed_and_decided_through_the_parent(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    llm.default = approval_model
    poster = SubagentDef(
        description="Writes notes.",
        system_prompt="You are the poster.",
        tools=["write_file"],
        policy={"rules": [{"name": "ask-writes", "tool": "write_file", "decision": "ask"}]},
    )
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, subagents={"poster": poster})
        child_id = f"{handle.id}/poster/s1c0"
        for _ in range(200):
            status = await handle.query(AgentWorkflow.status)
            if status.pending_approvals:
                break
            await asyncio.sleep(0.1)
        assert status.state == "waiting_approval"
        (pending,) = status.pending_approvals
        assert pending.workflow_id == child_id and pending.tool == "write_file" and pending.rule == "ask-writes"

        capsys.readouterr()
        await cmd_pending(dev_env.client, argparse.Namespace(workflow_id=handle.id, json=True), runtime.settings)
        (row,) = json.loads(capsys.readouterr().out)
        assert (row["workflow_id"], row["via"], row["approval_id"]) == (child_id, handle.id, pending.approval_id)

        decision = argparse.Namespace(
            workflow_id=handle.id, approval_id=pending.approval_id, reviewer="alice", comment="fine"
        )
        assert await cmd_approve(dev_env.client, decision, runtime.settings) == 0
        assert f"approved {pending.approval_id}" in capsys.readouterr().out
        result = await handle.result()
        after = await handle.query(AgentWorkflow.status)

    assert result.status == "completed"
    assert result.output.startswith("poster: ") and "Error" not in result.output
    assert after.pending_approvals == []


def sleepy_model(body: dict[str, Any]) -> Scripted:
    messages = body["messages"]
    if messages[0]["content"] == "You are the sleeper.":
        return Scripted(tool_calls=[("run_shell", json.dumps({"command": "sleep 30"}))])
    if any(m["role"] == "tool" for m in messages):
        return Scripted(text="the parent went on after the cancel")
    return Scripted(tool_calls=[("sleeper", json.dumps({"task": f"sleep {i}"})) for i in range(2)])


async def test_cancelling_the_parent_cancels_every_child_and_kills_their_sandboxes(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    llm.default = sleepy_model
    sleeper = SubagentDef(description="Sleeps.", system_prompt="You are the sleeper.", tools=["run_shell"])
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, subagents={"sleeper": sleeper})
        children = [dev_env.client.get_workflow_handle(f"{handle.id}/sleeper/s1c{i}") for i in range(2)]
        for _ in range(300):
            try:
                events = [(await c.query(AgentWorkflow.status)).last_event for c in children]
            except Exception:
                events = []
            if events and all("running run_shell" in e for e in events):
                break
            await asyncio.sleep(0.05)
        assert events and all("running run_shell" in e for e in events), events
        workspaces = [
            Path(runtime.settings.state_dir) / "sandboxes" / sandbox_id_for(f"{c.id}/{(await c.describe()).run_id}")
            for c in children
        ]
        assert all(w.is_dir() for w in workspaces)

        await handle.cancel()
        result = await handle.result()
        child_states = [(await c.describe()).status for c in children]
        child_results = [
            await dev_env.client.get_workflow_handle(c.id, result_type=AgentResult).result() for c in children
        ]

    assert result.status == "cancelled", result
    assert all(s != WorkflowExecutionStatus.RUNNING for s in child_states), child_states
    assert [r.status for r in child_results] == ["cancelled", "cancelled"]
    assert not any(w.exists() for w in workspaces), "every child's sandbox must be killed"
    for child in children:
        assert child.id in result.output  # the parent's result says what each child did
    assert "went on" not in result.output


CHILD_TURNS = 10


def long_tree_model(body: dict[str, Any]) -> Scripted:
    """A parent delegating 20 times (two turns of 10), each child making 10 big tool calls."""
    messages = body["messages"]
    done = sum(1 for m in messages if m["role"] == "tool")
    if messages[0]["content"] == "You are the digger.":
        if done >= CHILD_TURNS:
            return Scripted(text=f"dug {done} rows")
        return Scripted(tool_calls=[("big_lookup", json.dumps({"n": done}))])
    if done >= 20:
        return Scripted(text="all dug")
    return Scripted(tool_calls=[("digger", json.dumps({"task": f"dig part {done + i}"})) for i in range(10)])


async def test_a_tree_of_20_delegations_keeps_every_history_small(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = long_tree_model
    modules = (*runtime.settings.extensions.tool_modules, "tests.fakes.slow_tools")
    rt = with_settings(runtime, extensions=ExtensionSettings(tool_modules=modules))
    digger = SubagentDef(
        description="Digs.", system_prompt="You are the digger.", tools=["big_lookup"], limits=Limits(max_steps=12)
    )
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start_agent(dev_env.client, tq, subagents={"digger": digger})
        result = await handle.result()

    assert result.status == "completed" and result.output == "all dug"
    found = await events(dev_env.client, handle.id)
    started = EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    children = [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in found
        if e.event_type == started
    ]
    assert len(children) == 20
    for workflow_id in [handle.id, *children]:
        history = await dev_env.client.get_workflow_handle(workflow_id).fetch_history()
        size = sum(e.ByteSize() for e in history.events)
        assert size < 1_000_000, (workflow_id, size)
    child = await dev_env.client.get_workflow_handle(children[-1], result_type=AgentResult).result()
    assert child.output == f"dug {CHILD_TURNS} rows"


async def test_scripted_demo_delegates_when_the_task_asks(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    require_bwrap()
    helpers = {
        name: SubagentDef(description=f"The {name}.", model="scripted:demo", tools=["write_file", "run_python"])
        for name in ("analyst", "checker")
    }
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(
            dev_env.client, tq, model="scripted:demo", task="Delegate the prime statistics.", subagents=helpers
        )
        result = await handle.result()

    assert result.status == "completed", result
    lines = result.output.splitlines()
    assert lines[0] == "Done. My sub-agents reported:"
    assert lines[1].startswith("- analyst: ") and lines[2].startswith("- checker: ")
    assert all("sandboxed Python said: primes below 60" in line for line in lines[1:])


def sharing_model(body: dict[str, Any]) -> Scripted:
    messages = body["messages"]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if messages[0]["content"] == "You are the peer.":
        if results:
            return Scripted(text=f"peer read: {results[0]}")
        return Scripted(tool_calls=[("read_file", json.dumps({"path": "shared.txt"}))])
    if not results:
        return Scripted(tool_calls=[("write_file", json.dumps({"path": "shared.txt", "content": "from the parent"}))])
    if len(results) == 1:
        return Scripted(tool_calls=[("peer", json.dumps({"task": "read shared.txt"}))])
    return Scripted(text=results[-1])


async def test_a_sharing_subagent_works_in_its_parents_sandbox(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    llm.default = sharing_model
    peer = SubagentDef(description="Reads.", system_prompt="You are the peer.", tools=["read_file"], share_sandbox=True)
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, subagents={"peer": peer})
        result = await handle.result()
        run_id = (await handle.describe()).run_id

    assert result.status == "completed"
    assert result.output == "peer read: from the parent"
    workspace = Path(runtime.settings.state_dir) / "sandboxes" / sandbox_id_for(f"{handle.id}/{run_id}")
    assert not workspace.exists(), "the parent kills the shared sandbox at its end"


async def test_only_a_subagent_may_name_a_parents_sandbox(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, parent_conversation="victim/run")
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    assert "only a sub-agent may work in its own parent's sandbox" in str(failure.value.cause)


async def test_watch_shows_the_children_indented_under_the_parent(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, tmp_path: Path
) -> None:
    llm.default = fan_out_model
    rt = with_settings(runtime, subagents_file=write_definitions(tmp_path))
    out = io.StringIO()
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start_agent(dev_env.client, tq, task="research and write")
        await asyncio.wait_for(watch(dev_env.client, handle.id, json_lines=False, file=out), 60)
        result = await handle.result()

    assert result.status == "completed"
    lines = out.getvalue().splitlines()
    top = [line for line in lines if not line.startswith(" ")]
    nested = [line for line in lines if line.startswith("  ") and not line.startswith("    ")]
    assert any(f"delegating to researcher ({handle.id}/researcher/s1c0)" in line for line in top), lines
    assert sum("finished: completed" in line for line in nested) == 2, lines
    assert "finished: completed" in top[-1]


async def test_run_follow_shows_the_children_indented_under_the_parent(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from durable_agents.cli.run import DemoModelNote, _follow_stream

    llm.default = fan_out_model
    rt = with_settings(runtime, subagents_file=write_definitions(tmp_path))
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start_agent(dev_env.client, tq, task="research and write")
        result = await asyncio.wait_for(_follow_stream(dev_env.client, handle, reviewer=None, note=DemoModelNote()), 60)

    assert result.status == "completed"
    lines = capsys.readouterr().out.splitlines()
    nested = [line for line in lines if line.startswith("  ") and not line.startswith("    ")]
    assert sum("finished: completed" in line for line in nested) == 2, lines


async def test_only_a_subagent_may_spend_from_a_trees_budget(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    budget = TreeBudget(root="someone/else", max_tokens=10, max_cost_usd=0)
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, budget=budget)
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    assert "only a sub-agent spends from a tree's budget" in str(failure.value.cause)


def test_the_example_definitions_load(runtime: Runtime) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "subagents.json"
    rt = with_settings(runtime, subagents_file=str(example))
    assert sorted(rt.subagents) == ["analyst", "reviewer"]
    assert rt.subagents["reviewer"].share_sandbox
