"""The idle-session floor: a bare Temporal workflow that answers messages with one activity each, in its own worker.

What an idle session must cost at least on this SDK and server: a workflow instance blocked in
``wait_condition`` until a ``send`` update hands it a message, then one activity that POSTs the message
to the model server (the same fake LLM server ours calls, so both are timed by the request's arrival
there), then back to waiting. A first message given at start is answered the same way, so the floor
goes idle after one exchange, as ours does. It sets ``AgentState`` (``running``/``idle``) as ours does.

    python -m bench.floor_sessions --address HOST:PORT --task-queue Q --llm-url URL [--max-cached N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import urllib.request
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

READY_LINE = "worker_started"
STATE = SearchAttributeKey.for_keyword("AgentState")  # as ours sets it, so the bench counts both alike


@activity.defn(name="floor_reply")
async def floor_reply(text: str) -> str:
    """One Chat Completions request to the model server, as ours makes for a message."""
    body = {"model": "floor", "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(
        os.environ["BENCH_LLM_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )

    def call() -> str:
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.loads(response.read())
        return str(reply["choices"][0]["message"]["content"] or "")

    return await asyncio.to_thread(call)


@workflow.defn(name="BenchSessionFloorWorkflow")
class SessionFloorWorkflow:
    def __init__(self) -> None:
        self._queue: list[str] = []

    @workflow.run
    async def run(self, first: str) -> str:
        if first:
            self._queue.append(first)
        while True:
            if not self._queue:
                workflow.upsert_search_attributes([STATE.value_set("idle")])
                await workflow.wait_condition(lambda: bool(self._queue))
                workflow.upsert_search_attributes([STATE.value_set("running")])
            await workflow.execute_activity(
                floor_reply,
                self._queue.pop(0),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )

    @workflow.update(name="send")
    async def send(self, text: str) -> int:
        self._queue.append(text)
        return len(self._queue)


async def serve(args: argparse.Namespace) -> None:
    client = await Client.connect(args.address, data_converter=pydantic_data_converter)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    os.environ["BENCH_LLM_URL"] = args.llm_url
    async with Worker(
        client,
        task_queue=args.task_queue,
        workflows=[SessionFloorWorkflow],
        activities=[floor_reply],
        max_cached_workflows=args.max_cached,
    ):
        print(READY_LINE, flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor_sessions")
    p.add_argument("--address", required=True)
    p.add_argument("--task-queue", required=True)
    p.add_argument("--llm-url", required=True, help="the fake LLM server's OpenAI base URL (.../v1)")
    p.add_argument("--max-cached", type=int, default=500, help="as our worker's default")
    asyncio.run(serve(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
