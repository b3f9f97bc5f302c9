"""How the CLI shows humans in the loop, without a server: ``pending`` rows of questions and quorums,
the audit and remembered approvals of ``status``, what an accepted decision prints, ``--edit``'s value.

The same commands run end to end in ``tests/test_cli_humans.py``.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from durable_agents.cli.approval_text import decision_line, pending_lines, remembered_line
from durable_agents.cli.decisions import Extras, edit_object, outcome_text
from workflows.types import DecisionRecord, PendingApproval, RememberedApproval


def _question(**fields: Any) -> PendingApproval:
    base: dict[str, Any] = {
        "approval_id": "q_1", "tool": "ask_human", "args": {}, "requested_at": "2026-01-01T00:00:00+00:00",
        "expires_at": "2099-01-01T00:00:00+00:00", "kind": "question", "question": "Which?",
    }  # fmt: skip
    return PendingApproval.model_validate(base | fields)


def _row(approval: PendingApproval, **extra: Any) -> dict[str, Any]:
    return {**approval.model_dump(), "workflow_id": "run-1", "time_left": "1h00m", **extra}


def test_pending_lines_of_a_question_and_of_a_quorum() -> None:
    lines = pending_lines(_row(_question(options=["a", "b"], allow_free_text=True)))
    assert lines[0] == "run-1  q_1  question  rule=-  by=anyone  left=1h00m"
    assert lines[1:3] == ["    asks: Which?", "    options: 1) a  2) b  (free text allowed)"]
    assert lines[3].endswith("answer run-1 q_1 TEXT")
    free = pending_lines(_row(_question(question="line one\nline two\x1b[2J")))
    assert free[1:4] == [
        "    asks: line one",
        "          line two\\u001b[2J",
        "    options: none (answer in free text)",
    ]

    call = PendingApproval(
        approval_id="ap_1", tool="http_request", args={"method": "POST", "url": "https://x.example/pay"},
        requested_at="", expires_at="", approvals_required=2, approved_by=["alice"],
    )  # fmt: skip
    lines = pending_lines(_row(call, via="parent-1"))
    assert lines[0].endswith("(sub-agent of parent-1)")
    assert lines[1:3] == ["    approved 1/2 by alice", "    http_request POST https://x.example/pay"]
    assert (
        lines[-1]
        == "    hint: the --reason given with reject reaches the model; approve --edit JSON runs the call changed"
    )
    edited = pending_lines(
        _row(call.model_copy(update={"edited_args": {"method": "POST", "url": "https://y.example/"}}))
    )
    assert "    the call as edited by the approvals so far (the model asked for another):" in edited
    assert "    http_request POST https://y.example/" in edited


def test_decision_and_remembered_lines_are_text_not_reprs() -> None:
    record = DecisionRecord(
        approval_id="ap_1", tool="http_request", decision="approved", reviewer="alice", at="2026-01-01T00:00:00+00:00",
        comment="fine\nby me", edits={"json": {"sku": "B2"}}, remember="remembered for identical calls", step=3,
    )  # fmt: skip
    line = decision_line(record)
    assert '  ap_1  http_request  approved  by alice  step 3  comment: "fine by me"  ' in line
    assert 'edited to: {"json":{"sku":"B2"}}  remember: remembered for identical calls' in line
    assert "{'" not in line and "\n" not in line
    answered = decision_line(
        DecisionRecord(approval_id="q_1", kind="question", tool="ask_human", decision="answered", comment="M")
    )
    assert answered.startswith('-  q_1  ask_human  answered  answer: "M"')
    forgotten = decision_line(DecisionRecord(approval_id="", kind="remembered", decision="forgotten", reviewer="bob"))
    assert forgotten.startswith("-  -  remembered  forgotten  by bob")

    whole = RememberedApproval(tool="read_file", scope="tool", reviewer="alice", approval_id="ap_1", at="")
    assert remembered_line(whole) == "every read_file call  by alice  from ap_1 at -"
    one = RememberedApproval(tool="http_request", scope="call", args={"method": "POST", "url": "https://x.example/"})
    assert remembered_line(one).startswith("calls identical to http_request POST https://x.example/ (arguments sha256 ")


def test_what_an_accepted_decision_prints() -> None:
    call = PendingApproval(
        approval_id="ap_1", tool="http_request", args={"method": "POST", "url": "https://x.example/", "json": {"a": 1}},
        requested_at="", expires_at="",
    )  # fmt: skip
    counted = outcome_text(
        "approve", "ap_1", "alice", "", call, "ap_1 approved by alice (1/3); waiting for more reviewers", Extras()
    )
    assert counted.splitlines() == [
        "approved ap_1 (http_request POST https://x.example/) as alice",
        "  1/3 approvals: the call waits for 2 more reviewer(s) before it runs",
    ]
    message = "ap_1 approved by alice (1/3); waiting for more reviewers"
    remembering = outcome_text("approve", "ap_1", "alice", "", call, message, Extras(remember="call"))
    assert remembering.splitlines()[-1] == (
        "  --remember call was not kept: the approval that completes the quorum sets it"
    )
    message = "ap_1 approved by bob with edited arguments; remember tool refused: rule r"
    extras = Extras(edit={"url": "https://y.example/", "json": {"a": 1}}, remember="tool")
    edited = outcome_text("approve", "ap_1", "bob", "ok", call, message, extras)
    assert edited.splitlines() == [
        "approved ap_1 (http_request POST https://y.example/) as bob: ok with edited arguments (url)",
        "  remember tool refused: rule r (the approval itself stands)",
    ]
    assert Extras(edit={"json": None}).arguments(call) == {"method": "POST", "url": "https://x.example/", "json": None}
    question = _question(question="  What\n now?  ")
    assert (
        outcome_text("answer", "q_1", "al", "", question, "", Extras(text="x")) == "answered q_1 (What now?) as al: x"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [("{", "not valid JSON"), ("[1]", "got an array"), ("7", "got a number"), ("null", "got null"), ("{}", "is empty")],
)
def test_edit_must_be_a_json_object(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        edit_object(text)
    assert edit_object('{"json": {"sku": "B2"}}') == {"json": {"sku": "B2"}}
