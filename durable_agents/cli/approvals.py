"""The approval commands of ``starter.py``: approve / reject / resolve / pending, and ``run``'s approval options.

Decisions go through the ``decide`` update (:mod:`durable_agents.cli.decisions`), so
the caller learns at once whether a decision took effect (refusals come back with the
run's reason). With ``AGENT_APPROVAL_KEY`` set (``settings.approval_key``), decisions
are signed (``workflows.identity.decision_signature``) for workers that require signed ones.

``pending`` without a run id finds the waiting runs by the ``AgentPendingApprovals``
search attribute, so it sees every one of them however many runs are running:
one visibility listing (a page holds ``VISIBILITY_PAGE`` runs), then one status
query for each of the first ``--limit`` hits, ``QUERY_CONCURRENCY`` at a time and
each with a short deadline, so a run no worker answers for costs seconds, not
the command. On a namespace without the attribute it asks every running run instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.settings import Settings
from durable_agents.cli.approval_text import deciding, edited_lines, pending_lines, pending_row
from durable_agents.cli.common import (
    EXIT_USAGE,
    QUERY_TIMEOUT,
    QUICK_QUERY_TIMEOUT,
    VISIBILITY_PAGE,
    CliError,
    NoAnswer,
    ask_status,
    bounded,
    describe_run,
    ended_state,
    list_runs,
    no_answer_reason,
    no_worker_line,
    poller_count,
    positive_int,
    raise_if_cancelled,
    start_worker_hint,
)
from durable_agents.cli.decisions import Decision, Extras, decide_request, edit_object, send_decision
from durable_agents.cli.owners import Owned, owned, tree, unconfirmed
from workflows.agent import AgentWorkflow
from workflows.approvals import DECISIONS
from workflows.policy import parse_run_policy
from workflows.progress import PENDING_APPROVALS
from workflows.types import StatusView

RUNNING_AGENTS = "WorkflowType = 'AgentWorkflow' AND ExecutionStatus = 'Running'"
WAITING_AGENTS = f"{RUNNING_AGENTS} AND {PENDING_APPROVALS.name} > 0"
DECIDE_TIMEOUT = timedelta(seconds=30)
QUERY_CONCURRENCY = 16  # status queries in flight at once while `pending` reads many runs
PENDING_LIMIT = 100  # waiting runs `pending` shows by default (it says how many more wait)


# --- argument parsing ----------------------------------------------------------------


def add_commands(sub: argparse._SubParsersAction[Any]) -> None:
    approve = sub.add_parser("approve", help="approve a tool call a run waits for")
    reject = sub.add_parser("reject", help="reject a tool call a run waits for (it is not run; the model is told)")
    for parser in (approve, reject):
        parser.add_argument("workflow_id")
        parser.add_argument("approval_id", nargs="?", help="optional when the run waits for exactly one approval")
        parser.add_argument("--reviewer", required=True, help="your name (checked against the run's approvers)")
    approve.add_argument("--comment", default="", help="a note recorded with the approval")
    approve.add_argument(
        "--edit",
        type=edit_object,
        metavar="JSON",
        help="approve the call with changed arguments: a JSON object whose top-level keys replace the call's "
        """(merged: '{"json": {"sku": "B2"}}' changes only the body of an http_request); the run validates """
        "the edited call and checks its policy again (refused: the call stays pending)",
    )
    approve.add_argument(
        "--remember",
        choices=["call", "tool"],
        help="call: also approve identical calls later in the run; tool: every later call of the tool "
        "(refused, the approval standing, where the rule does not allow it: http_request writes by default)",
    )
    reject.add_argument("--reason", required=True, help="why; the model is told")

    resolve = sub.add_parser(
        "resolve", help="answer an unknown outcome: a side effect whose worker died mid-call (docs/concepts.md)"
    )
    resolve.add_argument("workflow_id")
    resolve.add_argument("approval_id", nargs="?", help="optional when the run waits for exactly one decision")
    resolve.add_argument(
        "--as",
        dest="resolution",
        required=True,
        choices=["mark_done", "retry", "fail"],
        help="mark_done: it happened; retry: run it again with the same key; fail: report it failed",
    )
    resolve.add_argument("--reviewer", required=True, help="your name (checked against the run's approvers)")
    resolve.add_argument("--comment", default="", help="a note recorded with the decision")

    pending = sub.add_parser("pending", help="approvals a run (or every running run) waits for")
    pending.add_argument("workflow_id", nargs="?")
    pending.add_argument(
        "--limit",
        type=positive_int,
        default=PENDING_LIMIT,
        help=f"without a run id: show at most this many waiting runs (default: {PENDING_LIMIT}); says how many more",
    )
    pending.add_argument("--json", action="store_true")


def add_run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--reviewer",
        default=None,  # settings.reviewer, once the settings are read
        help="your name when deciding approvals from --follow (default: $USER)",
    )
    run.add_argument(
        "--approver",
        action="append",
        default=[],
        dest="approvers",
        metavar="NAME",
        help="who may decide this run's approvals (repeatable; default: anyone)",
    )
    run.add_argument("--policy", dest="policy_file", metavar="FILE", help="JSON run policy; it can only tighten")


def load_run_policy(path: str | None) -> dict[str, Any]:
    """The run policy file as the workflow input's ``policy`` object; a bad file is a usage error."""
    if not path:
        return {}
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise CliError(f"--policy {path}: {exc.strerror or exc}", code=EXIT_USAGE) from None
    except ValueError as exc:
        raise CliError(f"--policy {path}: not valid JSON: {exc}", code=EXIT_USAGE) from None
    if not isinstance(raw, dict):
        raise CliError(f"--policy {path}: expected a JSON object with 'rules'", code=EXIT_USAGE)
    try:
        parse_run_policy(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "policy"
        raise CliError(f"--policy {path}: {where}: {first['msg']}", code=EXIT_USAGE) from None
    return raw


# --- reading a run -------------------------------------------------------------------


async def running_view(
    client: Client, workflow_id: str, *, query_timeout: timedelta = QUICK_QUERY_TIMEOUT
) -> tuple[str, StatusView | None]:
    """The run's state name and, while it runs, its status query answer (``CliError`` when none comes).

    A closed run's state is the agent's (``cancelled``, ``failed`` ...), not Temporal's ``completed``.
    """
    handle, desc = await describe_run(client, workflow_id)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return await ended_state(client, desc.id, desc.run_id, desc.status, desc.typed_search_attributes), None
    view = await query_status(client, handle, desc, query_timeout=query_timeout)
    return view.state, view


async def query_status(
    client: Client,
    handle: WorkflowHandle[Any, Any],
    desc: WorkflowExecutionDescription,
    *,
    query_timeout: timedelta = QUICK_QUERY_TIMEOUT,
) -> StatusView:
    try:
        return await ask_status(client, handle, desc, query_timeout=query_timeout)
    except NoAnswer as err:
        pending = desc.typed_search_attributes.get(PENDING_APPROVALS)
        recorded = f"; it last recorded {pending} pending approval(s)" if pending is not None else ""
        raise CliError(f"run {handle.id} is running but {err}{recorded}") from None


async def _view_or_none(client: Client, workflow_id: str) -> StatusView | None:
    try:
        return (await running_view(client, workflow_id))[1]
    except CliError as err:
        print(f"warning: {err}", file=sys.stderr)
        return None


async def waiting_runs(client: Client, limit: int) -> tuple[list[WorkflowExecution], int, bool]:
    """The first ``limit`` runs that may wait for a decision, how many there are in all, and whether
    the attribute said so.

    By the ``AgentPendingApprovals`` search attribute the workflow keeps current: one
    listing call (per ``VISIBILITY_PAGE`` waiting runs). On a namespace that does not
    know the attribute (the server rejects the query), every running ``AgentWorkflow``,
    all pages (their status queries then tell which ones wait).
    """
    try:
        runs, total = await list_runs(client, WAITING_AGENTS, limit, page_size=VISIBILITY_PAGE)
    except RPCError as err:
        if err.status != RPCStatusCode.INVALID_ARGUMENT:
            raise
    else:
        return runs, len(runs) if total is None else total, True
    everyone = await _workflows(client, RUNNING_AGENTS)
    return everyone, len(everyone), False


async def _workflows(client: Client, query: str) -> list[WorkflowExecution]:
    found: dict[str, WorkflowExecution] = {}
    async for wf in client.list_workflows(query):  # no limit: the iterator reads every page
        found.setdefault(wf.id, wf)
    return list(found.values())


async def listed_view(client: Client, wf: WorkflowExecution) -> StatusView | None:
    """A listed run's status query answer: one query RPC, under ``QUICK_QUERY_TIMEOUT``.

    No answer is a warning on stderr naming the run and why (from what the server
    knows without a worker), and None: one stuck run costs seconds, not the command.
    """
    handle = client.get_workflow_handle(wf.id)
    try:
        async with asyncio.timeout(QUICK_QUERY_TIMEOUT.total_seconds() + 1):  # in case the RPC overstays
            view = await handle.query(AgentWorkflow.status, rpc_timeout=QUICK_QUERY_TIMEOUT)
        return StatusView.model_validate(view)
    except WorkflowQueryFailedError as err:
        reason = f"its worker could not answer: {err}"
    except (RPCError, RPCTimeoutOrCancelledError, TimeoutError):
        raise_if_cancelled()
        reason = await _why_no_answer(client, wf.id)
    pending = wf.typed_search_attributes.get(PENDING_APPROVALS)
    recorded = f"; it last recorded {pending} pending approval(s)" if pending is not None else ""
    print(f"warning: run {wf.id} is running but {reason}{recorded}", file=sys.stderr)
    return None


async def _why_no_answer(client: Client, workflow_id: str) -> str:
    try:
        _, desc = await describe_run(client, workflow_id)
        return await no_answer_reason(client, desc, waited=QUICK_QUERY_TIMEOUT)
    except (CliError, RPCError, RPCTimeoutOrCancelledError):
        raise_if_cancelled()
        return f"no worker answered within {QUICK_QUERY_TIMEOUT.seconds} s"


# --- commands ------------------------------------------------------------------------


async def cmd_pending(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    """Each approval as the run that waits for it lists it: every run of each tree is asked for its own
    (``durable_agents.cli.owners``); what a parent relays from its sub-agents is never shown as such."""
    more, unanswered = 0, 0
    if args.workflow_id:
        state, view = await running_view(client, args.workflow_id)
        views = [(args.workflow_id, view)]
    else:
        views, more = await _waiting_views(client, args.limit, quiet_fallback=args.json)
        unanswered = sum(1 for _, view in views if view is None)
    found: dict[tuple[str, str], Owned] = {}
    asked: set[str] = set()
    for workflow_id, view in views:
        if view is None or workflow_id in asked:  # a sub-agent the search attribute listed too: once
            continue
        runs = await tree(client, workflow_id, view)
        asked.update(wid for wid, _ in runs)
        mine = owned(runs, workflow_id)
        for key, entry in mine.items():
            found.setdefault(key, entry)
        for warning in unconfirmed(runs, mine):
            print(warning, file=sys.stderr)
    rows = [pending_row(entry) for entry in found.values()]
    more_line = (
        f"... and {more} more run(s) waiting for approvals (--limit {args.limit + more} shows them all)" if more else ""
    )
    if args.json:
        print(json.dumps(rows, indent=2))
        if more_line:
            print(more_line, file=sys.stderr)  # stdout stays JSON
        return 0
    for row in rows:
        print("\n".join(pending_lines(row)))
    if more_line:
        print(more_line)
    if rows or more_line:
        return 0
    if args.workflow_id:
        print(f"run {args.workflow_id} has no pending approvals ({state})")
    elif unanswered:
        print(f"no run that answered waits for an approval; {unanswered} run(s) did not answer (see above)")
    else:
        print("no running run waits for an approval")
    return 0


async def _waiting_views(
    client: Client, limit: int, *, quiet_fallback: bool = False
) -> tuple[list[tuple[str, StatusView | None]], int]:
    """The status of the first ``limit`` runs that wait, and how many more wait.

    Runs on a task queue no worker polls are not asked, but counted. Without the
    search attribute every running run is asked (today's only way to tell) and
    the first ``limit`` that wait are kept.
    """
    runs, total, by_attribute = await waiting_runs(client, limit)
    if not by_attribute and not quiet_fallback:
        print(
            f"note: the namespace has no {PENDING_APPROVALS.name} search attribute, so every running run "
            f"({len(runs)}) is asked (register the Agent* attributes: see docs/operations.md)",
            file=sys.stderr,
        )
    queues = sorted({wf.task_queue for wf in runs})
    pollers = dict(zip(queues, await asyncio.gather(*(poller_count(client, q) for q in queues)), strict=True))
    asked = [wf for wf in runs if pollers[wf.task_queue] != 0]
    for queue in queues:
        if pollers[queue] == 0:
            count = sum(1 for wf in runs if wf.task_queue == queue)
            what = "wait(s) for approvals" if by_attribute else "may wait for approvals"
            print(
                f"warning: {count} run(s) on task queue {queue} {what}, but {no_worker_line(queue)} "
                f"to show them ({start_worker_hint(queue)})",
                file=sys.stderr,
            )
    found = await bounded((listed_view(client, wf) for wf in asked), QUERY_CONCURRENCY)
    views = [(wf.id, view) for wf, view in zip(asked, found, strict=True)]
    if by_attribute:
        return views, total - len(runs)
    waiting: list[tuple[str, StatusView | None]] = [
        (wid, view) for wid, view in views if view and view.pending_approvals
    ]
    unanswered = [(wid, view) for wid, view in views if view is None]
    return waiting[:limit] + unanswered, max(len(waiting) - limit, 0)


async def cmd_approve(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    # Callers that build the namespace by hand (tests, embedding code) may leave the newer options out.
    extras = Extras(edit=getattr(args, "edit", None), remember=getattr(args, "remember", None) or "")
    return await decide_command(client, args, settings, "approve", args.comment, extras)


async def cmd_reject(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    if not args.reason.strip():
        raise CliError("reject needs a non-empty --reason (the model is told why)", code=EXIT_USAGE)
    return await decide_command(client, args, settings, "reject", args.reason)


async def cmd_resolve(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    return await decide_command(client, args, settings, args.resolution, args.comment)


async def decide_command(
    client: Client,
    args: argparse.Namespace,
    settings: Settings,
    decision: Decision,
    note: str,
    extras: Extras | None = None,
) -> int:
    """Send ``decision`` to the run of ``args.workflow_id``'s tree that owns ``args.approval_id`` (optional
    when exactly one pending entry takes that decision), after printing that run's own entry."""
    extras = extras or Extras()
    workflow_id, reviewer = args.workflow_id, args.reviewer.strip()
    if not reviewer:
        raise CliError("--reviewer must name who decides", code=EXIT_USAGE)
    # Bad input is refused before asking anything.
    decide_request(
        args.approval_id or "ap_0", decision, reviewer, note, "", text=extras.text, arguments=extras.edit,
        remember=extras.remember,
    )  # fmt: skip
    # A decision waits longer than a glance at the status: a worker that just restarted replays the run
    # first. With no worker polling at all, the answer still comes at once.
    state, view = await running_view(client, workflow_id, query_timeout=QUERY_TIMEOUT)
    if view is None:
        raise CliError(f"run {workflow_id} is not running ({state}); there is nothing to {decision}")
    # Each run of the tree is asked for its own approvals: what a parent relays is never signed.
    runs = await tree(client, workflow_id, view)
    pending = {key[1]: entry for key, entry in reversed(owned(runs, workflow_id).items())}
    takes = {aid: e for aid, e in pending.items() if decision in DECISIONS.get(e.approval.kind, ())}
    if args.approval_id:
        approval_id = args.approval_id
    elif not takes:
        raise CliError(f"run {workflow_id} has no pending approvals" + (" to " + decision if pending else ""))
    elif len(takes) > 1:
        raise CliError(f"run {workflow_id} has {len(takes)} pending approvals; name one of: {', '.join(takes)}")
    else:
        approval_id = next(iter(takes))
    found = pending.get(approval_id)
    if found is None:
        relayed = {a.approval_id: a.workflow_id for a in view.pending_approvals if a.workflow_id}
        if approval_id in relayed:
            raise CliError(
                f"refused: run {relayed[approval_id]} does not wait for approval {approval_id} (run {workflow_id} "
                "lists it as that run's: a forged or out-of-date report); nothing was signed or sent"
            )
        # Pending nowhere in the tree: sent unsigned-for-nothing, so the run itself says why it is refused.
        owner, approval = workflow_id, None
    else:
        owner, approval = found.workflow_id, found.approval
        print(deciding(decision, found), flush=True)
        if extras.edit is not None:
            print("\n".join(edited_lines(approval, extras.edit)), flush=True)
    line = await send_decision(
        client,
        owner,
        approval_id,
        decision,
        reviewer,
        note,
        approval,
        approval_key=settings.approval_key,
        extras=extras,
    )
    print(line)
    return 0
