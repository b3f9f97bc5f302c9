"""Anyone who can signal a run can send it anything; nothing they send can break it.

A run waiting for an approval gets ~1,000 junk signals of every kind: fields of
1.5 MB (three of them, as once observed: each was copied into its refusal
message, kept in ``refused`` and the progress stream, and carried into
continue-as-new until the status query failed with "message too large" and every
workflow task with ``PayloadsTooLarge``), wrong types, non-object and
undecodable payloads, the wrong number of payloads, unknown approval ids, the
wrong reviewer, bad or missing signatures, unknown signal names and publishes to
the progress stream. Every one is refused in one log line and counted in the
status view, which stays small; the run still completes after one valid
approval, and its history holds the oversized content only in the signals
themselves.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import SecretStr
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from durable_agents.cli.common import workflow_not_ready
from tests.conftest import REPLAY_MODES, WorkerFactory, start_agent, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.history_payloads import payloads
from tests.scenarios import pending_view
from tests.waiting import DEADLINE_S, eventually
from workflows.agent import REFUSAL_EVENT_EVERY, AgentWorkflow
from workflows.identity import decision_signature
from workflows.progress import PUBLISH_SIGNAL
from workflows.types import ApproveSignal, StatusView

KEY = "junk-signals-key"
MARK = "BIG-" + uuid.uuid4().hex  # starts every oversized field, to find it in history
BIG = MARK + "R" * 1_500_000
ASK_FIRST = {"rules": [{"name": "ask-first", "tool": "always_fails", "decision": "ask"}]}


@pytest.fixture(params=REPLAY_MODES)
def cache_mode(request: pytest.FixtureRequest) -> str:
    """The loop itself: each test runs cached and again with no workflow cache (every task replays)."""
    return str(request.param)


def raw(data: bytes, encoding: bytes = b"json/plain") -> RawValue:
    return RawValue(Payload(metadata={"encoding": encoding}, data=data))


def junk(aid: str) -> list[tuple[str, list[Any], str]]:
    """(signal name, its payloads, the reason it must be counted under), ~1,000 of them."""
    published = base64.b64encode(Payload(data=b"x" * 1000).SerializeToString()).decode()
    kinds: list[tuple[str, list[Any], str, int]] = [
        # oversized fields (the 1.5 MB ones are sent last: see below)
        ("approve", [{"approval_id": aid, "reviewer": "alice", "comment": MARK + "c" * 5000}], "malformed", 40),
        ("reject", [{"approval_id": aid, "reviewer": "alice", "reason": MARK + "r" * 5000}], "malformed", 40),
        ("approve", [{"approval_id": aid, "reviewer": "alice", "signature": "f" * 300}], "malformed", 30),
        ("approve", [{"approval_id": "ap_" + "0" * 62, "reviewer": "alice"}], "malformed", 30),
        ("resolve", [{"approval_id": aid, "reviewer": "r" * 201, "resolution": "retry"}], "malformed", 30),
        # wrong types and shapes
        ("approve", [{"approval_id": 5, "reviewer": "alice"}], "malformed", 30),
        ("approve", [{"approval_id": aid, "reviewer": None}], "malformed", 30),
        ("reject", [{"approval_id": aid, "reviewer": "alice", "reason": [1]}], "malformed", 30),
        ("resolve", [{"approval_id": aid, "reviewer": "alice", "resolution": "maybe"}], "malformed", 30),
        ("approve", [{}], "malformed", 20),
        ("approve", [[1, 2]], "malformed", 20),
        ("reject", ["str"], "malformed", 20),
        ("resolve", [42], "malformed", 20),
        ("approve", [None], "malformed", 20),
        ("approve", [True], "malformed", 20),
        # payloads the SDK itself cannot decode
        ("approve", [raw(b'{"approval_id": "\\ud800", "reviewer": "alice"}')], "malformed", 20),
        ("reject", [raw(b'{"approval_id": "\xff", "reviewer": "alice"}')], "malformed", 20),
        ("approve", [raw(b'{"approval_id": ')], "malformed", 20),
        ("approve", [raw(b"\x00\x01", b"binary/plain")], "malformed", 20),
        # the wrong number of payloads (two used to fail every workflow task)
        ("approve", [], "malformed", 20),
        ("reject", [{"approval_id": aid, "reviewer": "alice"}] * 2, "malformed", 20),
        # well-formed but wrong
        ("approve", [{"approval_id": "ap_forged0000000", "reviewer": "alice"}], "unknown_approval", 100),
        ("approve", [{"approval_id": aid, "reviewer": "mallory"}], "not_an_approver", 110),
        ("reject", [{"approval_id": aid, "reviewer": " "}], "no_reviewer", 30),
        ("approve", [{"approval_id": aid, "reviewer": "alice"}], "unsigned", 50),
        ("approve", [{"approval_id": aid, "reviewer": "alice", "signature": "00" * 32}], "bad_signature", 40),
        ("resolve", [{"approval_id": aid, "reviewer": "alice", "resolution": "retry"}], "wrong_decision", 30),
        # other signal names
        ("aprove", [{"approval_id": aid, "reviewer": "alice"}], "unknown_signal", 40),
        ("cancel", [], "unknown_signal", 20),
        (PUBLISH_SIGNAL, [{"items": [{"topic": "progress", "data": published}]}], "stream_publish", 40),
        (PUBLISH_SIGNAL, [[1]], "stream_publish", 10),
    ]
    signals = [(name, args, reason) for name, args, reason, count in kinds for _ in range(count)]
    # Three 1.5 MB reviewers, as observed; sent last so that the other signals' workflow tasks
    # (replayed from scratch in the no-cache mode) do not all carry them.
    signals += [("approve", [{"approval_id": aid, "reviewer": BIG}], "malformed")] * 3
    return signals


async def status_unless_not_ready(handle: WorkflowHandle[AgentWorkflow, Any]) -> StatusView | None:
    """The status, or None while the server refuses queries because the workflow task is on a retry: it
    force-closes the task a flood of signals arrived during, and the next attempt handles them all (that
    the worker failed no task itself is asserted from history)."""
    try:
        return await handle.query(AgentWorkflow.status)
    except RPCError as err:
        if workflow_not_ready(err):
            return None
        raise


FORCE_CLOSED = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND


def worker_task_failures(events: Sequence[HistoryEvent]) -> list[HistoryEvent]:
    """Workflow tasks the worker failed. The server itself force-closes an in-flight task when more
    than 100 signals (or 2 MB of them) arrive during it; the next task handles them all."""
    return [
        e
        for e in events
        if e.HasField("workflow_task_failed_event_attributes")
        and e.workflow_task_failed_event_attributes.cause
        != WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND
    ]


async def history_digest(handle: WorkflowHandle[AgentWorkflow, Any]) -> str:
    """What a run that did not finish was doing: its last events and every workflow task that failed or
    timed out, so that a hang says where it is."""
    history = await handle.fetch_history()
    names = [EventType.Name(e.event_type) for e in history.events]
    trouble = [
        f"{e.event_id}: {names[i]} {e.workflow_task_failed_event_attributes.cause}"
        f" {e.workflow_task_failed_event_attributes.failure.message[:300]}"
        for i, e in enumerate(history.events)
        if "TASK_FAILED" in names[i] or "TIMED_OUT" in names[i]
    ]
    tail = [
        n.removeprefix("EVENT_TYPE_")
        + (
            f"({e.marker_recorded_event_attributes.marker_name}:{list(e.marker_recorded_event_attributes.details)})"
            if e.HasField("marker_recorded_event_attributes")
            else ""
        )
        + (
            f"({e.workflow_execution_signaled_event_attributes.signal_name})"
            if e.HasField("workflow_execution_signaled_event_attributes")
            else ""
        )
        for n, e in zip(names[-40:], history.events[-40:], strict=True)
    ]
    seen = await status_unless_not_ready(handle)
    view = (
        ""
        if seen is None
        else (
            f"; status {seen.state}, refused {seen.refused_counts}, latest {seen.refused[-3:]}, "
            f"pending {[(p.approval_id, p.expires_at) for p in seen.pending_approvals]}"
        )
    )
    return (
        f"the run did not finish: {len(names)} events; last: {tail}; failed or timed-out tasks: {trouble[-10:]}{view}"
    )


async def test_a_run_survives_1000_junk_signals_and_completes_after_a_valid_approval(
    can_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    caplog: pytest.LogCaptureFixture,
    cache_mode: str,
) -> None:
    # A server that suggests continue-as-new early: the run continues as new right after the approval,
    # so what it carries across (the progress stream, the refusal counts) is exercised too.
    client = can_env.client
    llm.enqueue(Scripted(tool_calls=[("always_fails", "{}")]), Scripted(text="done despite the junk"))
    caplog.set_level(logging.WARNING)
    async with run_worker(client, with_settings(runtime, approval_key=SecretStr(KEY))) as tq:
        handle = await start_agent(client, tq, id_prefix="junk", approvers=["alice"], policy=ASK_FIRST)
        approval = (await pending_view(handle)).pending_approvals[0]
        signals = junk(approval.approval_id)
        assert len(signals) >= 1000
        if cache_mode == "replay":
            # Without a cache every task and query replays the whole history, and the SDK decodes all its
            # signals in one activation under its fixed 2 s deadlock limit: a thousand exceed it on a starved
            # machine (the SDK's own cost per payload, not the run's), and every later task of the run replays
            # them all again. Every tenth signal keeps each kind.
            signals = signals[::10]

        began = time.monotonic()
        untyped = client.get_workflow_handle(handle.id)
        for start in range(0, len(signals), 100):
            await asyncio.gather(*(untyped.signal(name, args=args) for name, args, _ in signals[start : start + 100]))

        async def all_refused() -> StatusView | None:
            seen = await status_unless_not_ready(handle)
            return seen if seen is not None and seen.refused_total >= len(signals) else None

        view = await eventually(all_refused, f"the run counts {len(signals)} refusals", every_s=0.1)
        sent_and_refused_s = time.monotonic() - began

        # The status query works and stays small; every junk signal is counted, by reason.
        status_bytes = len((await untyped.query("status", result_type=RawValue)).payload.data)
        assert status_bytes < 64_000, f"status query result is {status_bytes} bytes"
        assert view.state == "waiting_approval"
        assert view.refused_total == len(signals)
        assert view.refused_counts == dict(Counter(reason for _, _, reason in signals))
        assert len(view.refused) == 20
        assert all(len(message) < 600 for message in view.refused)

        # The update refuses junk too, and its caller gets the reason (nothing reaches history).
        for arg, reason in [
            ({"approval_id": approval.approval_id, "decision": "approve", "reviewer": BIG[:10_000]}, "at most 200"),
            ([1, 2], "expected a JSON object, got an array"),
            (raw(b'{"approval_id": "\\udc00"}'), "not valid Unicode"),
        ]:
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await untyped.execute_update("decide", arg)
            assert reason in str(refused.value.cause)
            assert len(str(refused.value.cause)) < 600
        with pytest.raises(WorkflowUpdateFailedError) as two:
            await untyped.execute_update("decide", args=[{}, {}])
        assert "expected one payload, got 2" in str(two.value.cause)

        # One valid (signed) approval still completes the run.
        signature = decision_signature(KEY.encode(), approval.approval_id, "approve", "alice", approval.expires_at)
        # The signal names the expires_at it signed: the pending entry was read by a query that may have been
        # answered ahead of the workflow task that opened it (see ``workflows.types.SignedExpiry``).
        valid = ApproveSignal(
            approval_id=approval.approval_id,
            reviewer="alice",
            signature=signature,
            signed_expires_at=approval.expires_at,
        )
        await handle.signal(AgentWorkflow.approve, valid)
        try:
            result = await asyncio.wait_for(handle.result(), timeout=DEADLINE_S)
        except TimeoutError:
            raise AssertionError(
                f"{await history_digest(handle)}; signed for {(approval.approval_id, approval.expires_at)}"
            ) from None
        first_run = client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
        history = await first_run.fetch_history()
        final = await handle.query(AgentWorkflow.status)
    assert result.status == "completed" and result.output == "done despite the junk"

    # The next run was handed a small input, and still counts what the first one refused.
    continued = history.events[-1].workflow_execution_continued_as_new_event_attributes
    carried_bytes = continued.input.payloads[0].ByteSize()
    assert carried_bytes < 64_000, f"the continue-as-new input is {carried_bytes} bytes"
    assert final.refused_total == len(signals) and final.refused_counts == view.refused_counts
    print(
        f"{len(signals)} junk signals sent and refused in {sent_and_refused_s:.1f} s; "
        f"status {status_bytes} bytes; continue-as-new input {carried_bytes} bytes"
    )

    assert not worker_task_failures(history.events)
    # The oversized content is in history only as the signals that carried it, never in a refusal.
    carrying = [p for event in history.events for p in payloads(event) if MARK.encode() in p.data]
    assert len(carrying) == sum(MARK in repr(args) for _, args, _ in signals)

    # Bounded lines (the run's first refusals one line each, then one line per REFUSAL_EVENT_EVERY, however
    # the server batched them), never a traceback, every refusal counted, no signal dropped by the SDK.
    records = [r for r in caplog.records if r.name.startswith("temporalio")]
    assert not [r for r in records if "Failed deserializing" in r.getMessage()]
    refusals = [r for r in records if r.getMessage().startswith("refused")]
    assert all("\n" not in r.getMessage() and r.exc_info is None and len(r.getMessage()) < 2000 for r in refusals)
    summaries = [r for r in records if " signals and decisions refused so far" in r.getMessage()]
    # (a workflow task retried, or replayed without a cache, may log its lines again; the few refused
    # updates above are logged by the validator, one line each)
    assert refusals, f"no log line for {len(signals)} refusals"
    assert len(refusals) + len(summaries) < len(signals) / 4, f"{len(refusals) + len(summaries)} lines"
    # Summaries name the run's own count (an activation that already wrote its share of lines skips one).
    totals = {int(r.getMessage().split()[0]) for r in summaries}
    assert totals <= set(range(REFUSAL_EVENT_EVERY, len(signals) + 1, REFUSAL_EVENT_EVERY)), sorted(totals)


class SlowLog(logging.Handler):
    """A log that takes ``delay_s`` a line, as stderr does on a busy machine: each write lets go of the
    GIL, and taking it back waits for the worker's other threads."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(logging.WARNING)
        self.delay_s = delay_s

    def emit(self, record: logging.LogRecord) -> None:
        time.sleep(self.delay_s)


