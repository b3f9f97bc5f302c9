"""What does ``starter.py transcript`` cost? A session of 50, then 200 messages, read from its histories.

    .venv/bin/python -m bench.transcript_cost --messages 50,200

A local dev server and the fake LLM server: one session takes its messages one at a time (each
waits for its reply); every tenth message makes the model call ``write_file`` before it replies.
At each count, ``durable_agents.cli.transcript.read_transcript`` (what the command runs, minus the
process start) reads the conversation ``--reads`` times: the median wall time, the histories read
(executions of the id: continue-as-new runs included), the events and bytes fetched, and the
entries found. Written to ``bench/results/transcript_cost.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.sandbox.local import quota
from activities.settings import ProviderEndpoint, Settings
from durable_agents import logs
from durable_agents.cli.transcript import executions, read_transcript
from durable_agents.testing._llm_server import FakeLLMServer, Scripted
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, StatusView

TEMPORAL_CLI = Path(sys.executable).parent / "temporal"
RESULTS = Path(__file__).parent / "results" / "transcript_cost.json"


def model(body: dict[str, Any]) -> Scripted:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Scripted(text="saved it")
    text = str(last.get("content") or "")
    if text.startswith("write "):
        return Scripted(tool_calls=[("write_file", json.dumps({"path": text.split()[1], "content": "x" * 200}))])
    return Scripted(text=f"you said: {text} " + "lorem ipsum " * 20)


async def _answered(client: Client, session_id: str, seq: int) -> None:
    handle = client.get_workflow_handle(session_id)
    while True:
        view = StatusView.model_validate(await handle.query(AgentWorkflow.status))
        if view.replied >= seq and view.state == "idle":
            return
        await asyncio.sleep(0.02)


async def measure(counts: list[int], reads: int) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI), data_converter=pydantic_data_converter, dev_server_log_level="error"
    )
    points: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-transcript-") as tmp, FakeLLMServer(model) as llm:
            settings = Settings(
                model="openai:bench-model",
                openai=ProviderEndpoint(llm.openai_url),
                store_url=str(Path(tmp) / "store.sqlite3"),
                state_dir=Path(tmp) / "agent",
            )
            runtime = Runtime.from_settings(settings)
            task_queue = f"bench-{uuid.uuid4().hex[:8]}"
            session_id = f"bench-transcript-{uuid.uuid4().hex[:8]}"
            try:
                async with build_worker(env.client, runtime, task_queue=task_queue):
                    handle = await env.client.start_workflow(
                        AgentWorkflow.run, AgentInput(session=SessionSpec()), id=session_id, task_queue=task_queue
                    )
                    sent = 0
                    started = time.monotonic()
                    for count in counts:
                        while sent < count:
                            sent += 1
                            text = f"write f{sent}.txt" if sent % 10 == 0 else f"message number {sent}"
                            message = SessionMessage(message_id=f"b{sent}", text=text)
                            await handle.execute_update("send", message, result_type=SendResult)
                            await _answered(env.client, session_id, sent)
                        points.append(await _read(env.client, session_id, count, reads, time.monotonic() - started))
                    await handle.signal("close")
                    await handle.result()  # the session's cleanup stops its sandbox
            finally:
                await runtime.aclose()
                quota.unmount_under(Path(tmp))  # a workspace left mounted (a failed run) would block the cleanup
    finally:
        await env.shutdown()
    return {"points": points, "reads_per_point": reads}


async def _read(client: Client, session_id: str, count: int, reads: int, session_s: float) -> dict[str, Any]:
    times: list[float] = []
    for _ in range(reads):
        began = time.perf_counter()
        transcript = await read_transcript(client, session_id)
        times.append(time.perf_counter() - began)
    fetch: list[float] = []
    runs: list[dict[str, int]] = []
    for _ in range(reads):  # the same histories fetched without decoding: the server's and the wire's share
        began = time.perf_counter()
        runs = []
        for run_id in await executions(client, session_id):
            sizes = [
                event.ByteSize()
                async for event in client.get_workflow_handle(session_id, run_id=run_id).fetch_history_events()
            ]
            runs.append({"events": len(sizes), "bytes": sum(sizes), "started_event_bytes": sizes[0] if sizes else 0})
        fetch.append(time.perf_counter() - began)
    kinds = [entry.kind for entry in transcript.entries]
    return {
        "messages": count,
        "transcript_s_median": round(statistics.median(times), 3),
        "transcript_s_max": round(max(times), 3),
        "fetch_only_s_median": round(statistics.median(fetch), 3),
        "executions": transcript.executions,
        "events": transcript.events,
        "history_bytes": transcript.history_bytes,
        "bytes_per_message": round(transcript.history_bytes / count),
        "runs": runs,  # each history: a continued run's started event carries the session's state
        "entries": {kind: kinds.count(kind) for kind in ("message", "reply", "tool_call")},
        "session_wall_s": round(session_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", default="50,200", help="message counts to read the transcript at (ascending)")
    parser.add_argument("--reads", type=int, default=3, help="transcript reads per count (the median is reported)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)
    logs.configure(level="WARNING")  # the worker's per-activity lines would bury the numbers
    counts = sorted({int(part) for part in args.messages.split(",") if part.strip()})
    report = asyncio.run(measure(counts, max(args.reads, 1)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for point in report["points"]:
        print(
            f"{point['messages']:>4} messages: transcript {point['transcript_s_median']} s (median of {args.reads}), "
            f"fetch alone {point['fetch_only_s_median']} s, {point['executions']} histories, "
            f"{point['events']} events, {point['history_bytes']:,} B "
            f"({point['bytes_per_message']:,} B/message), entries {point['entries']}"
        )
    print(f"written to {args.out}")
    ok = all(p["entries"]["message"] == p["messages"] == p["entries"]["reply"] for p in report["points"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
