"""The waiting floor: a bare Temporal workflow parked on an update, then one activity, in its own worker process.

What a run waiting for an approval must cost at least on this SDK and server: a cached workflow
instance in the (default) sandbox, blocked in ``wait_condition``; the ``decide`` update accepts, and
the workflow schedules one activity that records when it started, as ``bench_effect`` does for ours.
Started with ``model_turn=True`` it first runs one no-op "model" activity, as an agent run asks its
model before it knows what to ask a human about (``bench.scale waiting``'s ``floor_turn``).

    python -m bench.floor_waiting --address HOST:PORT --task-queue Q --state-dir DIR [--max-cached N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

EFFECTS_LOG = "effects.log"  # the same file and line format as bench.fixtures_scale.bench_effect
READY_LINE = "worker_started"
STATE = SearchAttributeKey.for_keyword("AgentState")  # as ours sets it, so the bench counts both alike


@activity.defn(name="floor_effect")
async def floor_effect(workflow_id: str) -> str:
    now = time.time()
    path = Path(os.environ["BENCH_STATE_DIR"]) / EFFECTS_LOG
    with path.open("a") as f:
        f.write(f"{workflow_id} floor {now:.6f}\n")
    return f"effect at {now:.6f}"


@activity.defn(name="floor_model")
async def floor_model(task: str) -> str:
    return ""


@workflow.defn(name="BenchWaitFloorWorkflow")
class WaitFloorWorkflow:
    def __init__(self) -> None:
        self._approved = False

    @workflow.run
    async def run(self, task: str, model_turn: bool = False) -> str:
        if model_turn:  # as an agent run does before it can ask: one model activity, whose answer names the call
            await workflow.execute_activity(floor_model, task, start_to_close_timeout=timedelta(seconds=60))
        workflow.upsert_search_attributes([STATE.value_set("waiting_approval")])
        await workflow.wait_condition(lambda: self._approved)
        workflow.upsert_search_attributes([STATE.value_set("running")])
        return await workflow.execute_activity(
            floor_effect,
            workflow.info().workflow_id,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )

    @workflow.update(name="decide")
    async def decide(self, approval_id: str) -> bool:
        self._approved = True
        return True


async def serve(args: argparse.Namespace) -> None:
    client = await Client.connect(args.address, data_converter=pydantic_data_converter)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    os.environ["BENCH_STATE_DIR"] = str(args.state_dir)
    async with Worker(
        client,
        task_queue=args.task_queue,
        workflows=[WaitFloorWorkflow],
        activities=[floor_effect, floor_model],
        max_cached_workflows=args.max_cached,
    ):
        print(READY_LINE, flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor_waiting")
    p.add_argument("--address", required=True)
    p.add_argument("--task-queue", required=True)
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--max-cached", type=int, default=1000, help="the SDK's default, as our worker's")
    asyncio.run(serve(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