async def test_a_flood_of_refusals_fails_no_workflow_task_on_a_slow_machine(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    """A burst of junk signals reaches the run in one or two activations, on a machine where every log
    line costs 20 ms. A line per refusal would cost 4 s for these 200, over the SDK's 2 s deadlock
    limit, and every retry of the workflow task would fail the same way; the throttled lines cost at
    most 0.1 s an activation. The burst is 200, not more: replaying a thousand signals without a cache
    takes the SDK itself near that limit on a starved machine, whatever the workflow logs."""
    llm.enqueue(Scripted(tool_calls=[("always_fails", "{}")]), Scripted(text="done"))
    slow = SlowLog(0.02)
    logging.getLogger("temporalio.workflow").addHandler(slow)
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(dev_env.client, tq, id_prefix="junk-slow", policy=ASK_FIRST)
            aid = (await pending_view(handle)).pending_approvals[0].approval_id
            untyped = dev_env.client.get_workflow_handle(handle.id)
            forged = {"approval_id": "ap_forged0000000", "reviewer": "alice"}
            for _ in range(2):
                await asyncio.gather(*(untyped.signal("approve", forged) for _ in range(100)))

            async def all_refused() -> StatusView | None:
                seen = await status_unless_not_ready(handle)
                return seen if seen is not None and seen.refused_total >= 200 else None

            view = await eventually(all_refused, "the run counts 200 refusals", every_s=0.1)
            assert view.refused_counts == {"unknown_approval": 200}
            await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=aid, reviewer="alice"))
            assert (await asyncio.wait_for(handle.result(), timeout=DEADLINE_S)).status == "completed"
    finally:
        logging.getLogger("temporalio.workflow").removeHandler(slow)
    history = await handle.fetch_history()
    assert not worker_task_failures(history.events)


