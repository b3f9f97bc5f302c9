"""Run store outages are survived: PostgreSQL stopped mid-flight, a SQLite store locked by another connection.

Five runs each make model turns and two side-effecting ``http_request`` POSTs (allowed by the
operator's policy) to a destination that records every delivery by ``Idempotency-Key`` and answers
slowly, so that POSTs are on the wire, holding their ledger leases, when the store goes away. Two of
the runs start during the outage, so their model turns meet it too. One in-process worker on the dev
server. Afterwards: every run completed, each key was delivered exactly once (nothing re-sent,
nothing lost), every ledger entry is ``done``, and the worker logged the outage once
(``store_unavailable``) and its end once (``store_recovered``), with no pool or traceback spam.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

import activities.store.outage as outage
import activities.store.sqlite as sqlite_store
import activities.tools.recovery as recovery
from activities.runtime import Runtime
from activities.settings import Settings
from activities.store import RunStore, open_store
from tests.fakes.dedupe_server import DedupeServer
from tests.fakes.llm_server import FakeLLMServer
from tests.fakes.worker_proc import orders_model, write_policy
from tests.pg import StoppablePostgres
from tests.waiting import eventually
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, AgentResult

RUNS = 5
EARLY_RUNS = 3  # started before the outage: their first POST is in flight when it begins
POSTS_PER_RUN = 2
RESULT_WITHIN_S = 120.0

Outage = Callable[[], Awaitable[None]]


async def _results(handles: list[WorkflowHandle[Any, AgentResult]]) -> list[AgentResult]:
    return await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), RESULT_WITHIN_S)


async def _survive(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    api: DedupeServer,
    llm: FakeLLMServer,
    *,
    slow_s: float,
    begin: Outage,
    end: Outage,
    outage_s: float,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> tuple[list[MutableMapping[str, Any]], RunStore]:
    """Drive the runs through one outage; the captured structlog events and a store to inspect."""
    llm.default = orders_model(f"{api.url}/orders", POSTS_PER_RUN)
    # The first POST of each early run answers slowly: it is still in flight (its effect applied, its
    # answer not yet sent) when the outage begins, and answers while the store is still away.
    api.add_delay(after_s=slow_s, method="POST", path_prefix="/orders", times=EARLY_RUNS)
    runtime = Runtime.from_settings(settings)
    caplog.set_level(logging.WARNING)
    tag = uuid.uuid4().hex[:8]
    with structlog.testing.capture_logs() as events:
        # Fresh logger proxies, bound to the capturing configuration (another test may have configured
        # structlog with cached loggers in this process).
        monkeypatch.setattr(outage, "log", structlog.get_logger("activities.store"))
        monkeypatch.setattr(recovery, "log", structlog.get_logger("activities.tools.recovery"))
        task_queue = f"outage-{tag}"
        worker = build_worker(dev_env.client, runtime, task_queue=task_queue)
        async with worker:

            async def start(i: int) -> WorkflowHandle[Any, AgentResult]:
                return await dev_env.client.start_workflow(
                    AgentWorkflow.run,
                    AgentInput(task=f"order run {i}", tools=["http_request"]),
                    id=f"outage-{tag}-{i}",
                    task_queue=task_queue,
                )

            handles = [await start(i) for i in range(EARLY_RUNS)]
            await eventually(lambda: len(api.writes("/orders")) >= EARLY_RUNS, "the first POSTs are in flight")
            await begin()
            handles += [await start(i) for i in range(EARLY_RUNS, RUNS)]  # their model turns meet the outage
            # The outage lasts until the worker has seen it and the slow POSTs answered into it.
            await eventually(
                lambda: any(e["event"] == "store_unavailable" for e in events), "the worker sees the outage"
            )
            await asyncio.sleep(outage_s)  # the scenario: how long the store stays away, not a wait for an event
            await end()
            results = await _results(handles)
        await runtime.aclose()
    assert [r.status for r in results] == ["completed"] * RUNS, results

    # One delivery per key (nothing re-sent), none lost, each applied once.
    deliveries = Counter(d.key for d in api.writes("/orders"))
    assert len(deliveries) == RUNS * POSTS_PER_RUN, deliveries
    assert all(key and count == 1 for key, count in deliveries.items()), deliveries
    assert len(api.applied("/orders")) == RUNS * POSTS_PER_RUN

    # The worker told what happened, once: one warning when the outage began, one note when it ended.
    names = [e["event"] for e in events]
    assert names.count("store_unavailable") == 1, [e for e in events if e["event"].startswith("store_")]
    assert names.count("store_recovered") == 1, [e for e in events if e["event"].startswith("store_")]
    [down] = [e for e in events if e["event"] == "store_unavailable"]
    [up] = [e for e in events if e["event"] == "store_recovered"]
    assert down["log_level"] == "warning" and up["log_level"] == "info"
    assert up["failed_calls"] >= 1 and up["outage_s"] > 0
    assert names.index("store_unavailable") < names.index("store_recovered")
    assert "store_write_retrying" not in [e["event"] for e in events if e["log_level"] == "warning"]
    # No connection-pool chatter and no traceback per failed attempt.
    noisy = [
        r
        for r in caplog.records
        if r.name.startswith("psycopg") or (r.name.startswith("temporalio") and "StoreUnavailable" in r.getMessage())
    ]
    noisy += [r for r in caplog.records if r.exc_info and "StoreUnavailable" in repr(r.exc_info[1])]
    assert not noisy, [f"{r.name}: {r.getMessage()}" for r in noisy]
    print(
        f"\noutage: {up['outage_s']} s, {up['failed_calls']} failed store calls; "
        f"events: {Counter(n for n in names if n.startswith(('store_', 'lease_', 'tool_attempt')))}"
    )
    return events, open_store(settings.store_url)


async def _all_done(store: RunStore) -> None:
    try:
        entries = await store.ledger()
    finally:
        await store.close()
    assert len(entries) == RUNS * POSTS_PER_RUN
    assert {e.state for e in entries} == {"done"}, [(e.key, e.state, e.note) for e in entries]
    assert all(e.executions == 1 for e in entries), [(e.key, e.executions) for e in entries]


@pytest.fixture
def outage_settings(settings: Settings, tmp_path: Path) -> Settings:
    return replace(settings, policy_file=str(write_policy(tmp_path / "policy.json")))


async def test_postgres_stopped_mid_flight(
    dev_env: WorkflowEnvironment,
    stoppable_postgres: StoppablePostgres,
    outage_settings: Settings,
    llm: FakeLLMServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pg = stoppable_postgres
    settings = replace(outage_settings, store_url=pg.url)
    with DedupeServer() as api:
        _, store = await _survive(
            dev_env,
            settings,
            api,
            llm,
            slow_s=7.0,  # answers at ~7 s into the 8 s outage: its renewal at 5 s and its outcome meet it
            begin=lambda: asyncio.to_thread(pg.stop),
            end=lambda: asyncio.to_thread(pg.start),
            outage_s=8.0,
            monkeypatch=monkeypatch,
            caplog=caplog,
        )
    await _all_done(store)


async def test_sqlite_locked_by_another_connection(
    dev_env: WorkflowEnvironment,
    outage_settings: Settings,
    llm: FakeLLMServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A short busy timeout, so that a 6 s lock is an outage (with the default, writes would fail only
    # when they started in the lock's first second).
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_S", 1.0)
    path = Path(outage_settings.store_url)
    held = threading.Event()
    release = threading.Event()

    def hold_lock() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            held.set()
            release.wait(60)
            conn.execute("COMMIT")
        finally:
            conn.close()

    holder = threading.Thread(target=hold_lock, name="sqlite-lock-holder", daemon=True)

    async def begin() -> None:
        holder.start()
        assert await asyncio.to_thread(held.wait, 10)

    async def end() -> None:
        release.set()
        await asyncio.to_thread(holder.join, 10)

    with DedupeServer() as api:
        _, store = await _survive(
            dev_env,
            outage_settings,
            api,
            llm,
            slow_s=5.0,
            begin=begin,
            end=end,
            outage_s=6.0,
            monkeypatch=monkeypatch,
            caplog=caplog,
        )
    await _all_done(store)
