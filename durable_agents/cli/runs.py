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

from temporalio.client import Client

from activities.settings import Settings
from durable_agents.agent_client._listing import OPEN_STATES, list_query
from durable_agents.agent_client._types import RunDescription
from durable_agents.cli.approval_text import approval_summary, decision_line, remembered_line
from durable_agents.cli.common import CliError, agent_client, client_errors, positive_int, print_json
from durable_agents.cli.sessions import session_marker
from workflows.types import AgentResult, DecisionRecord, PendingApproval, RememberedApproval, RunState

LIST_LIMIT = 50  # runs `list` shows by default (it says how many more there are)
RUN_STATES: tuple[str, ...] = get_args(RunState)


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


@client_errors
async def cmd_status(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    described = await agent_client(client, settings).describe(args.workflow_id)
    problem = ""
    if described.view is not None:
        data = {"workflow_id": args.workflow_id, **described.view.model_dump()}
    elif described.no_answer:
        data = _recorded(described)
        problem = f"run {args.workflow_id} is running but {described.no_answer}; shown is what the run last recorded"
    elif described.result is not None:
        # A run started with AGENT_FAIL_WORKFLOW_ON_ERROR=1 that ended failed or limit_exceeded has its result in
        # the failure: shown as the same run would be had it completed its workflow.
        data = _result_data(args.workflow_id, described.result)
    else:
        data = {"workflow_id": args.workflow_id, "state": described.state}
        if described.error:
            data["error"] = described.error
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


def _recorded(described: RunDescription) -> dict[str, Any]:
    """What the server knows of a running run without a worker: its search attributes and where it runs."""
    data: dict[str, Any] = {"workflow_id": described.workflow_id, "state": described.state}
    if described.pending_approval_count is not None:
        data["pending_approval_count"] = described.pending_approval_count
    if described.model:
        data["model"] = described.model
    if described.cost_usd is not None:
        data["cost_usd"] = described.cost_usd
    data["task_queue"] = described.task_queue
    data["started"] = described.started_at
    data["answered_by_worker"] = False
    return data


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


@client_errors
async def cmd_cancel(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    await agent_client(client, settings).cancel(args.workflow_id)
    print(f"cancellation requested for {args.workflow_id}")
    return 0


@client_errors
async def cmd_list(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    agents = agent_client(client, settings)
    if args.tenant:
        agents = agents.for_tenant(args.tenant)
    page = await agents.list_page(state=args.state, limit=args.limit)
    rows = [
        {
            "workflow_id": run.workflow_id,
            "run_id": run.run_id,
            "status": run.state,
            "execution_status": run.execution_status,
            "tenant": run.tenant,
            "started": run.started_at,
            "session": run.session,
            "messages": run.messages,
        }
        for run in page.runs
    ]
    more = _more_line(len(rows), page.total)
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


__all__ = [
    "OPEN_STATES",
    "add_cancel_command",
    "add_list_command",
    "add_status_command",
    "cmd_cancel",
    "cmd_list",
    "cmd_status",
    "list_query",
]
