"""Inspecting and stopping runs: ``starter.py status`` / ``list`` / ``cancel``.

Each shows the agent's own status (``completed``, ``failed``, ``cancelled``,
``limit_exceeded``, ``waiting_approval`` ...), not Temporal's: a run that ends
``failed`` or ``cancelled`` still returns an ``AgentResult``, so Temporal says
``completed`` for it (with ``AGENT_FAIL_WORKFLOW_ON_ERROR=1`` a failed or
limit_exceeded run fails its workflow instead: its result is read from the
failure's details and shown the same way). ``status`` answers within seconds with no worker: it then
shows what the run last recorded (its search attributes) and says why no worker
answered.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, get_args

from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError, RPCStatusCode

from activities.crypto.codec import PayloadsEncrypted
from activities.settings import Settings
from durable_agents.cli.approval_text import approval_summary, decision_line, remembered_line
from durable_agents.cli.approvals import QUERY_CONCURRENCY
from durable_agents.cli.common import (
    EXIT_USAGE,
    RPC_TIMEOUT,
    VISIBILITY_PAGE,
    CliError,
    NoAnswer,
    ask_status,
    bounded,
    closed_result,
    describe_run,
    ended_state,
    list_runs,
    positive_int,
    print_json,
    query_literal,
    raise_if_cancelled,
    recorded_state,
    temporal_state,
)
from durable_agents.cli.sessions import session_marker, session_of
from workflows.progress import COST_USD, MODEL, PENDING_APPROVALS, STATE, TENANT
from workflows.types import AgentResult, DecisionRecord, PendingApproval, RememberedApproval, RunState

LIST_LIMIT = 50  # runs `list` shows by default (it says how many more there are)
RUN_STATES: tuple[str, ...] = get_args(RunState)
OPEN_STATES = ("running", "waiting_approval", "waiting_human")  # recorded by runs that still run


def add_status_command(sub: argparse._SubParsersAction[Any]) -> None:
    status = sub.add_parser("status", help="show a run's state")
    status.add_argument("workflow_id")
    status.add_argument("--json", action="store_true")


def add_cancel_command(sub: argparse._SubParsersAction[Any]) -> None:
    cancel = sub.add_parser("cancel", help="cancel a run (its sandbox is cleaned up)")
    cancel.add_argument("workflow_id")


def add_list_command(sub: argparse._SubParsersAction[Any]) -> None:
    listing = sub.add_parser(
        "list", help="recent runs: open ones, then the latest closed (filters need the Agent* search attributes)"
    )
    listing.add_argument("--state", choices=RUN_STATES, help="only runs in this agent state")
    listing.add_argument("--tenant", type=_tenant, help="only runs of this tenant (run --tenant)")
    listing.add_argument(
        "--limit",
        type=positive_int,
        default=LIST_LIMIT,
        help=f"show at most this many runs (default: {LIST_LIMIT}); says how many more there are",
    )
    listing.add_argument("--json", action="store_true")


def _tenant(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a tenant name")
    return text


def list_query(state: str | None, tenant: str | None) -> str:
    """The visibility query of ``list``: agent runs (not the closed runs a continue-as-new left), filtered.

    Filter values are quoted with :func:`query_literal`: a tenant is user input.
    A ``running``, ``waiting_approval`` or ``waiting_human`` run is one that still runs (a run that was
    terminated keeps the state it last recorded).
    """
    clauses = ["WorkflowType = 'AgentWorkflow'", "ExecutionStatus != 'ContinuedAsNew'"]
    if state:
        clauses.append(f"{STATE.name} = {query_literal(state)}")
        if state in OPEN_STATES:
            clauses.append("ExecutionStatus = 'Running'")
    if tenant:
        clauses.append(f"{TENANT.name} = {query_literal(tenant)}")
    return " AND ".join(clauses)


async def cmd_status(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    handle, desc = await describe_run(client, args.workflow_id)
    problem = ""
    if desc.status == WorkflowExecutionStatus.RUNNING:
        try:
            view = await ask_status(client, handle, desc)
            data = {"workflow_id": args.workflow_id, **view.model_dump()}
        except NoAnswer as err:
            data = _recorded(desc)
            problem = f"run {args.workflow_id} is running but {err}; shown is what the run last recorded"
    elif desc.status == WorkflowExecutionStatus.COMPLETED:
        result = await client.get_workflow_handle(args.workflow_id, run_id=desc.run_id, result_type=AgentResult).result(
            follow_runs=False, rpc_timeout=RPC_TIMEOUT
        )
        data = _result_data(args.workflow_id, result)
    elif desc.status == WorkflowExecutionStatus.FAILED and (
        failed := await closed_result(client, args.workflow_id, desc.run_id)
    ):
        # Started with AGENT_FAIL_WORKFLOW_ON_ERROR=1 and ended failed or limit_exceeded: its result is in the
        # failure; shown as the same run would be had it completed its workflow.
        data = _result_data(args.workflow_id, failed)
    else:
        data = {"workflow_id": args.workflow_id, "state": temporal_state(desc.status)}
        reason = await _why_it_ended(client, desc)
        if reason:
            data["error"] = reason
    _show(data, args.json)
    if problem:
        raise CliError(problem)
    return 0


def _result_data(workflow_id: str, result: AgentResult) -> dict[str, Any]:
    return {
        "workflow_id": workflow_id,
        "state": result.status,
        "step": result.steps,
        "usage": result.usage.model_dump(),
        "output": result.output,
        "decisions": [record.model_dump() for record in result.decisions],
    }


def _recorded(desc: WorkflowExecutionDescription) -> dict[str, Any]:
    """What the server knows of a running run without a worker: its search attributes and where it runs."""
    attributes = desc.typed_search_attributes
    data: dict[str, Any] = {"workflow_id": desc.id, "state": recorded_state(attributes) or "running"}
    pending = attributes.get(PENDING_APPROVALS)
    if pending is not None:
        data["pending_approval_count"] = pending
    if model := attributes.get(MODEL):
        data["model"] = model
    if (cost := attributes.get(COST_USD)) is not None:
        data["cost_usd"] = cost
    data["task_queue"] = desc.task_queue
    data["started"] = desc.start_time.isoformat(timespec="seconds")
    data["answered_by_worker"] = False
    return data


async def _why_it_ended(client: Client, desc: WorkflowExecutionDescription) -> str:
    """The failure of a run that ended without a result (failed, timed out, terminated); empty if none."""
    handle = client.get_workflow_handle(desc.id, run_id=desc.run_id)
    try:
        await handle.result(follow_runs=False, rpc_timeout=RPC_TIMEOUT)
    except WorkflowFailureError as err:
        return str(err.cause or err)
    except (RPCError, RPCTimeoutOrCancelledError, TemporalError):
        raise_if_cancelled()
        return ""
    return ""


def _show(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(data)
        return
    for key, value in data.items():
        if key == "pending_approvals":
            print(f"{key:>18}: {len(value) or 'none'}")
            for approval in value:
                for line in approval_summary(PendingApproval.model_validate(approval)):
                    print(f"{'':>20}{line}")
        elif key == "decisions":
            total = data.get("decisions_total", len(value))
            shown = f" (the newest {len(value)} of {total})" if total > len(value) else ""
            print(f"{key:>18}: {total or 'none'}{shown}")
            for record in value:
                print(f"{'':>20}{decision_line(DecisionRecord.model_validate(record))}")
        elif key == "remembered":
            print(f"{key:>18}: {len(value) or 'none'}")
            for entry in value:
                print(f"{'':>20}{remembered_line(RememberedApproval.model_validate(entry))}")
        elif key == "decisions_total":
            continue  # with the decisions
        elif key in ("refused", "notes"):
            for index, message in enumerate(value[-5:] if key == "refused" else value):
                print(f"{key if index == 0 else '':>18}{':' if index == 0 else ' '} {message}")
        elif key == "cost_tracked":
            if not value:
                print(f"{'cost':>18}: not tracked (the model has no price): set AGENT_PRICES")
        else:
            print(f"{key:>18}: {_text(key, value)}")


def _text(key: str, value: Any) -> str:
    """A status value as text: usage as tokens and cost, other objects and lists as their items."""
    if isinstance(value, dict) and key.endswith("usage"):
        cost = float(value.get("cost_usd") or 0)
        return f"{value.get('input_tokens', 0)} in / {value.get('output_tokens', 0)} out tokens, ${cost:.4f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    return str(value)


async def cmd_cancel(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    handle, desc = await describe_run(client, args.workflow_id)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        state = await ended_state(client, desc.id, desc.run_id, desc.status, desc.typed_search_attributes)
        raise CliError(f"run {args.workflow_id} has already ended: {state}")
    await handle.cancel()
    print(f"cancellation requested for {args.workflow_id}")
    return 0


async def cmd_list(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    query = list_query(args.state, args.tenant)
    try:
        executions, total = await list_runs(client, query, args.limit, page_size=min(args.limit, VISIBILITY_PAGE))
    except RPCError as err:
        if err.status != RPCStatusCode.INVALID_ARGUMENT or not (args.state or args.tenant):
            raise
        raise CliError(
            f"this namespace cannot filter by --state/--tenant ({err.message}); register the Agent* search "
            "attributes (see docs/operations.md)",
            code=EXIT_USAGE,
        ) from None
    states = await bounded((_agent_state(client, wf) for wf in executions), QUERY_CONCURRENCY)
    sessions = await bounded((session_of(client, wf) for wf in executions), QUERY_CONCURRENCY)
    rows = [
        {
            "workflow_id": wf.id,
            "run_id": wf.run_id,
            "status": session.state or state,
            "execution_status": temporal_state(wf.status),
            "tenant": wf.typed_search_attributes.get(TENANT) or "",
            "started": wf.start_time.isoformat(timespec="seconds"),
            "session": session.session,
            "messages": session.messages,
        }
        for wf, state, session in zip(executions, states, sessions, strict=True)
    ]
    more = _more_line(len(rows), total)
    if args.json:
        print_json(rows)
        if more:
            print(more, file=sys.stderr)  # stdout stays JSON
        return 0
    if not rows:
        print("no matching runs" if args.state or args.tenant else "no runs yet")
    for row in rows:
        print(f"{row['started']}  {row['status']:<18} {row['workflow_id']}{session_marker(row)}")
    if more:
        print(more)
    return 0


def _more_line(shown: int, total: int | None) -> str:
    if total is None:
        return f"... {shown} shown; more runs match (--limit shows more)"
    if total > shown:
        return f"... {shown} of {total} shown; {total - shown} more (--limit {total} shows them all)"
    return ""


async def _agent_state(client: Client, wf: WorkflowExecution) -> str:
    """The agent's state of a listed run: its ``AgentState`` attribute, else (closed runs) its result."""
    if wf.status == WorkflowExecutionStatus.RUNNING:
        return recorded_state(wf.typed_search_attributes) or "running"
    try:
        return await ended_state(client, wf.id, wf.run_id, wf.status, wf.typed_search_attributes)
    except PayloadsEncrypted:  # one run this CLI has no keys for does not stop the listing: Temporal's word for it
        return temporal_state(wf.status)
