"""``starter.py``'s entry point: the parser, the settings, the connection, and one line per failure.

The environment is read once, by ``Settings.from_env()``, after the arguments
parsed; each command gets the connected client, its arguments and the settings.
The starter does not import operator modules (``AGENT_TOOL_MODULES``,
``AGENT_PROVIDER_MODULES``): those are the worker's. Two exceptions: ``tools``, a
local command (no Temporal connection) that shows what a worker with this
environment would offer, so it loads the tool modules and starts the MCP servers
the way a worker does; and ``run`` / ``fork`` given a ``--model`` or ``--tools``
that is not a built-in one, which load them to check the name before the run
starts (``durable_agents/cli/names.py``: a misspelt name is exit 2 with a "did you
mean"). A misspelt command, choice or flag gets a "did you mean" too.

A user never sees a traceback. Every failure is one line on stderr, and the exit
code says which kind it was:

    0    done
    1    a run-level failure: no such run, the run did not complete (failed,
         cancelled, limit_exceeded), it refused the request (a decision, a
         duplicate id, a message: refused: REASON), or no worker answered (status / pending / watch); an
         MCP server ``tools`` could not list; also an internal error (a bug),
         named in its one line
    2    bad usage or input (arguments, an empty or non-UTF-8 task, an unreadable
         --task-file or --policy), a bad configuration (including a key ring
         missing for a run whose payloads are encrypted: ``AGENT_PAYLOAD_KEYS``),
         or no Temporal server, also when it goes away while a command follows
         a run (the line says how to reattach)
    130  interrupted (Ctrl-C); the run itself goes on, and the line says how to
         reattach

A reader that closes the output early (``starter.py watch ID | head -1``) ends
the command quietly with exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import re
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from temporalio.client import RPCTimeoutOrCancelledError
from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError

import durable_agents.cli.schedule as schedule
from activities.crypto.codec import PayloadsEncrypted
from activities.settings import ConfigurationError, Settings
from durable_agents import logs
from durable_agents.agent_client._errors import AgentClientError
from durable_agents.cli.approvals import add_commands as add_approval_commands
from durable_agents.cli.approvals import cmd_approve, cmd_pending, cmd_reject, cmd_resolve
from durable_agents.cli.chat import add_command as add_chat_command
from durable_agents.cli.chat import cmd_chat
from durable_agents.cli.codec import add_command as add_codec_command
from durable_agents.cli.codec import cmd_codec_server
from durable_agents.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUN,
    EXIT_USAGE,
    CliError,
    Command,
    Parser,
    check_text_arguments,
    cli_error,
    interrupt_note,
    lost_note,
    parse,
    raise_if_cancelled,
    temporal_lost,
)
from durable_agents.cli.eval import add_command as add_eval_command
from durable_agents.cli.eval import cmd_eval, prepare_eval
from durable_agents.cli.forget import add_command as add_forget_command
from durable_agents.cli.forget import cmd_forget
from durable_agents.cli.fork import add_fork_command, add_rewind_command, cmd_fork, cmd_rewind
from durable_agents.cli.humans import add_commands as add_human_commands
from durable_agents.cli.humans import cmd_answer, cmd_forget_approvals
from durable_agents.cli.memory import add_command as add_memory_command
from durable_agents.cli.memory import cmd_memory
from durable_agents.cli.run import add_command as add_run_command
from durable_agents.cli.run import cmd_run
from durable_agents.cli.runs import (
    add_cancel_command,
    add_list_command,
    add_status_command,
    cmd_cancel,
    cmd_list,
    cmd_status,
)
from durable_agents.cli.sandboxes import add_command as add_sandboxes_command
from durable_agents.cli.sandboxes import cmd_sandboxes
from durable_agents.cli.serve import add_command as add_serve_command
from durable_agents.cli.serve import cmd_serve
from durable_agents.cli.sessions import add_close_command, add_send_command, cmd_close, cmd_send
from durable_agents.cli.tools import add_command as add_tools_command
from durable_agents.cli.tools import cmd_tools
from durable_agents.cli.transcript import add_command as add_transcript_command
from durable_agents.cli.transcript import cmd_transcript
from durable_agents.cli.watch import add_command as add_watch_command
from durable_agents.cli.watch import cmd_watch
from durable_agents.client import TemporalUnavailable, connect
from durable_agents.version import package_version

if TYPE_CHECKING:
    from temporalio.plugin import SimplePlugin  # imports the worker: 0.1 s a command needs only when tracing

COMMANDS: dict[str, Command] = {
    "run": cmd_run,
    "watch": cmd_watch,
    "status": cmd_status,
    "approve": cmd_approve,
    "reject": cmd_reject,
    "resolve": cmd_resolve,
    "pending": cmd_pending,
    "answer": cmd_answer,
    "forget-approvals": cmd_forget_approvals,
    "cancel": cmd_cancel,
    "sandboxes": cmd_sandboxes,
    "list": cmd_list,
    "fork": cmd_fork,
    "rewind": cmd_rewind,
    "send": cmd_send,
    "close": cmd_close,
    "transcript": cmd_transcript,
    "chat": cmd_chat,
    "forget": cmd_forget,
    "schedule": schedule.cmd_schedule,
    "eval": cmd_eval,
    "serve": cmd_serve,
}
# Commands that check their input files before connecting: a bad input is exit 2 even with no Temporal server.
PREPARE: dict[str, Callable[[argparse.Namespace, Settings], None]] = {"eval": prepare_eval}
# Commands that need no Temporal server: their arguments and the settings → the exit code.
LocalCommand = Callable[[argparse.Namespace, Settings], Awaitable[int]]
LOCAL_COMMANDS: dict[str, LocalCommand] = {
    "tools": cmd_tools,
    "memory": cmd_memory,
    "codec-server": cmd_codec_server,
}


def build_parser(prog: str = "starter.py") -> argparse.ArgumentParser:
    """Every command's arguments; reads nothing from the environment."""
    parser = Parser(
        prog=prog,
        description="Start and inspect durable agent runs.",
        epilog="Exit codes: 0 done; 1 no such run, the run did not complete, it refused the request, or no worker "
        "answered; 2 bad usage or input, a bad configuration, or no Temporal server; "
        "130 interrupted (the run goes on).",
    )
    parser.add_argument("--version", action="version", version=f"durable-agents {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_run_command(sub)
    add_watch_command(sub)
    add_status_command(sub)
    add_approval_commands(sub)
    add_human_commands(sub)
    add_cancel_command(sub)
    add_sandboxes_command(sub)
    add_list_command(sub)
    add_fork_command(sub)
    add_rewind_command(sub)
    add_send_command(sub)
    add_close_command(sub)
    add_transcript_command(sub)
    add_chat_command(sub)
    add_forget_command(sub)
    schedule.add_command(sub)
    add_eval_command(sub)
    add_tools_command(sub)
    add_memory_command(sub)
    add_codec_command(sub)
    add_serve_command(sub)
    return parser


async def main(argv: Sequence[str] | None = None, *, prog: str = "starter.py") -> int:
    """Parse, configure, connect and run one command; the exit code (see the module docstring)."""
    address = "its address"
    try:
        args = parse(build_parser(prog), argv)
        check_text_arguments(args)
        settings = Settings.from_env()
        # Library warnings only, on stderr: stdout is the command's output.
        logs.configure(level="WARNING", secrets=settings.secret_values())
        plugins = _tracing(settings)
        if args.command in LOCAL_COMMANDS:
            return await LOCAL_COMMANDS[args.command](args, settings)
        if args.command in PREPARE:
            PREPARE[args.command](args, settings)
        client = await connect(
            settings.temporal,
            plugins=plugins,
            runtime=quiet_runtime(),
            keyring=settings.encryption.keyring,
            name_encrypted=True,
        )
        address = client.service_client.config.target_host
        return await COMMANDS[args.command](client, args, settings)
    except (CliError, AgentClientError, ConfigurationError, TemporalUnavailable) as err:
        if isinstance(err, AgentClientError):  # a command that did not map its client's errors itself
            err = cli_error(err)
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return err.code if isinstance(err, CliError) else EXIT_USAGE
    except PayloadsEncrypted as err:
        print(f"error: {encrypted_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except RPCError as err:
        if temporal_lost(err):
            note = lost_note()
            print(
                f"error: lost the connection to Temporal at {address} ({one_line(err.message)})"
                + (f"; {note}" if note else ""),
                file=sys.stderr,
            )
            return EXIT_USAGE
        print(f"error: Temporal refused the request: {one_line(err.message)}", file=sys.stderr)
        return EXIT_RUN
    except RPCTimeoutOrCancelledError as err:
        raise_if_cancelled()
        print(f"error: Temporal did not answer in time: {one_line(str(err))}", file=sys.stderr)
        return EXIT_RUN
    except BrokenPipeError:
        raise  # run() ends quietly
    except Exception as err:  # a bug: still one line, with where it happened
        print(f"error: internal error: {_where(err)}: {type(err).__name__}: {one_line(str(err))}", file=sys.stderr)
        return EXIT_RUN
    finally:
        if "durable_agents.telemetry" in sys.modules:  # the process leaves through os._exit: flush spans first
            sys.modules["durable_agents.telemetry"].shutdown_tracing()


def _tracing(settings: Settings) -> list[SimplePlugin]:
    """Temporal's tracing plugin when ``OTEL_TRACES_EXPORTER`` / an OTLP endpoint asks for traces, else none.

    OpenTelemetry is imported only then: it is a tenth of a command's start-up, which every command pays.
    """
    if not settings.observability.trace_exporters:
        return []
    from durable_agents import telemetry

    telemetry.configure_tracing("durable-agents-starter", settings.observability)
    return telemetry.temporal_plugins()


def run(argv: Sequence[str] | None = None, *, prog: str = "starter.py") -> int:
    """``starter.py``: :func:`main` in an event loop, plus what no command can catch itself.

    Ctrl-C cancels the command (asyncio turns it into ``KeyboardInterrupt`` here):
    one line, with the note the command left (how to reattach), exit 130. A closed
    stdout (``| head``) ends it quietly: stdout goes to /dev/null, as the Python
    docs recommend, so nothing fails again when it is flushed at exit.
    """
    runner = asyncio.Runner()
    try:
        code = runner.run(main(argv, prog=prog))
    except KeyboardInterrupt:
        # The loop is left as it is, not closed: closing cancels every task left and waits for each to end,
        # and one that is inside a call the SDK cannot cancel at once (or that takes its cancellation for
        # an RPC error) would keep an interrupted command alive. The process leaves through os._exit next.
        note = interrupt_note()
        _say(f"interrupted{': ' + note if note else ''}")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        runner.close()
        _output_closed()
        return EXIT_OK
    runner.close()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _output_closed()
        return EXIT_OK
    return code


@functools.cache  # one per process: each runtime has its own thread pool
def quiet_runtime() -> Runtime:
    """The Temporal core runtime of a CLI process: its own logs only at ERROR, through the stderr handler.

    By default the core writes each retry of a failing call as a multi-line warning to stdout (the
    command's output); a command says what failed in its one line instead. No worker runs here,
    so no worker heartbeats either.
    """
    core_logs = logging.getLogger("temporalio.core")
    return Runtime(
        telemetry=TelemetryConfig(
            logging=LoggingConfig(
                filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"),
                forwarding=LogForwardingConfig(logger=core_logs),
            )
        ),
        worker_heartbeat_interval=None,
    )


def encrypted_line(err: PayloadsEncrypted) -> str:
    """What the CLI says when it reads an encrypted payload without keys: which setting gives it the key."""
    return (
        f"the run's payloads are encrypted (key id {err.key_id or '?'}) and this command has no key ring: "
        "set AGENT_PAYLOAD_KEYS (or AGENT_PAYLOAD_KEYS_FILE) to the workers' key ring"
    )


def one_line(text: str) -> str:
    """A message on one line, whatever a server or a library put in it."""
    return re.sub(r"\s*\n\s*", " ", text.strip())


def _where(err: BaseException) -> str:
    """``file.py:123`` of the innermost frame of the error's traceback."""
    frames = traceback.extract_tb(err.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except BrokenPipeError:
        _output_closed()


def _output_closed() -> None:
    """The reader went away: point stdout and stderr at /dev/null so the exit's flush cannot fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)


__all__ = ["EXIT_INTERRUPTED", "EXIT_OK", "EXIT_RUN", "EXIT_USAGE", "build_parser", "main", "run"]
