"""``starter.py run``: start a run, then wait, or follow its progress and approvals until it ends."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.service import RPCError

from activities.settings import Settings
from durable_agents.agent_client._errors import AgentClientError
from durable_agents.agent_client._starting import start_agent_run as _start_agent_run
from durable_agents.agent_client._starting import static_details as static_details
from durable_agents.agent_client._starting import static_summary as static_summary
from durable_agents.cli.approvals import add_run_options, json_object_file, load_run_policy
from durable_agents.cli.common import (
    EXIT_USAGE,
    QUERY_TIMEOUT,
    QUICK_QUERY_TIMEOUT,
    RPC_TIMEOUT,
    CliError,
    cli_command,
    cli_error,
    following,
    name_list,
    on_interrupt,
    positive_int,
    print_json,
    raise_if_cancelled,
    temporal_lost,
    warn_when_no_worker,
)
from durable_agents.cli.names import check_model, check_tools
from durable_agents.cli.review import FollowReviewer
from durable_agents.cli.tokens import TokenPrinter
from durable_agents.cli.watch import ASKING, POLL_COOLDOWN, EventPrinter, events, mode_for, watch_child
from workflows.agent import AgentWorkflow
from workflows.progress import MODEL, ProgressEvent
from workflows.run_failure import result_of_failure
from workflows.typed_output import MAX_OUTPUT_SCHEMA_BYTES
from workflows.types import AgentInput, AgentResult, Limits, StatusView

DRAIN_S = 5.0  # after the result: how long the progress stream may take to deliver its last events
MAX_TASK_BYTES = 1024 * 1024  # a run's input travels in one Temporal payload (2 MB by default)
WAITING = "keeps waiting (Ctrl-C stops waiting, not the run)"


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    run = sub.add_parser("run", help="start an agent run")
    run.add_argument("task", nargs="?", help="what the agent should do (or --task-file)")
    run.add_argument(
        "--task-file",
        metavar="FILE",
        help="read the task from FILE (UTF-8 text; - reads stdin), for tasks longer than the shell allows",
    )
    # Empty by default: the worker runs the run on its own default model (its AGENT_MODEL).
    run.add_argument("--model", default="", help="e.g. openai:gpt-4o-mini (default: the worker's)")
    run.add_argument("--id", dest="workflow_id", help="workflow id (default: agent-<random>)")
    add_reuse_id_option(run)
    run.add_argument("--max-steps", type=positive_int, help="model turns before limit_exceeded")
    run.add_argument("--timeout", type=positive_int, dest="timeout_s", help="run deadline in seconds")
    run.add_argument("--tools", type=name_list, help="comma-separated tool names (default: all)")
    run.add_argument("--tenant", default="", help="tenant label for the run")
    run.add_argument("--user", default="", help="the tenant's user the run acts for")
    run.add_argument(
        "--output-schema",
        dest="output_schema_file",
        metavar="FILE",
        help="JSON Schema file the final answer must match (a typed result: output_json)",
    )
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--wait", action="store_true", help="wait for the result")
    mode.add_argument("--follow", action="store_true", help="show progress until the run ends")
    run.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_run_options(run)


def add_reuse_id_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reuse-id",
        action="store_true",
        help="allow --id to name a closed run: start another run under its id (default: refused)",
    )


def ui_link(ui_url: str, namespace: str, workflow_id: str, run_id: str | None) -> str:
    base = ui_url.rstrip("/")
    return f"{base}/namespaces/{namespace}/workflows/{workflow_id}/{run_id or ''}".rstrip("/")


async def cmd_run(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    inp = run_input(args)
    check_model(inp.model, settings)  # a misspelt name is a usage error now, not a failed run later
    check_tools(inp.tools, settings)
    workflow_id = args.workflow_id or f"agent-{uuid.uuid4().hex[:12]}"
    task_queue = settings.temporal.task_queue
    note = DemoModelNote()
    on_interrupt(f"run {workflow_id} may or may not have started: see {cli_command(f'status {workflow_id}')}")
    tokens = TokenPrinter.from_settings(settings, workflow_id) if args.follow and not args.json else None
    if tokens is not None:
        await tokens.listen()  # before the start: the run's first model turn streams to this terminal
    handle = await start_agent_run(
        client,
        inp,
        workflow_id,
        task_queue,
        summary=static_summary(inp),
        details=static_details(inp),
        reuse_id=args.reuse_id,
    )
    following(workflow_id)
    if not args.json:
        print(f"started run {workflow_id} on task queue {task_queue}")
        link = ui_link(settings.temporal.ui_url, client.namespace, workflow_id, handle.result_run_id)
        print(f"  ui: {link}", flush=True)  # before a long wait: through a pipe too
    note.model(inp.model)
    if not (args.wait or args.follow):
        if args.json:
            print_json({"workflow_id": workflow_id, "run_id": handle.result_run_id})
        return 0
    reviewer = None
    if args.follow and not args.json:
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
        name = args.reviewer if args.reviewer is not None else settings.reviewer
        reviewer = FollowReviewer(
            client, workflow_id, name, interactive=interactive, approval_key=settings.approval_key
        )
    watchdog = asyncio.ensure_future(warn_when_no_worker(client, workflow_id, task_queue, doing=WAITING))
    try:
        result = await _follow(
            client, handle, quiet=args.json or not args.follow, reviewer=reviewer, note=note, tokens=tokens
        )
    finally:
        watchdog.cancel()
        if tokens is not None:
            await tokens.close()
    return _report(result, args.json, handle, ui_link(settings.temporal.ui_url, client.namespace, handle.id, None))


def run_input(args: argparse.Namespace) -> AgentInput:
    """The workflow input from the arguments; any bad value is a one-line usage error."""
    chosen = {"max_steps": args.max_steps, "timeout_s": args.timeout_s}
    try:
        return AgentInput(
            task=read_task(args),
            model=args.model,
            tools=args.tools,
            limits=Limits(**{name: value for name, value in chosen.items() if value}),
            tenant=args.tenant,
            user=args.user,
            approvers=args.approvers,
            policy=load_run_policy(args.policy_file),
            output_schema=load_output_schema(getattr(args, "output_schema_file", None)),
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "input"
        raise CliError(f"invalid run input: {where}: {first['msg']}", code=EXIT_USAGE) from None


def load_output_schema(path: str | None) -> dict[str, Any] | None:
    """The ``--output-schema`` file as the run's ``output_schema``; a bad file is a usage error."""
    if not path:
        return None
    # Room for indentation; the run input's own bound decides the rest.
    return json_object_file("--output-schema", path, "a JSON Schema object", max_bytes=MAX_OUTPUT_SCHEMA_BYTES * 4)


