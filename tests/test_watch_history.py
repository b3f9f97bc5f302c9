"""Watching a run reads its progress by query: a watcher adds no event to the run's history.

The stream's own subscription polls with the ``__temporal_workflow_stream_poll`` *update*, and each
update is history (a dozen rows of a demo's two dozen in the Temporal UI). ``AgentClient.events``,
under ``watch``, ``run --follow`` and ``chat``, asks the query of that name instead. Here one run is
watched by ``watch`` for its whole life and by ``AgentClient.events`` (twice: from the start and
resumed from a cursor), another identical run by nobody; the watched run's history holds no stream
update and is the unwatched one's, event type for event type.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections import Counter
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from durable_agents.agent_client import AgentClient, EventCursor, NoAnswer, RunEvent
from durable_agents.cli.watch import watch
from tests.conftest import WorkerFactory
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.types import AgentInput

UPDATE_ACCEPTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED


def order(sink: HttpSink) -> Any:
    def reply(request: dict[str, Any]) -> Scripted:
        if any(m["role"] == "tool" for m in request["messages"]):
            return Scripted(text="ordered")
        args = {"method": "POST", "url": f"{sink.url}/orders", "json": {"sku": 1}}
        return Scripted(tool_calls=[("http_request", json.dumps(args))])

    return reply


async def history(client: Client, workflow_id: str) -> tuple[Counter[str], list[str]]:
    """The run's event types, counted, and the names of the updates it accepted."""
    kinds: Counter[str] = Counter()
    updates: list[str] = []
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        kinds[EventType.Name(event.event_type)] += 1
        if event.event_type == UPDATE_ACCEPTED:
            updates.append(event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name)
    return kinds, updates


async def approve_when_asked(agents: AgentClient, workflow_id: str) -> None:
    async def item() -> Any:
        try:
            items, _ = await agents.pending(workflow_id)
        except NoAnswer:  # the worker's first poll has not reached the server yet
            return None
        return items[0] if items else None

    found = await eventually(item, f"{workflow_id} asks")
    await agents.decide(workflow_id, found.approval_id, "approve", reviewer="alice")


async def test_watching_a_run_for_its_whole_life_adds_nothing_to_its_history(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    with HttpSink() as sink:
        llm.default = order(sink)
        async with run_worker(client, runtime) as task_queue:
            agents = AgentClient(client, task_queue=task_queue)
            alone = await agents.start(AgentInput(task="order one"))
            await approve_when_asked(agents, alone.workflow_id)
            await agents.result(alone.workflow_id)

            watched = await agents.start(AgentInput(task="order one"))
            printed = io.StringIO()
            watcher = asyncio.create_task(watch(client, watched.workflow_id, json_lines=True, file=printed))
            seen: list[RunEvent] = []

            async def read_all() -> None:
                async for event in agents.events(watched.workflow_id):
                    seen.append(event)

            reader = asyncio.create_task(read_all())
            await approve_when_asked(agents, watched.workflow_id)
            assert (await agents.result(watched.workflow_id)).status == "completed"
            await asyncio.wait_for(asyncio.gather(watcher, reader), timeout=60)  # both end with the run

            # Resumed after the third event, a reader gets exactly the rest.
            rest = [e async for e in agents.events(watched.workflow_id, after=seen[2].cursor)]
            resumed = [
                e async for e in agents.events(watched.workflow_id, after=EventCursor.parse(str(seen[2].cursor)))
            ]
        assert len(sink.writes()) == 2

    lines = [json.loads(line) for line in printed.getvalue().splitlines()]
    kinds = [e.kind for e in seen]
    assert kinds[0] == "started" and kinds[-1] == "finished" and "approval_requested" in kinds, kinds
    assert [line["kind"] for line in lines] == kinds  # watch printed every event, the same ones
    assert [e.cursor.offset for e in seen] == list(range(1, len(seen) + 1))
    assert all(e.progress is not None and e.progress.kind == e.kind and e.cursor.seq == 0 for e in seen)
    assert [e.model_dump() for e in rest] == [e.model_dump() for e in seen[3:]]
    assert [e.model_dump() for e in resumed] == [e.model_dump() for e in seen[3:]]

    watched_kinds, watched_updates = await history(client, watched.workflow_id)
    alone_kinds, alone_updates = await history(client, alone.workflow_id)
    assert watched_updates == alone_updates == ["decide"], watched_updates  # no __temporal_workflow_stream_poll

    # Workflow tasks are left out: how many the server makes depends on when the decision arrived
    # (during a task or between two), not on who watched.
    def commands(kinds: Counter[str]) -> Counter[str]:
        return Counter({kind: n for kind, n in kinds.items() if "WORKFLOW_TASK" not in kind})

    assert commands(watched_kinds) == commands(alone_kinds), (watched_kinds, alone_kinds)
