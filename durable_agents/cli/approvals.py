"""The approval side of ``starter.py``: approve / reject / pending, and reviewing while following a run.

Decisions go through the ``decide`` update, so the caller learns at once whether
a decision took effect (refusals come back with the run's reason). With
``AGENT_APPROVAL_KEY`` set, decisions are signed
(``workflows.identity.decision_signature``) for workers that require signed ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import ValidationError
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from workflows.agent import AgentWorkflow
from workflows.identity import canonical_json, decision_signature
from workflows.policy import parse_run_policy
from workflows.types import DecideRequest, DecideResult, PendingApproval, StatusView

Decision = Literal["approve", "reject", "retry", "mark_done", "fail"]
RUNNING_AGENTS = "WorkflowType = 'AgentWorkflow' AND ExecutionStatus = 'Running'"
QUERY_TIMEOUT = timedelta(seconds=10)
DECIDE_TIMEOUT = timedelta(seconds=30)
ARGS_WIDTH = 120
# input() runs here, not in the loop's default executor: asyncio.run() joins that executor on exit,
# which would hang a finished `run --follow` until someone pressed Enter at an abandoned prompt.
_PROMPTS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="approval-prompt")


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code attached."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def default_reviewer() -> str:
    return os.environ.get("USER") or "cli"


# --- argument parsing ----------------------------------------------------------------


def add_commands(sub: argparse._SubParsersAction[Any]) -> None:
    approve = sub.add_parser("approve", help="approve a tool call a run waits for")
    reject = sub.add_parser("reject", help="reject a tool call a run waits for (it is not run; the model is told)")
    for parser in (approve, reject):
        parser.add_argument("workflow_id")
        parser.add_argument("approval_id", nargs="?", help="optional when the run waits for exactly one approval")
        parser.add_argument("--reviewer", required=True, help="your name (checked against the run's approvers)")
    approve.add_argument("--comment", default="", help="a note recorded with the approval")
    reject.add_argument("--reason", required=True, help="why; the model is told")

    resolve = sub.add_parser(
        "resolve", help="answer an unknown outcome: a side effect whose worker died mid-call (see README)"
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
    pending.add_argument("--json", action="store_true")


def add_run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--reviewer",
        default=default_reviewer(),
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
        raise CliError(f"--policy {path}: {exc.strerror or exc}", code=2) from None
    except ValueError as exc:
        raise CliError(f"--policy {path}: not valid JSON: {exc}", code=2) from None
    if not isinstance(raw, dict):
        raise CliError(f"--policy {path}: expected a JSON object with 'rules'", code=2)
    try:
        parse_run_policy(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "policy"
        raise CliError(f"--policy {path}: {where}: {first['msg']}", code=2) from None
    return raw


# --- presentation --------------------------------------------------------------------


def describe_call(tool: str, args: dict[str, Any]) -> str:
    """``http_request POST 127.0.0.1:8080/orders`` — the call in a few words."""
    if tool == "http_request":
        url = str(args.get("url", "")).split("://", 1)[-1]
        return f"{tool} {str(args.get('method', '')).upper()} {_truncate(url, 80)}"
    return f"{tool} {_truncate(canonical_json(args), 80)}"


def time_left(expires_at: str, now: datetime | None = None) -> str:
    """``23h59m``, ``4m10s``, ``2d03h`` or ``expired``."""
    try:
        expiry = datetime.fromisoformat(expires_at)
    except ValueError:
        return "?"
    if expiry.tzinfo is None:
        expiry = expiry.replace(tzinfo=UTC)
    seconds = int((expiry - (now or datetime.now(UTC))).total_seconds())
    if seconds <= 0:
        return "expired"
    hours, rest = divmod(seconds, 3600)
    if hours >= 48:
        return f"{hours // 24}d{hours % 24:02d}h"
    if hours:
        return f"{hours}h{rest // 60:02d}m"
    return f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{rest}s"


def who_decides(approval: PendingApproval) -> str:
    return ", ".join(approval.reviewers) or "anyone"


def approval_summary(approval: PendingApproval) -> str:
    """One line for ``status``: id, call, rule, who may decide, time left."""
    return (
        f"{approval.approval_id}  {describe_call(approval.tool, approval.args)}  rule={approval.rule or '-'}  "
        f"by={who_decides(approval)}  left={time_left(approval.expires_at)}"
    )


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _row(workflow_id: str, approval: PendingApproval) -> dict[str, Any]:
    return {"workflow_id": workflow_id, **approval.model_dump(), "time_left": time_left(approval.expires_at)}


def _given(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments the model actually set (unset optional ones are null): what a reviewer reads."""
    return {key: value for key, value in args.items() if value is not None}


def _line(row: dict[str, Any]) -> str:
    who = ", ".join(row["reviewers"]) or "anyone"
    return (
        f"{row['workflow_id']}  {row['approval_id']}  {row['tool']}  "
        f"{_truncate(canonical_json(_given(row['args'])), ARGS_WIDTH)}  rule={row['rule'] or '-'}  by={who}  "
        f"left={row['time_left']}"
    )


