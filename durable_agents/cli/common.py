"""What every command of ``starter.py`` shares: errors, the argument parser, JSON output, and reading a run.

Reading a run never waits in silence: a status query gets a short deadline
(``QUICK_QUERY_TIMEOUT``), and when no worker answers, :func:`no_answer_reason`
says why (no worker polls the run's task queue, or its workflow task keeps
failing) from what the server knows without a worker.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import functools
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError, RPCStatusCode

from activities.settings import Settings
from workflows.agent import AgentWorkflow
from workflows.progress import STATE
from workflows.run_failure import result_of_failure
from workflows.types import AgentResult, StatusView

# Exit codes (documented in durable_agents/cli/main.py and docs/reference/cli.md).
EXIT_OK = 0
EXIT_RUN = 1  # no such run, it did not complete, it refused the request, no worker answered
EXIT_USAGE = 2  # bad arguments or input, a bad configuration, no Temporal server
EXIT_INTERRUPTED = 130  # Ctrl-C

QUERY_TIMEOUT = timedelta(seconds=10)  # a status query while following a run (a worker is known to be there)
QUICK_QUERY_TIMEOUT = timedelta(seconds=2)  # status / pending: answer within seconds, worker or not
PROBE_TIMEOUT = timedelta(seconds=3)  # a closed run's progress: a worker replays its history first
RPC_TIMEOUT = timedelta(seconds=5)  # server-only reads (describe a task queue, a closed run's result)
VISIBILITY_PAGE = 1000  # runs per ListWorkflowExecutions page (the SDK's default page size)
NO_WORKER_AFTER_S = 10.0  # a run that waits this long on a queue nobody polls is said so, once
T = TypeVar("T")
# A command: the connected client, its parsed arguments and the process's settings → the exit code.
Command = Callable[[Client, argparse.Namespace, Settings], Awaitable[int]]


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code attached."""

    def __init__(self, message: str, code: int = EXIT_RUN) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """Usage errors become a one-line ``CliError`` with exit code 2 (instead of argparse's usage dump).

    A misspelt command or choice gets a "did you mean"; :func:`parse` does the same for a misspelt flag.
    """

    def error(self, message: str) -> NoReturn:
        choice = _INVALID_CHOICE.search(message)
        if choice is not None:
            message += did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        raise CliError(f"{self.prog}: {message} (see --help)", code=EXIT_USAGE)


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")
SUGGEST_CUTOFF = 0.6  # difflib's default similarity for a suggestion


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or empty when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=SUGGEST_CUTOFF)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an unknown flag is refused with the closest flag of its command."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        flags = _flags(parser, getattr(args, "command", None))
        hints = [did_you_mean(extra.split("=", 1)[0], flags) for extra in extras if extra.startswith("-")]
        hint = next((h for h in hints if h), "")
        parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
    return args


def _flags(parser: argparse.ArgumentParser, command: str | None) -> list[str]:
    """The long flags of ``command`` (a subcommand of ``parser``), and the parser's own."""
    parsers = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            parsers.append(action.choices[command])
    return [flag for p in parsers for action in p._actions for flag in action.option_strings if flag.startswith("--")]


# --- the commands it prints ----------------------------------------------------------------

CONSOLE_SCRIPT = "durable-agents"
REPO_STARTER = Path(__file__).resolve().parents[2] / "starter.py"


def cli_command(words: str) -> str:
    """``words`` (e.g. ``watch RUN_ID``) as a command a user can paste: this CLI as it was started.

    ``durable-agents ...`` when the process is that console script; else the interpreter actually
    running (``python`` when that name on PATH is it, else its full path: a venv need not be
    activated) and the script as it was given (``starter.py`` when it is in the working directory).
    Called from elsewhere (a test, an embedding app), the console script when it is on PATH, else
    this checkout's ``starter.py``.
    """
    return f"{_invocation()} {words}"


@functools.cache
def _invocation() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if Path(argv0).name == CONSOLE_SCRIPT:
        return _program(CONSOLE_SCRIPT, argv0)
    if argv0.endswith(".py"):
        return f"{_python()} {shlex.quote(_shortened(argv0))}"
    on_path = shutil.which(CONSOLE_SCRIPT)
    if on_path is not None or not REPO_STARTER.exists():
        return CONSOLE_SCRIPT
    return f"{_python()} {shlex.quote(_shortened(str(REPO_STARTER)))}"


