"""What every command of ``starter.py`` shares: errors, the argument parser, JSON output, Ctrl-C's note.

Reading runs is ``AgentClient``'s (``durable_agents.agent_client``); its helpers are re-exported here
for the commands, and :func:`client_errors` turns its errors into the CLI's one line and exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import functools
import json
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, NoReturn

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.settings import Settings
from durable_agents.agent_client._client import AgentClient

# Reading runs is AgentClient's; what the commands use of it is re-exported here (see __all__).
from durable_agents.agent_client._errors import AgentClientError, InvalidRequest, NoAnswer, RunExists
from durable_agents.agent_client._reading import (
    PROBE_TIMEOUT,
    QUERY_TIMEOUT,
    QUICK_QUERY_TIMEOUT,
    RPC_TIMEOUT,
    VISIBILITY_PAGE,
    ask_status,
    bounded,
    check_agent_run,
    closed_result,
    describe_run,
    ended_state,
    list_runs,
    no_answer_reason,
    no_worker_line,
    poller_count,
    query_literal,
    raise_if_cancelled,
    recorded_state,
    start_worker_hint,
    started_input,
    temporal_state,
    workflow_not_ready,
)
from durable_agents.agent_client._words import (
    CONSOLE_SCRIPT,
    REPO_STARTER,
    cli_command,
    worker_command,
)

# Exit codes (documented in durable_agents/cli/main.py and docs/reference/cli.md).
EXIT_OK = 0
EXIT_RUN = 1  # no such run, it did not complete, it refused the request, no worker answered
EXIT_USAGE = 2  # bad arguments or input, a bad configuration, no Temporal server
EXIT_INTERRUPTED = 130  # Ctrl-C

NO_WORKER_AFTER_S = 10.0  # a run that waits this long on a queue nobody polls is said so, once
# A command: the connected client, its parsed arguments and the process's settings → the exit code.
Command = Callable[[Client, argparse.Namespace, Settings], Awaitable[int]]


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code attached."""

    def __init__(self, message: str, code: int = EXIT_RUN) -> None:
        super().__init__(message)
        self.code = code


def agent_client(client: Client, settings: Settings) -> AgentClient:
    """The ``AgentClient`` a command works through: the settings' task queue and approval key, its
    warnings (a run that did not answer) on stderr."""
    return AgentClient(
        client,
        task_queue=settings.temporal.task_queue,
        approval_key=settings.approval_key,
        store_url=settings.store_url,
        warn=warn,
    )


def warn(line: str) -> None:
    print(line, file=sys.stderr)


def cli_error(err: AgentClientError) -> CliError:
    """The one place an ``AgentClient`` error becomes the CLI's one line and exit code."""
    usage = isinstance(err, InvalidRequest) or (isinstance(err, RunExists) and err.closed)
    return CliError(str(err), code=EXIT_USAGE if usage else EXIT_RUN)


def client_errors(command: Command) -> Command:
    """``command``, its ``AgentClient`` errors raised as ``CliError`` (see :func:`cli_error`)."""

    @functools.wraps(command)
    async def wrapped(client: Client, args: argparse.Namespace, settings: Settings) -> int:
        try:
            return await command(client, args, settings)
        except AgentClientError as err:
            raise cli_error(err) from None

    return wrapped


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
    """The server stopped answering (the SDK gave up retrying a connection), as opposed to refusing a request.

    A call in flight when the server's process dies can also end as ``UNKNOWN`` (or ``CANCELLED``) with
    "transport error": the connection broke under it, which is the same loss.
    """
    if not isinstance(err, RPCError):
        return False
    if err.status == RPCStatusCode.UNAVAILABLE:
        return True
    return err.status in (RPCStatusCode.UNKNOWN, RPCStatusCode.CANCELLED) and "transport error" in err.message


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


# --- waiting on a run ---------------------------------------------------------------


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


__all__ = [
    "CONSOLE_SCRIPT",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_RUN",
    "EXIT_USAGE",
    "MAX_INT",
    "NO_WORKER_AFTER_S",
    "PROBE_TIMEOUT",
    "QUERY_TIMEOUT",
    "QUICK_QUERY_TIMEOUT",
    "REPO_STARTER",
    "RPC_TIMEOUT",
    "SUGGEST_CUTOFF",
    "VISIBILITY_PAGE",
    "AgentClient",
    "AgentClientError",
    "CliError",
    "Command",
    "InterruptState",
    "InvalidRequest",
    "NoAnswer",
    "Parser",
    "RunExists",
    "agent_client",
    "ask_status",
    "bounded",
    "check_agent_run",
    "check_text_arguments",
    "cli_command",
    "cli_error",
    "client_errors",
    "closed_result",
    "describe_run",
    "did_you_mean",
    "ended_state",
    "event_offset",
    "following",
    "interrupt_note",
    "interrupt_state",
    "list_runs",
    "lost_note",
    "name_list",
    "no_answer_reason",
    "no_worker_line",
    "not_utf8",
    "on_interrupt",
    "parse",
    "poller_count",
    "positive_int",
    "print_json",
    "query_literal",
    "raise_if_cancelled",
    "reattach_command",
    "reattach_note",
    "recorded_state",
    "restore_interrupt",
    "start_worker_hint",
    "started_input",
    "temporal_lost",
    "temporal_state",
    "warn",
    "warn_when_no_worker",
    "worker_command",
    "workflow_not_ready",
]
