"""Sandbox housekeeping: ``starter.py sandboxes reap``."""

from __future__ import annotations

import argparse
from typing import Any

from temporalio.client import Client

from activities.sandbox.base import SandboxUnavailable
from activities.sandbox.factory import backend_for
from activities.settings import Settings
from durable_agents.cli.common import EXIT_USAGE, CliError, Parser, positive_int
from durable_agents.reaping import reap_once


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    sandboxes = sub.add_parser("sandboxes", help="sandbox housekeeping")
    sandboxes_sub = sandboxes.add_subparsers(dest="sandboxes_command", required=True, parser_class=Parser)
    reap_parser = sandboxes_sub.add_parser("reap", help="kill sandboxes whose run has ended")
    reap_parser.add_argument("--min-age", type=positive_int, default=60, help="keep sandboxes younger than this (s)")


async def cmd_sandboxes(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    """Reap with this machine's sandbox configuration (AGENT_SANDBOX, AGENT_STATE_DIR, E2B_API_KEY)."""
    try:
        backend = backend_for(settings)
    except SandboxUnavailable as err:
        raise CliError(str(err), code=EXIT_USAGE) from None
    report = await reap_once(client, backend, min_age_s=args.min_age)
    print(report.summary())
    return 1 if report.errors else 0