WORKER_SCRIPT = "durable-agents-worker"
WORKER_FILE = "worker.py"


def worker_command() -> str:
    """How to start a worker, as a command a user can paste; chosen the way :func:`cli_command` is.

    ``durable-agents-worker`` when this CLI is the ``durable-agents`` console script and the worker's
    script is installed beside it; ``worker.py`` (beside the script that was run) with the interpreter
    actually running when this CLI is ``starter.py``. Called from elsewhere, the worker's console
    script beside the running interpreter, else this checkout's ``worker.py``, else the bare name.
    A console script is shown by name when that name on PATH is it, else by its full path.
    """
    return _worker_invocation()


@functools.cache
def _worker_invocation() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if Path(argv0).name == CONSOLE_SCRIPT and (beside := Path(argv0).with_name(WORKER_SCRIPT)).is_file():
        return _program(WORKER_SCRIPT, str(beside))
    if argv0.endswith(".py") and (script := Path(argv0).with_name(WORKER_FILE)).is_file():
        return f"{_python()} {shlex.quote(_shortened(str(script)))}"
    installed = Path(sys.executable).with_name(WORKER_SCRIPT)
    if installed.is_file():
        return _program(WORKER_SCRIPT, str(installed))
    repo_worker = REPO_STARTER.with_name(WORKER_FILE)
    if repo_worker.is_file():
        return f"{_python()} {shlex.quote(_shortened(str(repo_worker)))}"
    return WORKER_SCRIPT


def _python() -> str:
    for name in ("python", "python3"):
        if _same_path(shutil.which(name), sys.executable):
            return name
    return shlex.quote(sys.executable)


def _program(name: str, path: str) -> str:
    """``name`` when it is on PATH as ``path``, else ``path`` itself."""
    return name if _same_path(shutil.which(name), path) else shlex.quote(os.path.abspath(path))


def _same_path(found: str | None, path: str) -> bool:
    # Not resolved: a venv's python is a symlink to the system's, which runs without the venv.
    return found is not None and os.path.abspath(found) == os.path.abspath(path)


def _shortened(script: str) -> str:
    """The script's name when it is in the working directory, else the path as given."""
    path = Path(script)
    return path.name if path.is_absolute() and path.parent == Path.cwd() else script


# --- what Ctrl-C says ---------------------------------------------------------------------

_interrupt_note = ""
_following: tuple[str, int] | None = None  # (run id, next event offset) of the run this command follows


def on_interrupt(note: str) -> None:
    """What ``starter.py`` says (after ``interrupted:``) when Ctrl-C stops the command from now on."""
    global _interrupt_note, _following
    _interrupt_note = note
    _following = None


def interrupt_note() -> str:
    return _interrupt_note


InterruptState = tuple[str, "tuple[str, int] | None"]


def interrupt_state() -> InterruptState:
    """What Ctrl-C and a lost connection would say now, to :func:`restore_interrupt` after a detour."""
    return _interrupt_note, _following


def restore_interrupt(state: InterruptState) -> None:
    global _interrupt_note, _following
    _interrupt_note, _following = state


def following(workflow_id: str, from_offset: int = 0) -> None:
    """The command follows run ``workflow_id`` and has shown its events before ``from_offset``: Ctrl-C,
    and a Temporal server that goes away, say how to reattach from there (:func:`reattach_note`, :func:`lost_note`)."""
    global _following
    on_interrupt(reattach_note(workflow_id, from_offset))
    _following = (workflow_id, from_offset)


def reattach_command(workflow_id: str, from_offset: int = 0) -> str:
    since = f" --from {from_offset}" if from_offset else ""
    return cli_command(f"watch {workflow_id}{since}")


def reattach_note(workflow_id: str, from_offset: int = 0) -> str:
    return (
        f"run {workflow_id} goes on (Ctrl-C stops this command, not the run); "
        f"reattach with: {reattach_command(workflow_id, from_offset)}"
    )


def lost_note() -> str:
    """What to do after the connection to Temporal was lost: reattach to the run followed, else the Ctrl-C note."""
    if _following is None:
        return _interrupt_note
    workflow_id, from_offset = _following
    command = reattach_command(workflow_id, from_offset)
    return f"run {workflow_id} goes on; once Temporal is back, reattach with: {command}"


