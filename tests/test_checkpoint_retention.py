"""The reaper's checkpoint garbage collection against Temporal: open runs and recently closed ones keep theirs."""

from __future__ import annotations

import json
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities.checkpoints.engine import load_manifest
from activities.runtime import Runtime
from durable_agents.reaping import collect_garbage, run_closed_checker
from tests.conftest import WorkerFactory, require_bwrap, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.scenarios import pending_view
from workflows.agent import AgentWorkflow


def write_then_order(body: dict[str, Any]) -> Scripted:
    """Write a file (a checkpoint), then ask for a POST that waits for approval (the run stays open)."""
    done = [m for m in body.get("messages", []) if m.get("role") == "tool"]
    task = next(str(m["content"]) for m in body["messages"] if m.get("role") == "user")
    if not done:  # each run's own content, so each run has checkpoints of its own
        return Scripted(tool_calls=[("write_file", json.dumps({"path": "a.txt", "content": f"files of {task}"}))])
    if len(done) == 1:
        post = {"method": "POST", "url": "http://127.0.0.1:65000/orders", "json": {}}
        return Scripted(tool_calls=[("http_request", json.dumps(post))])
    return Scripted(text="done")


async def test_checkpoints_of_open_and_recent_runs_are_kept_and_expired_ones_collected(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    llm.default = write_then_order
    client = dev_env.client
    async with run_worker(client, runtime) as tq:
        open_run = await start_agent(client, tq, id_prefix="gc-open", task="the open run")
        await pending_view(open_run)  # written a.txt, now waiting for the POST's approval
        closed_run = await start_agent(client, tq, id_prefix="gc-closed", task="the closed run")
        await pending_view(closed_run)
        await closed_run.cancel()
        await closed_run.result()
        views = {h.id: await h.query(AgentWorkflow.status) for h in (open_run, closed_run)}
        store = runtime.store
        checkpoints = {wid: view.checkpoint for wid, view in views.items()}
        files = {wid: (await load_manifest(store, cp)).hashes() for wid, cp in checkpoints.items()}
        assert all(checkpoints.values()) and all(files.values())

        # A branch of a rewound run belongs to its chain: the reaper does not take its sandbox.
        is_closed = run_closed_checker(client)
        assert not await is_closed(f"{views[open_run.id].conversation_id}~0123456789")
        assert await is_closed(f"{views[closed_run.id].conversation_id}~0123456789")

        # Within retention: both kept (the closed one can still be forked).
        kept = await collect_garbage(client, store, retention_days=7, grace_s=0)
        assert kept.deleted == 0
        # Past retention (0 days): only the open run's checkpoint and files are left.
        collected = await collect_garbage(client, store, retention_days=0, grace_s=0)
        assert collected.deleted >= 1
        assert await store.get_blob(checkpoints[open_run.id]) is not None
        assert all([await store.get_blob(h) is not None for h in files[open_run.id]])
        gone = {checkpoints[closed_run.id], *files[closed_run.id]}
        assert not gone & {checkpoints[open_run.id], *files[open_run.id]}
        assert [await store.get_blob(digest) for digest in gone] == [None] * len(gone)
        await open_run.cancel()