def read_task(args: argparse.Namespace) -> str:
    """The task: the argument or ``--task-file`` (``-``: stdin), never both, never empty, always UTF-8."""
    if args.task is not None and args.task_file is not None:
        raise CliError("give the task as an argument or with --task-file, not both", code=EXIT_USAGE)
    if args.task_file is not None:
        task = _read_task_file(args.task_file)
    elif args.task is None:
        example = cli_command('run "TASK"')
        raise CliError(f"run needs a task: {example} (or --task-file FILE, - for stdin)", code=EXIT_USAGE)
    else:
        task = args.task  # main checked it is UTF-8
    return checked_task(task)


def checked_task(task: str) -> str:
    """``task`` if it is not blank and fits in a run's input; a usage error saying which it is not."""
    if not task.strip():
        raise CliError("the task is empty", code=EXIT_USAGE)
    size = len(task.encode())
    if size > MAX_TASK_BYTES:
        raise CliError(f"the task is {size:,} bytes; at most {MAX_TASK_BYTES:,} fit in a run's input", code=EXIT_USAGE)
    return task


def _read_task_file(path: str) -> str:
    name = "stdin" if path == "-" else path
    try:
        if path == "-":
            if sys.stdin.isatty():
                print("reading the task from the terminal; end it with Ctrl-D", file=sys.stderr, flush=True)
            data = sys.stdin.buffer.read(MAX_TASK_BYTES + 1)
        else:
            with Path(path).open("rb") as file:
                data = file.read(MAX_TASK_BYTES + 1)
    except OSError as exc:
        raise CliError(f"--task-file {name}: {exc.strerror or exc}", code=EXIT_USAGE) from None
    if len(data) > MAX_TASK_BYTES:
        raise CliError(f"--task-file {name}: more than {MAX_TASK_BYTES:,} bytes", code=EXIT_USAGE)
    try:
        return data.decode("utf-8").rstrip()
    except UnicodeDecodeError as exc:
        raise CliError(
            f"--task-file {name}: not UTF-8 text (byte 0x{data[exc.start]:02X} at offset {exc.start})",
            code=EXIT_USAGE,
        ) from None


