"""Two workers run the same side-effecting tool call at once on a shared PostgreSQL ledger: one POST, ever."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.runtime import Runtime
from activities.settings import Settings
from activities.tools.activity import tool_activities
from tests.fakes.http_sink import HttpSink
from workflows.types import ToolInvocation, ToolOutcome

WORKFLOW_ID = "wf-ledger-race"


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink(delay_s=1.0) as server:  # slow enough that both attempts are in flight together
        yield server


@pytest.fixture
async def runtimes(postgres_db_url: str, tmp_path: Path) -> AsyncIterator[list[Runtime]]:
    rts = [
        Runtime.from_settings(
            Settings(
                http_allow=("127.0.0.1:1024-65535",), store_url=postgres_db_url, state_dir=tmp_path / f"worker-{i}"
            )
        )
        for i in range(2)
    ]
    yield rts
    for rt in rts:
        await rt.aclose()


def http_activity(runtime: Runtime) -> Callable[[ToolInvocation], Any]:
    [fn] = [fn for fn in tool_activities(runtime) if fn.__name__ == "tool_http_request"]
    return fn


def env(attempt: int = 1) -> ActivityEnvironment:
    e = ActivityEnvironment()
    e.info = dataclasses.replace(
        e.info,
        workflow_id=WORKFLOW_ID,
        activity_id="tool-1",
        activity_type="http_request",
        attempt=attempt,
        heartbeat_timeout=timedelta(seconds=10),  # the ledger lease
        start_to_close_timeout=timedelta(seconds=60),
    )
    return e


def invocation(sink: HttpSink, seq: int = 3) -> ToolInvocation:
    return ToolInvocation(
        conversation_id="conv-race",
        workflow_id=WORKFLOW_ID,
        step=1,
        call_id="call-1",
        call_index=0,
        seq=seq,
        tool="http_request",
        arguments={"method": "POST", "url": f"{sink.url}/orders", "json": {"sku": 7}},
        idempotency_key=f"{WORKFLOW_ID}/1/0",
    )


async def test_two_workers_one_post(runtimes: list[Runtime], sink: HttpSink) -> None:
    inv = invocation(sink)
    results = await asyncio.gather(*(env().run(http_activity(rt), inv) for rt in runtimes), return_exceptions=True)

    outcomes = [r for r in results if isinstance(r, ToolOutcome)]
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(outcomes) == 1 and len(errors) == 1, results
    [winner] = outcomes
    [loser_error] = errors
    assert isinstance(loser_error, ApplicationError), repr(loser_error)
    assert loser_error.type == "CallInFlight" and not loser_error.non_retryable
    assert loser_error.next_retry_delay is not None and loser_error.next_retry_delay >= timedelta(seconds=1)
    assert winner.ok and "HTTP 200" in winner.preview and '"n": 1' in winner.preview

    assert len(sink.writes()) == 1
    [post] = sink.writes()
    assert post.headers["idempotency-key"] == inv.idempotency_key and json.loads(post.body) == {"sku": 7}

    [entry] = await runtimes[0].store.ledger(WORKFLOW_ID)
    assert (entry.state, entry.executions, entry.is_error) == ("done", 1, False)

    # The loser is retried once the winner is done: the same outcome, no second POST.
    loser = runtimes[results.index(loser_error)]
    assert await env(attempt=2).run(http_activity(loser), inv) == winner
    # Even without the transcript entry (as if the winner died between ledger and transcript),
    # the ledger's recorded outcome is returned rather than a re-send.
    via_ledger = await env(attempt=3).run(http_activity(loser), invocation(sink, seq=4))
    assert via_ledger == winner
    assert len(sink.writes()) == 1
    [entry] = await runtimes[0].store.ledger(WORKFLOW_ID)
    assert entry.executions == 1
