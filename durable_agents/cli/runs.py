"""Inspecting and stopping runs: ``starter.py status`` / ``list`` / ``cancel``."""

from __future__ import annotations

import argparse
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from activities.settings import Settings
from durable_agents.cli.approvals import approval_summary
from durable_agents.cli.common import CliError, describe_run, positive_int, print_json
from workflows.agent import AgentWorkflow
from workflows.types import AgentResult, PendingApproval, StatusView


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
    if desc.status == WorkflowExecutionStatus.RUNNING:
        try:
            view = await handle.query(AgentWorkflow.status)
        except RPCError as err:
            raise CliError(f"run {args.workflow_id} is running but no worker answered: {err.message}") from None
        data = {"workflow_id": args.workflow_id, **StatusView.model_validate(view).model_dump()}
    elif desc.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CONTINUED_AS_NEW):
        result = await client.get_workflow_handle(args.workflow_id, result_type=AgentResult).result()
        data = {
            "workflow_id": args.workflow_id,
            "state": result.status,
            "step": result.steps,
            "usage": result.usage.model_dump(),
            "output": result.output,
        }
    else:
        data = {"workflow_id": args.workflow_id, "state": desc.status.name.lower() if desc.status else "unknown"}
    if args.json:
        print_json(data)
        return 0
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
    return 0


async def cmd_cancel(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    handle, desc = await describe_run(client, args.workflow_id)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        state = desc.status.name.lower() if desc.status else "unknown"
        raise CliError(f"run {args.workflow_id} is not running ({state})")
    await handle.cancel()
    print(f"cancellation requested for {args.workflow_id}")
    return 0


async def cmd_list(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    rows = []
    async for wf in client.list_workflows("WorkflowType = 'AgentWorkflow'", limit=args.limit):
        rows.append(
            {
                "workflow_id": wf.id,
                "run_id": wf.run_id,
                "status": wf.status.name.lower() if wf.status else "unknown",
                "started": wf.start_time.isoformat(timespec="seconds"),
            }
        )
    if args.json:
        print_json(rows)
    elif not rows:
        print("no runs yet")
    else:
        for row in rows:
            print(f"{row['started']}  {row['status']:<18} {row['workflow_id']}")
    return 0
