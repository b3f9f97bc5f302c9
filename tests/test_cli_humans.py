"""Humans in the loop beyond yes/no, from the command line, end to end with real processes.

``worker.py`` runs as a subprocess against the dev server and the fake LLM (the setup of
``tests/test_cli_approvals.py``); the model asks questions (``ask_human``) and asks for
``http_request`` POSTs to a real HTTP server on 127.0.0.1 that records what arrives. Each
decision goes through ``starter.py`` (``answer``, ``approve --edit`` / ``--remember``,
``forget-approvals``) and through the real ``temporal`` CLI (signals, the ``decide`` update).
A third worker runs with an operator policy (a deny rule, a quorum of two) and a sub-agent.
"""

from __future__ import annotations

import json
import os
import pty
import queue
import select
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import replay_task_queue
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.test_cli_approvals import (
    APPROVAL_KEY,
    DEADLINE_S,
    ROOT,
    Destination,
    ScriptByTask,
    Setup,
    _new_run,
    _one_line_error,
    _pending,
    _post,
    _read_lines,
    _setup_fixture,
    _side_by_side,
    _start,
    _status,
    _wait_status,
    shared,
)
from tests.waiting import eventually_sync
from workflows.identity import decision_signature, idempotency_key, signed_extras

__all__ = ["shared"]  # a fixture, used by name

OPEN = ("running", "waiting_approval", "waiting_human")
SIZES = ["S", "M", "L"]
OPERATOR_POLICY = {
    "rules": [
        {"name": "no-forbidden", "tool": "http_request", "when": {"url": "/forbidden/"}, "decision": "deny"},
        {"name": "two-people", "tool": "http_request", "when": {"url": "/quorum/"}, "decision": "ask", "approvals": 2},
    ]
}
SUBAGENTS = {"helper": {"description": "Asks a person what to do.", "tools": ["ask_human"]}}


def _replayed(extra: dict[str, str]) -> Callable[..., AsyncIterator[Setup]]:
    """The worker of ``tests/test_cli_approvals.py`` with ``extra`` settings; once the module is done,
    every run it ran is replayed from its history (``replay_task_queue`` raises on a nondeterminism)."""

    async def fixture(
        dev_env: WorkflowEnvironment,
        shared: tuple[FakeLLMServer, ScriptByTask, Destination],
        tmp_path_factory: pytest.TempPathFactory,
    ) -> AsyncIterator[Setup]:
        started = _setup_fixture(extra)(dev_env, shared, tmp_path_factory)
        setup = next(started)
        try:
            yield setup
            await replay_task_queue(dev_env.client, setup.cli.env["AGENT_TASK_QUEUE"])
        finally:
            next(started, None)  # stops the worker

    return fixture


unsigned = pytest.fixture(scope="module", name="unsigned")(_replayed({}))
signed = pytest.fixture(scope="module", name="signed")(_replayed({"AGENT_APPROVAL_KEY": APPROVAL_KEY}))


@pytest.fixture(scope="module")
async def operator(
    dev_env: WorkflowEnvironment,
    shared: tuple[FakeLLMServer, ScriptByTask, Destination],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Setup]:
    """A worker with an operator policy (``AGENT_POLICY_FILE``) and a sub-agent (``AGENT_SUBAGENTS_FILE``)."""
    folder = tmp_path_factory.mktemp("operator")
    (folder / "policy.json").write_text(json.dumps(OPERATOR_POLICY))
    (folder / "subagents.json").write_text(json.dumps(SUBAGENTS))
    extra = {"AGENT_POLICY_FILE": str(folder / "policy.json"), "AGENT_SUBAGENTS_FILE": str(folder / "subagents.json")}
    async for setup in _replayed(extra)(dev_env, shared, tmp_path_factory):
        yield setup


# --- helpers --------------------------------------------------------------------------------


def _ask(question: str, options: list[str] | None = None, free_text: bool = True) -> tuple[str, str]:
    args: dict[str, Any] = {"question": question}
    if options is not None:
        args |= {"options": options, "allow_free_text": free_text}
    return ("ask_human", json.dumps(args))


def _done(setup: Setup, workflow_id: str) -> dict[str, Any]:
    return _wait_status(setup, workflow_id, lambda d: d["state"] not in OPEN)


