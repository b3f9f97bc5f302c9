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
import json
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from durable_agents import approvals_cli, logs, telemetry
from durable_agents.approvals_cli import QUERY_TIMEOUT, CliError, FollowReviewer
from durable_agents.client import TemporalUnavailable, connect, exit_process
from durable_agents.watch import EventPrinter, events, mode_for, watch
from workflows.agent import AgentWorkflow
from workflows.progress import ProgressEvent
from workflows.types import AgentInput, AgentResult, Limits, PendingApproval, StatusView

TERMINAL = {"completed", "failed", "cancelled", "limit_exceeded"}
SUMMARY_CHARS = 120
DETAILS_TASK_CHARS = 2000
SECRET_VARIABLES = ("AGENT_APPROVAL_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "E2B_API_KEY")
DRAIN_S = 5.0  # after the result: how long the progress stream may take to deliver its last events


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


def ui_link(client: Client, workflow_id: str, run_id: str | None) -> str:
    base = os.environ.get("TEMPORAL_UI_URL", "http://localhost:8233").rstrip("/")
    return f"{base}/namespaces/{client.namespace}/workflows/{workflow_id}/{run_id or ''}".rstrip("/")


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


async def cmd_run(client: Client, args: argparse.Namespace) -> int:
    limits = Limits()
    if args.max_steps:
        limits.max_steps = args.max_steps
    if args.timeout_s:
        limits.timeout_s = args.timeout_s
    inp = AgentInput(
        task=args.task,
        model=args.model,
        tools=args.tools,
        limits=limits,
        tenant=args.tenant,
        approvers=args.approvers,
        policy=approvals_cli.load_run_policy(args.policy_file),
    )
    workflow_id = args.workflow_id or f"agent-{uuid.uuid4().hex[:12]}"
    task_queue = os.environ.get("AGENT_TASK_QUEUE", "agents")
    try:
        handle = await client.start_workflow(
            AgentWorkflow.run,
            inp,
            id=workflow_id,
            task_queue=task_queue,
            static_summary=static_summary(inp),
            static_details=static_details(inp),
        )
    except RPCError as err:
        if err.status == RPCStatusCode.ALREADY_EXISTS:
            raise CliError(f"a run with id {workflow_id!r} is already running") from None
        raise
    if not args.json:
        print(f"started run {workflow_id} on task queue {task_queue}")
        print(f"  ui: {ui_link(client, workflow_id, handle.result_run_id)}")
    if not (args.wait or args.follow):
        if args.json:
            _print_json({"workflow_id": workflow_id, "run_id": handle.result_run_id})
        return 0
    reviewer = None
    if args.follow and not args.json:
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
        reviewer = FollowReviewer(client, workflow_id, args.reviewer, interactive=interactive)
    result = await _follow(client, handle, quiet=args.json or not args.follow, reviewer=reviewer)
    return _report(result, args.json, handle, client)


def static_summary(inp: AgentInput) -> str:
    """The run list's one line: the task, on one line, trimmed."""
    task = " ".join(inp.task.split())
    return task if len(task) <= SUMMARY_CHARS else task[: SUMMARY_CHARS - 1] + "…"


def static_details(inp: AgentInput) -> str:
    """Markdown shown on the run's page: the task, the model and the limits it runs under."""
    task = inp.task if len(inp.task) <= DETAILS_TASK_CHARS else inp.task[:DETAILS_TASK_CHARS] + "…"
    limits = inp.limits
    lines = [
        "**task**",
        "",
        *(f"> {line}" if line else ">" for line in task.splitlines()),
        "",
        f"**model** {inp.model or 'the worker default (AGENT_MODEL)'}",
        "",
        f"**limits** {limits.max_steps} steps · {limits.max_tokens} tokens · ${limits.max_cost_usd:g}"
        f" · {limits.timeout_s} s",
        "",
        f"**tools** {', '.join(inp.tools) if inp.tools is not None else 'all registered'}",
    ]
    if inp.tenant:
        lines += ["", f"**tenant** {inp.tenant}"]
    if inp.approvers:
        lines += ["", f"**approvers** {', '.join(inp.approvers)}"]
    if inp.policy:
        lines += ["", f"**run policy** {len(inp.policy.get('rules', []))} rule(s)"]
    return "\n".join(lines)


async def _follow(
    client: Client, handle: WorkflowHandle[Any, AgentResult], *, quiet: bool, reviewer: FollowReviewer | None = None
) -> AgentResult:
    """Wait for the result; unless quiet, print the run's progress events as they happen.

    A reviewer is shown every approval the run starts waiting for (it prompts or prints commands).
    """
    try:
        if quiet:
            return await _result(handle, asyncio.ensure_future(handle.result()))
        return await _follow_stream(client, handle, reviewer=reviewer)
    finally:
        if reviewer is not None:
            await reviewer.close()


async def _result(handle: WorkflowHandle[Any, AgentResult], result_task: asyncio.Future[AgentResult]) -> AgentResult:
    try:
        return await result_task
    except WorkflowFailureError as err:
        raise CliError(f"run {handle.id} failed: {err.cause}") from None


class _FollowPrinter:
    """Progress lines for ``run --follow``: held while an approval prompt is open, then printed in order."""

    def __init__(self, handle: WorkflowHandle[Any, AgentResult], reviewer: FollowReviewer | None) -> None:
        self.handle, self.reviewer = handle, reviewer
        self.printer = EventPrinter(handle.id, mode=mode_for(False, sys.stdout), show_commands=False)
        self.held: list[tuple[int, ProgressEvent]] = []
        self.announced = False

    async def on_event(self, offset: int, event: ProgressEvent) -> None:
        if event.kind == "started" and not self.announced:
            await self._announce_model()
        self.held.append((offset, event))
        self.flush()
        if event.kind == "approval_requested" and self.reviewer is not None:
            view = await self._status()
            if view is not None:
                self.reviewer.notice(view.pending_approvals)

    def flush(self, *, force: bool = False) -> None:
        if self.reviewer is not None and self.reviewer.busy and not force:
            return
        held, self.held = self.held, []
        for offset, event in held:
            self.printer(offset, event)

    async def _status(self) -> StatusView | None:
        try:
            return StatusView.model_validate(await self.handle.query(AgentWorkflow.status, rpc_timeout=QUERY_TIMEOUT))
        except (RPCError, RPCTimeoutOrCancelledError):
            return None

    async def _announce_model(self) -> None:
        self.announced = True
        view = await self._status()
        if view is not None and view.model:
            note = (
                "  (offline deterministic model: no model API key configured)"
                if view.model.startswith("scripted:")
                else ""
            )
            print(f"model: {view.model}{note}", flush=True)


async def _follow_stream(
    client: Client, handle: WorkflowHandle[Any, AgentResult], *, reviewer: FollowReviewer | None
) -> AgentResult:
    result_task = asyncio.ensure_future(handle.result())
    printer = _FollowPrinter(handle, reviewer)

    async def pump() -> None:
        async for offset, event in events(client, handle.id):
            await printer.on_event(offset, event)

    watcher = asyncio.ensure_future(pump())
    while not result_task.done():
        waiting: set[asyncio.Future[Any]] = {result_task} if watcher.done() else {result_task, watcher}
        await asyncio.wait(waiting, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
        printer.flush()
        if watcher.done() and not watcher.cancelled() and watcher.exception() is not None:
            print(
                f"warning: progress stream unavailable ({watcher.exception()}); polling the run's status",
                file=sys.stderr,
            )
            return await _poll_loop(handle, result_task, reviewer=reviewer)
    if not watcher.done():
        await asyncio.wait({watcher}, timeout=DRAIN_S)  # the run's last events are on their way
        watcher.cancel()
    [ended] = await asyncio.gather(watcher, return_exceptions=True)
    if isinstance(ended, Exception):
        print(f"warning: the progress stream ended early ({ended}); progress lines may be missing", file=sys.stderr)
    if reviewer is not None:
        await reviewer.close()
    printer.flush(force=True)
    return await _result(handle, result_task)


async def _poll_loop(
    handle: WorkflowHandle[Any, AgentResult],
    result_task: asyncio.Future[AgentResult],
    *,
    reviewer: FollowReviewer | None,
) -> AgentResult:
    """The fallback when the progress stream cannot be read: print the changes the status query shows."""
    last = ""
    while not result_task.done():
        try:
            view = await handle.query(AgentWorkflow.status)
        except RPCError:
            view = None  # no worker polling yet, or the run just closed
        if view is not None and not (reviewer is not None and reviewer.busy):
            line = f"[step {view.step}] {view.state}: {view.last_event}"
            if line != last:
                print(line, flush=True)
                last = line
        if view is not None and reviewer is not None:
            reviewer.notice(view.pending_approvals)
        await asyncio.wait({result_task}, timeout=0.5)
    return await _result(handle, result_task)


def _report(result: AgentResult, as_json: bool, handle: WorkflowHandle[Any, Any], client: Client) -> int:
    if as_json:
        _print_json({"workflow_id": handle.id, **result.model_dump()})
    else:
        print(
            f"\nstatus: {result.status}   steps: {result.steps}   tokens: "
            f"{result.usage.input_tokens} in / {result.usage.output_tokens} out   cost: ${result.usage.cost_usd:.4f}"
        )
        print(f"\n{result.output}\n")
        print(f"run id: {handle.id}")
        print(f"ui:     {ui_link(client, handle.id, None)}")
    return 0 if result.status == "completed" else 1


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
        _print_json(data)
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
        _print_json(rows)
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