class DemoModelNote:
    """Says once (on stderr) that the offline ``scripted:`` model does not read the task."""

    def __init__(self) -> None:
        self.said = False

    def model(self, model: str) -> None:
        if self.said or not model.startswith("scripted:"):
            return
        self.said = True
        print(
            f"note: {model} is the offline demo model: the task is not read by a real model, it plays a fixed "
            "demo plan (for a real one, give the worker OPENAI_API_KEY or ANTHROPIC_API_KEY, or pass --model)",
            file=sys.stderr,
            flush=True,
        )

    async def watch(self, handle: WorkflowHandle[Any, Any]) -> None:
        """Learn the run's model from its status query (the worker fills it in first); until cancelled."""
        while not self.said:
            try:
                view = StatusView.model_validate(
                    await handle.query(AgentWorkflow.status, rpc_timeout=QUICK_QUERY_TIMEOUT)
                )
            except (RPCError, RPCTimeoutOrCancelledError, ValueError):
                raise_if_cancelled()
                view = None  # no worker yet (the watchdog says so), or the run just closed
            if view is not None and view.model:
                self.model(view.model)
                return
            await asyncio.sleep(0.5)

    async def recorded(self, handle: WorkflowHandle[Any, Any]) -> None:
        """After the end, if not said yet: the model the run recorded (``AgentModel``), else its status query."""
        if self.said:
            return
        try:
            desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
            model = desc.typed_search_attributes.get(MODEL) or ""
            if not model:
                answer = await handle.query(AgentWorkflow.status, rpc_timeout=QUICK_QUERY_TIMEOUT)
                model = StatusView.model_validate(answer).model
        except (RPCError, RPCTimeoutOrCancelledError, WorkflowQueryFailedError, ValueError):
            raise_if_cancelled()
            return
        self.model(model)


async def _follow(
    client: Client,
    handle: WorkflowHandle[Any, AgentResult],
    *,
    quiet: bool,
    reviewer: FollowReviewer | None = None,
    note: DemoModelNote | None = None,
    tokens: TokenPrinter | None = None,
) -> AgentResult:
    """Wait for the result; unless quiet, print the run's progress events as they happen.

    A reviewer is shown every approval the run starts waiting for (it prompts or prints commands);
    the note learns the run's model (quietly: from the status query; followed: at the ``started`` event);
    ``tokens`` prints the model's text as it streams, between the progress lines.
    """
    note = note or DemoModelNote()
    try:
        if quiet:
            learn = asyncio.ensure_future(note.watch(handle))
            try:
                result_task = asyncio.ensure_future(handle.result())
                await asyncio.wait({result_task})
            finally:
                learn.cancel()
            await note.recorded(handle)
            return await _result(handle, result_task)
        return await _follow_stream(client, handle, reviewer=reviewer, note=note, tokens=tokens)
    finally:
        if reviewer is not None:
            await reviewer.close()


async def _result(handle: WorkflowHandle[Any, AgentResult], result_task: asyncio.Future[AgentResult]) -> AgentResult:
    try:
        return await result_task
    except WorkflowFailureError as err:
        result = result_of_failure(err)  # AGENT_FAIL_WORKFLOW_ON_ERROR=1: a failed run's result is in the failure
        if result is None:
            raise CliError(f"run {handle.id} failed: {err.cause}") from None
        return result


class _FollowPrinter:
    """Progress lines for ``run --follow``: held while an approval prompt is open, then printed in order."""

    def __init__(
        self,
        client: Client,
        handle: WorkflowHandle[Any, AgentResult],
        reviewer: FollowReviewer | None,
        note: DemoModelNote,
        tokens: TokenPrinter | None = None,
    ) -> None:
        self.client, self.handle, self.reviewer, self.note = client, handle, reviewer, note
        self.tokens = tokens
        self.children: list[asyncio.Task[None]] = []  # sub-agents' progress, printed indented
        self.printer = EventPrinter(handle.id, mode=mode_for(False, sys.stdout), show_commands=False)
        self.held: list[tuple[int, ProgressEvent]] = []
        self.announced = False

    async def on_event(self, offset: int, event: ProgressEvent) -> None:
        if event.kind == "started" and not self.announced:
            await self._announce_model()
        self.held.append((offset, event))
        self.flush()
        if event.kind in ASKING and self.reviewer is not None:
            view = await self._status()
            if view is not None:
                self.reviewer.notice(view.pending_approvals)

    def flush(self, *, force: bool = False) -> None:
        if self.reviewer is not None and self.reviewer.busy and not force:
            return
        held, self.held = self.held, []
        if held and self.tokens is not None:
            self.tokens.end_line()
        for offset, event in held:
            self.printer(offset, event)
            following(self.handle.id, offset + 1)
            if event.kind == "turn_started" and self.tokens is not None:
                self.tokens.started(event.step)
            child_id = event.data.get("child_workflow_id") if event.kind == "tool_started" else None
            if isinstance(child_id, str) and child_id:
                follow = watch_child(self.client, child_id, sys.stdout, POLL_COOLDOWN, None, 1)
                self.children.append(asyncio.ensure_future(follow))

    async def _status(self) -> StatusView | None:
        try:
            return StatusView.model_validate(await self.handle.query(AgentWorkflow.status, rpc_timeout=QUERY_TIMEOUT))
        except (RPCError, RPCTimeoutOrCancelledError, ValueError):
            raise_if_cancelled()
            return None

    async def _announce_model(self) -> None:
        self.announced = True
        view = await self._status()
        if view is not None and view.model:
            print(f"model: {view.model}", flush=True)
            self.note.model(view.model)


