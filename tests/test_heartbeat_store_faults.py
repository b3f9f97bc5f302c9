"""A side effect whose ledger writes hit a store outage still heartbeats and still records its outcome.

The store here is the real SQLite run store behind a fault-injecting proxy: lease renewals
fail for a while (as during a PostgreSQL restart) and the first two attempts to record the
outcome fail. The side effect happened, so its result must reach the caller and the ledger.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio.testing import ActivityEnvironment

from activities.runtime import Runtime
from activities.settings import Settings
from activities.store import RunStore, StoreError, open_store
from activities.tools import ToolContext, ToolRegistry, tool
from activities.tools.activity import tool_activities
from activities.tools.spec import spec_of
from workflows.types import ToolInvocation

DELIVERED: list[str] = []


class SendArgs(BaseModel):
    message: str


@tool("slow_send", description="A side effect that takes a few seconds.", args=SendArgs, side_effect=True)
async def slow_send(args: SendArgs, ctx: ToolContext) -> str:
    await asyncio.sleep(4.5)  # several heartbeats (and lease renewals, one a second from the first) while it runs
    DELIVERED.append(args.message)
    return f"sent {args.message}"


class FlakyStore:
    """Forwards to a real store; ``renew`` fails until ``renew_ok``, ``finish`` fails ``finish_failures`` times."""

    def __init__(self, inner: RunStore, finish_failures: int) -> None:
        self.inner = inner
        self.renew_ok = False
        self.renew_calls = 0
        self.finish_failures = finish_failures

    async def renew(self, key: str, owner: str, lease_s: float) -> bool:
        self.renew_calls += 1
        if not self.renew_ok and lease_s > 0:
            raise StoreError("connection to the run store was lost")
        return await self.inner.renew(key, owner, lease_s)

    async def finish(self, *args: Any, **kwargs: Any) -> None:
        if self.finish_failures > 0:
            self.finish_failures -= 1
            raise StoreError("connection to the run store was lost")
        await self.inner.finish(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_outcome_survives_store_errors_during_heartbeats_and_finish(tmp_path: Path) -> None:
    spec = spec_of(slow_send)
    assert spec is not None
    settings = Settings(store_url=str(tmp_path / "store.sqlite3"), state_dir=tmp_path / "agent")
    runtime = Runtime.from_settings(settings, tools=ToolRegistry([spec]))
    flaky = FlakyStore(open_store(settings.store_url), finish_failures=2)
    runtime._store = flaky
    [run_tool] = tool_activities(runtime)
    beats: list[Any] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    env.info = dataclasses.replace(
        env.info,
        workflow_id="wf-flaky",
        activity_id="tool-1",
        activity_type="slow_send",
        heartbeat_timeout=timedelta(seconds=3),  # lease 3 s: a beat (and renewal) every second
        start_to_close_timeout=timedelta(seconds=60),
    )
    invocation = ToolInvocation(
        conversation_id="conv-flaky",
        workflow_id="wf-flaky",
        step=1,
        call_id="call-1",
        call_index=0,
        seq=2,
        tool="slow_send",
        arguments={"message": "hello"},
        idempotency_key="ik_flaky",
    )
    try:
        outcome = await env.run(run_tool, invocation)
        [entry] = await flaky.inner.ledger("wf-flaky")
    finally:
        await runtime.aclose()
        await flaky.inner.close()

    assert DELIVERED == ["hello"]
    assert outcome.ok and outcome.preview == "sent hello" and not outcome.unknown
    assert flaky.renew_calls >= 3, "renewals went on after the first failure"
    assert len(beats) >= 3, "heartbeats went on although every lease renewal failed"
    assert (entry.state, entry.result, entry.executions) == ("done", "sent hello", 1)
