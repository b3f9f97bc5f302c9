"""``AGENT_RUN_RETENTION_DAYS``: the worker's reaper deletes the data of runs closed longer ago, and only theirs.

Real dev server, an in-process worker with the bubblewrap sandbox and a SQLite run store. Two runs each
write a file of their own and one of the same bytes (one shared blob); the first closes before the
second. The reaper runs with its clock set so that the first closed more than the retention ago and the
second less (both from the server's own close times): the first run's transcript, checkpoint usage and
own blobs go, the second's and the shared blob stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.checkpoints.gc import workflow_of
from activities.runtime import Runtime
from activities.sandbox.checkpointable import Manifest
from activities.settings import Settings
from durable_agents.reaping import reap_forever
from tests.conftest import WorkerFactory, require_bwrap, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually

SHARED = "the same bytes in both runs' workspaces"


@pytest.fixture
def cache_mode() -> str:
    return "cached"


def writes(body: dict[str, Any]) -> Scripted:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Scripted(text="saved")
    own = str(last["content"]).split()[-1]
    return Scripted(
        tool_calls=[
            ("write_file", json.dumps({"path": "own.txt", "content": own})),
            ("write_file", json.dumps({"path": "shared.txt", "content": SHARED})),
        ]
    )


async def files_of(runtime: Runtime, conversation_id: str) -> dict[str, str]:
    """path -> digest of the last checkpoint the conversation names."""
    entries = await runtime.store.transcript(conversation_id)
    checkpoint = next(e.meta["checkpoint"] for e in reversed(entries) if isinstance(e.meta.get("checkpoint"), str))
    assert isinstance(checkpoint, str)
    manifest = Manifest.decode(await runtime.store.get_blob(checkpoint) or b"")
    return {"manifest": checkpoint, **{e.path: e.hash for e in manifest.entries if e.kind == "file"}}


def test_unset_keeps_runs_and_a_value_is_days() -> None:
    assert Settings.from_env({}).checkpoints.run_retention_days is None
    assert Settings.from_env({"AGENT_RUN_RETENTION_DAYS": "30"}).checkpoints.run_retention_days == 30.0


async def test_the_reaper_deletes_an_old_closed_runs_data_and_keeps_a_recent_ones(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    client = dev_env.client
    llm.default = writes
    days = Settings.from_env({"AGENT_RUN_RETENTION_DAYS": "1"}).checkpoints.run_retention_days
    assert days == 1.0
    async with run_worker(client, runtime) as tq:
        old = await start_agent(client, tq, id_prefix="ret-old", task=f"write OLD{uuid.uuid4().hex}")
        assert (await old.result()).status == "completed"
        recent = await start_agent(client, tq, id_prefix="ret-new", task=f"write NEW{uuid.uuid4().hex}")
        assert (await recent.result()).status == "completed"
        closed = []
        for handle in (old, recent):
            desc = await handle.describe()
            assert desc.close_time is not None
            closed.append(desc.close_time.timestamp())
        assert closed[0] < closed[1]
        # "Now": the old run closed a little more than a day ago, the recent one a little less.
        now = closed[1] + days * 86400 - (closed[1] - closed[0]) / 2

        [old_conversation] = [c for c, _ in await runtime.store.conversations() if workflow_of(c)[0] == old.id]
        [recent_conversation] = [c for c, _ in await runtime.store.conversations() if workflow_of(c)[0] == recent.id]
        old_files, recent_files = (
            await files_of(runtime, old_conversation),
            await files_of(runtime, recent_conversation),
        )
        assert old_files["shared.txt"] == recent_files["shared.txt"], "the same bytes are one blob"
        assert (await runtime.store.checkpoint_usage(old_conversation)).count == 2

        reaper = asyncio.create_task(
            reap_forever(
                client,
                runtime.sandbox_backend,
                0.05,
                store=lambda: runtime.store,
                run_retention_days=days,
                clock=lambda: now,
            )
        )
        try:

            async def old_gone() -> bool:
                return await runtime.store.count_messages(old_conversation) == 0

            await eventually(old_gone, "the reaper deletes the old run's transcript")
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper

    assert await runtime.store.get_blob(old_files["own.txt"]) is None
    assert await runtime.store.get_blob(old_files["manifest"]) is None
    assert (await runtime.store.checkpoint_usage(old_conversation)).count == 0
    assert await runtime.store.blob_refs_of(old_conversation) == []
    assert await runtime.store.count_messages(recent_conversation) > 0
    assert await files_of(runtime, recent_conversation) == recent_files
    for digest in recent_files.values():
        assert await runtime.store.get_blob(digest) is not None, digest
    assert await runtime.store.get_blob(recent_files["shared.txt"]) == SHARED.encode()
