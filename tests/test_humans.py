"""Humans beyond yes/no, in the workflow: questions, edited arguments, remembered approvals, quorum, the audit.

An in-process worker against the real dev server, the fake model and a real HTTP sink; decisions through
the ``decide`` update and the signals (``tests/test_cli_humans.py`` drives the same through the CLIs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import REPLAY_MODES, WorkerFactory, start_agent, with_settings
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.test_approvals import decide, pending, post, sink, tool_results
from tests.test_sessions import replied, send, start_session
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.identity import idempotency_key
from workflows.narration import details_markdown
from workflows.types import (
    AgentResult,
    AnswerSignal,
    ApproveSignal,
    DecideRequest,
    ForgetApprovalsSignal,
    PendingApproval,
    StatusView,
)

__all__ = ["sink"]  # a fixture, used by name


@pytest.fixture(params=REPLAY_MODES)
def cache_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def ask(question: str, options: list[str] | None = None, free: bool = True) -> tuple[str, str]:
    args: dict[str, Any] = {"question": question, "allow_free_text": free}
    if options is not None:
        args["options"] = options
    return ("ask_human", json.dumps(args))


async def refused(handle: WorkflowHandle[AgentWorkflow, AgentResult], request: DecideRequest) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as err:
        await decide(handle, request)
    return str(cast(Any, err.value.cause).message)


async def test_a_question_with_options_refuses_other_answers_and_hands_the_answer_verbatim(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(tool_calls=[ask("Which region?", ["eu", "us", "ap"], free=False)]), Scripted(text="eu it is"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, task="deploy", approvers=["alice"])
        view = await pending(handle)
        [question] = view.pending_approvals
        assert view.state == "waiting_human"
        assert question.kind == "question" and question.approval_id.startswith("q_")
        assert question.question == "Which region?" and question.options == ["eu", "us", "ap"]
        assert not question.allow_free_text and question.reviewers == ["alice"]

        qid = question.approval_id
        why = await refused(handle, DecideRequest(approval_id=qid, decision="answer", reviewer="alice", text="mars"))
        assert "not one of the options" in why
        why = await refused(handle, DecideRequest(approval_id=qid, decision="answer", reviewer="bob", text="eu"))
        assert "not an approver" in why
        # A signal that answers wrongly is refused and counted; the question still waits.
        await handle.signal("answer", AnswerSignal(question_id=qid, reviewer="alice", text="moon"))
        await handle.signal("answer", {"question_id": qid, "reviewer": "alice"})  # no text: malformed
        await handle.signal("answer", {"question_id": qid, "reviewer": "alice", "text": "x" * 5000})  # too long
        answered = await decide(handle, DecideRequest(approval_id=qid, decision="answer", reviewer="alice", text="eu"))
        assert answered.accepted
        result = await handle.result()
        status = await handle.query(AgentWorkflow.status)
    assert result.status == "completed" and result.output == "eu it is"
    assert tool_results(llm, 1) == ["eu"]  # verbatim, at the call's place
    assert status.refused_counts.get("not_an_option") == 1
    assert status.refused_counts.get("malformed") == 2
    assert any("refused answer signal: text:" in line for line in status.refused)
    [record] = [d for d in result.decisions if d.approval_id == qid]
    assert record.kind == "question" and record.decision == "answered" and record.reviewer == "alice"
    assert record.comment == "eu"


async def test_an_unanswered_question_expires_and_the_model_is_told(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(tool_calls=[ask("Anyone there?")]), Scripted(text="nobody came"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, task="ask", policy={"approval_timeout_s": 2})
        result = await handle.result()
    assert result.status == "completed"
    [told] = tool_results(llm, 1)
    assert told.startswith("Nobody answered the question before it expired")
    assert [d.decision for d in result.decisions] == ["expired"]


async def test_an_edited_call_runs_once_with_its_own_key_and_the_model_is_told(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(Scripted(tool_calls=[post(sink, 1)]), Scripted(text="ordered"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, task="order")
        [approval] = (await pending(handle)).pending_approvals
        aid, original = approval.approval_id, approval.args
        edited = {**original, "json": {"sku": 2}}

        # Not the tool's arguments: refused, still pending.
        bad = {**original, "method": "FETCH"}
        why = await refused(handle, DecideRequest(approval_id=aid, decision="approve", reviewer="r", arguments=bad))
        assert "invalid arguments for http_request" in why
        assert [a.approval_id for a in (await pending(handle)).pending_approvals] == [aid]

        done = await decide(handle, DecideRequest(approval_id=aid, decision="approve", reviewer="r", arguments=edited))
        assert done.accepted and "edited" in done.message
        result = await handle.result()
    assert result.status == "completed"
    [write] = sink.writes()
    assert json.loads(write.body) == {"sku": 2}
    key = write.headers["idempotency-key"]
    assert key == idempotency_key(handle.id, 1, 0, "http_request", edited)
    assert key != idempotency_key(handle.id, 1, 0, "http_request", original)
    [told] = tool_results(llm, 1)
    assert told.startswith("Note: a reviewer (r) changed this call's arguments before it ran") and '"sku": 2' in told
    [record] = result.decisions
    assert record.decision == "approved" and record.edits == edited and record.reviewer == "r"


async def test_an_edit_policy_denies_stays_pending(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    sink: HttpSink,
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps(
            {"rules": [{"name": "no-admin", "tool": "http_request", "when": {"url": "/admin"}, "decision": "deny"}]}
        )
    )
    llm.enqueue(Scripted(tool_calls=[post(sink, 1)]))
    llm.default = Scripted(text="done")
    async with run_worker(dev_env.client, with_settings(runtime, policy_file=str(policy))) as tq:
        handle = await start_agent(dev_env.client, tq, task="order")
        [approval] = (await pending(handle)).pending_approvals
        aid = approval.approval_id
        denied = {**approval.args, "url": f"{sink.url}/admin"}
        why = await refused(handle, DecideRequest(approval_id=aid, decision="approve", reviewer="r", arguments=denied))
        assert "policy denies the edited call (rule no-admin)" in why
        # The same edit by signal: refused and counted, the call still waits.
        await handle.signal("approve", ApproveSignal(approval_id=aid, reviewer="r", arguments=denied))
        view = await pending(handle)
        assert [a.approval_id for a in view.pending_approvals] == [aid]
        await decide(handle, DecideRequest(approval_id=aid, decision="reject", reviewer="r", comment="no"))
        await handle.result()
        view = await handle.query(AgentWorkflow.status)
    assert view.refused_counts.get("edit_denied") == 2  # the update's and the signal's
    assert sink.writes() == []


async def test_remember_call_and_tool_scopes(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(
        Scripted(tool_calls=[post(sink, 1)]),  # approved; remembering the tool is refused
        Scripted(tool_calls=[post(sink, 1)]),  # approved and remembered for identical calls
        Scripted(tool_calls=[post(sink, 1)]),  # identical: remembered
        Scripted(tool_calls=[post(sink, 1)]),  # identical: remembered
        Scripted(tool_calls=[post(sink, 2)]),  # different arguments: asks
        Scripted(text="done"),
    )
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, task="orders")
        [first] = (await pending(handle)).pending_approvals
        # ``tool`` scope is refused for an HTTP POST (the default rule); the approval itself stands.
        answer = await decide(
            handle, DecideRequest(approval_id=first.approval_id, decision="approve", reviewer="r", remember="tool")
        )
        assert answer.accepted and "remember tool refused" in answer.message
        second = await pending_other(handle, {first.approval_id})
        await decide(handle, DecideRequest(approval_id=second, decision="approve", reviewer="r", remember="call"))
        third = await pending_other(handle, {first.approval_id, second})
        view = await handle.query(AgentWorkflow.status)
        assert [w.method for w in sink.writes()] == ["POST"] * 4  # two approved, two remembered
        assert [(r.tool, r.scope, r.reviewer) for r in view.remembered] == [("http_request", "call", "r")]
        await handle.signal("forget_approvals", ForgetApprovalsSignal(reviewer="ops"))
        await decide(handle, DecideRequest(approval_id=third, decision="approve", reviewer="r"))
        result = await handle.result()
        view = await handle.query(AgentWorkflow.status)
    assert result.status == "completed" and view.remembered == []
    assert [json.loads(w.body) for w in sink.writes()] == [{"sku": 1}] * 4 + [{"sku": 2}]
    assert [d.decision for d in result.decisions] == [
        "approved", "approved", "remembered", "remembered", "forgotten", "approved",
    ]  # fmt: skip
    assert "remember tool refused" in result.decisions[0].remember


async def pending_other(handle: WorkflowHandle[AgentWorkflow, AgentResult], seen: set[str]) -> str:
    """The id of a pending approval not in ``seen``, once there is one."""

    async def fresh() -> str | None:
        view = await handle.query(AgentWorkflow.status)
        return next((a.approval_id for a in view.pending_approvals if a.approval_id not in seen), None)

    return await eventually(fresh, "a new pending approval")


async def test_a_quorum_of_two_distinct_reviewers(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    sink: HttpSink,
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps({"rules": [{"name": "two-eyes", "tool": "http_request", "decision": "ask", "approvals": 2}]})
    )
    llm.enqueue(Scripted(tool_calls=[post(sink, 1)]), Scripted(text="paid"))
    async with run_worker(dev_env.client, with_settings(runtime, policy_file=str(policy))) as tq:
        handle = await start_agent(dev_env.client, tq, task="pay")
        [approval] = (await pending(handle)).pending_approvals
        aid = approval.approval_id
        assert approval.approvals_required == 2 and approval.approved_by == []
        one = await decide(handle, DecideRequest(approval_id=aid, decision="approve", reviewer="alice"))
        assert one.accepted and "(1/2)" in one.message
        [waiting] = (await pending(handle)).pending_approvals
        assert waiting.approved_by == ["alice"]
        why = await refused(handle, DecideRequest(approval_id=aid, decision="approve", reviewer="alice"))
        assert "already approved" in why
        assert sink.writes() == []
        two = await decide(handle, DecideRequest(approval_id=aid, decision="approve", reviewer="bob"))
        assert two.accepted and "approved by alice, bob" in two.message
        result = await handle.result()
    assert result.status == "completed"
    assert len(sink.writes()) == 1
    assert [(d.decision, d.reviewer) for d in result.decisions] == [("counted", "alice"), ("approved", "bob")]


async def test_a_message_to_a_session_does_not_answer_its_question(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(
        Scripted(tool_calls=[ask("Shall I go on?", ["yes", "no"], free=False)]),
        Scripted(text="going on"),
        Scripted(text="and the second message"),
    )
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_session(dev_env, tq, task="start")
        [question] = (await pending(handle)).pending_approvals
        sent = await send(handle, "yes")  # a message, not an answer: queued behind the work it waits in
        assert sent.accepted
        view = await handle.query(AgentWorkflow.status)
        assert view.state == "waiting_human" and view.queued == 1
        assert [a.approval_id for a in view.pending_approvals] == [question.approval_id]
        await handle.signal("answer", AnswerSignal(question_id=question.approval_id, reviewer="me", text="no"))
        view = await replied(handle, 2)
    assert tool_results(llm, 1) == ["no"]
    assert view.decisions[0].comment == "no"


def test_the_ui_details_show_a_question_with_its_options_and_a_quorum() -> None:
    question = PendingApproval(
        approval_id="q_1", tool="ask_human", args={}, requested_at="t0", expires_at="t1", kind="question",
        question="Which region?", options=["eu", "us"], allow_free_text=False,
    )  # fmt: skip
    payment = PendingApproval(
        approval_id="ap_2", tool="http_request", args={"method": "POST", "url": "https://pay.example/x"},
        requested_at="t0", expires_at="t1", approvals_required=2, approved_by=["alice"],
    )  # fmt: skip
    view = StatusView(state="waiting_human", step=1, pending_approvals=[question, payment])
    markdown = details_markdown("run-1", view, [])
    assert "**waiting for an answer** `q_1`" in markdown
    assert "    Which region?" in markdown and "    1. eu" in markdown and "    2. us" in markdown
    assert '`durable-agents answer run-1 q_1 "TEXT"` (one of the options)' in markdown
    assert "**waiting for approval** `ap_2`" in markdown and "approved 1/2 by alice" in markdown


@pytest.mark.parametrize("cache_mode", ["cached"], indirect=True)
async def test_a_remembered_approval_lasts_across_a_sessions_continue_as_new(
    can_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    llm.enqueue(
        Scripted(tool_calls=[post(sink, 7)]),
        Scripted(text="ordered"),
        Scripted(tool_calls=[post(sink, 7)]),  # message 2, after continue-as-new: identical, remembered
        Scripted(text="ordered again"),
    )
    async with run_worker(can_env.client, runtime) as tq:
        handle = await start_session(can_env, tq, task="order 7")
        [approval] = (await pending(handle)).pending_approvals
        await decide(
            handle, DecideRequest(approval_id=approval.approval_id, decision="approve", reviewer="r", remember="call")
        )
        await replied(handle, 1)
        first_run = (await handle.describe()).run_id
        await send(handle, "again")
        view = await replied(handle, 2)
        current = (await handle.describe()).run_id
    assert current != first_run  # the server suggested continue-as-new between the messages
    assert len(sink.writes()) == 2
    assert [(r.tool, r.scope) for r in view.remembered] == [("http_request", "call")]
    assert [d.decision for d in view.decisions] == ["approved", "remembered"]
