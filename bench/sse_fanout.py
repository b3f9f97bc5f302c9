"""SSE fan-out: 200 clients follow one run through ``GET /v1/runs/{id}/events`` (issue 26).

    .venv/bin/python -m bench.sse_fanout --clients 200 --turns 20

Starts a dev server, a worker (in this process, on the fake OpenAI server) and ``starter.py serve`` as a
process of its own (on the worker's run store, ``AGENT_STORE_URL``, so that it reads the streamed text),
opens ``--clients`` SSE streams on one run of ``--turns`` model turns (each writes a few hundred
characters of text, streamed in pieces of ``--chunk-chars`` every ``--piece-delay`` seconds, and all but
the last call a tool, so every turn publishes several progress events) and records when each client
receives each event. Reports, over every (client, event) pair, the event latency (arrival minus the
event's own timestamp, ``progress.at``: workflow time, when the workflow task that published it ran)
p50/p95/max, the fan-out spread (per event, the last client's arrival minus the first's), whether every
client got every event once and in order, and the API process's RSS (peak and at the end, from /proc).

Over every (client, ``delta`` frame) pair it reports the delta latency: arrival minus the time the fake
model server wrote the piece that holds the delta's last character (``text_sent_at`` of the turn's
request; the piece is found by the character's position in the turn's text, ``// chunk_chars``). That
includes the worker's batching (a row every 50 ms, or at 200 characters) and, with secrets configured,
its holdback (none here). A turn streams only if someone listens when it starts, so the first turn does
not when it starts before the first client connects: ``streamed_turns`` counts the turns that did, and
``unmapped_deltas`` the delta frames whose text was not the model's at that position (0 when the
measure holds). Written to ``bench/results/sse_fanout.json``.

Target: event latency p95 under 2 s with 200 clients (exit code 1 if missed, or if any client missed
or repeated an event). The delta latency is reported, not a target.
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
from typing import Any, NamedTuple

import httpx
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import ExtensionSettings, ProviderEndpoint, Settings
from bench.report import write_results
from durable_agents.api.tokens import digest
from durable_agents.testing._llm_server import OPENAI_PATH, FakeLLMServer, Scripted
from worker import build_worker

ROOT = Path(__file__).resolve().parent.parent
TEMPORAL_CLI = Path(sys.executable).parent / "temporal"
RESULTS = ROOT / "bench" / "results" / "sse_fanout.json"
TARGET_P95_S = 2.0
TOKEN = "bench-token-" + uuid.uuid4().hex
# What the model writes each turn (one of these, after "Step N."): prose of a few hundred characters.
PROSE = (
    "I read the failing test and the function it covers. The parser drops the last field when a line ends "
    "with a delimiter, because the loop stops one index early. Before I change it I want to see how the "
    "other callers depend on that behaviour, so I will run the helper on the sample input first and "
    "compare its output with what the documentation promises for trailing delimiters.",
    "The helper failed again, so I cannot rely on it for this check. The error does not depend on the input: "
    "it fails before it reads anything, which points at its environment rather than the data. I will note "
    "the failure in the summary, work from the source instead, and trace by hand how the three call sites "
    "build their lines, starting with the importer, which handles the largest files.",
    "The importer strips trailing delimiters before it calls the parser, so it never meets the case. The "
    "export path and the command line tool do not, and both would lose data silently. The fix belongs in "
    "the parser itself: keep iterating until the end of the line and emit an empty last field. I will also "
    "add a test for a line that ends with two delimiters, which the current code gets wrong twice.",
    "Before I write the change I am checking the history of that loop. It was shortened two years ago to "
    "avoid an index error on empty lines, and nothing in the tests covers an empty line today. The safer "
    "version handles both: an empty line gives one empty field, a trailing delimiter gives a last empty "
    "field, and every other line parses exactly as before, which the existing tests will confirm.",
)


class Arrival(NamedTuple):
    """One frame a client received: its id and kind, when (``time.time()``), the progress event's ``at``,
    and for a delta its ``(turn, attempt, restart, text)``."""

    event_id: str
    kind: str
    got_at: float
    at: str
    delta: tuple[int, int, bool, str] | None


def reply_text(step: int) -> str:
    return f"Step {step}. {PROSE[(step - 1) % len(PROSE)]}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 4) if ordered else 0.0


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def follow(http: httpx.AsyncClient, url: str, arrivals: list[Arrival]) -> None:
    """One SSE client: every event until ``end``."""
    async with http.stream("GET", url, headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        assert response.status_code == 200, await response.aread()
        frame: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line == "":
                if frame.get("event") == "end":
                    return
                if "id" in frame:
                    data = json.loads(frame.get("data", "{}"))
                    got_at = time.time()
                    kind = frame.get("event", "")
                    at = (data.get("progress") or {}).get("at", "")
                    delta = None
                    if kind == "delta":
                        restart = bool((data.get("data") or {}).get("restart"))
                        delta = (int(data.get("turn", 0)), int(data.get("attempt", 0)), restart, data.get("text", ""))
                    arrivals.append(Arrival(frame["id"], kind, got_at, at, delta))
                frame = {}
            elif not line.startswith(":"):
                key, _, value = line.partition(": ")
                frame[key] = value


def serve(
    address: str, task_queue: str, tokens: Path, store_url: str, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "starter.py"), "serve", "--port", "0", "--host", "127.0.0.1"],
        env={
            "PATH": os.environ["PATH"],
            "TEMPORAL_ADDRESS": address,
            "AGENT_TASK_QUEUE": task_queue,
            "AGENT_API_TOKENS_FILE": str(tokens),
            "AGENT_STORE_URL": store_url,  # the worker's run store: the streamed text is read from there
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


def delta_latencies(
    arrivals: list[list[Arrival]], requests: list[dict[str, Any]], texts: list[str], chunk_chars: int
) -> tuple[list[float], int]:
    """The latency of every (client, delta) pair, and how many deltas could not be mapped to a sent piece.

    The deltas of one turn attempt (``turn``, ``attempt``: a retry's text, which starts with a restart,
    is an attempt of its own) are joined; the model request whose reply text begins with them is that
    attempt's (request ``i`` answered ``texts[i]``: the replies are scripted in order), and a delta whose
    last character is at position ``p`` of the text was complete when piece ``p // chunk_chars`` of that
    request went out (``text_sent_at``)."""
    sent = [(text, request.get("text_sent_at") or []) for request, text in zip(requests, texts, strict=False)]
    latencies: list[float] = []
    unmapped = 0
    for got in arrivals:
        attempts: dict[tuple[int, int], list[tuple[float, str]]] = {}
        for arrival in got:
            if arrival.delta is not None:
                turn, attempt, _, text = arrival.delta
                attempts.setdefault((turn, attempt), []).append((arrival.got_at, text))
        for (turn, _), deltas in attempts.items():
            joined = "".join(text for _, text in deltas)
            matches = [i for i, (text, times) in enumerate(sent) if times and text.startswith(joined)]
            if len(matches) > 1:  # a text that is the start of several (it cannot be here: "Step N." differs)
                matches = [i for i in matches if i == turn - 1]  # turn N is the Nth model request
            if len(matches) != 1:
                unmapped += len(deltas)
                continue
            times = sent[matches[0]][1]
            end = 0
            for got_at, text in deltas:
                end += len(text)
                piece = (end - 1) // chunk_chars
                if not text or piece >= len(times):
                    unmapped += 1
                    continue
                latencies.append(got_at - times[piece])
    return latencies, unmapped


async def measure(
    clients: int, turns: int, turn_delay_s: float, chunk_chars: int, piece_delay_s: float
) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI), data_converter=pydantic_data_converter, dev_server_log_level="error"
    )
    address = env.client.service_client.config.target_host
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sse-") as tmp, FakeLLMServer() as llm:
            texts = [reply_text(step) for step in range(1, turns + 1)]
            replies = [
                Scripted(
                    text=text,
                    tool_calls=[("always_fails", "{}")] if step < turns else [],
                    delay_s=turn_delay_s,
                    chunk_chars=chunk_chars,
                    piece_delay_s=piece_delay_s,
                )
                for step, text in enumerate(texts, start=1)
            ]
            llm.enqueue(*replies)
            settings = Settings(
                model="openai:bench-model",
                openai=ProviderEndpoint(llm.openai_url),
                extensions=ExtensionSettings(tool_modules=("tests.fakes.failing_tools",)),
                store_url=str(Path(tmp) / "store.sqlite3"),
                state_dir=Path(tmp) / "agent",
            )
            # The worker holds back twice its longest secret's length of text until more comes (none here).
            holdback = 2 * max((len(secret) for secret in settings.secret_values()), default=0)
            tokens = Path(tmp) / "tokens.json"
            tokens.write_text(json.dumps({"tokens": [{"sha256": digest(TOKEN), "roles": ["admin"], "reviewer": "b"}]}))
            runtime = Runtime.from_settings(settings)
            task_queue = f"bench-{uuid.uuid4().hex[:8]}"
            api_log = Path(tmp) / "api.log"
            proc, url = serve(address, task_queue, tokens, settings.store_url, api_log)
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
                        arrivals: list[list[Arrival]] = [[] for _ in range(clients)]
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

    reference = [a.event_id for a in arrivals[0]]
    complete = all([a.event_id for a in got] == reference for got in arrivals) and len(set(reference)) == len(reference)
    latencies = [
        a.got_at - datetime.fromisoformat(a.at.replace("Z", "+00:00")).timestamp()
        for got in arrivals
        for a in got
        if a.at and a.kind != "delta"
    ]
    by_event: dict[str, list[float]] = {}
    for got in arrivals:
        for a in got:
            by_event.setdefault(a.event_id, []).append(a.got_at)
    spreads = [max(times) - min(times) for times in by_event.values()]
    deltas = sum(1 for a in arrivals[0] if a.kind == "delta")
    model_requests = [r for r in llm.requests if r["path"] == OPENAI_PATH]
    delta_lat, unmapped = delta_latencies(arrivals, model_requests, texts, chunk_chars)
    streamed = {a.delta[0] for got in arrivals for a in got if a.delta is not None}
    p95 = pct(latencies, 95)
    return {
        "clients": clients,
        "turns": turns,
        "events_per_client": len(reference) - deltas,  # progress events; the deltas are frames of their own
        "deltas_per_client": deltas,
        "streamed_turns": len(streamed),
        "every_client_every_event_once_in_order": complete,
        "event_latency_s": {"p50": pct(latencies, 50), "p95": p95, "max": pct(latencies, 100)},
        "delta_latency_s": {"p50": pct(delta_lat, 50), "p95": pct(delta_lat, 95), "max": pct(delta_lat, 100)},
        "unmapped_deltas": unmapped,
        "text": {
            "chars_per_turn": round(sum(map(len, texts)) / len(texts)),
            "chunk_chars": chunk_chars,
            "piece_delay_s": piece_delay_s,
            "holdback_chars": holdback,
        },
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
    parser.add_argument("--chunk-chars", type=int, default=16, help="characters of text per streamed piece")
    parser.add_argument("--piece-delay", type=float, default=0.02, help="seconds the fake model waits per piece")
    args = parser.parse_args(argv)
    report = asyncio.run(measure(args.clients, args.turns, args.turn_delay, args.chunk_chars, args.piece_delay))
    write_results(RESULTS, report, echo=True)
    return 0 if report["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
