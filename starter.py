"""Command line for agent runs: run / status / approve / reject / pending / cancel / list.

    python starter.py run "Summarise https://example.com" --follow [--approver alice] [--policy FILE]
    python starter.py watch RUN_ID [--json] [--from N]
    python starter.py status RUN_ID [--json]
    python starter.py pending [RUN_ID] [--json]
    python starter.py approve RUN_ID [APPROVAL_ID] --reviewer alice [--comment TEXT]
    python starter.py reject RUN_ID [APPROVAL_ID] --reviewer alice --reason TEXT
    python starter.py cancel RUN_ID
    python starter.py list

``run --follow`` prints the run's progress events as they happen (the run's
durable progress stream, as ``watch`` does) and asks for each approval the run
waits for when it runs on a terminal, and otherwise prints the exact commands
that decide it. With ``AGENT_APPROVAL_KEY`` set, decisions are signed. The
approval commands live in ``durable_agents/approvals_cli.py``, the progress
rendering in ``durable_agents/watch.py``.

Every failure is one line on stderr and a non-zero exit: 2 for bad arguments
or an unreachable server, 1 for a run that does not exist or did not complete.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from durable_agents import approvals_cli, logs, telemetry
from durable_agents.approvals_cli import CliError
from durable_agents.client import TemporalUnavailable, connect, exit_process
from durable_agents.run_cli import cmd_run, print_json
from durable_agents.watch import watch
from workflows.agent import AgentWorkflow
from workflows.types import AgentResult, PendingApproval, StatusView

SECRET_VARIABLES = ("AGENT_APPROVAL_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "E2B_API_KEY")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CliError(f"{self.prog}: {message} (see --help)", code=2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="starter.py", description="Start and inspect durable agent runs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="start an agent run")
    run.add_argument("task", help="what the agent should do")
    run.add_argument("--model", default=os.environ.get("AGENT_MODEL", ""), help="e.g. openai:gpt-4o-mini")
    run.add_argument("--id", dest="workflow_id", help="workflow id (default: agent-<random>)")
    run.add_argument("--max-steps", type=_positive_int, help="model turns before limit_exceeded")
    run.add_argument("--timeout", type=_positive_int, dest="timeout_s", help="run deadline in seconds")
    run.add_argument("--tools", type=_name_list, help="comma-separated tool names (default: all)")
    run.add_argument("--tenant", default="", help="tenant label for the run")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--wait", action="store_true", help="wait for the result")
    mode.add_argument("--follow", action="store_true", help="show progress until the run ends")
    run.add_argument("--json", action="store_true", help="print machine-readable JSON")
    approvals_cli.add_run_options(run)

    watching = sub.add_parser("watch", help="stream a run's progress events until it ends")
    watching.add_argument("workflow_id")
    watching.add_argument("--json", action="store_true", help="one JSON object per event (ProgressEvent)")
    watching.add_argument(
        "--from", dest="from_offset", type=_offset, default=0, metavar="N", help="start at event offset N (default 0)"
    )

    status = sub.add_parser("status", help="show a run's state")
    status.add_argument("workflow_id")
    status.add_argument("--json", action="store_true")

    approvals_cli.add_commands(sub)

    cancel = sub.add_parser("cancel", help="cancel a run (its sandbox is cleaned up)")
    cancel.add_argument("workflow_id")

    sandboxes = sub.add_parser("sandboxes", help="sandbox housekeeping")
    sandboxes_sub = sandboxes.add_subparsers(dest="sandboxes_command", required=True, parser_class=_Parser)
    reap_parser = sandboxes_sub.add_parser("reap", help="kill sandboxes whose run has ended")
    reap_parser.add_argument("--min-age", type=_positive_int, default=60, help="keep sandboxes younger than this (s)")

    listing = sub.add_parser("list", help="recent runs")
    listing.add_argument("--limit", type=_positive_int, default=20)
    listing.add_argument("--json", action="store_true")
    return parser


def _int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_offset = _int_at_least(0, "an offset (0 or more)")


def _name_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected at least one tool name")
    return names


async def _describe(client: Client, workflow_id: str) -> Any:
    handle = client.get_workflow_handle(workflow_id)
    try:
        return handle, await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no run with id {workflow_id!r}") from None
        raise


async def cmd_watch(client: Client, args: argparse.Namespace) -> int:
    _, desc = await _describe(client, args.workflow_id)  # a missing run is a one-line error, not a hang
    try:
        await watch(client, args.workflow_id, json_lines=args.json, from_offset=args.from_offset)
    except (WorkflowQueryFailedError, WorkflowUpdateFailedError) as err:
        raise CliError(f"cannot read the progress of {args.workflow_id}: {err.cause or err}") from None
    except RPCError as err:
        hint = (
            f" (the run has ended; its progress is read from a worker on task queue {desc.task_queue})"
            if desc.status != WorkflowExecutionStatus.RUNNING
            else ""
        )
        raise CliError(f"cannot read the progress of {args.workflow_id}: {err.message}{hint}") from None
    return 0


async def cmd_status(client: Client, args: argparse.Namespace) -> int:
    handle, desc = await _describe(client, args.workflow_id)
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
                print(f"{'':>20}{approvals_cli.approval_summary(PendingApproval.model_validate(approval))}")
        elif key == "refused":
            for index, message in enumerate(value[-5:]):
                print(f"{key if index == 0 else '':>18}{':' if index == 0 else ' '} {message}")
        else:
            print(f"{key:>18}: {value}")
    return 0


async def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    handle, desc = await _describe(client, args.workflow_id)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        raise CliError(f"run {args.workflow_id} is not running ({desc.status.name.lower()})")
    await handle.cancel()
    print(f"cancellation requested for {args.workflow_id}")
    return 0


async def cmd_list(client: Client, args: argparse.Namespace) -> int:
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


async def cmd_sandboxes(client: Client, args: argparse.Namespace) -> int:
    """Reap with this machine's sandbox configuration (AGENT_SANDBOX, AGENT_STATE_DIR, E2B_API_KEY)."""
    from activities.config import Settings
    from activities.sandbox.base import SandboxUnavailable
    from activities.sandbox.factory import backend_for
    from durable_agents.reaping import reap_once

    try:
        backend = backend_for(Settings.from_env())
    except SandboxUnavailable as err:
        raise CliError(str(err), code=2) from None
    report = await reap_once(client, backend, min_age_s=args.min_age)
    print(report.summary())
    return 1 if report.errors else 0


COMMANDS = {
    "run": cmd_run,
    "watch": cmd_watch,
    "status": cmd_status,
    "approve": approvals_cli.cmd_approve,
    "sandboxes": cmd_sandboxes,
    "reject": approvals_cli.cmd_reject,
    "resolve": approvals_cli.cmd_resolve,
    "pending": approvals_cli.cmd_pending,
    "cancel": cmd_cancel,
    "list": cmd_list,
}


async def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        # Library warnings only, on stderr: stdout is the command's output.
        logs.configure(level="WARNING", secrets=[os.environ.get(name, "") for name in SECRET_VARIABLES])
        telemetry.configure_tracing("durable-agents-starter")
        client = await connect(plugins=telemetry.temporal_plugins())
        return await COMMANDS[args.command](client, args)
    except CliError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
    except TemporalUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RPCError as err:
        print(f"error: Temporal refused the request: {err.message}", file=sys.stderr)
        return 1
    finally:
        telemetry.shutdown_tracing()  # the process leaves through os._exit: flush spans first


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
