"""``starter.py schedule create|list|pause|unpause|delete|trigger`` end to end, with their exit codes.

Real dev server, an in-process worker, the fake model server; ``starter.py`` runs as a subprocess (in a
thread: the worker answers on this test's event loop). The schedules use a yearly cron and fire through
``schedule trigger``, so every run the test sees is one it asked for.
"""

from __future__ import annotations

import json
import shlex
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from durable_agents import AgentClient, ScheduleInfo
from durable_agents.cli.common import parse
from durable_agents.cli.main import build_parser
from tests.conftest import WorkerFactory
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.test_cli_sessions import Cli, one_line
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.types import AgentResult, StatusView

YEARLY = "0 0 1 1 *"


@pytest.fixture
def cache_mode() -> str:
    return "cached"


def model(body: dict[str, Any]) -> Scripted:
    return Scripted(text=f"echo: {body['messages'][-1].get('content')}")


def new_name() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


async def listed(cli: Cli, name: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        shown = await cli("schedule", "list", "--json")
        assert shown.returncode == 0, shown.stderr
        return next((row for row in json.loads(shown.stdout) if row["name"] == name), None)

    return await eventually(check, f"schedule list shows {name}")


async def _rows(cli: Cli, name: str, count: int, *flags: str) -> list[dict[str, Any]] | None:
    shown = await cli("schedule", "list", "--json", *flags)
    assert shown.returncode == 0, shown.stderr
    rows = [row for row in json.loads(shown.stdout) if row["name"] == name]
    return rows if len(rows) == count else None


async def ended(schedules: AgentClient, name: str, count: int) -> ScheduleInfo:
    async def check() -> ScheduleInfo | None:
        info = await schedules.schedule_describe(name)
        return info if info.actions >= count and not info.running else None

    return await eventually(check, f"{count} run(s) of {name} ended")


async def test_create_list_trigger_pause_unpause_delete_and_their_exit_codes(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    name = new_name()
    async with run_worker(dev_env.client, runtime) as tq:
        cli = Cli(dev_env.client, tq)
        schedules = AgentClient(dev_env.client, task_queue=tq)
        created = await cli("schedule", "create", name, "--cron", YEARLY, "--task", "good morning", "--tenant", "acme")
        assert created.returncode == 0, created.stderr
        assert created.stdout.startswith(f"created schedule {name} ({YEARLY}): an agent run at each firing"), created
        assert "next: " in created.stdout and f"schedule trigger {name}" in created.stdout, created.stdout
        again = await cli("schedule", "create", name, "--cron", YEARLY, "--task", "twice", "--tenant", "acme")
        assert again.returncode == 1 and f"a schedule named '{name}' exists already" in one_line(again)

        row = await listed(cli, name)
        assert row["kind"] == "task" and row["task"] == "good morning" and row["tenant"] == "acme", row
        assert row["paused"] is False and row["actions"] == 0 and row["cron"] == YEARLY, row

        fired = await cli("schedule", "trigger", name)
        assert fired.returncode == 0 and fired.stdout.startswith(f"triggered schedule {name}"), fired
        info = await ended(schedules, name, 1)
        run = dev_env.client.get_workflow_handle(info.recent_runs[-1].workflow_id, result_type=AgentResult)
        assert (await run.result()).output == "echo: good morning"

        paused = await cli("schedule", "pause", name, "--note", "holidays")
        assert paused.returncode == 0 and paused.stdout.startswith(f"paused schedule {name}"), paused
        text = await cli("schedule", "list")
        [line] = [line for line in text.stdout.splitlines() if line.startswith(f"{name}  ")]
        assert " paused " in line and "runs=1 " in line and "tenant=acme" in line and "task: good morning" in line
        assert line.count(info.recent_runs[-1].workflow_id) == 1, line
        unpaused = await cli("schedule", "unpause", name)
        assert unpaused.returncode == 0, unpaused.stderr
        assert (await schedules.schedule_describe(name)).paused is False

        # Another tenant's schedule of the same name: by name alone it is ambiguous, --tenant picks one.
        other = await cli("schedule", "create", name, "--cron", YEARLY, "--task", "theirs", "--tenant", "globex")
        assert other.returncode == 0, other.stderr
        await eventually(lambda: _rows(cli, name, 2), f"schedule list shows both schedules named {name}")
        ambiguous = await cli("schedule", "trigger", name)
        assert ambiguous.returncode == 2, ambiguous
        assert f"2 schedules are named '{name}', of tenants 'acme', 'globex'" in one_line(ambiguous), ambiguous
        assert "--tenant" in one_line(ambiguous), ambiguous
        [theirs] = await _rows(cli, name, 1, "--tenant", "globex") or [{}]
        assert theirs["tenant"] == "globex" and theirs["task"] == "theirs", theirs
        paused_theirs = await cli("schedule", "pause", name, "--tenant", "globex")
        assert paused_theirs.returncode == 0, paused_theirs.stderr
        assert (await schedules.schedule_describe(name, tenant="globex")).paused
        assert not (await schedules.schedule_describe(name, tenant="acme")).paused
        assert (await cli("schedule", "delete", name, "--tenant", "globex")).returncode == 0

        deleted = await cli("schedule", "delete", name)
        assert deleted.returncode == 0 and deleted.stdout.startswith(f"deleted schedule {name}"), deleted
        for verb in ("delete", "trigger", "pause", "unpause"):
            missing = await cli("schedule", verb, name)
            assert missing.returncode == 1 and one_line(missing) == f"error: no schedule named '{name}'", missing


async def test_a_session_schedule_made_on_the_command_line_sends_its_message_at_each_firing(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    name, session_id = new_name(), f"cs-{uuid.uuid4().hex[:10]}"
    async with run_worker(dev_env.client, runtime) as tq:
        cli = Cli(dev_env.client, tq)
        schedules = AgentClient(dev_env.client, task_queue=tq)
        created = await cli("schedule", "create", name, "--cron", YEARLY, "--session", session_id, "--message", "hi")
        assert created.returncode == 0, created.stderr
        assert f"session {session_id} at each firing" in created.stdout, created.stdout
        for count in (1, 2):
            fired = await cli("schedule", "trigger", name)
            assert fired.returncode == 0, fired.stderr
            await ended(schedules, name, count)
        row = await listed(cli, name)
        assert row["kind"] == "session" and row["session"] == session_id and row["message"] == "hi", row
        assert (await cli("schedule", "delete", name)).returncode == 0
        handle = dev_env.client.get_workflow_handle(session_id)

        async def answered() -> StatusView | None:
            view = StatusView.model_validate(await handle.query(AgentWorkflow.status))
            return view if view.replied >= 2 and view.state == "idle" else None

        view = await eventually(answered, "the session answered both scheduled messages")
        assert view.messages == 2 and view.output == "echo: hi", view
        await handle.signal("close")


async def test_bad_usage_is_one_line_and_exit_2_before_any_call_to_temporal(dev_env: WorkflowEnvironment) -> None:
    cli = Cli(dev_env.client, "unused")
    cli.env["TEMPORAL_ADDRESS"] = "127.0.0.1:9"  # nothing listens: a call to Temporal would fail otherwise
    cases = {
        ("create", "n1", "--cron", "0 25 * * *", "--task", "x"): "hour '25' is not in 0-23",
        ("create", "n1", "--cron", "every day", "--task", "x"): "expected 5 fields",
        ("create", "bad/name", "--cron", YEARLY, "--task", "x"): "bad schedule name 'bad/name'",
        ("create", "n1", "--cron", YEARLY): "one of the arguments --task --session is required",
        ("create", "n1", "--cron", YEARLY, "--task", "x", "--session", "s"): "not allowed with argument",
        ("create", "n1", "--cron", YEARLY, "--session", "s"): "--session needs --message",
        ("create", "n1", "--cron", YEARLY, "--task", "x", "--message", "m"): "--message goes with --session",
        ("pause", ".hidden"): "bad schedule name",
        ("trigger", "x" * 65): "expected 1 to 64",
        ("frobnicate",): "invalid choice",
    }
    for args, why in cases.items():
        shown = await cli("schedule", *args)
        assert shown.returncode == 2, (args, shown.stdout, shown.stderr)
        assert why in one_line(shown), (args, shown.stderr)


def test_every_schedule_command_the_docs_show_parses() -> None:
    """The ``## Schedules`` section of docs/front-ends.md shows command lines the CLI's own parser takes."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "front-ends.md").read_text(encoding="utf-8")
    section = page.split("## Schedules", 1)[1].split("\n## ", 1)[0]
    lines = [line.split("  #")[0] for line in section.splitlines() if line.startswith("durable-agents schedule ")]
    assert len(lines) >= 7, lines
    for line in lines:
        args = parse(build_parser("durable-agents"), shlex.split(line)[1:])
        assert args.command == "schedule", line
