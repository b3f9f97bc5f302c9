"""``throughput``: many concurrent runs through 3 in-process workers, ours against the floor, interleaved."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.scale.common import (
    dev_server,
    embedded_postgres,
    floor_workers,
    histories,
    history_stats,
    machine,
    our_workers,
    ours_settings,
    queue,
    run_floor,
    run_ours,
    worker_clients,
)

TARGET_RATIO = 0.9


async def _phase(
    clients: list[Client], kind: str, args: argparse.Namespace, tmp: Path, store_url: str | None
) -> dict[str, Any]:
    client = clients[0]
    task_queue = queue(kind)
    run = run_ours if kind == "ours" else run_floor
    load = os.getloadavg()[0]

    async def all_runs() -> tuple[list[tuple[str, str, float]], float]:
        await run(client, task_queue, 1, args.kb)  # warm-up of this phase's workers, not counted
        started = time.monotonic()
        done = await asyncio.gather(*(run(client, task_queue, args.turns, args.kb) for _ in range(args.runs)))
        return done, time.monotonic() - started

    if kind == "ours":
        state = tmp / f"ours-{task_queue}"
        async with our_workers(clients, ours_settings(state, store_url), task_queue):
            done, wall = await all_runs()
    else:
        async with floor_workers(clients, task_queue):
            done, wall = await all_runs()
    stats = [history_stats(await histories(client, wid, rid)) for wid, rid, _ in done]
    activities = sum(s["activities"] for s in stats)
    local = sum(s["local_activities"] for s in stats)
    row = {
        "system": kind,
        "wall_s": round(wall, 2),
        "runs_per_s": round(args.runs / wall, 2),
        "activities": activities,
        "local_activities": local,
        "activities_per_s": round(activities / wall, 1),
        "workflow_tasks": sum(s["workflow_tasks"] for s in stats),
        "max_run_s": round(max(w for _, _, w in done), 2),
        "loadavg_1m_at_start": round(load, 2),
    }
    print(
        f"{kind:5s}: {row['wall_s']:6.2f} s, {row['runs_per_s']:5.2f} runs/s, "
        f"{row['activities_per_s']:6.1f} activities/s ({activities} + {local} local), load {load:.2f}"
    )
    return row


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    systems = ["floor", "ours"] if args.only == "both" else [args.only]
    rows: list[dict[str, Any]] = []
    async with dev_server() as env:
        clients = await worker_clients(env.client, args.workers)
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-throughput-"))
            store_url = stack.enter_context(embedded_postgres()) if args.store == "postgres" else None
            for _ in range(args.rounds):
                for kind in systems:
                    rows.append(await _phase(clients, kind, args, Path(tmp), store_url))
    report: dict[str, Any] = {
        "bench": "throughput",
        "what": f"{args.runs} concurrent runs of {args.turns} tool turns ({args.kb} KB outputs) + an answer, "
        f"{args.workers} workers in one process (ours: separate Runtimes sharing one {args.store} run store, "
        "as workers on separate hosts share one), "
        "phases interleaved floor, ours, floor, ours on one dev server",
        "machine": machine(),
        "runs": args.runs,
        "turns": args.turns,
        "workers": args.workers,
        "store": args.store,
        "rows": rows,
        "target": f"ours >= {TARGET_RATIO}x the floor's activities/s",
    }
    ours = [r for r in rows if r["system"] == "ours"]
    floor = [r for r in rows if r["system"] == "floor"]
    if ours and floor:
        o = sum(r["activities_per_s"] for r in ours) / len(ours)
        f = sum(r["activities_per_s"] for r in floor) / len(floor)
        report |= {
            "ours_activities_per_s": round(o, 1),
            "floor_activities_per_s": round(f, 1),
            "ours_runs_per_s": round(sum(r["runs_per_s"] for r in ours) / len(ours), 2),
            "floor_runs_per_s": round(sum(r["runs_per_s"] for r in floor) / len(floor), 2),
            "ratio": round(o / f, 3),
            "target_met": o / f >= TARGET_RATIO,
        }
        print(f"ratio (activities/s, mean of rounds): {o / f:.2f}x (target >= {TARGET_RATIO}x)")
    return report