def _tool_messages(setup: Setup, task: str, turn: int) -> list[str]:
    """The tool results the model read in its ``turn``-th request (1: the first)."""

    def sent() -> list[str]:
        requests = setup.requests_for(task)
        assert len(requests) >= turn, f"{len(requests)} model requests so far"
        return [str(m["content"]) for m in requests[turn - 1]["messages"] if m["role"] == "tool"] or ["<none>"]

    return eventually_sync(sent, f"model turn {turn} of {task!r}")


def _signal(setup: Setup, workflow_id: str, name: str, payload: dict[str, Any]) -> None:
    sent = setup.cli.temporal(
        "workflow", "signal", "--workflow-id", workflow_id, "--name", name, "--input", json.dumps(payload)
    )
    assert sent.returncode == 0, sent.stderr


def _update(setup: Setup, workflow_id: str, payload: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return setup.cli.temporal(
        "workflow", "update", "execute", "--workflow-id", workflow_id, "--name", "decide", "--input",
        json.dumps(payload),
    )  # fmt: skip


def _posts(setup: Setup, path: str, count: int) -> list[Any]:
    def arrived() -> list[Any]:
        posts = setup.dest.posts(path)
        assert len(posts) >= count, f"{len(posts)} POSTs to {path}"
        return posts

    return eventually_sync(arrived, f"{count} POST(s) to {path}")


def _refused(setup: Setup, workflow_id: str, needle: str) -> dict[str, Any]:
    return _wait_status(setup, workflow_id, lambda d: any(needle in r for r in d.get("refused", [])))


# --- questions ------------------------------------------------------------------------------


def test_a_question_with_options_refuses_others_and_the_answer_reaches_the_model(unsigned: Setup) -> None:
    by_starter, task_a = _new_run(
        unsigned, Scripted(tool_calls=[_ask("Which size?", SIZES, False)]), Scripted(text="a")
    )
    by_temporal, task_b = _new_run(
        unsigned, Scripted(tool_calls=[_ask("Which size?", SIZES, False)]), Scripted(text="b")
    )
    for workflow_id, task in ((by_starter, task_a), (by_temporal, task_b)):
        _start(unsigned, workflow_id, task)
    [row] = _pending(unsigned, by_starter)
    [other] = _pending(unsigned, by_temporal)
    qid, other_qid = row["approval_id"], other["approval_id"]
    assert qid.startswith("q_") and row["kind"] == "question" and row["question"] == "Which size?"
    assert row["options"] == SIZES and row["allow_free_text"] is False and row["tool"] == "ask_human"

    listed, status_text, outside, unknown = _side_by_side(
        unsigned,
        ("pending", by_starter),
        ("status", by_starter),
        ("answer", by_starter, qid, "XL", "--reviewer", "alice"),
        ("answer", by_starter, "q_0123456789abcdef", "M"),
    )
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].startswith(f"{by_starter}  {qid}  question  rule=") and "by=anyone" in lines[0]
    assert lines[1] == "    asks: Which size?"
    assert lines[2] == "    options: 1) S  2) M  3) L  (only these: free text not allowed)"
    assert lines[3].startswith("    answer: ") and lines[3].endswith(f"answer {by_starter} {qid} TEXT")
    assert "state: waiting_human" in status_text.stdout and f"{qid}  question  rule=" in status_text.stdout
    _one_line_error(outside, 1, "error: refused:", "'XL' is not one of the options")
    _one_line_error(unknown, 1, "error: refused:", "no pending approval q_0123456789abcdef")

    refused = _update(
        unsigned, by_temporal, {"approval_id": other_qid, "decision": "answer", "reviewer": "bob", "text": "XL"}
    )
    assert refused.returncode != 0 and "is not one of the options" in refused.stdout + refused.stderr
    assert [p["approval_id"] for p in _status(unsigned, by_temporal)["pending_approvals"]] == [other_qid]

    answered = unsigned.cli.starter("answer", by_starter, qid, "M", "--reviewer", "alice")
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.splitlines()[0].startswith(f"answer {qid} of run {by_starter}, step 1")
    assert answered.stdout.splitlines()[-1] == f"answered {qid} (Which size?) as alice: M"
    _signal(unsigned, by_temporal, "answer", {"question_id": other_qid, "reviewer": "bob", "text": "L"})

    assert _done(unsigned, by_starter)["state"] == "completed" and _done(unsigned, by_temporal)["state"] == "completed"
    assert _tool_messages(unsigned, task_a, 2) == ["M"]  # verbatim, and nothing else
    assert _tool_messages(unsigned, task_b, 2) == ["L"]

    final = unsigned.cli.starter("status", by_starter)
    assert final.returncode == 0, final.stderr
    [audit] = [ln for ln in final.stdout.splitlines() if qid in ln]
    assert ' ask_human  answered  by alice  step 1  answer: "M"' in audit, final.stdout
    assert "decisions: 1" in final.stdout and "{'" not in final.stdout


