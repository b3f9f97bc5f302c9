"""Approvals in the workflow: bound to the exact call, expiring on durable timers, refused when wrong."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import REPLAY_MODES, WorkerFactory, start_agent, with_settings
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.types import (
    AgentResult,
    ApproveSignal,
    DecideRequest,
    DecideResult,
    RejectSignal,
    StatusView,
)


@pytest.fixture(params=REPLAY_MODES)
def cache_mode(request: pytest.FixtureRequest) -> str:
    """The loop itself: each test runs cached and again with no workflow cache (every task replays)."""
    return str(request.param)


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


def post(sink: HttpSink, sku: int) -> tuple[str, str]:
    return ("http_request", json.dumps({"method": "POST", "url": f"{sink.url}/orders", "json": {"sku": sku}}))


async def start(client: Client, tq: str, **fields: Any) -> WorkflowHandle[AgentWorkflow, AgentResult]:
    fields.setdefault("task", "place orders")
    return await start_agent(client, tq, id_prefix="ap", **fields)


async def pending(handle: WorkflowHandle[AgentWorkflow, AgentResult], count: int = 1) -> StatusView:
    for _ in range(200):
        view = await handle.query(AgentWorkflow.status)
        if len(view.pending_approvals) >= count:
            return view
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {count} pending approvals, status: {view}")


async def decide(handle: WorkflowHandle[AgentWorkflow, AgentResult], request: DecideRequest) -> DecideResult:
    # The SDK types an update that has a validator as returning a coroutine; at runtime it is the result.
    return cast(DecideResult, await handle.execute_update(AgentWorkflow.decide_update, request))


def tool_results(llm: FakeLLMServer, request_index: int) -> list[str]:
    return [m["content"] for m in llm.requests[request_index]["body"]["messages"] if m["role"] == "tool"]


async def test_approved_call_runs_once_with_its_idempotency_key(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(Scripted(tool_calls=[post(sink, 1)]), Scripted(text="ordered"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start(dev_env.client, tq)
        view = await pending(handle)
        assert view.state == "waiting_approval"
        approval = view.pending_approvals[0]
        assert approval.tool == "http_request" and approval.args["json"] == {"sku": 1}
        assert approval.rule == "default:side-effect" and approval.approval_id.startswith("ap_")
        assert sink.received == []  # nothing runs before the decision
        await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=approval.approval_id, reviewer="alice"))
        result = await handle.result()
    assert result.status == "completed"
    assert len(sink.writes()) == 1
    assert sink.writes()[0].headers["idempotency-key"].startswith("ik_")


async def test_rejection_reason_reaches_the_model(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(Scripted(tool_calls=[post(sink, 1)]), Scripted(text="ok, not ordering"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start(dev_env.client, tq)
        aid = (await pending(handle)).pending_approvals[0].approval_id
        await handle.signal(AgentWorkflow.reject, RejectSignal(approval_id=aid, reviewer="bob", reason="too risky"))
        result = await handle.result()
    assert result.status == "completed" and sink.received == []
    [message] = tool_results(llm, 1)
    assert "rejected by bob" in message and "too risky" in message


async def test_wrong_decisions_are_refused_and_nothing_runs(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(Scripted(tool_calls=[post(sink, 1)]), Scripted(text="done"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start(dev_env.client, tq, approvers=["alice"])
        aid = (await pending(handle)).pending_approvals[0].approval_id

        # Signals cannot answer, so refusals are logged and listed in status; the run keeps waiting.
        await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id="ap_forged", reviewer="alice"))
        await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=aid, reviewer="mallory"))
        # Updates answer at once through the validator.
        with pytest.raises(WorkflowUpdateFailedError) as unknown:
            await decide(handle, DecideRequest(approval_id="ap_forged", decision="approve", reviewer="alice"))
        assert "no pending approval ap_forged" in str(unknown.value.cause)
        with pytest.raises(WorkflowUpdateFailedError) as unlisted:
            await decide(handle, DecideRequest(approval_id=aid, decision="approve", reviewer="mallory"))
        assert "not an approver" in str(unlisted.value.cause)
        for refusal in (unknown, unlisted):  # asking again cannot change the answer: no client retries it
            cause = refusal.value.cause
            assert isinstance(cause, ApplicationError) and cause.non_retryable, cause
            assert cause.type == "DecisionRefused", cause.type

        view = await handle.query(AgentWorkflow.status)
        assert view.state == "waiting_approval" and [p.approval_id for p in view.pending_approvals] == [aid]
        assert len(view.refused) == 2
        assert "no pending approval ap_forged" in view.refused[0] and "mallory" in view.refused[1]
        assert sink.received == []

        accepted = await decide(handle, DecideRequest(approval_id=aid, decision="approve", reviewer="alice"))
        assert accepted.accepted
        # An approval that was already decided is answered, not failed: accepted false, saying why.
        again = await decide(handle, DecideRequest(approval_id=aid, decision="reject", reviewer="alice"))
        assert again == DecideResult(accepted=False, message=f"approval {aid} was already decided (approved)")
        assert (await handle.result()).status == "completed"
    assert len(sink.writes()) == 1


async def test_two_pending_approvals_decided_in_reverse_order(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(Scripted(tool_calls=[post(sink, 1), post(sink, 2)]), Scripted(text="both handled"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start(dev_env.client, tq)
        first, second = (await pending(handle, 2)).pending_approvals
        assert first.approval_id != second.approval_id
        await handle.signal(AgentWorkflow.reject, RejectSignal(approval_id=second.approval_id, reviewer="bob"))
        assert [p.approval_id for p in (await handle.query(AgentWorkflow.status)).pending_approvals] == [
            first.approval_id
        ]
        await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=first.approval_id, reviewer="alice"))
        assert (await handle.result()).status == "completed"
    assert [json.loads(r.body)["sku"] for r in sink.writes()] == [1]
    results = tool_results(llm, 1)
    assert '"ok": true' in results[0] and "rejected by bob" in results[1]


async def test_changed_arguments_need_a_new_approval(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(Scripted(tool_calls=[post(sink, 1)]), Scripted(tool_calls=[post(sink, 2)]), Scripted(text="done"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start(dev_env.client, tq)
        old = (await pending(handle)).pending_approvals[0].approval_id
        await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=old, reviewer="alice"))
        for _ in range(200):
            view = await handle.query(AgentWorkflow.status)
            if view.pending_approvals and view.pending_approvals[0].approval_id != old:
                break
            await asyncio.sleep(0.05)
        new = view.pending_approvals[0]
        assert new.args["json"] == {"sku": 2} and new.approval_id != old
        stale = await decide(handle, DecideRequest(approval_id=old, decision="approve", reviewer="alice"))
        assert not stale.accepted and stale.message == f"approval {old} was already decided (approved)"
        assert len(sink.writes()) == 1
        await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=new.approval_id, reviewer="alice"))
        assert (await handle.result()).status == "completed"
    assert [json.loads(r.body)["sku"] for r in sink.writes()] == [1, 2]


async def test_policy_deny_rule_and_run_policy_cannot_loosen(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(
        Scripted(tool_calls=[("run_shell", json.dumps({"command": "rm -rf /workspace"})), post(sink, 1)]),
        Scripted(text="done"),
    )
    run_policy = {
        "rules": [
            {"name": "no-rm", "tool": "run_shell", "when": {"command": "rm -rf"}, "decision": "deny"},
            {"name": "loosen", "tool": "http_request", "decision": "allow"},
        ]
    }
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start(dev_env.client, tq, policy=run_policy)
        view = await pending(handle)
        assert view.pending_approvals[0].tool == "http_request"  # still asked: a run cannot loosen
        await handle.signal(
            AgentWorkflow.reject, RejectSignal(approval_id=view.pending_approvals[0].approval_id, reviewer="bob")
        )
        assert (await handle.result()).status == "completed"
    denial = tool_results(llm, 1)[0]
    assert "policy denied run_shell (rule no-rm)" in denial


async def test_approval_expires_after_24h_and_late_decisions_are_refused(
    time_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(Scripted(tool_calls=[post(sink, 1)]), Scripted(tool_calls=[post(sink, 2)]), Scripted(text="gave up"))
    async with run_worker(time_env.client, runtime) as tq:
        handle = await start(time_env.client, tq, limits={"timeout_s": 7 * 24 * 3600})
        with time_env.auto_time_skipping_disabled():
            first = (await pending(handle)).pending_approvals[0]
        assert first.expires_at > first.requested_at
        await time_env.sleep(timedelta(hours=24, minutes=1))  # skipped, not waited
        with time_env.auto_time_skipping_disabled():
            for _ in range(200):
                view = await handle.query(AgentWorkflow.status)
                if view.pending_approvals and view.pending_approvals[0].approval_id != first.approval_id:
                    break
                await asyncio.sleep(0.05)
            # The model was told; a decision for the expired approval is refused.
            assert f"approval {first.approval_id} for http_request expired" in tool_results(llm, 1)[0]
            await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=first.approval_id, reviewer="alice"))
            second = view.pending_approvals[0].approval_id
            await handle.signal(AgentWorkflow.reject, RejectSignal(approval_id=second, reviewer="alice"))
            result = await handle.result()
            view = await handle.query(AgentWorkflow.status)
    assert result.status == "completed" and sink.received == []
    assert any("already decided (expired)" in r for r in view.refused)


async def approval_timer_started(handle: WorkflowHandle[Any, Any]) -> bool:
    history = await handle.fetch_history()
    return any(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in history.events)


async def test_operator_policy_snapshot_survives_a_restart_with_an_edited_file(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    sink: HttpSink,
    tmp_path,
) -> None:
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps({"rules": [{"name": "no-shell", "tool": "run_shell", "decision": "deny"}]}))
    rt = with_settings(runtime, policy_file=str(policy_file))
    llm.enqueue(
        Scripted(tool_calls=[post(sink, 1)]),
        Scripted(tool_calls=[("run_shell", json.dumps({"command": "echo hi"}))]),
        Scripted(text="done"),
    )
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start(dev_env.client, tq)
        aid = (await pending(handle)).pending_approvals[0].approval_id
        # A query can show the approval before the workflow task that opens it has completed; stop the
        # worker only once that task is in history (its expiry timer started), so that the signal below
        # reaches an open approval and not the same task as the turn that opens it.
        await eventually(lambda: approval_timer_started(handle), "the approval's task is in history")
    # The worker is gone; the operator loosens the file; a new worker (forced replay) continues the run.
    policy_file.write_text(json.dumps({"rules": [{"name": "shell-ok", "tool": "run_shell", "decision": "allow"}]}))
    async with run_worker(
        dev_env.client,
        with_settings(runtime, policy_file=str(policy_file)),
        max_cached_workflows=0,
        task_queue_override=tq,
    ):
        await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=aid, reviewer="alice"))
        assert (await handle.result()).status == "completed"
    assert "policy denied run_shell (rule no-shell)" in tool_results(llm, 2)[1]
