"""Humans in the loop beyond yes/no: ``starter.py answer`` and ``forget-approvals``.

``answer RUN_ID QUESTION_ID TEXT`` answers a question the model asked (``ask_human``)
through the ``decide`` update (decision ``answer``), signed with ``AGENT_APPROVAL_KEY``
like every decision, and sent to the run of the tree that owns the question (a
sub-agent's question is answered through its parent's id: ``durable_agents.cli.owners``).
``TEXT`` ``-`` reads the answer from stdin. A refusal (an answer outside the options when
free text is off, an expired or unknown question) is one line, exit 1.

``forget-approvals RUN_ID`` sends the ``forget_approvals`` signal, which drops every
approval ``approve --remember`` made to stand for later calls of the run, then reads the
run's status until the run has recorded it and says how many remain.

``approve --edit`` / ``--remember`` are options of ``approve``
(:mod:`durable_agents.cli.approvals`, sent by :mod:`durable_agents.cli.decisions`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import timedelta
from typing import Any

from temporalio.client import Client, RPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from activities.settings import Settings
from durable_agents.cli.approval_text import remembered_line
from durable_agents.cli.approvals import decide_command, running_view
from durable_agents.cli.common import EXIT_USAGE, QUERY_TIMEOUT, CliError, client_errors, not_utf8, raise_if_cancelled
from durable_agents.cli.decisions import Extras
from workflows.agent import AgentWorkflow
from workflows.human_types import MAX_ANSWER_CHARS
from workflows.types import ForgetApprovalsSignal, StatusView

FORGET_WAIT = timedelta(seconds=30)  # for the run to record the forget_approvals signal
FORGET_POLL_S = 0.2


def add_commands(sub: argparse._SubParsersAction[Any]) -> None:
    answer = sub.add_parser("answer", help="answer a question a run's model asked (ask_human)")
    answer.add_argument("workflow_id")
    answer.add_argument("question_id", help="the question's id (q_...; `pending` lists it)")
    answer.add_argument("text", help="the answer, handed to the model verbatim (- reads it from stdin)")
    answer.add_argument("--reviewer", default=None, help="your name (default: $USER; checked against the approvers)")

    forget = sub.add_parser(
        "forget-approvals", help="drop the approvals a run remembers for later calls (approve --remember)"
    )
    forget.add_argument("workflow_id")
    forget.add_argument("--reviewer", default=None, help="who asks, kept in the run's audit (default: $USER)")


def _answer_text(text: str) -> str:
    if text == "-":
        if sys.stdin.isatty():
            print("reading the answer from the terminal; end it with Ctrl-D", file=sys.stderr, flush=True)
        data = sys.stdin.buffer.read(MAX_ANSWER_CHARS * 4 + 1)
        try:
            text = data.decode("utf-8").rstrip("\n")
        except UnicodeDecodeError as exc:
            raise CliError(f"the answer on stdin is not UTF-8 text (offset {exc.start})", code=EXIT_USAGE) from None
    elif where := not_utf8(text):
        raise CliError(f"the answer is not valid UTF-8 text ({where})", code=EXIT_USAGE)
    if not text.strip():
        raise CliError("the answer is empty", code=EXIT_USAGE)
    if len(text) > MAX_ANSWER_CHARS:
        raise CliError(f"the answer is {len(text):,} characters; at most {MAX_ANSWER_CHARS:,} fit", code=EXIT_USAGE)
    return text


@client_errors
async def cmd_answer(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    text = _answer_text(args.text)
    decision = argparse.Namespace(
        workflow_id=args.workflow_id,
        approval_id=args.question_id,
        reviewer=args.reviewer if args.reviewer is not None else settings.reviewer,
    )
    return await decide_command(client, decision, settings, "answer", "", Extras(text=text))


@client_errors
async def cmd_forget_approvals(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    workflow_id = args.workflow_id
    reviewer = args.reviewer if args.reviewer is not None else settings.reviewer
    state, view = await running_view(client, workflow_id, query_timeout=QUERY_TIMEOUT)
    if view is None:
        raise CliError(f"run {workflow_id} is not running ({state}); it remembers nothing any more")
    before = view.decisions_total
    try:
        await client.get_workflow_handle(workflow_id).signal(
            AgentWorkflow.forget_approvals, ForgetApprovalsSignal(reviewer=reviewer)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no running run with id {workflow_id!r}") from None
        raise
    after = await _recorded(client, workflow_id, before)
    if after is None:
        print(
            f"sent forget_approvals to run {workflow_id}; it has not recorded it yet ({len(view.remembered)} "
            "remembered approval(s) before)"
        )
        return 0
    forgotten = next(
        (r.comment for r in reversed(after.decisions) if r.decision == "forgotten"),
        f"{len(view.remembered)} remembered approval(s) forgotten",
    )
    print(f"run {workflow_id}: {forgotten} (asked by {reviewer}); {len(after.remembered)} remain")
    for entry in after.remembered:  # remembered again meanwhile
        print(f"  {remembered_line(entry)}")
    return 0


async def _recorded(client: Client, workflow_id: str, before: int) -> StatusView | None:
    """The run's status once its audit counts one more decision than ``before`` (the signal's), else None."""
    handle = client.get_workflow_handle(workflow_id)
    deadline = asyncio.get_running_loop().time() + FORGET_WAIT.total_seconds()
    while asyncio.get_running_loop().time() < deadline:
        try:
            view = StatusView.model_validate(await handle.query(AgentWorkflow.status, rpc_timeout=QUERY_TIMEOUT))
        except (RPCError, RPCTimeoutOrCancelledError, ValueError):
            raise_if_cancelled()
            view = None
        if view is not None and view.decisions_total > before:
            return view
        await asyncio.sleep(FORGET_POLL_S)
    return None
