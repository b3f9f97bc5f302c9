"""The sandbox reaper against real Temporal: sandboxes of closed or unknown runs are killed, open ones kept."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from activities.sandbox.base import META_RUN
from activities.sandbox.local.backend import LocalSandboxBackend
from tests.conftest import require_bwrap
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput

ROOT = Path(__file__).resolve().parent.parent


async def test_starter_reaps_sandboxes_of_closed_runs(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    require_bwrap()
    client = dev_env.client
    queue = f"reap-{uuid.uuid4().hex[:8]}"  # no worker: started runs simply stay running
    running = await client.start_workflow(AgentWorkflow.run, AgentInput(task="x"), id=f"open-{queue}", task_queue=queue)
    closed = await client.start_workflow(AgentWorkflow.run, AgentInput(task="y"), id=f"done-{queue}", task_queue=queue)
    await closed.terminate("test")
    backend = LocalSandboxBackend(tmp_path / "state" / "sandboxes")
    runs = {
        "sbx-open": f"{running.id}/{running.result_run_id}",
        "sbx-closed": f"{closed.id}/{closed.result_run_id}",
        "sbx-gone": f"never-started-{queue}/00000000",
        "sbx-reused": f"{running.id}/an-older-chain",
    }
    for sandbox_id, conversation in runs.items():
        await backend.create(sandbox_id, metadata={META_RUN: conversation})
    await asyncio.sleep(1.1)  # older than --min-age 1

    env = {
        "PATH": os.environ["PATH"],
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_SANDBOX": "local",
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(ROOT / "starter.py"), "sandboxes", "reap", "--min-age", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("checked 4 sandbox(es): killed 3, kept 1"), done.stdout
    left = sorted(p.name for p in (tmp_path / "state" / "sandboxes").iterdir())
    assert left == ["sbx-open"]
    await running.terminate("test done")
