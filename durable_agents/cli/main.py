"""``starter.py``'s entry point: the parser, the settings, the connection, and one line per failure.

The environment is read once, by ``Settings.from_env()``, after the arguments
parsed; each command gets the connected client, its arguments and the settings.
Every failure is one line on stderr and a non-zero exit: 2 for bad arguments, a
bad configuration or an unreachable server, 1 for a run that does not exist or did
not complete.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from temporalio.service import RPCError

from activities.settings import ConfigurationError, Settings
from durable_agents import logs, telemetry
from durable_agents.cli.approvals import add_commands as add_approval_commands
from durable_agents.cli.approvals import cmd_approve, cmd_pending, cmd_reject, cmd_resolve
from durable_agents.cli.common import CliError, Command, Parser
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
from durable_agents.cli.watch import add_command as add_watch_command
from durable_agents.cli.watch import cmd_watch
from durable_agents.client import TemporalUnavailable, connect

COMMANDS: dict[str, Command] = {
    "run": cmd_run,
    "watch": cmd_watch,
    "status": cmd_status,
    "approve": cmd_approve,
    "reject": cmd_reject,
    "resolve": cmd_resolve,
    "pending": cmd_pending,
    "cancel": cmd_cancel,
    "sandboxes": cmd_sandboxes,
    "list": cmd_list,
}


def build_parser() -> argparse.ArgumentParser:
    """Every command's arguments; reads nothing from the environment."""
    parser = Parser(prog="starter.py", description="Start and inspect durable agent runs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_run_command(sub)
    add_watch_command(sub)
    add_status_command(sub)
    add_approval_commands(sub)
    add_cancel_command(sub)
    add_sandboxes_command(sub)
    add_list_command(sub)
    return parser


async def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        settings = Settings.from_env()
        # Library warnings only, on stderr: stdout is the command's output.
        logs.configure(level="WARNING", secrets=settings.secret_values())
        telemetry.configure_tracing("durable-agents-starter", settings.observability)
        client = await connect(settings.temporal, plugins=telemetry.temporal_plugins())
        return await COMMANDS[args.command](client, args, settings)
    except (CliError, ConfigurationError, TemporalUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code if isinstance(err, CliError) else 2
    except RPCError as err:
        print(f"error: Temporal refused the request: {err.message}", file=sys.stderr)
        return 1
    finally:
        telemetry.shutdown_tracing()  # the process leaves through os._exit: flush spans first
