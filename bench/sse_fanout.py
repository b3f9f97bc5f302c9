"""SSE fan-out: 200 clients follow one run through ``GET /v1/runs/{id}/events`` (issue 26).

    .venv/bin/python -m bench.sse_fanout --clients 200 --turns 20

Starts a dev server, a worker (in this process, on the fake OpenAI server) and ``starter.py serve`` as a
process of its own, opens ``--clients`` SSE streams on one run of ``--turns`` model turns (each calls a
tool, so every turn publishes several progress events) and records when each client receives each
event. Reports, over every (client, event) pair, the event latency (arrival minus the event's own
timestamp, ``progress.at``: workflow time, when the workflow task that published it ran) p50/p95/max,
the fan-out spread (per event, the last client's arrival minus the first's), streamed text deltas
when the run streams them, whether every client got every event once and in order, and the API
process's RSS (peak and at the end, from /proc). Written to ``bench/results/sse_fanout.json``.

Target: event latency p95 under 2 s with 200 clients (exit code 1 if missed, or if any client missed
or repeated an event).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import ExtensionSettings, ProviderEndpoint, Settings
from bench.report import write_results
from durable_agents.api.tokens import digest
from tests.fakes.llm_server import FakeLLMServer, Scripted
from worker import build_worker

ROOT = Path(__file__).resolve().parent.parent
TEMPORAL_CLI = Path(sys.executable).parent / "temporal"
RESULTS = ROOT / "bench" / "results" / "sse_fanout.json"
TARGET_P95_S = 2.0
TOKEN = "bench-token-" + uuid.uuid4().hex


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 4) if ordered else 0.0


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def follow(http: httpx.AsyncClient, url: str, arrivals: list[tuple[str, str, float, str]]) -> None:
    """One SSE client: (id, kind, arrival, event time) of every event until ``end``."""
    async with http.stream("GET", url, headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        assert response.status_code == 200, await response.aread()
        frame: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line == "":
                if frame.get("event") == "end":
                    return
                if "id" in frame:
                    data = json.loads(frame.get("data", "{}"))
                    at = (data.get("progress") or {}).get("at", "")
                    arrivals.append((frame["id"], frame.get("event", ""), time.time(), at))
                frame = {}
            elif not line.startswith(":"):
                key, _, value = line.partition(": ")
                frame[key] = value


def serve(address: str, task_queue: str, tokens: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "starter.py"), "serve", "--port", "0", "--host", "127.0.0.1"],
        env={
            "PATH": os.environ["PATH"],
            "TEMPORAL_ADDRESS": address,
            "AGENT_TASK_QUEUE": task_queue,
            "AGENT_API_TOKENS_FILE": str(tokens),
            "AGENT_API_RATE_PER_MINUTE": "100000",
            "AGENT_LOG_LEVEL": "WARNING",
        },
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("API on http://"):
                return proc, line.split()[2]
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {log.read_text()}")
        time.sleep(0.05)
    raise RuntimeError("serve did not start")


async def measure(clients: int, turns: int, turn_delay_s: float) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI), data_converter=pydantic_data_converter, dev_server_log_level="error"
    )
    address = env.client.service_client.config.target_host
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sse-") as tmp, FakeLLMServer() as llm:
            replies = [Scripted(tool_calls=[("always_fails", "{}")], delay_s=turn_delay_s) for _ in range(turns - 1)]
            llm.enqueue(*replies, Scripted(text="done", delay_s=turn_delay_s))
            settings = Settings(
                model="openai:bench-model",
                openai=ProviderEndpoint(llm.openai_url),
                extensions=ExtensionSettings(tool_modules=("tests.fakes.failing_tools",)),
                store_url=str(Path(tmp) / "store.sqlite3"),
                state_dir=Path(tmp) / "agent",
            )
            tokens = Path(tmp) / "tokens.json"
            tokens.write_text(json.dumps({"tokens": [{"sha256": digest(TOKEN), "roles": ["admin"], "reviewer": "b"}]}))
            runtime = Runtime.from_settings(settings)
            task_queue = f"bench-{uuid.uuid4().hex[:8]}"
            api_log = Path(tmp) / "api.log"
            proc, url = serve(address, task_queue, tokens, api_log)
            try:
                async with build_worker(env.client, runtime, task_queue=task_queue):
                    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
                    async with httpx.AsyncClient(
                        base_url=url, timeout=httpx.Timeout(60, read=300), limits=limits
                    ) as http:
                        idle_rss, _ = rss_kib(proc.pid)
                        started = await http.post(
                            "/v1/runs",
                            json={"task": "fan out", "limits": {"max_steps": turns + 5}},
                            headers={"Authorization": f"Bearer {TOKEN}"},
                        )
                        assert started.status_code == 201, started.text
                        wid = started.json()["workflow_id"]
                        arrivals: list[list[tuple[str, str, float, str]]] = [[] for _ in range(clients)]
                        peak = [0]

                        async def sample() -> None:
                            while True:
                                peak[0] = max(peak[0], rss_kib(proc.pid)[0])
                                await asyncio.sleep(0.2)

                        sampler = asyncio.create_task(sample())
                        began = time.monotonic()
                        await asyncio.gather(*(follow(http, f"/v1/runs/{wid}/events", a) for a in arrivals))
                        wall_s = time.monotonic() - began
                        sampler.cancel()
                        end_rss, hwm = rss_kib(proc.pid)
            except BaseException:
                print(f"the API's log:\n{api_log.read_text(errors='replace')[-4000:]}", file=sys.stderr)
                raise
            finally:
                proc.terminate()
                proc.wait(timeout=30)
                await runtime.aclose()
    finally:
        await env.shutdown()

    reference = [a[0] for a in arrivals[0]]
    complete = all([a[0] for a in got] == reference for got in arrivals) and len(set(reference)) == len(reference)
    latencies = [
        got_at - datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
        for got in arrivals
        for _, kind, got_at, at in got
        if at and kind != "delta"
    ]
    by_event: dict[str, list[float]] = {}
    for got in arrivals:
        for event_id, _, got_at, _ in got:
            by_event.setdefault(event_id, []).append(got_at)
    spreads = [max(times) - min(times) for times in by_event.values()]
    deltas = sum(1 for _, kind, _, _ in arrivals[0] if kind == "delta")
    p95 = pct(latencies, 95)
    return {
        "clients": clients,
        "turns": turns,
        "events_per_client": len(reference),
        "deltas_per_client": deltas,
        "every_client_every_event_once_in_order": complete,
        "event_latency_s": {"p50": pct(latencies, 50), "p95": p95, "max": pct(latencies, 100)},
        "fanout_spread_s": {"p50": pct(spreads, 50), "p95": pct(spreads, 95), "max": pct(spreads, 100)},
        "api_rss_mib": {
            "idle": round(idle_rss / 1024, 1),
            "peak_sampled": round(peak[0] / 1024, 1),
            "high_water": round(hwm / 1024, 1),
            "end": round(end_rss / 1024, 1),
        },
        "wall_s": round(wall_s, 2),
        "target": f"event latency p95 < {TARGET_P95_S} s with {clients} clients, every event once and in order",
        "target_met": complete and p95 < TARGET_P95_S,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--turn-delay", type=float, default=0.2, help="seconds the fake model takes per turn")
    args = parser.parse_args(argv)
    report = asyncio.run(measure(args.clients, args.turns, args.turn_delay))
    write_results(RESULTS, report, echo=True)
    return 0 if report["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