def test_a_question_nobody_answers_expires_and_the_model_is_told(unsigned: Setup, tmp_path: Path) -> None:
    policy = tmp_path / "quick.json"
    policy.write_text(json.dumps({"approval_timeout_s": 2}))
    by_starter, task_a = _new_run(unsigned, Scripted(tool_calls=[_ask("Anyone there?")]), Scripted(text="alone"))
    by_temporal, task_b = _new_run(unsigned, Scripted(tool_calls=[_ask("Anyone there?")]), Scripted(text="alone"))
    _start(unsigned, by_starter, task_a, "--policy", str(policy))
    started = unsigned.cli.start_run(by_temporal, json.dumps({"task": task_b, "policy": {"approval_timeout_s": 2}}))
    assert started.returncode == 0, started.stderr

    for workflow_id, task in ((by_starter, task_a), (by_temporal, task_b)):
        assert _done(unsigned, workflow_id)["state"] == "completed"
        [told] = _tool_messages(unsigned, task, 2)
        assert told.startswith("Nobody answered the question before it expired"), told
    late = unsigned.cli.starter("answer", by_starter, "q_0123456789abcdef", "too late")
    _one_line_error(late, 1, f"run {by_starter} is not running (completed)")

    # watch of the closed run: the question and its expiry, no command to answer what nobody waits for
    watched = unsigned.cli.starter("watch", by_starter)
    assert watched.returncode == 0, watched.stderr
    assert "question_asked: turn 1: question q_" in watched.stdout and "Anyone there?" in watched.stdout
    assert "question_answered: turn 1: question q_" in watched.stdout and "expired unanswered" in watched.stdout
    assert "--name answer" not in watched.stdout and f"answer {by_starter}" not in watched.stdout, watched.stdout


