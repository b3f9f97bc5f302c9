"""Schedules (``ScheduleMethods``, mixed into ``AgentClient``) on the real dev server's Temporal Schedules.

An in-process worker and the fake model server. A task ``post it`` gets an ``http_request`` POST, which
waits for an approval (a run that stays open); any other user message gets ``echo: <text>``. Schedules
that must not fire by themselves use a yearly cron and fire through ``schedule_trigger``; the one that
fires by itself uses ``@every 2s``. Every wait is for the event (``eventually``), never a fixed time.
"""

from __future__ import annotations

import json
import uuid
from functools import partial
from typing import Any

import pytest
from temporalio.client import Client, ScheduleActionStartWorkflow, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from durable_agents import AgentClient
from durable_agents.agent_client._schedules import (
    InvalidSchedule,
    ScheduleExists,
    ScheduleInfo,
    ScheduleNotFound,
    check_cron,
)
from tests.conftest import WorkerFactory, replay_task_queue
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.schedule_types import SCHEDULED_SEND_REFUSED, ScheduledMessage
from workflows.scheduled_message import ScheduledMessageWorkflow
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, AgentResult, StatusView

YEARLY = "0 0 1 1 *"  # never fires during a test: these schedules fire by trigger


@pytest.fixture
def cache_mode() -> str:
    return "cached"


def model(body: dict[str, Any]) -> Scripted:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Scripted(text="posted")
    text = str(last.get("content") or "")
    if text == "post it":  # a side effect: the run waits for an approval and stays open
        post = json.dumps({"method": "POST", "url": "http://127.0.0.1:65000/orders", "body": "{}"})
        return Scripted(tool_calls=[("http_request", post)])
    return Scripted(text=f"echo: {text}")


def new_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


async def runs_of(client: Client, info: ScheduleInfo) -> list[tuple[str, WorkflowExecutionStatus | None]]:
    """The schedule's runs as the server lists them (``TemporalScheduledById`` is set by Schedules)."""
    query = f'TemporalScheduledById = "{info.schedule_id}"'
    return [(wf.id, wf.status) async for wf in client.list_workflows(query)]


async def fired(schedules: AgentClient, name: str, count: int) -> ScheduleInfo:
    """The schedule once ``count`` runs have been started and none of them is open."""

    async def check() -> ScheduleInfo | None:
        info = await _named(schedules, name)
        assert info is not None, f"{name} not listed yet"
        return info if info.actions >= count and not info.running else None

    return await eventually(check, f"schedule {name} started {count} runs that all ended")


def test_cron_expressions_are_checked_before_anything_reaches_temporal() -> None:
    for good in (
        "0 9 * * 1-5",
        "*/15 * * * *",
        "0 9 * * mon-fri",
        "0 0 1 jan,jul *",
        "@daily",
        "@every 90s",
        "@every 1h/5m",
        "CRON_TZ=Europe/Paris 30 8 * * *",
        "0 0 9 * * 1-5 2030",
        "0 12 ? * *",
    ):
        assert check_cron(good) == good
    bad = {
        "": "expected 1 to",
        "0 9 * *": "expected 5 fields",
        "61 * * * *": "minute '61' is not in 0-59",
        "0 25 * * *": "hour '25' is not in 0-23",
        "0 9 * * 1-9": "day of week '9' is not in 0-6",
        "0 9 * * fri-mon": "goes backwards",
        "*/0 * * * *": "step 0 out of range",
        "0 9 * * monday": "is not in 0-6 or sun-sat",
        "@sometimes": "expected one of @yearly",
        "@every 0s": "expected one of",
        "@every 1m/2m": "phase must be shorter",
        "TZ=Mars/Olympus 0 9 * * *": "unknown time zone",
        "0 9 * * 1;rm": "day of week",
    }
    for cron, why in bad.items():
        with pytest.raises(InvalidSchedule) as err:
            check_cron(cron)
        assert why in str(err.value) and "\n" not in str(err.value), (cron, str(err.value))


