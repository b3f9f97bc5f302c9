"""``sessions-idle``: N idle sessions in ONE worker process; its RSS, and how fast cold sessions answer a burst.

Each session (``AgentInput(session=SessionSpec())``) answers one first message (its task) through the
fake LLM server on 127.0.0.1 and goes idle. Then ``--sends`` ``send`` updates go out at once to sessions
that are cold: the worker is restarted first (``--cold restart``, the default: no session is in any
worker's cache), or not, and the sessions are picked among those that went idle first, which the LRU
cache has evicted (``--cold evicted``). Each is timed from the client's ``time.time()`` just before
``execute_update`` to the model server's ``time.time()`` when that session's model request arrives
(same host clock). The floor (``bench/floor_sessions.py``) does the same with a bare workflow.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowUpdateRPCTimeoutOrCancelledError

from activities.settings import WorkerSettings
from bench.scale.common import dev_server, histories, history_stats, machine, median, pct, queue
from bench.scale.waiting import cpu_s, rss_kb
from durable_agents.search_attributes import ensure_search_attributes
from durable_agents.testing._llm_server import FakeLLMServer, Scripted
from durable_agents.testing._worker_proc import WorkerProc, worker_env
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, StatusView

SYSTEMS = ("floor", "ours")
COLD_MODES = ("restart", "evicted")
WARM_UP = 5  # sessions woken (outside the sample) after a restart, so the burst does not time the worker's first task
_KEY = re.compile(r"\b(hello|cold|warm) (\S+)")


def message_key(body: dict[str, Any]) -> str | None:
    """``"<kind> <session id>"`` of the last user message of a Chat Completions request, if it is the bench's."""
    users = [m for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        return None
    found = _KEY.search(str(users[-1].get("content")))
    return f"{found.group(1)} {found.group(2)}" if found else None


class ModelClock:
    """The fake model's reply: answers "ok" at once and records when each bench message's request arrived."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.arrivals: dict[str, list[float]] = {}

    def __call__(self, body: dict[str, Any]) -> Scripted:
        now = time.time()
        key = message_key(body)
        if key is not None:
            with self._lock:
                self.arrivals.setdefault(key, []).append(now)
        return Scripted(text="ok")

    def first(self, key: str) -> float | None:
        with self._lock:
            times = self.arrivals.get(key)
            return times[0] if times else None

    def count(self, key: str) -> int:
        with self._lock:
            return len(self.arrivals.get(key, []))


async def _count_idle(client: Client, task_queue: str) -> int:
    return (await client.count_workflows(f"TaskQueue = '{task_queue}' AND AgentState = 'idle'")).count


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    clock = ModelClock()
    async with dev_server() as env:
        client = env.client
        await ensure_search_attributes(client)
        with FakeLLMServer(default=clock) as llm:
            for system in args.systems:
                with tempfile.TemporaryDirectory(prefix=f"bench-sessions-{system}-") as tmp:
                    rows[system] = await _drive(system, client, llm, clock, Path(tmp), args)
    return _report(rows, args)


def _cache_size(args: argparse.Namespace) -> int:
    return args.max_cached if args.max_cached is not None else WorkerSettings().max_cached_workflows


class _Worker:
    """The system's worker process, restartable with the same environment."""

    def __init__(self, system: str, client: Client, llm: FakeLLMServer, task_queue: str, tmp: Path, args: Any) -> None:
        self.tmp = tmp
        self.generation = 0
        state = tmp / "state"
        state.mkdir()
        address = client.service_client.config.target_host
        cached = {"AGENT_MAX_CACHED_WORKFLOWS": str(args.max_cached)} if args.max_cached is not None else {}
        self.env = worker_env(
            address=address,
            task_queue=task_queue,
            llm_url=llm.openai_url,
            state_dir=state,
            policy_file=tmp / "unused.json",
            AGENT_POLICY_FILE="",
            AGENT_TOOL_MODULES="",
            AGENT_LOG_LEVEL="INFO",  # the default; its worker_started line marks it ready
            AGENT_REAP_INTERVAL_S="0",
            **cached,
        )
        self.argv: list[str] | None = None
        if system == "floor":
            # The floor caches as many workflows as ours does, so the two are compared at one cache size.
            self.argv = [sys.executable, "-m", "bench.floor_sessions", "--address", address]
            self.argv += ["--task-queue", task_queue, "--llm-url", llm.openai_url]
            self.argv += ["--max-cached", str(_cache_size(args))]
        self.proc = self._spawn()

    def _spawn(self) -> WorkerProc:
        self.generation += 1
        return WorkerProc(self.env, self.tmp / f"worker-{self.generation}.log", argv=self.argv)

    async def restart(self) -> None:
        self.proc.stop()
        self.proc = self._spawn()
        await self.proc.async_wait_ready(120)


async def _drive(
    system: str, client: Client, llm: FakeLLMServer, clock: ModelClock, tmp: Path, args: argparse.Namespace
) -> dict[str, Any]:
    task_queue = queue(f"sessions-{system}")
    worker = _Worker(system, client, llm, task_queue, tmp, args)
    try:
        return await _phases(system, client, clock, worker, task_queue, args)
    finally:
        worker.proc.stop()


async def _phases(
    system: str, client: Client, clock: ModelClock, worker: _Worker, task_queue: str, args: argparse.Namespace
) -> dict[str, Any]:
    await worker.proc.async_wait_ready(120)
    await asyncio.sleep(1)
    baseline = rss_kb(worker.proc.pid)
    print(f"{system}: worker {worker.proc.pid} ready: RSS {baseline['VmRSS'] / 1024:.0f} MB")
    ids = [f"{task_queue}-{i}" for i in range(args.sessions)]
    first_runs: dict[str, str] = {}
    gate = asyncio.Semaphore(args.start_concurrency)

    async def start(wid: str) -> None:
        first = f"hello {wid}" if args.first_message else ""
        async with gate:
            if system == "ours":
                inp = AgentInput(task=first, session=SessionSpec(), tools=[])
                handle = await client.start_workflow("AgentWorkflow", inp, id=wid, task_queue=task_queue)
            else:
                handle = await client.start_workflow("BenchSessionFloorWorkflow", first, id=wid, task_queue=task_queue)
            first_runs[wid] = handle.first_execution_run_id or ""

    # --- N sessions, each answering its first message, until all are idle ---------------------------
    t0, cpu0 = time.monotonic(), cpu_s(worker.proc.pid)
    starting = asyncio.gather(*(start(wid) for wid in ids))
    idle, samples, peak = 0, [], baseline["VmRSS"]
    while True:
        await asyncio.sleep(2)
        rss = rss_kb(worker.proc.pid)["VmRSS"]
        peak = max(peak, rss)
        idle = await _count_idle(client, task_queue)
        samples.append({"t_s": round(time.monotonic() - t0, 1), "idle": idle, "rss_mb": rss // 1024})
        print(f"  {system} {samples[-1]['t_s']:7.1f} s: {idle} idle, RSS {rss / 1024:.0f} MB", flush=True)
        if idle >= args.sessions or time.monotonic() - t0 > args.idle_timeout:
            break
        if not worker.proc.alive():
            raise RuntimeError(f"worker exited:\n{worker.proc.tail()}")
    await starting
    idle_s, idle_cpu = time.monotonic() - t0, cpu_s(worker.proc.pid) - cpu0
    await asyncio.sleep(5)  # let the worker settle (cache, pollers) before reading its memory
    idle_rss = rss_kb(worker.proc.pid)

    sample = random.Random(14).sample(ids, min(20, len(ids)))
    hist = [history_stats(await histories(client, wid, first_runs[wid])) for wid in sample]
    touched = {ids[0]}
    if system == "ours":
        view = await client.get_workflow_handle(ids[0]).query("status", result_type=StatusView)
        if view.state != "idle" or view.messages != (1 if args.first_message else 0):
            raise RuntimeError(f"{ids[0]} is not an idle session: {view.state}, {view.messages} message(s)")

    # --- the sessions to wake: cold by a restart, or by eviction ---------------------------------------
    restarted: dict[str, float] = {}
    rng = random.Random(7)
    if args.cold == "restart":
        await worker.restart()
        await asyncio.sleep(1)
        fresh = rss_kb(worker.proc.pid)["VmRSS"]
        warm = [wid for wid in ids[-WARM_UP:] if wid not in touched] if len(ids) > args.sends + WARM_UP else []
        await asyncio.gather(*(_send(system, client, wid, "warm", _Sends()) for wid in warm))
        await _arrived(clock, [f"warm {wid}" for wid in warm], args.send_timeout)
        restarted = {
            "rss_mb_fresh": round(fresh / 1024, 1),
            "rss_mb_after_warm_up": round(rss_kb(worker.proc.pid)["VmRSS"] / 1024, 1),
        }
        candidates = [wid for wid in ids if wid not in touched and wid not in warm]
    else:
        # The LRU cache keeps the sessions active last; those that answered their first message first are gone.
        order = sorted(ids, key=lambda wid: clock.first(f"hello {wid}") or float("inf"))
        candidates = [wid for wid in order[: max(0, len(ids) - _cache_size(args))] if wid not in touched]
    chosen = rng.sample(candidates, min(args.sends, len(candidates)))

    # --- the burst: every send at once ------------------------------------------------------------------
    sends = _Sends()
    load_before = [round(x, 2) for x in os.getloadavg()]
    sent, answered = sends.sent, sends.answered
    burst = time.time()
    before, burst_cpu0 = rss_kb(worker.proc.pid)["VmRSS"], cpu_s(worker.proc.pid)
    await asyncio.gather(*(_send(system, client, wid, "cold", sends) for wid in chosen))
    await _arrived(clock, [f"cold {wid}" for wid in chosen], args.send_timeout)
    after, burst_cpu = rss_kb(worker.proc.pid), cpu_s(worker.proc.pid) - burst_cpu0
    arrivals = {wid: clock.first(f"cold {wid}") for wid in chosen}
    to_model = [at - sent[wid] for wid, at in arrivals.items() if at is not None]
    rtt = [answered[wid] - sent[wid] for wid in chosen if wid in answered]
    calls = [clock.count(f"cold {wid}") for wid in chosen]
    proto = [h["proto_bytes"] for h in hist]
    row: dict[str, Any] = {
        "idle": idle,
        "idle_s": round(idle_s, 1),
        "sessions_per_s": round(args.sessions / idle_s, 1),
        "worker_cpu_s_starting": round(idle_cpu, 1),
        "worker_cpu_ms_per_session_started": round(1000 * idle_cpu / max(args.sessions, 1), 2),
        "rss_mb": {
            "baseline": round(baseline["VmRSS"] / 1024, 1),
            "idle": round(idle_rss["VmRSS"] / 1024, 1),
            "peak_while_starting": round(peak / 1024, 1),
            "hwm_while_starting": round(idle_rss["VmHWM"] / 1024, 1),
            "per_idle_session_kb": round((idle_rss["VmRSS"] - baseline["VmRSS"]) / max(idle, 1), 1),
            **restarted,
            "before_burst": round(before / 1024, 1),
            "after_burst": round(after["VmRSS"] / 1024, 1),
        },
        "history_per_idle_session": {
            "proto_bytes_median": median(proto),
            "json_bytes_median": median([h["json_bytes"] for h in hist]),
            "events_median": median([h["events"] for h in hist]),
            "sampled_sessions": len(hist),
        },
        "cold_sends": {
            "cold_by": args.cold,
            "sent": len(chosen),
            "model_called": len(to_model),
            "model_calls_max_per_send": max(calls, default=0),
            "send_spread_s": round(max(sent.values()) - burst, 3) if sent else 0,
            "send_to_model_call_s": {
                "p50": round(pct(to_model, 0.5), 3),
                "p95": round(pct(to_model, 0.95), 3),
                "max": round(max(to_model, default=0), 3),
            },
            "update_round_trip_s": {"p50": round(pct(rtt, 0.5), 3), "p95": round(pct(rtt, 0.95), 3)},
            "update_rpc_timeouts_resent": sends.rpc_timeouts,
            "worker_cpu_s": round(burst_cpu, 2),
            "worker_cpu_ms_per_send": round(1000 * burst_cpu / max(len(chosen), 1), 2),
            "errors": sends.errors[:20],
            "error_count": len(sends.errors),
        },
        "loadavg_before_burst": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "starting": samples,
    }
    c = row["cold_sends"]["send_to_model_call_s"]
    print(
        f"{system}: {idle}/{args.sessions} idle in {idle_s:.0f} s; RSS {idle_rss['VmRSS'] / 1024:.0f} MB "
        f"(baseline {baseline['VmRSS'] / 1024:.0f}); history per idle session {median(proto):,.0f} B proto"
    )
    print(f"{system}: {len(to_model)}/{len(chosen)} cold sends reached the model: p50 {c['p50']} s, p95 {c['p95']} s")
    return row


class _Sends:
    """When each send went out and was answered, the update RPCs that timed out (and were re-sent), failures."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.answered: dict[str, float] = {}
        self.rpc_timeouts = 0
        self.errors: list[str] = []


async def _send(system: str, client: Client, wid: str, kind: str, sends: _Sends, attempts: int = 5) -> None:
    """One ``send``; an update RPC that times out (the server gives up waiting for the worker to accept it) is
    sent again under the same update id, as a front end would, and stays timed from the first try."""
    handle = client.get_workflow_handle(wid)
    text = f"{kind} {wid}"
    sends.sent[wid] = time.time()
    for attempt in range(attempts):
        try:
            if system == "ours":
                message = SessionMessage(message_id=f"{kind}-{wid}", text=text, sender="bench")
                result = await handle.execute_update("send", message, id=f"{kind}-{wid}", result_type=SendResult)
                if not result.accepted:
                    sends.errors.append(f"{wid}: refused: {result.reason}: {result.message}")
            else:
                await handle.execute_update("send", text, id=f"{kind}-{wid}", result_type=int)
            sends.answered[wid] = time.time()
            return
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            sends.rpc_timeouts += 1
            if attempt == attempts - 1:
                sends.errors.append(f"{wid}: update RPC timed out {attempts} times")
        except Exception as exc:  # one failed send must not lose the whole burst's figures
            sends.errors.append(f"{wid}: {exc!r}")
            return


async def _arrived(clock: ModelClock, keys: list[str], within_s: float) -> None:
    """Until every key's model request has arrived (the server's thread records it; polled, bounded)."""
    deadline = time.monotonic() + within_s
    while True:
        missing = sum(1 for key in keys if clock.first(key) is None)
        if not missing or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.1)


def _report(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    cache = _cache_size(args)
    cold = (
        "after a restart of the worker (every session out of every cache; "
        f"{WARM_UP} other sessions woken first so the new worker's first task is not timed)"
        if args.cold == "restart"
        else f"evicted: picked among the sessions that went idle first, beyond the cache of {cache}"
    )
    first = "each answers one first message (its task) and goes idle" if args.first_message else "no first message"
    report: dict[str, Any] = {
        "bench": "sessions_idle",
        "what": f"{args.sessions} sessions (AgentInput(session=SessionSpec()), no tools; {first}) in ONE worker "
        f"process (worker.py, the fake LLM server on 127.0.0.1 as its model) with max_cached_workflows={cache}; "
        f"then {args.sends} 'send' updates at once to sessions that are cold, {cold}. The floor: a bare workflow "
        "waiting in wait_condition for a 'send' update, then one activity POSTing the message to the same model "
        "server, in its own plain temporalio worker process (same SDK, sandbox and cache size)",
        "signal": "the client's time.time() just before execute_update('send') -> the fake model server's "
        "time.time() when that session's request arrives (same host clock)",
        "machine": machine(),
        "sessions": args.sessions,
        "max_cached_workflows": cache,
        "cold_by": args.cold,
        "systems": rows,
    }
    ours, floor = rows.get("ours"), rows.get("floor")
    if ours is not None and floor is not None:
        report["ratios"] = {
            "rss_idle": round(ours["rss_mb"]["idle"] / floor["rss_mb"]["idle"], 2),
            "per_idle_session_kb": round(
                ours["rss_mb"]["per_idle_session_kb"] / max(floor["rss_mb"]["per_idle_session_kb"], 0.1), 2
            ),
            "send_to_model_p50": round(
                ours["cold_sends"]["send_to_model_call_s"]["p50"]
                / max(floor["cold_sends"]["send_to_model_call_s"]["p50"], 0.001),
                2,
            ),
            "send_to_model_p95": round(
                ours["cold_sends"]["send_to_model_call_s"]["p95"]
                / max(floor["cold_sends"]["send_to_model_call_s"]["p95"], 0.001),
                2,
            ),
            "history_bytes": round(
                ours["history_per_idle_session"]["proto_bytes_median"]
                / max(floor["history_per_idle_session"]["proto_bytes_median"], 1),
                2,
            ),
        }
    return report