def test_watch_of_a_live_run_prints_how_to_answer(unsigned: Setup) -> None:
    workflow_id, task = _new_run(unsigned, Scripted(tool_calls=[_ask("Proceed?", ["yes", "no"])]), Scripted(text="ok"))
    _start(unsigned, workflow_id, task)
    [row] = _pending(unsigned, workflow_id)
    watch = subprocess.Popen(
        [sys.executable, str(ROOT / "starter.py"), "watch", workflow_id],
        env={**unsigned.cli.env, "USER": "wendy"},
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(watch.stdout, lines), daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not any("--name answer" in line for line in seen):
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "".join(seen)
            seen.append(line)
        output = "".join(seen)
        assert "    asks: Proceed?\n" in output and "    options: 1) yes  2) no  (free text allowed)\n" in output
        signal_input = {"question_id": row["approval_id"], "reviewer": "wendy", "text": "..."}
        assert f"--name answer --input '{json.dumps(signal_input)}'" in output, output
        assert f"answer {workflow_id} {row['approval_id']} '...' --reviewer wendy" in output, output
        answered = subprocess.run(  # free text, read from stdin
            [sys.executable, str(ROOT / "starter.py"), "answer", workflow_id, row["approval_id"], "-"],
            env=unsigned.cli.env, cwd=ROOT, input="yes, go\n", capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout.splitlines()[-1].endswith("(Proceed?) as cli: yes, go"), answered.stdout
        assert watch.wait(timeout=DEADLINE_S) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
    while (line := lines.get(timeout=5)) is not None:
        seen.append(line)
    assert "question_answered: " in "".join(seen) and f"{row['approval_id']} answered by " in "".join(seen)
    assert _tool_messages(unsigned, task, 2) == ["yes, go"]


def test_follow_on_a_terminal_answers_a_question_inline(unsigned: Setup) -> None:
    workflow_id, task = _new_run(
        unsigned, Scripted(tool_calls=[_ask("Which size?", SIZES, False)]), Scripted(text="ok")
    )
    controller, terminal = pty.openpty()
    follow = subprocess.Popen(
        [sys.executable, str(ROOT / "starter.py"), "run", task, "--id", workflow_id, "--follow", "--reviewer", "tina"],
        env=unsigned.cli.env,
        cwd=ROOT,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    screen = b""

    def expect(text: bytes) -> None:
        nonlocal screen

        def shown() -> bool:
            nonlocal screen
            ready, _, _ = select.select([controller], [], [], 0.2)
            if ready:
                try:
                    screen += os.read(controller, 4096)
                except OSError:
                    if text not in screen:
                        raise RuntimeError(f"the terminal closed before {text!r}: {screen!r}") from None
            assert text in screen, screen.decode(errors="replace")
            return True

        eventually_sync(shown, f"the terminal shows {text!r}", every_s=0)

    try:
        expect(b"answer (1-3): ")
        assert b"asks: Which size?" in screen and b"1) S  2) M  3) L  (only these" in screen
        os.write(controller, b"XL\n")  # not an option: asked again
        expect(b"XL\r\nanswer (1-3): ")
        os.write(controller, b"2\n")
        expect(b"(Which size?) as tina: M")
        expect(b"status: completed")
        assert follow.wait(timeout=DEADLINE_S) == 0
    finally:
        if follow.poll() is None:
            follow.kill()
        os.close(controller)
    assert _tool_messages(unsigned, task, 2) == ["M"]


# --- edited calls ---------------------------------------------------------------------------


def test_an_edited_approval_delivers_the_edited_call_once(unsigned: Setup) -> None:
    path_a, path_b = f"/edit/{uuid.uuid4().hex[:8]}", f"/edit/{uuid.uuid4().hex[:8]}"
    by_starter, task_a = _new_run(
        unsigned, Scripted(tool_calls=[_post(unsigned, path_a, {"sku": "A1", "qty": 2})]), Scripted(text="placed")
    )
    by_temporal, task_b = _new_run(
        unsigned, Scripted(tool_calls=[_post(unsigned, path_b, {"sku": "A1", "qty": 2})]), Scripted(text="placed")
    )
    for workflow_id, task in ((by_starter, task_a), (by_temporal, task_b)):
        _start(unsigned, workflow_id, task)
    [row] = _pending(unsigned, by_starter)
    [other] = _pending(unsigned, by_temporal)

    approved = unsigned.cli.starter(
        "approve", by_starter, "--reviewer", "alice", "--edit", '{"json": {"sku": "B2", "qty": 2}}'
    )
    assert approved.returncode == 0, approved.stderr
    assert "  edited (json changed); the call to run:" in approved.stdout
    assert approved.stdout.splitlines()[-1] == (
        f"approved {row['approval_id']} (http_request POST {unsigned.dest.url}{path_a}) as alice "
        "with edited arguments (json)"
    )
    edited_b = {**other["args"], "json": {"sku": "C3", "qty": 1}}
    _signal(
        unsigned,
        by_temporal,
        "approve",
        {"approval_id": other["approval_id"], "reviewer": "bob", "arguments": edited_b},
    )

    for workflow_id, path, row_, body in (
        (by_starter, path_a, row, {"sku": "B2", "qty": 2}),
        (by_temporal, path_b, other, {"sku": "C3", "qty": 1}),
    ):
        assert _done(unsigned, workflow_id)["state"] == "completed"
        [post] = unsigned.dest.posts(path)
        assert json.loads(post.body) == body
        edited = {**row_["args"], "json": body}
        assert post.headers["idempotency-key"] == idempotency_key(workflow_id, 1, 0, "http_request", edited)
        assert post.headers["idempotency-key"] != idempotency_key(workflow_id, 1, 0, "http_request", row_["args"])
    [result] = _tool_messages(unsigned, task_a, 2)
    assert result.startswith("Note: a reviewer (alice) changed this call's arguments before it ran; it ran with json")

    # The audit says who edited what; watch of the closed run shows the call as it ran and no commands.
    status = _status(unsigned, by_starter)
    [record] = [d for d in status["decisions"] if d["approval_id"] == row["approval_id"]]
    assert record["decision"] == "approved" and record["reviewer"] == "alice"
    assert record["edits"]["json"] == {"sku": "B2", "qty": 2}
    text, watched = _side_by_side(unsigned, ("status", by_starter), ("watch", by_starter))
    [audit] = [ln for ln in text.stdout.splitlines() if row["approval_id"] in ln]
    assert "  http_request  approved  by alice  step 1  edited to: {" in audit and '"sku":"B2"' in audit
    assert watched.returncode == 0, watched.stderr
    assert "approval_requested: " in watched.stdout and "with edited arguments" in watched.stdout
    assert "edited by the reviewer(s); it runs as:" in watched.stdout
    assert "--name approve" not in watched.stdout and f"approve {by_starter}" not in watched.stdout, watched.stdout


def test_an_edit_that_does_not_validate_leaves_the_call_pending(unsigned: Setup) -> None:
    path = f"/invalid/{uuid.uuid4().hex[:8]}"
    workflow_id, task = _new_run(unsigned, Scripted(tool_calls=[_post(unsigned, path, {"a": 1})]), Scripted(text="no"))
    _start(unsigned, workflow_id, task)
    [row] = _pending(unsigned, workflow_id)
    aid = row["approval_id"]

    method, typed, broken, listed = _side_by_side(
        unsigned,
        ("approve", workflow_id, "--reviewer", "alice", "--edit", '{"method": "FETCH"}'),
        ("approve", workflow_id, aid, "--reviewer", "alice", "--edit", '{"headers": "x"}'),
        ("approve", workflow_id, "--reviewer", "alice", "--edit", '{"json": '),
        ("approve", workflow_id, "--reviewer", "alice", "--edit", '["json"]'),
    )
    _one_line_error(method, 1, "error: refused:", "method must be one of")
    _one_line_error(typed, 1, "error: refused:", "headers")
    _one_line_error(broken, 2, "--edit", "not valid JSON")
    _one_line_error(listed, 2, "--edit", "expected a JSON object")
    bad = _update(unsigned, workflow_id, {
        "approval_id": aid, "decision": "approve", "reviewer": "bob", "arguments": {**row["args"], "method": "FETCH"},
    })  # fmt: skip
    assert bad.returncode != 0 and "method must be one of" in bad.stdout + bad.stderr
    _signal(unsigned, workflow_id, "approve", {"approval_id": aid, "reviewer": "bob", "arguments": {"url": 5}})
    status = _refused(unsigned, workflow_id, "via signal")
    assert [p["approval_id"] for p in status["pending_approvals"]] == [aid] and status["state"] == "waiting_approval"
    assert unsigned.dest.posts(path) == []
    rejected = unsigned.cli.starter("reject", workflow_id, "--reviewer", "alice", "--reason", "not like this")
    assert rejected.returncode == 0, rejected.stderr
    assert _done(unsigned, workflow_id)["state"] == "completed" and unsigned.dest.posts(path) == []


def test_an_edit_the_policy_denies_leaves_the_call_pending(operator: Setup) -> None:
    path = f"/ok/{uuid.uuid4().hex[:8]}"
    workflow_id, task = _new_run(operator, Scripted(tool_calls=[_post(operator, path, {"a": 1})]), Scripted(text="x"))
    _start(operator, workflow_id, task)
    [row] = _pending(operator, workflow_id)
    forbidden = f"{operator.dest.url}/forbidden{path}"
    denied = operator.cli.starter(
        "approve", workflow_id, "--reviewer", "alice", "--edit", json.dumps({"url": forbidden})
    )
    _one_line_error(denied, 1, "error: refused:", "policy denies the edited call (rule no-forbidden)")
    bad = _update(operator, workflow_id, {
        "approval_id": row["approval_id"], "decision": "approve", "reviewer": "bob",
        "arguments": {**row["args"], "url": forbidden},
    })  # fmt: skip
    assert bad.returncode != 0 and "policy denies" in bad.stdout + bad.stderr
    assert [p["approval_id"] for p in _pending(operator, workflow_id)] == [row["approval_id"]]
    cancelled = operator.cli.starter("cancel", workflow_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert _done(operator, workflow_id)["state"] == "cancelled"
    assert not [r for r in operator.dest.received if "/forbidden/" in r.path or r.path == path]


def test_a_signature_over_the_original_call_does_not_approve_an_edit(signed: Setup) -> None:
    path = f"/signed-edit/{uuid.uuid4().hex[:8]}"
    workflow_id, task = _new_run(signed, Scripted(tool_calls=[_post(signed, path, {"amount": 10})]), Scripted(text="x"))
    _start(signed, workflow_id, task)
    [row] = _pending(signed, workflow_id)
    aid, original = row["approval_id"], row["args"]
    edited = {**original, "json": {"amount": 1000}}
    stale = decision_signature(
        APPROVAL_KEY.encode(), aid, "approve", "alice", row["expires_at"], signed_extras(original)
    )
    bad = _update(signed, workflow_id, {
        "approval_id": aid, "decision": "approve", "reviewer": "alice", "arguments": edited, "signature": stale,
    })  # fmt: skip
    assert bad.returncode != 0 and "signature does not verify" in bad.stdout + bad.stderr
    _signal(
        signed,
        workflow_id,
        "approve",
        {"approval_id": aid, "reviewer": "alice", "arguments": edited, "signature": stale},
    )
    status = _refused(signed, workflow_id, "via signal")
    assert "signature does not verify" in status["refused"][-1]
    assert [p["approval_id"] for p in status["pending_approvals"]] == [aid] and signed.dest.posts(path) == []

    keyed = {**signed.cli.env, "AGENT_APPROVAL_KEY": APPROVAL_KEY}
    approved = signed.cli.starter(
        "approve", workflow_id, "--reviewer", "alice", "--edit", '{"json": {"amount": 20}}', env=keyed
    )
    assert approved.returncode == 0, approved.stderr
    assert _done(signed, workflow_id)["state"] == "completed"
    [post] = signed.dest.posts(path)
    assert json.loads(post.body) == {"amount": 20}


# --- remembered approvals ---------------------------------------------------------------------


def test_remember_call_approves_identical_calls_and_forget_drops_it(unsigned: Setup) -> None:
    same, other = f"/same/{uuid.uuid4().hex[:8]}", f"/other/{uuid.uuid4().hex[:8]}"
    plan = [
        Scripted(tool_calls=[_post(unsigned, same, {"n": 1})]),
        Scripted(tool_calls=[_post(unsigned, same, {"n": 1})]),
        Scripted(tool_calls=[_post(unsigned, same, {"n": 1})]),
        Scripted(tool_calls=[_post(unsigned, other, {"n": 1})]),
        Scripted(text="three and one"),
    ]
    by_starter, task_a = _new_run(unsigned, *plan)
    same_b = f"/same/{uuid.uuid4().hex[:8]}"
    by_temporal, task_b = _new_run(
        unsigned, *[Scripted(tool_calls=[_post(unsigned, same_b, {"n": 1})]) for _ in range(3)], Scripted(text="3")
    )
    for workflow_id, task in ((by_starter, task_a), (by_temporal, task_b)):
        _start(unsigned, workflow_id, task)
    [row] = _pending(unsigned, by_starter)
    [row_b] = _pending(unsigned, by_temporal)

    approved = unsigned.cli.starter("approve", by_starter, "--reviewer", "alice", "--remember", "call")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.splitlines()[-1] == "  remembered for identical calls"
    _signal(
        unsigned, by_temporal, "approve", {"approval_id": row_b["approval_id"], "reviewer": "bob", "remember": "call"}
    )

    # The identical calls of the next two turns run unasked; the different one asks.
    asked = _wait_status(unsigned, by_starter, lambda d: d["step"] >= 4 and bool(d["pending_approvals"]))
    [waiting] = asked["pending_approvals"]
    assert waiting["args"]["url"] == unsigned.dest.url + other and len(unsigned.dest.posts(same)) == 3
    assert [(d["decision"], d["approval_id"]) for d in asked["decisions"]] == [
        ("approved", row["approval_id"]), ("remembered", row["approval_id"]), ("remembered", row["approval_id"]),
    ]  # fmt: skip
    [entry] = asked["remembered"]
    assert entry["scope"] == "call" and entry["reviewer"] == "alice" and entry["args"] == row["args"]
    text = unsigned.cli.starter("status", by_starter)
    assert "        remembered: 1\n" in text.stdout and "{'" not in text.stdout, text.stdout
    assert f"calls identical to http_request POST {unsigned.dest.url}{same} (arguments sha256 " in text.stdout
    assert f"by alice  from {row['approval_id']} at " in text.stdout

    forgot = unsigned.cli.starter("forget-approvals", by_starter, "--reviewer", "alice")
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.stdout.strip() == (f"run {by_starter}: 1 remembered approval(s) forgotten (asked by alice); 0 remain")
    assert _status(unsigned, by_starter)["remembered"] == []
    done = unsigned.cli.starter("approve", by_starter, "--reviewer", "alice")
    assert done.returncode == 0, done.stderr
    assert _done(unsigned, by_starter)["state"] == "completed"
    assert len(unsigned.dest.posts(same)) == 3 and len(unsigned.dest.posts(other)) == 1

    assert _done(unsigned, by_temporal)["state"] == "completed"
    assert len(unsigned.dest.posts(same_b)) == 3
    decisions = _status(unsigned, by_temporal)["decisions"]
    assert [d["decision"] for d in decisions] == ["approved", "remembered", "remembered"]


def test_forget_approvals_through_the_temporal_cli(unsigned: Setup) -> None:
    """Remembered by a signal, forgotten by a signal: the model's next identical call asks again."""
    again = f"/forget/{uuid.uuid4().hex[:8]}"
    workflow_id, task = _new_run(
        unsigned,
        Scripted(tool_calls=[_post(unsigned, again, {"n": 3})]),
        Scripted(tool_calls=[_ask("Forget first?")]),
        Scripted(tool_calls=[_post(unsigned, again, {"n": 3})]),
        Scripted(text="asked twice"),
    )
    _start(unsigned, workflow_id, task)
    [row] = _pending(unsigned, workflow_id)
    _signal(
        unsigned, workflow_id, "approve", {"approval_id": row["approval_id"], "reviewer": "bob", "remember": "call"}
    )
    [question] = _pending(unsigned, workflow_id)  # the next turn's question: the remembered approval stands
    assert question["kind"] == "question" and len(_status(unsigned, workflow_id)["remembered"]) == 1
    _signal(unsigned, workflow_id, "forget_approvals", {"reviewer": "bob"})
    status = _wait_status(unsigned, workflow_id, lambda d: d["remembered"] == [])
    assert status["decisions"][-1]["decision"] == "forgotten" and status["decisions"][-1]["reviewer"] == "bob"
    _signal(unsigned, workflow_id, "answer", {"question_id": question["approval_id"], "reviewer": "bob", "text": "yes"})
    asked = _wait_status(unsigned, workflow_id, lambda d: any(p["kind"] == "tool_call" for p in d["pending_approvals"]))
    assert asked["step"] == 3 and len(unsigned.dest.posts(again)) == 1  # asked again, not run
    _signal(
        unsigned,
        workflow_id,
        "approve",
        {"approval_id": asked["pending_approvals"][0]["approval_id"], "reviewer": "bob"},
    )
    assert _done(unsigned, workflow_id)["state"] == "completed" and len(unsigned.dest.posts(again)) == 2


def test_remember_tool_is_refused_for_a_write_and_the_approval_stands(unsigned: Setup) -> None:
    path_a, path_b = f"/tool/{uuid.uuid4().hex[:8]}", f"/tool/{uuid.uuid4().hex[:8]}"
    by_starter, task_a = _new_run(unsigned, Scripted(tool_calls=[_post(unsigned, path_a)]), Scripted(text="one"))
    by_temporal, task_b = _new_run(unsigned, Scripted(tool_calls=[_post(unsigned, path_b)]), Scripted(text="one"))
    for workflow_id, task in ((by_starter, task_a), (by_temporal, task_b)):
        _start(unsigned, workflow_id, task)
    [row] = _pending(unsigned, by_starter)
    [row_b] = _pending(unsigned, by_temporal)

    approved = unsigned.cli.starter("approve", by_starter, "--reviewer", "alice", "--remember", "tool")
    assert approved.returncode == 0, approved.stderr
    *_, verdict, remembered = approved.stdout.splitlines()
    assert verdict.startswith(f"approved {row['approval_id']} (http_request POST ") and verdict.endswith("as alice")
    assert remembered.startswith("  remember tool refused: rule default:side-effect does not let every http_request")
    assert remembered.endswith("(the approval itself stands)")
    _signal(
        unsigned, by_temporal, "approve", {"approval_id": row_b["approval_id"], "reviewer": "bob", "remember": "tool"}
    )

    for workflow_id, path in ((by_starter, path_a), (by_temporal, path_b)):
        status = _done(unsigned, workflow_id)
        assert status["state"] == "completed" and len(unsigned.dest.posts(path)) == 1
        [record] = status["decisions"]
        assert record["decision"] == "approved" and record["remember"].startswith("remember tool refused")


# --- a quorum -----------------------------------------------------------------------------------


def test_a_quorum_of_two_releases_exactly_one_delivery(operator: Setup) -> None:
    path_a, path_b = f"/quorum/{uuid.uuid4().hex[:8]}", f"/quorum/{uuid.uuid4().hex[:8]}"
    by_starter, task_a = _new_run(operator, Scripted(tool_calls=[_post(operator, path_a)]), Scripted(text="two"))
    by_temporal, task_b = _new_run(operator, Scripted(tool_calls=[_post(operator, path_b)]), Scripted(text="two"))
    for workflow_id, task in ((by_starter, task_a), (by_temporal, task_b)):
        _start(operator, workflow_id, task)
    [row] = _pending(operator, by_starter)
    [row_b] = _pending(operator, by_temporal)
    assert row["approvals_required"] == 2 and row["approved_by"] == [] and row["rule"] == "two-people"

    first = operator.cli.starter("approve", by_starter, "--reviewer", "alice")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == "  1/2 approvals: the call waits for 1 more reviewer(s) before it runs"
    listed, twice = _side_by_side(
        operator, ("pending", by_starter), ("approve", by_starter, row["approval_id"], "--reviewer", "alice")
    )
    assert f"    approved 1/2 by alice\n    http_request POST {operator.dest.url}{path_a}\n" in listed.stdout
    _one_line_error(twice, 1, "error: refused:", "'alice' already approved", "(1/2)", "distinct reviewers")
    _signal(operator, by_starter, "approve", {"approval_id": row["approval_id"], "reviewer": "alice"})
    status = _refused(operator, by_starter, "already approved")
    assert status["pending_approvals"][0]["approved_by"] == ["alice"] and operator.dest.posts(path_a) == []
    _signal(operator, by_starter, "approve", {"approval_id": row["approval_id"], "reviewer": "bob"})

    counted = _update(
        operator, by_temporal, {"approval_id": row_b["approval_id"], "decision": "approve", "reviewer": "carol"}
    )
    assert counted.returncode == 0 and "(1/2); waiting for more reviewers" in counted.stdout, counted.stderr
    again = _update(
        operator, by_temporal, {"approval_id": row_b["approval_id"], "decision": "approve", "reviewer": "carol"}
    )
    assert again.returncode != 0 and "already approved" in again.stdout + again.stderr
    assert _pending(operator, by_temporal)[0]["approved_by"] == ["carol"]
    second = operator.cli.starter("approve", by_temporal, "--reviewer", "dave")
    assert second.returncode == 0, second.stderr
    assert (
        second.stdout.splitlines()[-1]
        == f"approved {row_b['approval_id']} (http_request POST {operator.dest.url}{path_b}) as dave"
    )

    for workflow_id, path, names in ((by_starter, path_a, ["alice", "bob"]), (by_temporal, path_b, ["carol", "dave"])):
        status = _done(operator, workflow_id)
        assert status["state"] == "completed" and len(operator.dest.posts(path)) == 1
        assert [(d["decision"], d["reviewer"]) for d in status["decisions"]] == [
            ("counted", names[0]),
            ("approved", names[1]),
        ]


# --- sub-agents -----------------------------------------------------------------------------------


def test_a_sub_agent_s_question_is_answered_through_its_parent(operator: Setup) -> None:
    runs = []
    for _ in range(2):
        child_task = f"ask about {uuid.uuid4().hex[:8]}"
        operator.script.add(
            child_task, Scripted(tool_calls=[_ask("Red or blue?", ["red", "blue"], False)]), Scripted(text="chose")
        )
        parent, task = _new_run(
            operator, Scripted(tool_calls=[("helper", json.dumps({"task": child_task}))]), Scripted(text="delegated")
        )
        _start(operator, parent, task)
        runs.append((parent, child_task))
    (by_starter, child_task_a), (by_temporal, child_task_b) = runs

    [row] = _pending(operator, by_starter)
    child = f"{by_starter}/helper/s1c0"
    assert row["workflow_id"] == child and row["via"] == by_starter and row["kind"] == "question"
    listed = operator.cli.starter("pending", by_starter)
    assert (
        f"{child}  {row['approval_id']}  question  " in listed.stdout
        and f"(sub-agent of {by_starter})" in listed.stdout
    )
    assert f"answer {by_starter} {row['approval_id']} TEXT" in listed.stdout
    answered = operator.cli.starter("answer", by_starter, row["approval_id"], "blue", "--reviewer", "alice")
    assert answered.returncode == 0, answered.stderr
    assert f"answer {row['approval_id']} of run {child} (a sub-agent of {by_starter})" in answered.stdout
    assert answered.stdout.splitlines()[-1] == f"answered {row['approval_id']} (Red or blue?) as alice: blue"

    [row_b] = _pending(operator, by_temporal)
    _signal(
        operator,
        row_b["workflow_id"],
        "answer",
        {"question_id": row_b["approval_id"], "reviewer": "bob", "text": "red"},
    )

    for parent, child_task, text in ((by_starter, child_task_a, "blue"), (by_temporal, child_task_b, "red")):
        status = _done(operator, parent)
        assert status["state"] == "completed" and status["output"] == "delegated"
        assert _tool_messages(operator, child_task, 2) == [text]
