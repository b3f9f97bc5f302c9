"""``starter.py schedule create|list|pause|unpause|delete|trigger``: agents on a cron, as Temporal Schedules.

``create NAME --cron "0 9 * * 1-5" --task TEXT`` starts an agent run with the task at each firing;
``--session ID --message TEXT`` sends the message to that session instead (starting or waking it).
The cron and the name are checked while the arguments are parsed, so a typo is one line and exit 2
before any call to Temporal. A schedule never has two runs open: a firing while its previous run is
open is skipped (``list`` counts those). ``list`` shows this task queue's and every other schedule the
command may see (``--tenant T``: T's only); ``--json`` prints ``ScheduleInfo`` objects. A name with no
schedule is exit 1. Names are per tenant: ``pause``, ``unpause``, ``delete`` and ``trigger`` find a name
among every tenant's schedules, and need ``--tenant T`` when several tenants use it (exit 2 otherwise).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from typing import Any

from temporalio.client import Client

from activities.settings import Settings
from durable_agents.agent_client import AgentClient
from durable_agents.agent_client._schedules import (
    InvalidSchedule,
    ScheduleExists,
    ScheduleInfo,
    ScheduleNotFound,
    check_cron,
    check_name,
)
from durable_agents.cli.common import EXIT_OK, EXIT_RUN, EXIT_USAGE, CliError, Parser, cli_command, print_json
from durable_agents.cli.names import check_model
from durable_agents.cli.sessions import read_message


def _name(text: str) -> str:
    try:
        return check_name(text)
    except InvalidSchedule as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _cron(text: str) -> str:
    try:
        return check_cron(text)
    except InvalidSchedule as err:
        raise argparse.ArgumentTypeError(str(err)) from None


class _ScheduleParser(Parser):
    """``create``'s flags that go together are checked while parsing (argparse has no "requires"), so that
    a missing ``--message`` is exit 2 before the command connects to Temporal."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        session, message, task = (getattr(parsed, flag, None) for flag in ("session", "message", "task"))
        if session is not None and message is None:
            self.error("--session needs --message TEXT")
        if task is not None and message is not None:
            self.error("--message goes with --session, not --task")
        return parsed, extras


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    schedule = sub.add_parser(
        "schedule", help="run an agent task, or message a session, on a cron (Temporal Schedules)"
    )
    commands = schedule.add_subparsers(dest="schedule_command", required=True, parser_class=_ScheduleParser)
    create = commands.add_parser("create", help="create a schedule (it fires at the cron's times)")
    create.add_argument("name", type=_name, help="the schedule's name (letters, digits, '.', '_', '-')")
    create.add_argument(
        "--cron", required=True, type=_cron, help='when: "MIN HOUR DOM MON DOW", @daily, or "@every 10m"'
    )
    what = create.add_mutually_exclusive_group(required=True)
    what.add_argument("--task", help="start an agent run with this task at each firing")
    what.add_argument("--session", help="send --message to this session at each firing (started when missing)")
    create.add_argument("--message", help="the message a --session schedule sends")
    create.add_argument("--model", help="the runs' model (default: the worker's AGENT_MODEL)")
    create.add_argument("--tenant", help="the tenant the runs are for")
    create.add_argument("--paused", action="store_true", help="create it paused (unpause starts it)")
    listing = commands.add_parser("list", help="every schedule, with its next and recent runs")
    listing.add_argument("--json", action="store_true", help="one JSON array of schedule objects")
    listing.add_argument("--tenant", help="only this tenant's schedules")
    for verb, text in (
        ("pause", "stop firing until unpause (a run already started goes on)"),
        ("unpause", "fire again at the cron's times"),
        ("delete", "delete the schedule (its runs are not touched)"),
        ("trigger", "fire now (skipped while its previous run is open)"),
    ):
        command = commands.add_parser(verb, help=text)
        command.add_argument("name", type=_name, help="the schedule's name")
        command.add_argument("--tenant", help="the tenant whose schedule it is (needed when several use the name)")
        if verb in ("pause", "unpause"):
            command.add_argument("--note", default="", help="why (shown with the schedule, also in the UI)")


def schedules(client: Client, settings: Settings) -> AgentClient:
    return AgentClient(client, task_queue=settings.temporal.task_queue)


async def cmd_schedule(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    agents = schedules(client, settings)
    command: str = args.schedule_command
    try:
        if command == "create":
            return await _create(agents, args, settings)
        if command == "list":
            return await _list(agents, args)
        name: str = args.name
        tenant: str | None = args.tenant
        if command == "pause":
            await agents.schedule_pause(name, note=args.note, tenant=tenant)
            print(f"paused schedule {name} (resume: {cli_command(f'schedule unpause {name}{_of(tenant)}')})")
        elif command == "unpause":
            await agents.schedule_unpause(name, note=args.note, tenant=tenant)
            print(f"unpaused schedule {name}")
        elif command == "delete":
            await agents.schedule_delete(name, tenant=tenant)
            print(f"deleted schedule {name} (its runs are not touched)")
        else:
            await agents.schedule_trigger(name, tenant=tenant)
            print(f"triggered schedule {name} (skipped if its previous run is still open; see {_list_command()})")
    except (ScheduleNotFound, ScheduleExists) as err:
        raise CliError(str(err), EXIT_RUN) from None
    except InvalidSchedule as err:
        raise CliError(str(err), EXIT_USAGE) from None
    return EXIT_OK


async def _create(agents: AgentClient, args: argparse.Namespace, settings: Settings) -> int:
    if args.model:
        check_model(args.model, settings)
    message = read_message(args.message) if args.message is not None else None
    info = await agents.schedule_create(
        args.name,
        cron=args.cron,
        task=args.task,
        session=args.session,
        message=message,
        model=args.model or None,
        tenant=args.tenant,
        paused=args.paused,
    )
    target = f"session {info.session}" if info.kind == "session" else "an agent run"
    print(f"created schedule {info.name} ({info.cron}): {target} at each firing, on task queue {agents.task_queue}")
    print(f"next: {info.next_runs[0]}" if info.next_runs else "next: none (paused)")
    print(f"fire now: {cli_command(f'schedule trigger {info.name}{_of(info.tenant)}')}   see it: {_list_command()}")
    return EXIT_OK


def _of(tenant: str | None) -> str:
    """`` --tenant T`` for a hint that must name the tenant (another tenant may use the same name)."""
    return f" --tenant {shlex.quote(tenant)}" if tenant else ""


def _list_command() -> str:
    return cli_command("schedule list")


async def _list(agents: AgentClient, args: argparse.Namespace) -> int:
    infos = await (agents.for_tenant(args.tenant) if args.tenant is not None else agents).schedule_list()
    if args.json:
        print_json([info.model_dump(mode="json") for info in infos])
        return EXIT_OK
    if not infos:
        print("no schedules")
    for info in infos:
        print(_line(info))
    return EXIT_OK


def _line(info: ScheduleInfo) -> str:
    state = "paused" if info.paused else "active"
    what = f"session {info.session}: {info.message}" if info.kind == "session" else f"task: {info.task}"
    what = " ".join("".join(c if c.isprintable() else " " for c in what).split())[:120]
    last = info.recent_runs[-1].workflow_id if info.recent_runs else "-"
    running = " running" if info.running else ""
    tenant = f" tenant={info.tenant}" if info.tenant else ""
    next_run = info.next_runs[0] if info.next_runs else "-"
    return (
        f"{info.name}  {state}{running}  cron={info.cron!r}  next={next_run}  runs={info.actions} "
        f"skipped={info.skipped_overlap}  last={last}{tenant}  {what}"
    )
