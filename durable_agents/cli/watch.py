"""Live progress of a run: ``starter.py watch ID`` and the progress lines of ``run --follow``.

Events come from the run's durable Workflow Stream (topic ``progress``, see
``workflows/progress.py``) through ``AgentClient.events``, which reads it by query,
so watching adds nothing to the run's history: it starts at any offset, follows
continue-as-new into the next run and ends once the run has closed and its last
events were read.

Three renderings: ``json`` (one ``ProgressEvent.model_dump_json()`` per line),
``rich`` (colours, one line per event, approvals highlighted with the commands
that decide them) and ``plain`` (the same lines without colours).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import shlex
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, Literal, TextIO

from rich.console import Console
from rich.text import Text
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError

from activities.settings import Settings
from durable_agents.agent_client._client import AgentClient
from durable_agents.agent_client._errors import AgentClientError
from durable_agents.agent_client._events import POLL_COOLDOWN as POLL_COOLDOWN
from durable_agents.agent_client._types import EventCursor
from durable_agents.cli.approval_text import decide_commands, what_waits
from durable_agents.cli.common import (
    PROBE_TIMEOUT,
    CliError,
    cli_command,
    client_errors,
    describe_run,
    ended_state,
    event_offset,
    following,
    no_worker_line,
    poller_count,
    raise_if_cancelled,
    start_worker_hint,
    temporal_lost,
    warn_when_no_worker,
)
from workflows.agent import AgentWorkflow
from workflows.call_view import call_lines
from workflows.progress import ProgressEvent
from workflows.types import StatusView

Mode = Literal["json", "rich", "plain"]
OnEvent = Callable[[int, ProgressEvent], Awaitable[None] | None]
SUBAGENT_INDENT = "  "
CHILD_APPEAR_TRIES = 50  # a delegation is announced just before its child run starts
DEFAULT_REVIEWER = Settings.reviewer  # "cli": the name in printed commands when none is given

_STYLES: dict[str, str] = {
    "started": "bold",
    "turn_started": "blue",
    "model_answered": "cyan",
    "tool_decided": "magenta",
    "tool_started": "blue",
    "tool_finished": "green",
    "approval_requested": "bold yellow",
    "approval_decided": "yellow",
    "decision_refused": "bold red",
    "question_asked": "bold yellow",
    "question_answered": "yellow",
    "approval_counted": "yellow",
    "continued_as_new": "dim",
    "rewound": "yellow",
    "finished": "bold green",
    # sessions: a watch of a session goes on across replies, until it closes or idles out
    "message_received": "bold cyan",
    "message_refused": "red",
    "interrupted": "yellow",
    "replied": "bold green",
    "idle": "dim",
}
_KIND_WIDTH = max(len(kind) for kind in _STYLES)


async def events(
    client: Client, workflow_id: str, *, from_offset: int = 0, poll_cooldown: timedelta = POLL_COOLDOWN
) -> AsyncIterator[tuple[int, ProgressEvent]]:
    """``(offset, event)`` pairs of a run's progress stream, until the (last continued) run has closed:
    ``AgentClient.events``, which reads by query (watching adds nothing to the run's history)."""
    cursor = EventCursor(offset=from_offset)
    async for event in AgentClient(client).events(workflow_id, after=cursor, poll_cooldown=poll_cooldown):
        if event.progress is not None:
            yield event.cursor.offset - 1, event.progress


def mode_for(json_lines: bool, file: TextIO) -> Mode:
    if json_lines:
        return "json"
    return "rich" if file.isatty() else "plain"


def clock(at: str) -> str:
    """The event's workflow time as local ``HH:MM:SS`` (``--:--:--`` when missing)."""
    try:
        return datetime.fromisoformat(at).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return "--:--:--"


def describe(event: ProgressEvent) -> str:
    """The event's text plus the numbers worth a glance (tokens and cost of a model answer)."""
    data = event.data
    if event.kind == "model_answered" and "input_tokens" in data:
        return (
            f"{event.text} · {data.get('input_tokens', 0)} in / {data.get('output_tokens', 0)} out tokens"
            f" · ${float(data.get('cost_usd') or 0):.4f}"
        )
    return event.text


def approval_commands(workflow_id: str, event: ProgressEvent, reviewer: str) -> list[str]:
    """The shell commands that decide the approval an ``approval_requested`` event announces
    (or answer the question a ``question_asked`` event announces)."""
    approval_id = str(event.data.get("approval_id", ""))
    if not approval_id:
        return []
    if event.kind == "question_asked":
        return answer_commands(workflow_id, approval_id, reviewer)
    if "-resolve" in approval_id:  # an unknown outcome: a human says whether it happened
        payload = {"approval_id": approval_id, "reviewer": reviewer, "resolution": "retry|mark_done|fail"}
        return [
            f"temporal workflow signal --workflow-id {shlex.quote(workflow_id)} --name resolve "
            f"--input {shlex.quote(json.dumps(payload))}"
        ]
    approve, signal, reject = decide_commands(workflow_id, approval_id, reviewer)
    return [approve, signal, reject]


def answer_commands(workflow_id: str, question_id: str, reviewer: str) -> list[str]:
    """The starter's answer (signed when so configured) and Temporal's answer signal."""
    run, who = shlex.quote(workflow_id), shlex.quote(reviewer)
    payload = {"question_id": question_id, "reviewer": reviewer, "text": "..."}
    return [
        cli_command(f"answer {run} {question_id} '...' --reviewer {who}"),
        f"temporal workflow signal --workflow-id {run} --name answer --input {shlex.quote(json.dumps(payload))}",
    ]


ASKING = ("approval_requested", "question_asked")  # events a person may have to act on


class EventPrinter:
    """Renders events one line each; ``show_commands`` adds the decide commands under approval requests."""

    def __init__(
        self,
        workflow_id: str,
        *,
        mode: Mode,
        file: TextIO | None = None,
        show_commands: bool = True,
        reviewer: str | None = None,
        indent: str = "",
    ) -> None:
        self.workflow_id = workflow_id
        self.indent = indent  # a sub-agent's events are printed under its parent's, indented
        self.mode = mode
        self.file = file if file is not None else sys.stdout
        self.show_commands = show_commands
        self.reviewer = reviewer or DEFAULT_REVIEWER
        self._console = Console(file=self.file, highlight=False, soft_wrap=True) if mode == "rich" else None

    def __call__(
        self, offset: int, event: ProgressEvent, call: list[str] | None = None, *, waiting: bool = True
    ) -> None:
        """``call``: the lines under the event: the call an approval request waits for (``workflows.call_view``),
        the question asked, the call as a reviewer edited it. ``waiting``: whether what an approval request or a
        question announces still waits (else no commands are printed for it: it was decided long ago)."""
        if self.mode == "json":
            print(event.model_dump_json(), file=self.file, flush=True)
            return
        commands = (
            approval_commands(self.workflow_id, event, self.reviewer)
            if self.show_commands and waiting and event.kind in ASKING
            else []
        )
        if self._console is None:
            print(f"{self.indent}{clock(event.at)} [step {event.step}] {event.kind}: {describe(event)}", file=self.file)
            for call_line in call or []:
                print(f"{self.indent}    {call_line}", file=self.file)
            for command in commands:
                print(f"{self.indent}    {command}", file=self.file)
            self.file.flush()
            return
        style = _STYLES.get(event.kind, "")
        if (event.kind == "tool_finished" and event.data.get("ok") is False) or (
            event.kind == "finished" and event.data.get("status", "completed") != "completed"
        ):
            style = "bold red" if event.kind == "finished" else "red"
        line = Text.assemble(
            self.indent,
            (clock(event.at), "dim"),
            " ",
            (f"step {event.step:<3}", "cyan"),
            " ",
            (event.kind.ljust(_KIND_WIDTH), style),
            " ",
            (describe(event), "bold yellow" if event.kind in ASKING else ""),
        )
        self._console.print(line)
        for call_line in call or []:
            self._console.print(Text.assemble(self.indent, "    ", (call_line, "bold")))
        for command in commands:
            self._console.print(Text.assemble(self.indent, "    ", ("decide: ", "yellow"), command))
        self.file.flush()


async def watch(
    client: Client,
    workflow_id: str,
    *,
    json_lines: bool,
    from_offset: int = 0,
    on_event: OnEvent | None = None,
    file: TextIO | None = None,
    poll_cooldown: timedelta = POLL_COOLDOWN,
    reviewer: str | None = None,
    depth: int = 0,
) -> None:
    """Print a run's progress events from ``from_offset`` as they happen; return once the run has ended.

    A sub-agent's events (announced by its parent's ``tool_started``) follow, indented under it,
    until the sub-agent has ended too (not in ``json`` mode: there each run is watched on its own).

    ``on_event(offset, event)`` (sync or async) sees every event before it is printed; ``reviewer``
    is the name in the decide commands printed under approval requests.
    """
    out = file if file is not None else sys.stdout
    mode = mode_for(json_lines, out)
    printer = EventPrinter(workflow_id, mode=mode, file=out, reviewer=reviewer, indent=SUBAGENT_INDENT * depth)
    children: list[asyncio.Task[None]] = []
    try:
        async for offset, event in events(client, workflow_id, from_offset=from_offset, poll_cooldown=poll_cooldown):
            if on_event is not None:
                result = on_event(offset, event)
                if inspect.isawaitable(result):
                    await result
            if mode == "json":
                printer(offset, event)
            else:
                lines, waiting = await event_context(client, workflow_id, event)
                printer(offset, event, lines, waiting=waiting)
            child_id = event.data.get("child_workflow_id") if event.kind == "tool_started" else None
            if isinstance(child_id, str) and child_id and mode != "json":
                follow = watch_child(client, child_id, out, poll_cooldown, reviewer, depth + 1)
                children.append(asyncio.create_task(follow))
        await asyncio.gather(*children)
    finally:
        for task in children:
            task.cancel()


async def event_context(client: Client, workflow_id: str, event: ProgressEvent) -> tuple[list[str] | None, bool]:
    """The lines to show under an event, from the run's status, and whether what it announces still waits.

    An ``approval_requested`` or ``question_asked`` event: the call or the question, as the run lists it
    while it still waits (not waiting: no lines, and no commands; unknown, no worker answering: no lines,
    commands as for a live run). An ``approval_decided`` event of an edited call: the call as it runs.
    """
    approval_id = event.data.get("approval_id")
    edited = event.kind == "approval_decided" and "edited" in event.text
    if not approval_id or not (event.kind in ASKING or edited):
        return None, True
    try:
        raw = await client.get_workflow_handle(workflow_id).query(AgentWorkflow.status, rpc_timeout=PROBE_TIMEOUT)
        view = StatusView.model_validate(raw)
    except (RPCError, RPCTimeoutOrCancelledError, WorkflowQueryFailedError, ValueError):
        raise_if_cancelled()
        return None, True
    if edited:
        for record in reversed(view.decisions):
            if record.approval_id == approval_id and record.edits is not None:
                return ["edited by the reviewer(s); it runs as:", *call_lines(record.tool, record.edits)], True
        return None, True
    ended = view.state in ("completed", "failed", "cancelled", "limit_exceeded")
    for approval in view.pending_approvals:
        if approval.approval_id == approval_id and not approval.workflow_id:
            return (what_waits(approval), not ended)
    return None, False


async def watch_child(
    client: Client, child_id: str, out: TextIO, poll_cooldown: timedelta, reviewer: str | None, depth: int
) -> None:
    """A sub-agent's progress, indented under its parent's; it may take a moment to exist."""
    for _ in range(CHILD_APPEAR_TRIES):
        try:
            await client.get_workflow_handle(child_id).describe()
            break
        except RPCError:
            await asyncio.sleep(0.1)
    else:
        return
    try:
        await watch(
            client, child_id, json_lines=False, file=out, poll_cooldown=poll_cooldown, reviewer=reviewer, depth=depth
        )
    except (RPCError, WorkflowQueryFailedError, WorkflowUpdateFailedError, AgentClientError) as err:
        print(f"{SUBAGENT_INDENT * depth}(sub-agent {child_id}: progress unavailable: {err})", file=out)


# --- the command ------------------------------------------------------------------------


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    watching = sub.add_parser(
        "watch", help="stream a run's progress events until it ends (a session's: across messages, until it closes)"
    )
    watching.add_argument("workflow_id")
    watching.add_argument("--json", action="store_true", help="one JSON object per event (ProgressEvent)")
    watching.add_argument(
        "--from",
        dest="from_offset",
        type=event_offset,
        default=0,
        metavar="N",
        help="start at event offset N (default 0)",
    )


@client_errors
async def cmd_watch(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    workflow_id = args.workflow_id
    handle, desc = await describe_run(client, workflow_id)  # a missing run is a one-line error, not a hang
    if desc.status != WorkflowExecutionStatus.RUNNING:
        await _readable_after_the_end(client, handle, desc)

    def seen(offset: int, event: ProgressEvent) -> None:
        following(workflow_id, offset + 1)

    following(workflow_id, args.from_offset)
    watchdog = asyncio.ensure_future(
        warn_when_no_worker(client, workflow_id, desc.task_queue, doing="shows its progress once one does")
    )
    try:
        await watch(
            client,
            workflow_id,
            json_lines=args.json,
            from_offset=args.from_offset,
            on_event=seen,
            reviewer=settings.reviewer,
        )
    except (WorkflowQueryFailedError, WorkflowUpdateFailedError) as err:
        raise CliError(f"cannot read the progress of {workflow_id}: {err.cause or err}") from None
    except RPCError as err:
        if temporal_lost(err):
            raise  # one line from main: the connection was lost, and how to reattach
        raise CliError(f"cannot read the progress of {workflow_id}: {err.message}") from None
    finally:
        watchdog.cancel()
    return 0


async def _readable_after_the_end(
    client: Client, handle: WorkflowHandle[Any, Any], desc: WorkflowExecutionDescription
) -> None:
    """A closed run's events are read by a query, which a worker answers: check one does, at once.

    Without one, say how the run ended (from the server alone) instead of waiting for a query to time out.
    """
    pollers = await poller_count(client, desc.task_queue)
    if pollers != 0:
        try:
            await handle.query(AgentWorkflow.status, rpc_timeout=PROBE_TIMEOUT)
            return
        except (RPCError, RPCTimeoutOrCancelledError, WorkflowQueryFailedError):
            raise_if_cancelled()
            pass
    state = await ended_state(client, desc.id, desc.run_id, desc.status, desc.typed_search_attributes)
    why = (
        f"{no_worker_line(desc.task_queue)} ({start_worker_hint(desc.task_queue)})"
        if pollers == 0
        else f"no worker on task queue {desc.task_queue} answered within {PROBE_TIMEOUT.seconds} s"
    )
    raise CliError(
        f"run {desc.id} has ended ({state}); its progress events are read from a worker, and {why}; "
        f"its outcome: {cli_command(f'status {desc.id}')}"
    )