async def _follow_stream(
    client: Client,
    handle: WorkflowHandle[Any, AgentResult],
    *,
    reviewer: FollowReviewer | None,
    note: DemoModelNote,
    tokens: TokenPrinter | None = None,
) -> AgentResult:
    result_task = asyncio.ensure_future(handle.result())
    printer = _FollowPrinter(client, handle, reviewer, note, tokens)
    async with tokens.printing() if tokens is not None else contextlib.nullcontext():
        return await _follow_events(client, handle, result_task, printer, reviewer)


async def _follow_events(
    client: Client,
    handle: WorkflowHandle[Any, AgentResult],
    result_task: asyncio.Future[AgentResult],
    printer: _FollowPrinter,
    reviewer: FollowReviewer | None,
) -> AgentResult:

    async def pump() -> None:
        async for offset, event in events(client, handle.id):
            await printer.on_event(offset, event)

    watcher = asyncio.ensure_future(pump())
    while not result_task.done():
        waiting: set[asyncio.Future[Any]] = {result_task} if watcher.done() else {result_task, watcher}
        await asyncio.wait(waiting, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
        printer.flush()
        if watcher.done() and not watcher.cancelled() and (failure := watcher.exception()) is not None:
            if isinstance(failure, BrokenPipeError) or temporal_lost(failure):
                raise failure  # the reader of stdout went away, or the server did: nothing left to show
            print(
                f"warning: progress stream unavailable ({failure}); polling the run's status",
                file=sys.stderr,
            )
            return await _poll_loop(handle, result_task, reviewer=reviewer)
    if not result_task.cancelled() and (lost := result_task.exception()) is not None and temporal_lost(lost):
        watcher.cancel()  # the server went away: the one line main prints says so, and how to reattach
        raise lost
    if not watcher.done():
        await asyncio.wait({watcher}, timeout=DRAIN_S)  # the run's last events are on their way
        watcher.cancel()
    if printer.children:
        await asyncio.wait(printer.children, timeout=DRAIN_S)
        for child in printer.children:
            child.cancel()
    [ended] = await asyncio.gather(watcher, return_exceptions=True)
    if isinstance(ended, BrokenPipeError) or (isinstance(ended, Exception) and temporal_lost(ended)):
        raise ended
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
            view = StatusView.model_validate(await handle.query(AgentWorkflow.status, rpc_timeout=QUERY_TIMEOUT))
        except (RPCError, RPCTimeoutOrCancelledError, ValueError):
            raise_if_cancelled()
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


def _report(result: AgentResult, as_json: bool, handle: WorkflowHandle[Any, Any], link: str) -> int:
    if as_json:
        print_json({"workflow_id": handle.id, **result.model_dump()})
    else:
        print(
            f"\nstatus: {result.status}   steps: {result.steps}   tokens: "
            f"{result.usage.input_tokens} in / {result.usage.output_tokens} out   cost: ${result.usage.cost_usd:.4f}"
        )
        print(f"\n{result.output}\n")
        print(f"run id: {handle.id}")
        print(f"ui:     {link}")
    return 0 if result.status == "completed" else 1


async def start_agent_run(
    client: Client,
    inp: AgentInput,
    workflow_id: str,
    task_queue: str,
    *,
    summary: str,
    details: str,
    search_attributes: TypedSearchAttributes = TypedSearchAttributes.empty,
    what: str = "run",
    reuse_id: bool = False,
) -> WorkflowHandle[Any, Any]:
    """Start ``AgentWorkflow`` (``AgentClient``'s start); a taken id or a refusal is one ``CliError`` line.

    An id whose run is running is refused (exit 1); one whose run is closed too (exit 2), unless
    ``reuse_id`` (``--reuse-id``): then another run starts under it.
    """
    try:
        return await _start_agent_run(
            client,
            inp,
            workflow_id,
            task_queue,
            summary=summary,
            details=details,
            search_attributes=search_attributes,
            what=what,
            reuse_id=reuse_id,
        )
    except AgentClientError as err:
        raise cli_error(err) from None
