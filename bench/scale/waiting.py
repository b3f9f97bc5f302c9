"""``waiting``: N runs parked on an approval in ONE worker process; its RSS, and how fast approvals resume them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from temporalio.client import Client

from activities.settings import WorkerSettings
from bench.fixtures_scale import EFFECT_TOOL, EFFECTS_LOG
from bench.scale.common import dev_server, histories, history_stats, machine, median, pct, queue
from durable_agents.search_attributes import ensure_search_attributes
from durable_agents.testing._worker_proc import WorkerProc, worker_env
from workflows.identity import approval_id
from workflows.types import AgentInput, DecideRequest, DecideResult, Limits, StatusView

# Ours against the floor (issue targets): RSS of the parked worker, update -> tool start p95, events per run.
TARGET_RATIOS = {"rss_parked": 1.5, "approval_p95": 1.3, "history_events": 2.0}
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


def cpu_s(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (/proc/<pid>/stat): a figure the shared machine's load
    stretches less than wall time."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _count_waiting(client: Client, task_queue: str) -> int:
    return (await client.count_workflows(f"TaskQueue = '{task_queue}' AND AgentState = 'waiting_approval'")).count


# "floor_turn" is the floor with one model activity before it parks: the same work as ours up to the wait.
SYSTEMS = ("floor", "floor_turn", "ours")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    async with dev_server() as env:
        client = env.client
        await ensure_search_attributes(client)
        for system in args.systems:
            with tempfile.TemporaryDirectory(prefix=f"bench-waiting-{system}-") as tmp:
                state = Path(tmp) / "state"
                state.mkdir()
                task_queue = queue(f"waiting-{system}")
                proc = _worker(system, client, task_queue, state, Path(tmp), args)
                try:
                    rows[system] = await _drive(system, client, proc, task_queue, state, args)
                finally:
                    proc.stop()
    return _report(rows, args)


def _worker(
    system: str, client: Client, task_queue: str, state: Path, tmp: Path, args: argparse.Namespace
) -> WorkerProc:
    address = client.service_client.config.target_host
    cached = {"AGENT_MAX_CACHED_WORKFLOWS": str(args.max_cached)} if args.max_cached is not None else {}
    env_vars = worker_env(
        address=address,
        task_queue=task_queue,
        llm_url="http://127.0.0.1:9/v1",  # never called: the bench model answers in-process
        state_dir=state,
        policy_file=tmp / "unused.json",
        AGENT_POLICY_FILE="",  # the default policy: side effects ask
        AGENT_MODEL="bench:instant",
        AGENT_TOOL_MODULES="bench.fixtures_scale",
        AGENT_PROVIDER_MODULES="bench.fixtures_scale",
        AGENT_LOG_LEVEL="INFO",  # the default; its worker_started line marks it ready
        AGENT_REAP_INTERVAL_S="0",
        **cached,
    )
    if system == "ours":
        return WorkerProc(env_vars, tmp / "worker.log")
    argv = [sys.executable, "-m", "bench.floor_waiting", "--address", address, "--task-queue", task_queue]
    # The floor caches as many runs as ours does, so the two are compared at one cache size.
    cache = args.max_cached if args.max_cached is not None else WorkerSettings().max_cached_workflows
    argv += ["--state-dir", str(state), "--max-cached", str(cache)]
    return WorkerProc(env_vars, tmp / "worker.log", argv=argv)


async def _drive(
    system: str, client: Client, proc: WorkerProc, task_queue: str, state: Path, args: argparse.Namespace
) -> dict[str, Any]:
    await proc.async_wait_ready(60)
    await asyncio.sleep(1)
    baseline = rss_kb(proc.pid)
    print(f"{system}: worker {proc.pid} ready: RSS {baseline['VmRSS'] / 1024:.0f} MB")
    ids = [f"{task_queue}-{i}" for i in range(args.runs)]
    first_runs: dict[str, str] = {}
    gate = asyncio.Semaphore(args.start_concurrency)
    peak = dict(baseline)

    async def start(wid: str) -> None:
        async with gate:
            if system == "ours":
                handle = await client.start_workflow(
                    "AgentWorkflow",
                    AgentInput(task=f"effect {wid}", tools=[EFFECT_TOOL], limits=Limits(max_steps=5)),
                    id=wid,
                    task_queue=task_queue,
                )
            else:
                handle = await client.start_workflow(
                    "BenchWaitFloorWorkflow",
                    args=[f"effect {wid}", system == "floor_turn"],
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
        print(f"  {system} {samples[-1]['t_s']:6.1f} s: {waiting} waiting, RSS {mem['VmRSS'] / 1024:.0f} MB")
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
    if system == "ours":
        status = await client.get_workflow_handle(ids[0]).query("status", result_type=StatusView)
        expected = approval_id(ids[0], 1, "bench_0", EFFECT_TOOL, EFFECT_ARGS)
        if [a.approval_id for a in status.pending_approvals] != [expected]:
            raise RuntimeError(f"unexpected pending approvals of {ids[0]}: {status.pending_approvals}")

    # 500 decide updates at once, to runs spread over the whole population (cached and evicted ones).
    chosen = random.Random(7).sample(ids, min(args.approvals, len(ids)))
    sent: dict[str, float] = {}
    answered: dict[str, float] = {}

    async def approve(wid: str) -> None:
        key = approval_id(wid, 1, "bench_0", EFFECT_TOOL, EFFECT_ARGS)
        handle = client.get_workflow_handle(wid)
        sent[wid] = time.time()
        if system == "ours":
            request = DecideRequest(approval_id=key, decision="approve", reviewer="bench")
            result = await handle.execute_update("decide", request, result_type=DecideResult)
            if not result.accepted:
                raise RuntimeError(f"{wid}: {result.message}")
        else:
            await handle.execute_update("decide", key, result_type=bool)
        answered[wid] = time.time()

    log = state / EFFECTS_LOG
    burst, burst_cpu0 = time.time(), cpu_s(proc.pid)
    await asyncio.gather(*(approve(wid) for wid in chosen))
    deadline = time.monotonic() + args.approve_timeout
    started: dict[str, float] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            started = {w: float(t) for w, _, t in (line.split() for line in log.read_text().splitlines())}
        if len(started) >= len(chosen):
            break
        await asyncio.sleep(0.2)
    # Until the last effect started: what the worker spent on the decisions, their replays and what ran with them.
    burst_cpu = cpu_s(proc.pid) - burst_cpu0
    after = rss_kb(proc.pid)
    to_start = [started[w] - sent[w] for w in chosen if w in started]
    update_rtt = [answered[w] - sent[w] for w in chosen]
    proto = [h["proto_bytes"] for h in hist]
    row = {
        "parked": waiting,
        "park_s": round(park_s, 1),
        "starts_per_s": round(args.runs / park_s, 1),
        "rss_mb": {
            "baseline": round(baseline["VmRSS"] / 1024, 1),
            "parked": round(parked["VmRSS"] / 1024, 1),
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
                "p95": round(pct(to_start, 0.95), 3),
                "max": round(max(to_start, default=0), 3),
            },
            "update_round_trip_s": {"p50": round(pct(update_rtt, 0.5), 3), "p95": round(pct(update_rtt, 0.95), 3)},
            "worker_cpu_s": round(burst_cpu, 2),
            "worker_cpu_ms_per_decision": round(1000 * burst_cpu / max(len(chosen), 1), 2),
        },
        "parking": samples,
    }
    a = row["approvals"]["update_to_tool_start_s"]
    print(
        f"{system}: parked {waiting}/{args.runs} in {park_s:.0f} s; RSS {parked['VmRSS'] / 1024:.0f} MB "
        f"(baseline {baseline['VmRSS'] / 1024:.0f}); history per waiting run {median(proto):,.0f} B proto"
    )
    print(
        f"{system}: {len(to_start)}/{len(chosen)} started after approval: p50 {a['p50']} s, p95 {a['p95']} s; "
        f"worker CPU {burst_cpu:.1f} s"
    )
    return row


def _report(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    cache = args.max_cached if args.max_cached is not None else f"{WorkerSettings().max_cached_workflows} (the default)"
    report: dict[str, Any] = {
        "bench": "waiting",
        "what": f"{args.runs} runs, each parked on the approval of one side-effecting tool call (default 'ask' "
        f"policy), in ONE worker process with max_cached_workflows={cache}; then {args.approvals} decide(approve) "
        "updates sent at once to runs sampled across all of them. The floor: a bare workflow parked in "
        "wait_condition on the same search attribute, whose 'decide' update lets it run one activity, in its "
        "own plain temporalio worker process (same SDK, sandbox and cache size), on the same dev server",
        "signal": "the client's time.time() just before execute_update -> the effect activity's time.time() as its "
        "first act (same host clock)",
        "machine": machine(),
        "runs": args.runs,
        "max_cached_workflows": cache,
        "systems": rows,
        "target": "ours against the floor: " + ", ".join(f"{k} <= {v}x" for k, v in TARGET_RATIOS.items()),
    }
    ours, floor, floor_turn = rows.get("ours"), rows.get("floor"), rows.get("floor_turn")
    if ours is not None and floor is not None:
        ratios = report["ratios"] = _ratios(ours, floor)
        met = {key: ratios[key] <= limit for key, limit in TARGET_RATIOS.items()}
        report["target_met"] = {**met, "all_started": ours["approvals"]["tool_started"] == ours["approvals"]["sent"]}
    if ours is not None and floor_turn is not None:
        report["ratios_vs_floor_turn"] = _ratios(ours, floor_turn)
    return report


def _ratios(ours: dict[str, Any], floor: dict[str, Any]) -> dict[str, float]:
    return {
        "rss_parked": round(ours["rss_mb"]["parked"] / floor["rss_mb"]["parked"], 2),
        "per_parked_run_kb": round(
            ours["rss_mb"]["per_parked_run_kb"] / max(floor["rss_mb"]["per_parked_run_kb"], 0.1), 2
        ),
        "approval_p95": round(
            ours["approvals"]["update_to_tool_start_s"]["p95"]
            / max(floor["approvals"]["update_to_tool_start_s"]["p95"], 0.001),
            2,
        ),
        "history_bytes": round(
            ours["history_per_waiting_run"]["proto_bytes_median"]
            / max(floor["history_per_waiting_run"]["proto_bytes_median"], 1),
            2,
        ),
        "history_events": round(
            ours["history_per_waiting_run"]["events_median"]
            / max(floor["history_per_waiting_run"]["events_median"], 1),
            2,
        ),
        "worker_cpu_per_decision": round(
            ours["approvals"]["worker_cpu_ms_per_decision"]
            / max(floor["approvals"]["worker_cpu_ms_per_decision"], 0.01),
            2,
        ),
    }