async def test_a_signal_with_two_payloads_does_not_fail_the_workflow_task(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    """Two payloads used to raise TypeError in the handler call, failing every workflow task for good."""
    llm.enqueue(Scripted(tool_calls=[("always_fails", "{}")]), Scripted(text="done"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, id_prefix="junk2", policy=ASK_FIRST)
        aid = (await pending_view(handle)).pending_approvals[0].approval_id
        decision = {"approval_id": aid, "reviewer": "alice"}
        await dev_env.client.get_workflow_handle(handle.id).signal("approve", args=[decision, decision])
        for _ in range(100):
            view = await handle.query(AgentWorkflow.status)
            if view.refused_total:
                break
            await asyncio.sleep(0.05)
        assert view.refused_counts == {"malformed": 1}
        assert "refused approve signal: expected one payload, got 2" in view.refused[-1]
        await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=aid, reviewer="alice"))
        assert (await asyncio.wait_for(handle.result(), timeout=30)).status == "completed"
    history = await handle.fetch_history()
    assert not worker_task_failures(history.events)


def test_the_refused_publish_signal_is_the_streams_own() -> None:
    """The run refuses outside publishes by the stream's signal name, which the contrib module owns."""
    from temporalio.contrib.workflow_streams import _stream

    assert _stream._PUBLISH_SIGNAL == PUBLISH_SIGNAL