async def test_a_task_schedule_fires_twice_by_itself_and_its_runs_carry_its_tenant(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    name = new_name()
    async with run_worker(dev_env.client, runtime) as tq:
        acme = AgentClient(dev_env.client, task_queue=tq, tenant="acme")
        created = await acme.schedule_create(name, cron="@every 2s", task="say hi", model="openai:test-model")
        assert created.kind == "task" and created.tenant == "acme" and created.task == "say hi", created
        assert created.schedule_id == f"agent-schedule-{name}@acme" and created.next_runs, created
        try:
            info = await fired(acme, name, 2)
        finally:
            await acme.schedule_pause(name)
            for late in (await acme.schedule_describe(name)).running:  # fired since: not left open on the server
                await dev_env.client.get_workflow_handle(late.workflow_id).cancel()
            await acme.schedule_delete(name)
        ids = [run.workflow_id for run in info.recent_runs]
        assert len(ids) >= 2 and all(i.startswith(f"agent-schedule-{name}@acme-") for i in ids), ids
        for workflow_id in ids[:2]:
            handle = dev_env.client.get_workflow_handle(workflow_id, result_type=AgentResult)
            result = await handle.result()
            assert result.status == "completed" and result.output == "echo: say hi", result
            view = StatusView.model_validate(await handle.query(AgentWorkflow.status))
            assert view.state == "completed"
        started = [r for r in llm.requests if r["path"].endswith("/chat/completions")]
        assert len(started) >= 2
        with pytest.raises(ScheduleNotFound):
            await acme.schedule_trigger(name)


async def test_overlap_skips_a_firing_while_the_previous_run_waits_for_an_approval(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    name = new_name()
    async with run_worker(dev_env.client, runtime) as tq:
        schedules = AgentClient(dev_env.client, task_queue=tq)
        info = await schedules.schedule_create(name, cron=YEARLY, task="post it")
        try:
            await schedules.schedule_trigger(name)

            async def waiting() -> ScheduleInfo | None:
                now = await schedules.schedule_describe(name)
                if not now.running:
                    return None
                handle = dev_env.client.get_workflow_handle(now.running[0].workflow_id)
                view = StatusView.model_validate(await handle.query(AgentWorkflow.status))
                return now if view.state == "waiting_approval" else None

            open_run = (await eventually(waiting, "the scheduled run waits for its approval")).running[0]
            await schedules.schedule_trigger(name)
            skipped = await eventually(lambda: _skipped(schedules, name), "the second firing is skipped for overlap")
            assert skipped.actions == 1 and [r.workflow_id for r in skipped.running] == [open_run.workflow_id]
            runs = await eventually(lambda: runs_of(dev_env.client, info), "the run is listed")
            assert runs == [(open_run.workflow_id, WorkflowExecutionStatus.RUNNING)], runs
        finally:
            await schedules.schedule_delete(name)
        handle = dev_env.client.get_workflow_handle(open_run.workflow_id, result_type=AgentResult)
        await handle.cancel()
        assert (await handle.result()).status == "cancelled"


async def _skipped(schedules: AgentClient, name: str) -> ScheduleInfo | None:
    info = await schedules.schedule_describe(name)
    return info if info.skipped_overlap >= 1 else None


async def test_pause_unpause_trigger_delete_and_tenant_scoping(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    name = new_name()
    async with run_worker(dev_env.client, runtime) as tq:
        acme = AgentClient(dev_env.client, task_queue=tq, tenant="acme")
        beta = AgentClient(dev_env.client, task_queue=tq, tenant="beta")
        admin = AgentClient(dev_env.client, task_queue=tq)
        with pytest.raises(InvalidSchedule, match="scoped to tenant 'acme'"):
            await acme.schedule_create(name, cron=YEARLY, task="x", tenant="beta")
        with pytest.raises(InvalidSchedule, match="bad schedule name"):
            await acme.schedule_create("../etc", cron=YEARLY, task="x")
        with pytest.raises(InvalidSchedule, match="needs a task"):
            await acme.schedule_create(name, cron=YEARLY)
        with pytest.raises(InvalidSchedule, match="needs --session and --message"):
            await acme.schedule_create(name, cron=YEARLY, session="s-1")
        await acme.schedule_create(name, cron=YEARLY, task="hello")
        with pytest.raises(ScheduleExists):
            await acme.schedule_create(name, cron=YEARLY, task="twice")
        listed = await eventually(lambda: _named(admin, name), "the schedule is listed")
        assert listed.tenant == "acme" and not listed.paused
        assert (await eventually(lambda: _named(acme, name), "acme lists it")).tenant == "acme"
        assert name not in [i.name for i in await beta.schedule_list()]
        for call in (
            beta.schedule_pause,
            beta.schedule_unpause,
            beta.schedule_trigger,
            beta.schedule_delete,
            beta.schedule_describe,
        ):
            with pytest.raises(ScheduleNotFound, match=f"no schedule named '{name}'"):
                await call(name)

        # Names are per tenant: beta's schedule of the same name is another schedule, acme's is unchanged.
        theirs = await beta.schedule_create(name, cron=YEARLY, task="mine now")
        assert theirs.tenant == "beta" and theirs.schedule_id == f"agent-schedule-{name}@beta", theirs
        assert (await acme.schedule_describe(name)).task == "hello"
        assert (await beta.schedule_describe(name)).task == "mine now"
        both = await eventually(lambda: _all_named(admin, name, 2), "both schedules are listed")
        assert sorted(i.tenant for i in both) == ["acme", "beta"], both
        assert [i.tenant for i in await acme.schedule_list() if i.name == name] == ["acme"]
        with pytest.raises(
            InvalidSchedule, match=f"2 schedules are named '{name}', of tenants 'acme', 'beta': name the tenant"
        ):
            await admin.schedule_describe(name)
        assert (await admin.schedule_describe(name, tenant="beta")).task == "mine now"
        with pytest.raises(InvalidSchedule, match="scoped to tenant 'acme'"):
            await acme.schedule_describe(name, tenant="beta")
        await beta.schedule_delete(name)
        with pytest.raises(ScheduleNotFound):
            await beta.schedule_describe(name)
        assert (await admin.schedule_describe(name)).tenant == "acme"  # one left: the name is no longer ambiguous

        await acme.schedule_pause(name, note="holidays")
        paused = await acme.schedule_describe(name)
        assert paused.paused and paused.note == "holidays", paused
        await acme.schedule_unpause(name)
        assert not (await acme.schedule_describe(name)).paused
        await acme.schedule_trigger(name)
        info = await eventually(lambda: _ended_runs(acme, name, 1), "the triggered run ended")
        result = await dev_env.client.get_workflow_handle(
            info.recent_runs[0].workflow_id, result_type=AgentResult
        ).result()
        assert result.output == "echo: hello"
        await acme.schedule_delete(name)
        with pytest.raises(ScheduleNotFound):
            await admin.schedule_describe(name)
        born_paused = await acme.schedule_create(f"{name}-p", cron="@every 1s", task="hello", paused=True, note="later")
        assert born_paused.paused and born_paused.note == "later" and born_paused.actions == 0, born_paused
        await acme.schedule_delete(born_paused.name)


async def _named(schedules: AgentClient, name: str) -> ScheduleInfo | None:
    return next((i for i in await schedules.schedule_list() if i.name == name), None)


async def test_a_schedule_made_under_the_id_without_a_tenant_is_still_found_by_its_tenant_only(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    """Schedules made before tenants had ids of their own are ``agent-schedule-<name>`` with the tenant in
    their memo: their tenant still finds, fires and deletes them, and still cannot make a second one."""
    llm.default = model
    name = new_name()
    async with run_worker(dev_env.client, runtime) as tq:
        acme = AgentClient(dev_env.client, task_queue=tq, tenant="acme")
        beta = AgentClient(dev_env.client, task_queue=tq, tenant="beta")
        admin = AgentClient(dev_env.client, task_queue=tq)
        # The old form, made from a new one: the same schedule and memo under the id without the tenant.
        made = await acme.schedule_create(name, cron=YEARLY, task="old one")
        new_form = dev_env.client.get_schedule_handle(made.schedule_id)
        desc = await new_form.describe()
        action = desc.schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        action.id = f"agent-schedule-{name}"
        await dev_env.client.create_schedule(f"agent-schedule-{name}", desc.schedule, memo=await desc.memo())
        await new_form.delete()
        try:
            old = await acme.schedule_describe(name)
            assert old.schedule_id == f"agent-schedule-{name}" and old.tenant == "acme" and old.task == "old one"
            with pytest.raises(ScheduleExists):
                await acme.schedule_create(name, cron=YEARLY, task="a second one")
            with pytest.raises(ScheduleNotFound):
                await beta.schedule_describe(name)
            theirs = await beta.schedule_create(name, cron=YEARLY, task="beta's")
            assert theirs.schedule_id == f"agent-schedule-{name}@beta", theirs
            with pytest.raises(InvalidSchedule, match="of tenants 'acme', 'beta'"):
                await admin.schedule_trigger(name)
            await acme.schedule_trigger(name)
            info = await eventually(lambda: _ended_runs(acme, name, 1), "the old-form schedule's run ended")
            assert (await beta.schedule_describe(name)).actions == 0
            result = await dev_env.client.get_workflow_handle(
                info.recent_runs[0].workflow_id, result_type=AgentResult
            ).result()
            assert result.output == "echo: old one"
            await beta.schedule_delete(name)
        finally:
            await acme.schedule_delete(name)
        with pytest.raises(ScheduleNotFound):
            await acme.schedule_describe(name)


async def _all_named(schedules: AgentClient, name: str, count: int) -> list[ScheduleInfo] | None:
    named = [i for i in await schedules.schedule_list() if i.name == name]
    return named if len(named) == count else None


async def _ended_runs(schedules: AgentClient, name: str, count: int) -> ScheduleInfo | None:
    info = await schedules.schedule_describe(name)
    return info if info.actions >= count and not info.running else None


async def test_a_session_schedule_sends_its_message_each_time_and_never_to_another_tenants_session(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    name, session_id = new_name(), f"ss-{uuid.uuid4().hex[:10]}"
    async with run_worker(dev_env.client, runtime) as tq:
        acme = AgentClient(dev_env.client, task_queue=tq, tenant="acme")
        info = await acme.schedule_create(name, cron=YEARLY, session=session_id, message="morning report")
        assert info.kind == "session" and info.session == session_id and info.message == "morning report", info
        try:
            for count in (1, 2):
                await acme.schedule_trigger(name)
                info = await eventually(partial(_ended_runs, acme, name, count), f"scheduled send {count} ended")
                run = info.recent_runs[-1]
                sent = await dev_env.client.get_workflow_handle(run.workflow_id, result_type=SendResult).result()
                assert sent.accepted and sent.seq == count and not sent.duplicate, sent
        finally:
            await acme.schedule_delete(name)
        session = dev_env.client.get_workflow_handle(session_id)

        async def replied() -> StatusView | None:
            view = StatusView.model_validate(await session.query(AgentWorkflow.status))
            return view if view.replied >= 2 and view.state == "idle" else None

        view = await eventually(replied, "the session replied to both scheduled messages")
        assert view.messages >= 2 and view.output == "echo: morning report", view
        start = await anext(aiter(session.fetch_history_events(page_size=1)))
        [inp] = await dev_env.client.data_converter.decode(
            start.workflow_execution_started_event_attributes.input.payloads, [AgentInput]
        )
        assert inp.tenant == "acme" and inp.session is not None

        # A session of tenant beta: acme's schedule naming it is refused for good, and beta's session hears nothing.
        theirs = f"ss-{uuid.uuid4().hex[:10]}"
        await dev_env.client.start_workflow(
            AgentWorkflow.run, AgentInput(session=SessionSpec(), tenant="beta"), id=theirs, task_queue=tq
        )
        await dev_env.client.get_workflow_handle(theirs).execute_update(
            "send", SessionMessage(message_id="b1", text="beta only"), result_type=SendResult
        )
        other = new_name()
        await acme.schedule_create(other, cron=YEARLY, session=theirs, message="hello from acme")
        try:
            await acme.schedule_trigger(other)
            info = await eventually(lambda: _ended_runs(acme, other, 1), "the refused send ended")
        finally:
            await acme.schedule_delete(other)
        with pytest.raises(WorkflowFailureError) as failed:
            await dev_env.client.get_workflow_handle(info.recent_runs[-1].workflow_id).result()
        cause = failed.value.cause
        assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
        assert cause.cause.type == SCHEDULED_SEND_REFUSED and "another tenant" in cause.cause.message
        beta_view = StatusView.model_validate(
            await dev_env.client.get_workflow_handle(theirs).query(AgentWorkflow.status)
        )
        assert beta_view.messages == 1, beta_view
        for sid in (session_id, theirs):
            await dev_env.client.get_workflow_handle(sid).signal("close")


async def test_a_scheduled_message_workflow_started_with_junk_fails_at_once_and_its_histories_replay(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    async with run_worker(dev_env.client, runtime) as tq:
        for junk in ({"session_id": 5, "text": ""}, "not an object", {"session_id": "s", "text": "x" * 200_001}):
            handle = await dev_env.client.start_workflow(
                "ScheduledMessageWorkflow", junk, id=f"junk-{uuid.uuid4().hex[:10]}", task_queue=tq
            )
            with pytest.raises(WorkflowFailureError) as failed:
                await handle.result()
            cause = failed.value.cause
            assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput", cause
            assert cause.message.startswith("invalid scheduled message: ") and len(cause.message) < 2500
        # A good one, delivered; then every ScheduledMessageWorkflow history of this queue replays.
        session_id = f"ss-{uuid.uuid4().hex[:10]}"
        good = await dev_env.client.start_workflow(
            ScheduledMessageWorkflow.run,
            ScheduledMessage(schedule="manual", session_id=session_id, text="hello", task_queue=tq),
            id=f"manual-{uuid.uuid4().hex[:10]}",
            task_queue=tq,
        )
        assert (await good.result()).seq == 1
        await dev_env.client.get_workflow_handle(session_id).signal("close")
    replayed = await replay_task_queue(dev_env.client, tq, workflows=(AgentWorkflow, ScheduledMessageWorkflow))
    assert replayed >= 5, replayed