def decide_commands(workflow_id: str, approval_id: str, reviewer: str) -> tuple[str, str, str]:
    """Shell commands deciding ``approval_id``: the starter's approve (signed when so configured),
    Temporal's approve signal, and the starter's reject (its reason left to fill in)."""
    run, who = shlex.quote(workflow_id), shlex.quote(reviewer)
    signal_input = shlex.quote(json.dumps({"approval_id": approval_id, "reviewer": reviewer}))
    return (
        f"python starter.py approve {run} {approval_id} --reviewer {who}",
        f"temporal workflow signal --workflow-id {run} --name approve --input {signal_input}",
        f"python starter.py reject {run} {approval_id} --reviewer {who} --reason '...'",
    )


# --- reading a run -------------------------------------------------------------------


async def running_view(client: Client, workflow_id: str) -> tuple[str, StatusView | None]:
    """The run's state name and, while it runs, its status query answer."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no run with id {workflow_id!r}") from None
        raise
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return (desc.status.name.lower() if desc.status else "unknown"), None
    view = await query_status(handle)
    return view.state, view


async def query_status(handle: WorkflowHandle[Any, Any]) -> StatusView:
    try:
        view = await handle.query(AgentWorkflow.status, rpc_timeout=QUERY_TIMEOUT)
    except (RPCError, RPCTimeoutOrCancelledError) as err:
        raise CliError(f"run {handle.id} is running but no worker answered: {err}") from None
    return StatusView.model_validate(view)


async def _view_or_none(client: Client, workflow_id: str) -> StatusView | None:
    try:
        return (await running_view(client, workflow_id))[1]
    except CliError as err:
        print(f"warning: {err}", file=sys.stderr)
        return None


# --- commands ------------------------------------------------------------------------


async def cmd_pending(client: Client, args: argparse.Namespace) -> int:
    if args.workflow_id:
        state, view = await running_view(client, args.workflow_id)
        views = [(args.workflow_id, view)]
    else:
        ids = [wf.id async for wf in client.list_workflows(RUNNING_AGENTS, limit=50)]
        found = await asyncio.gather(*(_view_or_none(client, wid) for wid in ids))
        views = list(zip(ids, found, strict=True))
    rows = [_row(wid, approval) for wid, view in views if view for approval in view.pending_approvals]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        for row in rows:
            print(_line(row))
    elif args.workflow_id:
        print(f"run {args.workflow_id} has no pending approvals ({state})")
    else:
        print("no running run waits for an approval")
    return 0


async def cmd_approve(client: Client, args: argparse.Namespace) -> int:
    return await _decide_command(client, args, "approve", args.comment)


async def cmd_reject(client: Client, args: argparse.Namespace) -> int:
    if not args.reason.strip():
        raise CliError("reject needs a non-empty --reason (the model is told why)", code=2)
    return await _decide_command(client, args, "reject", args.reason)


async def cmd_resolve(client: Client, args: argparse.Namespace) -> int:
    return await _decide_command(client, args, args.resolution, args.comment)


async def _decide_command(client: Client, args: argparse.Namespace, decision: Decision, note: str) -> int:
    workflow_id, reviewer = args.workflow_id, args.reviewer.strip()
    if not reviewer:
        raise CliError("--reviewer must name who decides", code=2)
    state, view = await running_view(client, workflow_id)
    if view is None:
        raise CliError(f"run {workflow_id} is not running ({state}); there is nothing to {decision}")
    pending = {approval.approval_id: approval for approval in view.pending_approvals}
    if args.approval_id:
        approval_id = args.approval_id  # not pending: still sent, so the run itself says why it is refused
    elif not pending:
        raise CliError(f"run {workflow_id} has no pending approvals")
    elif len(pending) > 1:
        raise CliError(f"run {workflow_id} has {len(pending)} pending approvals; name one of: {', '.join(pending)}")
    else:
        approval_id = next(iter(pending))
    print(await send_decision(client, workflow_id, approval_id, decision, reviewer, note, pending.get(approval_id)))
    return 0


async def send_decision(
    client: Client,
    workflow_id: str,
    approval_id: str,
    decision: Decision,
    reviewer: str,
    note: str,
    approval: PendingApproval | None,
) -> str:
    """Send one decision by the ``decide`` update; the line to print when it took effect, else CliError."""
    key = os.environ.get("AGENT_APPROVAL_KEY", "").strip()
    expires_at = approval.expires_at if approval else ""
    request = DecideRequest(
        approval_id=approval_id,
        decision=decision,
        reviewer=reviewer,
        comment=note,
        signature=decision_signature(key.encode(), approval_id, decision, reviewer, expires_at) if key else "",
    )
    handle = client.get_workflow_handle(workflow_id)
    try:
        # cast: the SDK's overloads type an update decorated with a validator as returning a coroutine
        result = cast(
            DecideResult,
            await handle.execute_update(AgentWorkflow.decide_update, request, rpc_timeout=DECIDE_TIMEOUT),
        )
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        reason = cause.message if isinstance(cause, ApplicationError) else str(cause)
        raise CliError(f"refused: {reason}") from None
    except RPCTimeoutOrCancelledError:
        raise CliError(
            f"run {workflow_id}: no answer to the decision within {DECIDE_TIMEOUT.seconds}s (is a worker running?)"
        ) from None
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no running run with id {workflow_id!r}") from None
        raise
    if not result.accepted:
        raise CliError(f"refused: {result.message}")
    verb = {"approve": "approved", "reject": "rejected"}.get(decision, f"resolved ({decision})")
    what = f" ({describe_call(approval.tool, approval.args)})" if approval else ""
    why = f": {note}" if note else ""
    return f"{verb} {approval_id}{what} as {reviewer}{why}"


# --- reviewing while following a run ------------------------------------------------


class FollowReviewer:
    """Reacts once to each approval a followed run starts waiting for.

    On a terminal (stdin and stdout) it asks ``approve? [y/n/c=comment]`` and sends
    the answer; the prompt is read in a thread, so the follow loop keeps polling.
    Otherwise, or once stdin is closed, it prints the exact commands that decide it.
    """

    def __init__(self, client: Client, workflow_id: str, reviewer: str, *, interactive: bool) -> None:
        self.client, self.workflow_id, self.reviewer = client, workflow_id, reviewer
        self.interactive = interactive
        self.busy = False  # a prompt is open: the follow loop holds its progress lines
        self._seen: set[str] = set()
        self._queue: asyncio.Queue[PendingApproval] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def notice(self, approvals: list[PendingApproval]) -> None:
        for approval in approvals:
            if approval.approval_id in self._seen:
                continue
            self._seen.add(approval.approval_id)
            if not self.interactive:
                self._print_commands(approval)
                continue
            self._queue.put_nowait(approval)
            if self._task is None:
                self._task = asyncio.ensure_future(self._review_queue())

    async def close(self) -> None:
        if self.busy:
            print("\n(the run ended; the open approval prompt is closed)", flush=True)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _print_commands(self, approval: PendingApproval) -> None:
        print(
            f"approval needed: {approval.approval_id}  {describe_call(approval.tool, approval.args)}  "
            f"(rule {approval.rule or '-'}, may decide: {who_decides(approval)}, "
            f"expires in {time_left(approval.expires_at)})"
        )
        approve, signal, reject = decide_commands(self.workflow_id, approval.approval_id, self.reviewer)
        print(f"  approve: {approve}")
        print(f"       or: {signal}")
        if os.environ.get("AGENT_APPROVAL_KEY", "").strip():
            print("           (unsigned: refused by workers that require signed decisions)")
        print(f"   reject: {reject}", flush=True)

    async def _review_queue(self) -> None:
        while True:
            approval = await self._queue.get()
            if not self.interactive:
                self._print_commands(approval)
                continue
            self.busy = True
            try:
                await self._review(approval)
            except EOFError:
                print("\n(stdin closed: decide with the commands below)")
                self.interactive = False
                self._print_commands(approval)
            except (CliError, RPCError) as err:
                print(f"error: {err}", file=sys.stderr, flush=True)
            finally:
                self.busy = False

    async def _review(self, approval: PendingApproval) -> None:
        _, view = await running_view(self.client, self.workflow_id)
        if view is None or approval.approval_id not in {p.approval_id for p in view.pending_approvals}:
            print(f"approval {approval.approval_id} is no longer pending")
            return
        args = json.dumps(_given(approval.args), indent=2, ensure_ascii=False).replace("\n", "\n    ")
        print(f"\napproval needed: {approval.approval_id} (step {approval.step})")
        print(f"  tool: {approval.tool}\n  args:\n    {args}")
        left = time_left(approval.expires_at)
        print(f"  rule: {approval.rule or '-'}   may decide: {who_decides(approval)}   expires in: {left}", flush=True)
        decision: Decision
        while True:
            answer = (await _ask("approve? [y/n/c=comment] ")).strip().lower()
            if answer in ("y", "yes"):
                decision, note = "approve", ""
            elif answer in ("c", "comment"):
                decision, note = "approve", (await _ask("comment: ")).strip()
            elif answer in ("n", "no"):
                decision, note = "reject", ""
                while not note:
                    note = (await _ask("reason: ")).strip()
            else:
                continue
            break
        try:
            line = await send_decision(
                self.client, self.workflow_id, approval.approval_id, decision, self.reviewer, note, approval
            )
        except CliError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            approve, _, reject = decide_commands(self.workflow_id, approval.approval_id, "<reviewer>")
            print(f"  to decide it otherwise: {approve}\n                      or: {reject}", flush=True)
        else:
            print(line, flush=True)


async def _ask(prompt: str) -> str:
    return await asyncio.get_running_loop().run_in_executor(_PROMPTS, input, prompt)
