"""Inspecting and stopping runs: ``starter.py status`` / ``list`` / ``cancel``.

Each shows the agent's own status (``completed``, ``failed``, ``cancelled``,
``limit_exceeded``, ``waiting_approval`` ...), not Temporal's: a run that ends
``failed`` or ``cancelled`` still returns an ``AgentResult``, so Temporal says
``completed`` for it. ``status`` answers within seconds with no worker: it then
shows what the run last recorded (its search attributes) and says why no worker
answered.
"""

from __future__ import annotations

import argparse
from typing import Any

from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError

from activities.settings import Settings
from durable_agents.cli.approvals import QUERY_CONCURRENCY, approval_summary
from durable_agents.cli.common import (
    RPC_TIMEOUT,
    CliError,
    NoAnswer,
    ask_status,
    bounded,
    describe_run,
    ended_state,
    positive_int,
    print_json,
    recorded_state,
    temporal_state,
)
from workflows.progress import COST_USD, MODEL, PENDING_APPROVALS
from workflows.types import AgentResult, PendingApproval


def add_status_command(sub: argparse._SubParsersAction[Any]) -> None:
    status = sub.add_parser("status", help="show a run's state")
    status.add_argument("workflow_id")
    status.add_argument("--json", action="store_true")


def add_cancel_command(sub: argparse._SubParsersAction[Any]) -> None:
    cancel = sub.add_parser("cancel", help="cancel a run (its sandbox is cleaned up)")
    cancel.add_argument("workflow_id")


def add_list_command(sub: argparse._SubParsersAction[Any]) -> None:
    listing = sub.add_parser("list", help="recent runs")
    listing.add_argument("--limit", type=positive_int, default=20)
    listing.add_argument("--json", action="store_true")


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
        data = {
            "workflow_id": args.workflow_id,
            "state": result.status,
            "step": result.steps,
            "usage": result.usage.model_dump(),
            "output": result.output,
        }
    else:
        data = {"workflow_id": args.workflow_id, "state": temporal_state(desc.status)}
        reason = await _why_it_ended(client, desc)
        if reason:
            data["error"] = reason
    _show(data, args.json)
    if problem:
        raise CliError(problem)
    return 0


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
                print(f"{'':>20}{approval_summary(PendingApproval.model_validate(approval))}")
        elif key == "refused":
            for index, message in enumerate(value[-5:]):
                print(f"{key if index == 0 else '':>18}{':' if index == 0 else ' '} {message}")
        else:
            print(f"{key:>18}: {value}")


async def cmd_cancel(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    handle, desc = await describe_run(client, args.workflow_id)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        state = await ended_state(client, desc.id, desc.run_id, desc.status, desc.typed_search_attributes)
        raise CliError(f"run {args.workflow_id} has already ended: {state}")
    await handle.cancel()
    print(f"cancellation requested for {args.workflow_id}")
    return 0


async def cmd_list(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    executions = [wf async for wf in client.list_workflows("WorkflowType = 'AgentWorkflow'", limit=args.limit)]
    states = await bounded((_agent_state(client, wf) for wf in executions), QUERY_CONCURRENCY)
    rows = [
        {
            "workflow_id": wf.id,
            "run_id": wf.run_id,
            "status": state,
            "execution_status": temporal_state(wf.status),
            "started": wf.start_time.isoformat(timespec="seconds"),
        }
        for wf, state in zip(executions, states, strict=True)
    ]
    if args.json:
        print_json(rows)
    elif not rows:
        print("no runs yet")
    else:
        for row in rows:
            print(f"{row['started']}  {row['status']:<18} {row['workflow_id']}")
    return 0


async def _agent_state(client: Client, wf: WorkflowExecution) -> str:
    """The agent's state of a listed run: its ``AgentState`` attribute, else (closed runs) its result."""
    if wf.status == WorkflowExecutionStatus.RUNNING:
        return recorded_state(wf.typed_search_attributes) or "running"
    return await ended_state(client, wf.id, wf.run_id, wf.status, wf.typed_search_attributes)