def temporal_lost(err: BaseException) -> bool:
    """The server stopped answering (the SDK gave up retrying a connection), as opposed to refusing a request."""
    return isinstance(err, RPCError) and err.status == RPCStatusCode.UNAVAILABLE


# --- argument values ----------------------------------------------------------------------


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _int_between(minimum: int, maximum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


MAX_INT = 1_000_000_000  # far beyond any sensible step count or deadline; bigger numbers are typos
positive_int = _int_between(1, MAX_INT, f"a positive integer (at most {MAX_INT:,})")
event_offset = _int_between(0, 2**62, "an offset (0 or more)")


def name_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected at least one tool name")
    return names


_LABELS = {
    "task": "the task",
    "workflow_id": "the run id",
    "approval_id": "the approval id",
    "question_id": "the question id",
    "approvers": "--approver",
    "policy_file": "--policy",
    "task_file": "--task-file",
    "text": "the message",
}


def not_utf8(text: str) -> str:
    """Empty when ``text`` encodes as UTF-8; else where it does not (a byte argv could not decode)."""
    for index, char in enumerate(text):
        if "\ud800" <= char <= "\udfff":
            # Python decodes argv with surrogateescape: undecodable byte 0xNN arrives as U+DCNN.
            code = ord(char)
            what = f"byte 0x{code - 0xDC00:02X}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
            return f"{what} at character {index}"
    return ""


def check_text_arguments(args: argparse.Namespace) -> None:
    """Every text argument is valid UTF-8; else a one-line usage error naming it."""
    for key, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and (where := not_utf8(text)):
                label = _LABELS.get(key, f"--{key.replace('_', '-')}")
                raise CliError(f"{label} is not valid UTF-8 text ({where})", code=EXIT_USAGE)


# --- listing runs through the visibility API ------------------------------------------


def query_literal(value: str) -> str:
    """``value`` as a quoted string literal of a visibility query: a quote or backslash in it stays text.

    Inside a single-quoted string the server's query parser reads a backslash
    followed by a quote as a quote, and two backslashes as one, so user input (a
    tenant name) cannot end the literal and add clauses of its own.
    """
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


async def list_runs(
    client: Client, query: str, limit: int, *, page_size: int = VISIBILITY_PAGE
) -> tuple[list[WorkflowExecution], int | None]:
    """Up to ``limit`` runs matching ``query`` (in the server's order: open runs, then the latest closed),
    and how many match in all (None: unknown).

    Pages of ``page_size`` are read until ``limit`` runs are in hand. When the last
    page read was the listing's last, the total is known without another call;
    else one ``CountWorkflowExecutions`` says it. An ``RPCError`` of the listing
    (e.g. ``INVALID_ARGUMENT``: a search attribute the namespace does not know) is raised.
    """
    pages = client.list_workflows(query, page_size=page_size, rpc_timeout=RPC_TIMEOUT)
    found: dict[str, WorkflowExecution] = {}
    while True:
        await pages.fetch_next_page()
        for wf in pages.current_page or ():
            found.setdefault(wf.id, wf)
        if not pages.next_page_token:
            return list(found.values())[:limit], len(found)
        if len(found) >= limit:
            break
    try:
        total: int | None = max((await client.count_workflows(query, rpc_timeout=RPC_TIMEOUT)).count, len(found))
    except (RPCError, RPCTimeoutOrCancelledError):
        raise_if_cancelled()
        total = None
    return list(found.values())[:limit], total


# --- reading a run without waiting in silence -------------------------------------------


async def describe_run(
    client: Client, workflow_id: str
) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
    """The run's handle and description; a run that does not exist, or is not an agent run, is a one-line ``CliError``.

    Every command reads an agent run through ``AgentWorkflow``'s queries, updates and payload types;
    another workflow type (a user's own workflow, or anything else on the namespace) is said to be one.
    """
    handle = client.get_workflow_handle(workflow_id)
    try:
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no run with id {workflow_id!r}") from None
        raise
    check_agent_run(desc)
    return handle, desc


def check_agent_run(desc: WorkflowExecutionDescription) -> None:
    """``CliError`` (exit 1) unless the described workflow is an ``AgentWorkflow`` run."""
    if desc.workflow_type != AgentWorkflow.__name__:
        raise CliError(f"{desc.id} is a {desc.workflow_type} workflow, not an {AgentWorkflow.__name__} run")


async def poller_count(client: Client, task_queue: str) -> int | None:
    """How many workers polled the workflow task queue lately; None when the server does not say."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    try:
        response = await client.workflow_service.describe_task_queue(request, timeout=RPC_TIMEOUT)
    except (RPCError, RPCTimeoutOrCancelledError):
        raise_if_cancelled()
        return None
    return len(response.pollers)


def start_worker_hint(task_queue: str) -> str:
    return f"start one with: AGENT_TASK_QUEUE={shlex.quote(task_queue)} {worker_command()}"


def no_worker_line(task_queue: str) -> str:
    return f"no worker polls task queue {task_queue}"


async def no_answer_reason(client: Client, desc: WorkflowExecutionDescription, *, waited: timedelta) -> str:
    """Why no worker answered the run within ``waited``, in words, from what the server knows without one."""
    pending = desc.raw_description.pending_workflow_task
    if desc.raw_description.HasField("pending_workflow_task") and pending.attempt > 1:
        return (
            f"its workflow task has failed {pending.attempt - 1} time(s) and is retried: the run is stuck "
            "(see the worker's log)"
        )
    pollers = await poller_count(client, desc.task_queue)
    if pollers == 0:
        return _no_pollers(desc.task_queue)
    if pollers is None:
        return f"no worker answered within {waited.seconds} s (the server does not say who polls {desc.task_queue})"
    return (
        f"no worker answered within {waited.seconds} s (task queue {desc.task_queue} has {pollers} recent "
        "poller(s): busy, stopped, or replaying a long history)"
    )


def _no_pollers(task_queue: str) -> str:
    return (
        f"no worker answered: {no_worker_line(task_queue)}; the run waits for one and loses nothing "
        f"({start_worker_hint(task_queue)})"
    )


class NoAnswer(Exception):
    """No worker answered a run's status query; the message says why, e.g. ``no worker answered: ...``."""


async def ask_status(
    client: Client,
    handle: WorkflowHandle[Any, Any],
    desc: WorkflowExecutionDescription,
    *,
    query_timeout: timedelta = QUICK_QUERY_TIMEOUT,
) -> StatusView:
    """A running run's status query; ``NoAnswer`` at once when no worker polls its queue, else after the timeout.

    While the server refuses the query because the run's workflow task is on a retry
    (:func:`workflow_not_ready`), the query is asked again until the timeout: a burst of
    signals makes the server retry a task it force-closed, which a worker answers moments later.
    """
    query = asyncio.ensure_future(_status_until_ready(handle, query_timeout))
    pollers = asyncio.ensure_future(poller_count(client, desc.task_queue))
    try:
        await asyncio.wait({query, pollers}, return_when=asyncio.FIRST_COMPLETED)
        if not query.done() and await pollers == 0:
            raise NoAnswer(_no_pollers(desc.task_queue))
        view = await query
    except WorkflowQueryFailedError as err:
        raise NoAnswer(f"its worker could not answer: {err}") from None
    except (RPCError, RPCTimeoutOrCancelledError):
        raise_if_cancelled()
        raise NoAnswer(await no_answer_reason(client, desc, waited=query_timeout)) from None
    finally:
        query.cancel()
        pollers.cancel()
    return StatusView.model_validate(view)


NOT_READY_RETRY_S = 0.2  # between status queries the server refused with WorkflowNotReady


def workflow_not_ready(err: RPCError) -> bool:
    """The server refused a query or update because the run's workflow task is on a retry (attempt > 1).

    That is so after a worker failed the task (a bug or a non-determinism: it stays so), and
    also, for a moment, after the server itself force-closed a task because more than 100
    signals arrived while a worker held it; the next attempt handles them all.
    """
    return err.status == RPCStatusCode.FAILED_PRECONDITION and any(
        detail.type_url.endswith("WorkflowNotReadyFailure") for detail in err.grpc_status.details
    )


async def _status_until_ready(handle: WorkflowHandle[Any, Any], within: timedelta) -> Any:
    deadline = asyncio.get_running_loop().time() + within.total_seconds()
    while True:
        left = deadline - asyncio.get_running_loop().time()
        try:
            return await handle.query(AgentWorkflow.status, rpc_timeout=timedelta(seconds=max(left, 0.1)))
        except RPCError as err:
            if not workflow_not_ready(err) or left <= NOT_READY_RETRY_S:
                raise
        await asyncio.sleep(NOT_READY_RETRY_S)


def recorded_state(search_attributes: TypedSearchAttributes) -> str | None:
    """The agent state the run last recorded in its ``AgentState`` search attribute (None: not recorded)."""
    value = search_attributes.get(STATE)
    return value or None


def temporal_state(status: WorkflowExecutionStatus | None) -> str:
    return status.name.lower() if status else "unknown"


async def ended_state(
    client: Client,
    workflow_id: str,
    run_id: str | None,
    status: WorkflowExecutionStatus | None,
    search_attributes: TypedSearchAttributes | None = None,
) -> str:
    """A closed run's outcome as the agent reports it: ``completed``, ``failed``, ``cancelled``, ``limit_exceeded``.

    Temporal says ``completed`` for all four (the workflow returns an ``AgentResult``
    either way); the ``AgentState`` search attribute says which, and without it the
    result does. A run started with ``AGENT_FAIL_WORKFLOW_ON_ERROR=1`` that ended failed or
    limit_exceeded failed its workflow: its result is in the failure. Runs that did not
    return otherwise (failed, terminated, timed out) keep Temporal's word.
    """
    if status == WorkflowExecutionStatus.FAILED:
        result = await closed_result(client, workflow_id, run_id)
        return result.status if result is not None else temporal_state(status)
    if status != WorkflowExecutionStatus.COMPLETED:
        return temporal_state(status)
    if search_attributes is not None and (state := recorded_state(search_attributes)) in (
        "completed",
        "failed",
        "cancelled",
        "limit_exceeded",
    ):
        return state
    handle = client.get_workflow_handle(workflow_id, run_id=run_id, result_type=AgentResult)
    try:
        result = await handle.result(follow_runs=False, rpc_timeout=RPC_TIMEOUT)
    except (RPCError, RPCTimeoutOrCancelledError, TemporalError, ValueError, TypeError):
        raise_if_cancelled()
        return "completed"
    return result.status if isinstance(result, AgentResult) else "completed"


async def closed_result(client: Client, workflow_id: str, run_id: str | None) -> AgentResult | None:
    """A closed run's ``AgentResult``: returned, or in the failure of a run that failed its workflow
    (``AGENT_FAIL_WORKFLOW_ON_ERROR=1``, ``AgentRunFailed``); None when it has none (or it cannot be read)."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id, result_type=AgentResult)
    try:
        result = await handle.result(follow_runs=False, rpc_timeout=RPC_TIMEOUT)
    except WorkflowFailureError as err:
        return result_of_failure(err)
    except (RPCError, RPCTimeoutOrCancelledError, TemporalError, ValueError, TypeError):
        raise_if_cancelled()
        return None
    return result if isinstance(result, AgentResult) else None


async def warn_when_no_worker(client: Client, workflow_id: str, task_queue: str, *, doing: str) -> None:
    """From ``NO_WORKER_AFTER_S`` on, check now and then; say once (stderr) when no worker polls the queue.

    Meant to run beside a wait and be cancelled when the wait ends.
    """
    while True:
        await asyncio.sleep(NO_WORKER_AFTER_S)
        if await poller_count(client, task_queue) == 0:
            print(
                f"warning: {no_worker_line(task_queue)}: run {workflow_id} waits until one does, and "
                f"this command {doing} ({start_worker_hint(task_queue)})",
                file=sys.stderr,
                flush=True,
            )
            return


async def bounded(pending: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """Await each (not yet started) awaitable, at most ``limit`` at a time; results in their order."""
    gate = asyncio.Semaphore(limit)

    async def one(awaitable: Awaitable[T]) -> T:
        async with gate:
            return await awaitable

    return list(await asyncio.gather(*(one(awaitable) for awaitable in pending)))


def raise_if_cancelled() -> None:
    """Re-raise a cancellation an RPC error stood for (call it first in every handler of RPC errors).

    The SDK turns the cancellation of a call in flight into ``RPCTimeoutOrCancelledError``; a handler
    that takes it for a slow server would swallow Ctrl-C (asyncio cancels every task on exit and then
    waits for them), so a loop polling the server would keep the command alive for good.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
