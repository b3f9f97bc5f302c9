"""``waiting``: N runs parked on an approval in ONE worker process; its RSS, and how fast approvals resume them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.fixtures_scale import EFFECT_TOOL, EFFECTS_LOG
from bench.scale.common import dev_server, histories, history_stats, machine, median, pct, queue
from durable_agents.search_attributes import ensure_search_attributes
from tests.fakes.worker_proc import WorkerProc, worker_env
from workflows.identity import approval_id
from workflows.types import AgentInput, DecideRequest, DecideResult, Limits, StatusView

TARGET_RSS_MB, TARGET_P95_S = 300, 1.0
EFFECT_ARGS = {"n": 1}


def rss_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of process ``pid`` in KB, from /proc/<pid>/status."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0])
    return found


async def _count_waiting(client: Client, task_queue: str) -> int:
    return (await client.count_workflows(f"TaskQueue = '{task_queue}' AND AgentState = 'waiting_approval'")).count


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    async with dev_server() as env:
        client = env.client
        await ensure_search_attributes(client)
        with tempfile.TemporaryDirectory(prefix="bench-waiting-") as tmp:
            state = Path(tmp) / "state"
            state.mkdir()
            task_queue = queue("waiting")
            env_vars = worker_env(
                address=client.service_client.config.target_host,
                task_queue=task_queue,
                llm_url="http://127.0.0.1:9/v1",  # never called: the bench model answers in-process
                state_dir=state,
                policy_file=Path(tmp) / "unused.json",
                AGENT_POLICY_FILE="",  # the default policy: side effects ask
                AGENT_MODEL="bench:instant",
                AGENT_TOOL_MODULES="bench.fixtures_scale",
                AGENT_PROVIDER_MODULES="bench.fixtures_scale",
                AGENT_LOG_LEVEL="INFO",  # the default; its worker_started line marks it ready
                AGENT_REAP_INTERVAL_S="0",
                **({"AGENT_MAX_CACHED_WORKFLOWS": str(args.max_cached)} if args.max_cached is not None else {}),
            )
            proc = WorkerProc(env_vars, Path(tmp) / "worker.log")
            try:
                return await _drive(client, proc, task_queue, state, args)
            finally:
                proc.stop()


async def _drive(
    client: Client, proc: WorkerProc, task_queue: str, state: Path, args: argparse.Namespace
) -> dict[str, Any]:
    await proc.async_wait_ready(60)
    await asyncio.sleep(1)
    baseline = rss_kb(proc.pid)
    print(f"worker {proc.pid} ready: RSS {baseline['VmRSS'] / 1024:.0f} MB")
    ids = [f"{task_queue}-{i}" for i in range(args.runs)]
    first_runs: dict[str, str] = {}
    gate = asyncio.Semaphore(args.start_concurrency)
    peak = dict(baseline)

    async def start(wid: str) -> None:
        async with gate:
            handle = await client.start_workflow(
                "AgentWorkflow",
                AgentInput(task=f"effect {wid}", tools=[EFFECT_TOOL], limits=Limits(max_steps=5)),
                id=wid,
                task_queue=task_queue,
            )
            first_runs[wid] = handle.first_execution_run_id or ""

    t0 = time.monotonic()
    starting = asyncio.gather(*(start(wid) for wid in ids))
    waiting, samples = 0, []
    while True:
        await asyncio.sleep(2)
        mem = rss_kb(proc.pid)
        peak["VmRSS"] = max(peak["VmRSS"], mem["VmRSS"])
        waiting = await _count_waiting(client, task_queue)
        samples.append({"t_s": round(time.monotonic() - t0, 1), "waiting": waiting, "rss_mb": mem["VmRSS"] // 1024})
        print(f"  {samples[-1]['t_s']:6.1f} s: {waiting} waiting, RSS {mem['VmRSS'] / 1024:.0f} MB")
        if waiting >= args.runs or time.monotonic() - t0 > args.park_timeout:
            break
        if not proc.alive():
            raise RuntimeError(f"worker exited:\n{proc.tail()}")
    await starting
    park_s = time.monotonic() - t0
    await asyncio.sleep(5)  # let the worker settle (cache, pollers) before reading its memory
    parked = rss_kb(proc.pid)

    sample = random.Random(14).sample(ids, min(20, len(ids)))
    hist = [history_stats(await histories(client, wid, first_runs[wid])) for wid in sample]
    status = await client.get_workflow_handle(ids[0]).query("status", result_type=StatusView)
    expected = approval_id(ids[0], 1, "bench_0", EFFECT_TOOL, EFFECT_ARGS)
    if [a.approval_id for a in status.pending_approvals] != [expected]:
        raise RuntimeError(f"unexpected pending approvals of {ids[0]}: {status.pending_approvals}")

    # 500 decide updates at once, to runs spread over the whole population (cached and evicted ones).
    chosen = random.Random(7).sample(ids, min(args.approvals, len(ids)))
    sent: dict[str, float] = {}
    answered: dict[str, float] = {}

    async def approve(wid: str) -> None:
        request = DecideRequest(
            approval_id=approval_id(wid, 1, "bench_0", EFFECT_TOOL, EFFECT_ARGS), decision="approve", reviewer="bench"
        )
        sent[wid] = time.time()
        result = await client.get_workflow_handle(wid).execute_update("decide", request, result_type=DecideResult)
        answered[wid] = time.time()
        if not result.accepted:
            raise RuntimeError(f"{wid}: {result.message}")

    log = state / EFFECTS_LOG
    burst = time.time()
    await asyncio.gather(*(approve(wid) for wid in chosen))
    deadline = time.monotonic() + args.approve_timeout
    started: dict[str, float] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            started = {w: float(t) for w, _, t in (line.split() for line in log.read_text().splitlines())}
        if len(started) >= len(chosen):
            break
        await asyncio.sleep(0.2)
    after = rss_kb(proc.pid)
    to_start = [started[w] - sent[w] for w in chosen if w in started]
    update_rtt = [answered[w] - sent[w] for w in chosen]
    rss_mb = parked["VmRSS"] / 1024
    p95 = pct(to_start, 0.95)
    proto = [h["proto_bytes"] for h in hist]
    cache = args.max_cached if args.max_cached is not None else "1000 (the default)"
    report = {
        "bench": "waiting",
        "what": f"{args.runs} runs, each parked on the approval of one side-effecting tool call (default 'ask' "
        f"policy), in ONE worker.py process with max_cached_workflows={cache}; then "
        f"{len(chosen)} decide(approve) updates sent at once to runs sampled across all of them",
        "machine": machine(),
        "runs": args.runs,
        "max_cached_workflows": cache,
        "parked": waiting,
        "park_s": round(park_s, 1),
        "starts_per_s": round(args.runs / park_s, 1),
        "rss_mb": {
            "baseline": round(baseline["VmRSS"] / 1024, 1),
            "parked": round(rss_mb, 1),
            "peak_while_parking": round(peak["VmRSS"] / 1024, 1),
            "after_approvals": round(after["VmRSS"] / 1024, 1),
            "hwm": round(after["VmHWM"] / 1024, 1),
            "per_parked_run_kb": round((parked["VmRSS"] - baseline["VmRSS"]) / max(waiting, 1), 1),
        },
        "history_per_waiting_run": {
            "proto_bytes_median": median(proto),
            "json_bytes_median": median([h["json_bytes"] for h in hist]),
            "events_median": median([h["events"] for h in hist]),
            "sampled_runs": len(hist),
        },
        "approvals": {
            "sent": len(chosen),
            "tool_started": len(to_start),
            "send_spread_s": round(max(sent.values()) - burst, 3) if sent else 0,
            "update_to_tool_start_s": {
                "p50": round(pct(to_start, 0.5), 3),
                "p95": round(p95, 3),
                "max": round(max(to_start, default=0), 3),
            },
            "update_round_trip_s": {"p50": round(pct(update_rtt, 0.5), 3), "p95": round(pct(update_rtt, 0.95), 3)},
            "signal": "the client's time.time() just before execute_update -> the bench_effect tool's time.time() "
            "as its first act (same host clock)",
        },
        "parking": samples,
        "target": f"RSS < {TARGET_RSS_MB} MB and update -> tool start p95 < {TARGET_P95_S} s",
        "target_met": {"rss": rss_mb < TARGET_RSS_MB, "p95": p95 < TARGET_P95_S and len(to_start) == len(chosen)},
    }
    a = report["approvals"]["update_to_tool_start_s"]
    print(
        f"parked {waiting}/{args.runs} in {park_s:.0f} s; RSS {rss_mb:.0f} MB (baseline {baseline['VmRSS'] / 1024:.0f})"
    )
    print(f"history per waiting run: {median(proto):,.0f} B proto")
    print(f"{len(to_start)}/{len(chosen)} approved tools started: p50 {a['p50']} s, p95 {a['p95']} s, max {a['max']} s")
    return report
