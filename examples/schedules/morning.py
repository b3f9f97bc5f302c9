"""An agent task on a cron, and a session that hears from a schedule, driven from your own code.

    python -m examples.schedules.morning [--name NAME]

Creates schedule NAME (a task every weekday at 09:00 UTC) and NAME-chat (a message to session
NAME-chat at the same time), fires both now with ``schedule_trigger`` instead of waiting for Monday,
prints what their runs did, pauses the first, lists both and deletes them. Both are Temporal Schedules
(``agent-schedule-NAME`` in the UI's Schedules page) that skip a firing while their previous run is
open. A worker (``worker.py``) must poll ``AGENT_TASK_QUEUE``; ``TEMPORAL_ADDRESS`` and the rest come
from ``Settings``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from typing import Any

from temporalio.client import Client, WorkflowHandle

from durable_agents import (
    AgentClient,
    AgentResult,
    ScheduleInfo,
    SendResult,
    Settings,
    StatusView,
    connect,
    exit_process,
)

WEEKDAYS_AT_NINE = "0 9 * * 1-5"


async def fired_once(schedules: AgentClient, name: str, within_s: float = 120.0) -> ScheduleInfo:
    """The schedule once the run its trigger started has ended."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        info = await schedules.schedule_describe(name)
        if info.actions >= 1 and not info.running:
            return info
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"schedule {name}: no run ended within {within_s:.0f} s")
        await asyncio.sleep(0.2)


async def replied(session: WorkflowHandle[Any, Any], seq: int, within_s: float = 120.0) -> StatusView:
    """The session's ``status`` once it has answered message ``seq`` and waits for the next one."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        view: StatusView = await session.query("status", result_type=StatusView)
        if view.replied >= seq and view.state == "idle":
            return view
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no reply to message {seq} within {within_s:.0f} s (state {view.state})")
        await asyncio.sleep(0.2)


async def main(name: str) -> None:
    settings = Settings.from_env()
    client: Client = await connect(settings.temporal, keyring=settings.encryption.keyring)
    schedules = AgentClient(client, task_queue=settings.temporal.task_queue)

    task = await schedules.schedule_create(name, cron=WEEKDAYS_AT_NINE, task="Good morning: what should I check first?")
    nine = all(at[11:16] == "09:00" for at in task.next_runs)
    print(f"created {task.name} ({task.kind}): cron {task.cron!r}, next runs at 09:00 UTC: {nine}")
    chat = await schedules.schedule_create(
        f"{name}-chat", cron=WEEKDAYS_AT_NINE, session=f"{name}-chat", message="Daily check-in: anything new?"
    )
    print(f"created {chat.name} ({chat.kind}): messages session {chat.session}")

    await schedules.schedule_trigger(name)
    await schedules.schedule_trigger(chat.name)
    run = (await fired_once(schedules, name)).recent_runs[-1]
    result = await client.get_workflow_handle(run.workflow_id, result_type=AgentResult).result()
    first_line = result.output.splitlines()[0] if result.output else ""
    print(f"the triggered run of {name}: {result.status}: {first_line}")
    sent_by = (await fired_once(schedules, chat.name)).recent_runs[-1]
    sent = await client.get_workflow_handle(sent_by.workflow_id, result_type=SendResult).result()
    print(f"session {chat.session} took the scheduled message as message {sent.seq}")

    session = client.get_workflow_handle(chat.session)
    view = await replied(session, sent.seq)
    print(f"session {chat.session} replied: {view.output.splitlines()[0] if view.output else ''}")

    await schedules.schedule_pause(name, note="on holiday")
    for info in [await schedules.schedule_describe(each) for each in (name, chat.name)]:
        print(f"{info.name}: paused={info.paused} runs={info.actions} skipped={info.skipped_overlap}")
    for each in (name, chat.name):
        await schedules.schedule_delete(each)
    await session.signal("close")
    print("deleted both schedules; their runs stay in the history")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m examples.schedules.morning", description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="", help="the schedule's name (default: morning-<random>)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse_args()
    asyncio.run(main(options.name or f"morning-{uuid.uuid4().hex[:8]}"))
    sys.stdout.flush()
    exit_process(0)  # a short-lived client process: leave without interpreter teardown
