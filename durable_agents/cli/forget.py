"""``starter.py forget --tenant T [--user U] [--dry-run] [--include-open]``: delete a tenant's (or user's) data.

What it deletes, and how, is :mod:`durable_agents.forgetting`'s; this prints the counts per kind,
the open runs it left alone, and writes the one audit line (``forget`` on stderr, with the tenant,
user, counts and ``dry_run``: never content). Exit 1 when runs stayed open with ``--include-open``
(they were cancelled but did not close in time: run it again).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.settings import Settings
from durable_agents import forgetting
from durable_agents.cli.common import EXIT_OK, EXIT_RUN, EXIT_USAGE, CliError

_KINDS = (
    ("runs", "runs (Temporal executions)"),
    ("conversations", "conversations"),
    ("messages", "messages"),
    ("checkpoints", "checkpoints"),
    ("blobs", "blobs"),
    ("ledger_entries", "ledger entries"),
    ("memory_entries", "memory entries"),
)


def _name(what: str) -> Any:
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"expected a {what} name")
        return text

    return parse


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    forget = sub.add_parser(
        "forget",
        help="delete everything of a tenant (or one of its users): runs, transcripts, checkpoints, ledger, memory",
    )
    forget.add_argument("--tenant", required=True, type=_name("tenant"), help="the tenant to forget")
    forget.add_argument("--user", type=_name("user"), help="only this user of the tenant")
    forget.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
    forget.add_argument(
        "--include-open",
        action="store_true",
        help="cancel the open runs (their compensations run), wait for them to close, and forget them too",
    )


async def cmd_forget(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    logging.getLogger(forgetting.AUDIT_LOGGER).setLevel(logging.INFO)  # the audit line, past the CLI's WARNING
    try:
        report = await forgetting.forget_tenant(
            client, settings, args.tenant, args.user, dry_run=args.dry_run, include_open=args.include_open
        )
    except RPCError as err:
        if err.status == RPCStatusCode.INVALID_ARGUMENT:
            raise CliError(
                f"this namespace cannot find runs by tenant ({err.message}); register the Agent* search "
                "attributes (see docs/operations.md)",
                code=EXIT_USAGE,
            ) from None
        raise
    who = f"user {args.user!r} of tenant {args.tenant!r}" if args.user else f"tenant {args.tenant!r}"
    print(f"would forget {who} (dry run: nothing deleted)" if args.dry_run else f"forgot {who}")
    counts = dict(report.counts)
    for key, label in _KINDS:
        print(f"  {label}: {counts.pop(key, 0)}")
    shared = counts.pop("shared_blobs_kept", 0)
    if shared:
        print(f"  ({shared} blob(s) kept: other runs still use the same content)")
    if report.kept_ledgers:
        print(f"  ledger entries kept for workflow ids other runs share: {', '.join(report.kept_ledgers)}")
    if not report.scrubbed:
        print(
            "  note: the SQLite WAL could not be truncated (another connection kept reading): earlier copies of the "
            "deleted rows stay in it until its next checkpoint; run forget again"
        )
    for problem in report.problems:
        print(f"  note: {problem}")
    if report.open_runs:
        if args.include_open and not args.dry_run:
            print(f"still open after cancelling (not deleted; run forget again): {', '.join(report.open_runs)}")
            return EXIT_RUN
        hint = "" if args.include_open else " (--include-open cancels and forgets them)"
        print(f"open runs left alone{hint}: {', '.join(report.open_runs)}")
    return EXIT_OK
