"""Hostile runs beside ordinary ones on ONE worker: FIFOs, 1,100-deep trees and a disk filler hurt nobody.

Six runs plant FIFOs where the host would open files (a ``write_file`` target, a
``read_file`` target) and build directory trees too deep for recursive removal; one
run keeps filling its workspace; four ordinary runs write and read a file. The
ordinary runs must complete with the right answer while the attack runs, the worker
must keep answering queries, every sandbox must be gone at the end and a reaper pass
must report no failure.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.sandbox.reaper import reap
from activities.settings import LocalLimits, LocalSandboxSettings, SandboxSettings
from tests.conftest import require_bwrap, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.types import Limits

DEEP_TREE = "import os\nfor _ in range(1100):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')"
FILL_DISK = "i=0; while true; do head -c 1048576 /dev/zero > fill$i || break; i=$((i+1)); done; echo filled $i"


def call(name: str, **arguments: Any) -> tuple[str, str]:
    return name, json.dumps(arguments)


def script(body: dict[str, Any]) -> Scripted:
    messages = body["messages"]
    task = next(m["content"] for m in messages if m["role"] == "user")
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if task.startswith("hostile"):
        plan = [
            [call("run_shell", command="mkfifo w r && echo planted"), call("run_python", code=DEEP_TREE)],
            [call("write_file", path="w", content="x"), call("read_file", path="r")],
        ]
    elif task.startswith("filler"):
        plan = [[call("run_shell", command=FILL_DISK)], [call("run_shell", command=FILL_DISK)]]
    else:
        plan = [[call("write_file", path="note.txt", content=task)], [call("read_file", path="note.txt")]]
    if turn < len(plan):
        return Scripted(tool_calls=plan[turn])
    last_tool = next(m["content"] for m in reversed(messages) if m["role"] == "tool")
    return Scripted(text=f"finished: {last_tool[:200]}")


async def test_hostile_runs_cannot_hurt_ordinary_ones(
    dev_env: WorkflowEnvironment, runtime: Runtime, llm: FakeLLMServer
) -> None:
    require_bwrap()
    llm.default = script
    limits = LocalLimits(timeout_s=8, disk_mb=32)
    hardened = Runtime.from_settings(
        replace(runtime.settings, sandbox=SandboxSettings(local=LocalSandboxSettings(limits=limits), reap_interval_s=0))
    )
    client = dev_env.client
    try:
        task_queue = f"hostile-{uuid.uuid4().hex[:8]}"
        # One worker with its normal workflow cache: what an operator runs.
        async with build_worker(client, hardened, task_queue=task_queue):
            ordinary = [await start_agent(client, task_queue, task=f"ordinary {i}") for i in range(4)]
            hostile = [await start_agent(client, task_queue, task=f"hostile {i}") for i in range(6)]
            filler = await start_agent(client, task_queue, task="filler", limits=Limits(max_steps=4))

            # The worker keeps answering while the attack runs: status queries of an ordinary run are
            # answered (each within the SDK's query deadline) while hostile runs are still open.
            answered_during_attack = 0
            for _ in range(5):
                await ordinary[0].query(AgentWorkflow.status, rpc_timeout=timedelta(seconds=30))
                if WorkflowExecutionStatus.RUNNING in [(await h.describe()).status for h in hostile]:
                    answered_during_attack += 1

            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in [*ordinary, *hostile, filler])), 120)
        report = await reap(hardened.sandbox_backend(), _closed, min_age_s=0)
    finally:
        await hardened.aclose()

    for index, result in enumerate(results[:4]):
        assert result.status == "completed" and result.output == f"finished: ordinary {index}", result
    for result in results[4:10]:
        assert result.status == "completed" and "FIFO" in result.output and "refused" in result.output, result
    assert "workspace is full" in results[10].output, results[10]
    assert answered_during_attack >= 1, "no status query was answered while the attack ran"
    sandboxes = Path(hardened.settings.state_dir) / "sandboxes"
    leftovers = [p.name for p in sandboxes.iterdir()] if sandboxes.exists() else []
    assert leftovers == [], f"sandboxes left behind: {leftovers}"
    assert report.errors == {}, report.summary()


async def _closed(run_id: str) -> bool:
    return True
