"""Crash recovery with the PostgreSQL run store: workers on separate "machines" (no shared disk).

The first worker is SIGKILLed mid-call; the replacement has its own state directory, so the
only thing the two share is the PostgreSQL ledger and transcripts (and Temporal).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.store.ledger import LedgerEntry
from activities.store.postgres import PostgresRunStore
from tests.fakes.dedupe_server import DedupeServer
from tests.fakes.llm_server import FakeLLMServer
from tests.fakes.worker_proc import WorkerProc
from tests.test_crash_recovery import Rig, one_call_per_task, pending_unknown, tool_results, wait_for
from workflows.types import ResolveSignal

ORDER = "order one item"
NOTIFY = "notify the team"


class PostgresRig(Rig):
    """Workers that share only PostgreSQL: each "machine" has its own state directory."""

    def __init__(
        self, client: Client, address: str, llm: FakeLLMServer, tmp: Path, *, store_url: str, api: DedupeServer
    ) -> None:
        super().__init__(client, address, llm, tmp)
        self.store_url = store_url
        self.api = api

    async def spawn_machine(self, name: str, **extra_env: str) -> WorkerProc:
        state = self.tmp / f"machine-{name}"
        return await self.spawn(AGENT_STORE_URL=self.store_url, AGENT_STATE_DIR=str(state), **extra_env)

    async def ledger(self, workflow_id: str) -> list[LedgerEntry]:
        store = PostgresRunStore(self.store_url)
        try:
            return await store.ledger(workflow_id)
        finally:
            await store.close()


@pytest.fixture
async def rig(dev_env: WorkflowEnvironment, postgres_db_url: str, tmp_path: Path) -> AsyncIterator[PostgresRig]:
    with DedupeServer() as api, FakeLLMServer() as llm:
        llm.default = one_call_per_task(
            {
                ORDER: ("http_request", {"method": "POST", "url": f"{api.url}/orders", "json": {"sku": "A-1"}}, "ok"),
                NOTIFY: ("notify", {"url": f"{api.url}/notify", "message": "deploy done"}, "sent"),
            }
        )
        address = dev_env.client.service_client.config.target_host
        rig = PostgresRig(dev_env.client, address, llm, tmp_path, store_url=postgres_db_url, api=api)
        try:
            yield rig
        finally:
            rig.stop_all()


async def test_killed_worker_on_another_machine_is_recovered_through_postgres(rig: PostgresRig) -> None:
    api = rig.api
    api.add_delay(after_s=8, method="POST", path_prefix="/orders", times=1)
    first = await rig.spawn_machine("a", CRASH_TOOLS_SLEEP_AFTER_S="30")
    order = await rig.start(ORDER, ["http_request"])
    notify = await rig.start(NOTIFY, ["notify"])
    await wait_for(api, lambda: bool(api.applied("/orders")) and bool(api.applied("/notify")), "both side effects")
    first.kill()
    await rig.spawn_machine("b", CRASH_TOOLS_SLEEP_AFTER_S="0")

    # Keyed: re-sent with the same key from the other machine; the destination applied it once.
    result = await rig.result(order)
    assert result.status == "completed", rig.logs()
    keys = {d.key for d in api.writes("/orders")}
    assert len(keys) == 1 and len(api.applied("/orders")) == 1
    [entry] = await rig.ledger(order.id)
    assert entry.state == "done" and entry.key in keys

    # Unkeyed: the other machine sees intent without outcome in PostgreSQL and pauses for a human.
    status = await pending_unknown(notify)
    [approval] = [p for p in status.pending_approvals if p.kind == "resolve_unknown_outcome"]
    await notify.signal(
        "resolve", ResolveSignal(approval_id=approval.approval_id, reviewer="ops", resolution="mark_done")
    )
    assert (await rig.result(notify)).status == "completed"
    assert len(api.writes("/notify")) == 1
    assert any("confirmed done by ops" in text for text in tool_results(rig.llm, NOTIFY))
    [entry] = await rig.ledger(notify.id)
    assert entry.state == "done" and entry.executions == 1
