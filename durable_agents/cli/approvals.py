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
import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecution,
)

import durable_agents.agent_client._listing as _listing
from activities.settings import Settings
from durable_agents.agent_client._client import AgentClient
from durable_agents.agent_client._errors import AgentClientError
from durable_agents.agent_client._types import PendingItem
from durable_agents.cli.approval_text import deciding, edited_lines, pending_lines, pending_row
from durable_agents.cli.common import (
    EXIT_USAGE,
    QUICK_QUERY_TIMEOUT,
    CliError,
    agent_client,
    cli_error,
    client_errors,
    positive_int,
    warn,
)
from durable_agents.cli.decisions import Decision, Extras, decide_request, edit_object, send_decision
from durable_agents.cli.owners import Owned
from workflows.policy import parse_run_policy
from workflows.types import PendingApproval, StatusView

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


def json_object_file(flag: str, path: str, expected: str, *, max_bytes: int | None = None) -> dict[str, Any]:
    """The JSON object in the file a flag names; unreadable, not JSON or not an object is a usage error."""
    try:
        with Path(path).open("rb") as file:
            data = file.read() if max_bytes is None else file.read(max_bytes + 1)
        raw = json.loads(data)
    except OSError as exc:
        raise CliError(f"{flag} {path}: {exc.strerror or exc}", code=EXIT_USAGE) from None
    except ValueError as exc:
        raise CliError(f"{flag} {path}: not valid JSON: {exc}", code=EXIT_USAGE) from None
    if not isinstance(raw, dict):
        raise CliError(f"{flag} {path}: expected {expected}", code=EXIT_USAGE)
    return raw


def load_run_policy(path: str | None) -> dict[str, Any]:
    """The run policy file as the workflow input's ``policy`` object; a bad file is a usage error."""
    if not path:
        return {}
    raw = json_object_file("--policy", path, "a JSON object with 'rules'")
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
    """``AgentClient.running_view``: the run's state name and, while it runs, its status query answer
    (``CliError`` when none comes). A closed run's state is the agent's, not Temporal's ``completed``."""
    try:
        return await AgentClient(client).running_view(workflow_id, query_timeout=query_timeout)
    except AgentClientError as err:
        raise cli_error(err) from None


async def listed_view(client: Client, wf: WorkflowExecution) -> StatusView | None:
    """A listed run's status query answer, or None with a warning on stderr saying why it did not come."""
    return await _listing.listed_view(client, wf, warn)


# --- commands ------------------------------------------------------------------------


@client_errors
async def cmd_pending(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    """Each approval as the run that waits for it lists it (``AgentClient.pending_page``): every run of each
    tree is asked for its own; what a parent relays from its sub-agents is never shown as such."""
    limit = getattr(args, "limit", PENDING_LIMIT)  # callers that build the namespace by hand may leave it out
    page = await agent_client(client, settings).pending_page(
        args.workflow_id or None, limit=limit, note_fallback=not args.json
    )
    rows = [pending_row(_owned(item)) for item in page.items]
    more = page.more
    more_line = (
        f"... and {more} more run(s) waiting for approvals (--limit {limit + more} shows them all)" if more else ""
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
        print(f"run {args.workflow_id} has no pending approvals ({page.state})")
    elif page.unanswered:
        print(f"no run that answered waits for an approval; {page.unanswered} run(s) did not answer (see above)")
    else:
        print("no running run waits for an approval")
    return 0


def _owned(item: PendingItem) -> Owned:
    """The client's entry as the CLI's rows and lines take it: the owner's own entry, and the run it was found under."""
    approval = PendingApproval.model_validate(item.model_dump(exclude={"workflow_id", "via"}))
    return Owned(item.workflow_id, approval, item.via)


@client_errors
async def cmd_approve(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    # Callers that build the namespace by hand (tests, embedding code) may leave the newer options out.
    extras = Extras(edit=getattr(args, "edit", None), remember=getattr(args, "remember", None) or "")
    return await decide_command(client, args, settings, "approve", args.comment, extras)


@client_errors
async def cmd_reject(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    if not args.reason.strip():
        raise CliError("reject needs a non-empty --reason (the model is told why)", code=EXIT_USAGE)
    return await decide_command(client, args, settings, "reject", args.reason)


@client_errors
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
    found = await agent_client(client, settings).find_approval(workflow_id, args.approval_id or "", decision=decision)
    if found is None:
        # Pending nowhere in the tree: sent unsigned-for-nothing, so the run itself says why it is refused.
        owner, approval_id, approval = workflow_id, args.approval_id, None
    else:
        owned_entry = _owned(found)
        owner, approval_id, approval = found.workflow_id, found.approval_id, owned_entry.approval
        print(deciding(decision, owned_entry), flush=True)
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
