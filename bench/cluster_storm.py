"""Cluster storm: the kill storm on the local cluster, with a PostgreSQL outage in the middle (issue 14).

    .venv/bin/python -m bench.cluster_storm --runs 100 --workers 3 --kills 12 --pg-down 20

Starts a ``scripts.cluster.Cluster`` in a temporary directory: a Temporal dev
server, a real PostgreSQL run store and ``--workers`` ``worker.py`` processes
that share only those two. One fake model server per worker and a destination
that dedupes by ``Idempotency-Key`` (``durable_agents/testing/_dedupe_server.py``); an
operator policy allows ``http_request``. ``--runs`` runs each POST ``--posts``
orders. Every 2-3 s one worker is SIGKILLed (preferably with a POST on the
wire, chosen as ``bench.kill_storm`` chooses) and restarted, ``--kills`` times;
after half the kills PostgreSQL is stopped for ``--pg-down`` seconds and started
again (no kills while it is down: a worker restarted then could not open its
store). Then the workers stay up until every run finishes.

Recovery latencies are defined as in ``bench.kill_storm``: for every POST a
killed worker had on the wire, the kill -> the destination's next delivery of
that key (a new attempt's re-send); for every model call it had in flight, the
kill -> the run's next model request. Separately, PostgreSQL's recovery: its
return (``pg_ctl start`` done) -> the first activity completed after it (from
the runs' Temporal histories).

Prints and writes ``bench/results/cluster_storm.json``. Exit code 1 if a run did
not complete or any key was applied more than once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.store import open_store
from bench.kill_storm import storm_parser
from bench.report import write_results
from bench.scale.common import pct
from durable_agents.testing._dedupe_server import DedupeServer
from durable_agents.testing._llm_server import FakeLLMServer
from durable_agents.testing._worker_proc import (
    Kill,
    ModelGate,
    cluster_worker_env,
    open_client_ports,
    orders_model,
    recovery_times,
    write_policy,
)
from scripts.cluster import Cluster, tail_of
from workflows.types import AgentInput, AgentResult, Limits

RESULTS = Path(__file__).parent / "results" / "cluster_storm.json"
POLICY = {"rules": [{"tool": "http_request", "decision": "allow"}]}  # the operator allows the side effects
KILL_EVERY_S = (2.0, 3.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = storm_parser(__doc__)
    parser.add_argument("--pg-down", type=float, default=20.0, help="seconds PostgreSQL stays down")
    return parser.parse_args(argv)


def summary(values: list[float]) -> dict[str, Any]:
    """n, p50, p99 (nearest rank, as bench.scale) and max; None figures for no values."""
    if not values:
        return {"n": 0, "p50_s": None, "p99_s": None, "max_s": None}
    return {"n": len(values), "p50_s": pct(values, 0.5), "p99_s": pct(values, 0.99), "max_s": max(values)}


async def activities_completed(client: Client, workflow_ids: list[str]) -> list[tuple[float, str]]:
    """``(time.time(), activity type)`` of every ActivityTaskCompleted event of these workflows."""
    found: list[tuple[float, str]] = []
    for wid in workflow_ids:
        with contextlib.suppress(Exception):  # a run that never started has no history
            history = await client.get_workflow_handle(wid).fetch_history()
            scheduled: dict[int, str] = {}
            for event in history.events:
                if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                    attrs = event.activity_task_completed_event_attributes
                    at = event.event_time.ToNanoseconds() / 1e9
                    found.append((at, scheduled.get(attrs.scheduled_event_id, "?")))
    return sorted(found)


async def storm(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    started_wall = time.time()
    queue = f"cluster-storm-{uuid.uuid4().hex[:8]}"
    killed: list[Kill] = []
    skipped = 0
    restarts: list[asyncio.Task[int]] = []
    results: dict[int, AgentResult] = {}
    run_s: dict[int, float] = {}
    errors: list[str] = []
    loads: list[float] = []
    outage: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(DedupeServer())
        # Half before the order is applied, half after: kills land on both sides of the effect.
        half = args.post_delay / 2
        api.add_delay(before_s=half, after_s=half, method="POST", path_prefix="/orders")
        gates = [ModelGate(orders_model(f"{api.url}/orders", args.posts)) for _ in range(args.workers)]
        llms = [stack.enter_context(FakeLLMServer(default=gate)) for gate in gates]
        policy = write_policy(work / "policy.json", POLICY)
        cluster = Cluster(
            work / "cluster",
            workers=args.workers,
            env=cluster_worker_env(llm_url=llms[0].openai_url, policy_file=policy),
            per_worker={i + 1: {"OPENAI_BASE_URL": llm.openai_url} for i, llm in enumerate(llms)},
            task_queue=queue,
        )
        await asyncio.to_thread(cluster.start)
        stack.callback(cluster.stop)
        cluster_start_s = time.monotonic() - t0
        print(f"cluster up in {cluster_start_s:.1f} s ({cluster.address}, {cluster.store_url})", flush=True)
        client = await Client.connect(cluster.address, data_converter=pydantic_data_converter)
        ids = [f"{queue}-run-{i}" for i in range(args.runs)]

        async def run(i: int) -> None:
            await asyncio.sleep(args.spread * i / max(1, args.runs))
            started = time.monotonic()
            handle = await client.start_workflow(
                "AgentWorkflow",
                AgentInput(task=f"{queue} run {i}", tools=["http_request"], limits=Limits(max_steps=10)),
                id=ids[i],
                task_queue=queue,
                result_type=AgentResult,
            )
            results[i] = await handle.result()
            run_s[i] = time.monotonic() - started

        async def sample_load() -> None:
            while True:
                loads.append(os.getloadavg()[0])
                await asyncio.sleep(1.0)

        def on_the_wire(pid: int) -> list[str]:
            """Keys of POSTs the server received from ``pid`` whose connection ``pid`` still holds open."""
            ports = open_client_ports(pid)
            latest = {d.client_port: d.key for d in api.writes("/orders")}  # one request per connection
            return sorted({key for port, key in latest.items() if port in ports})

        sampler = asyncio.create_task(sample_load())
        waiters = [asyncio.create_task(run(i)) for i in range(args.runs)]
        storm_ends = time.monotonic() + args.kills * 3.0 + args.pg_down + 60.0
        while (len(killed) < args.kills or not outage) and time.monotonic() < storm_ends:
            if not outage and len(killed) >= args.kills // 2:
                await asyncio.gather(*restarts)  # every worker up before PostgreSQL goes
                outage["down_at"] = time.time()
                print(f"PostgreSQL down for {args.pg_down:.0f} s", flush=True)
                await asyncio.to_thread(cluster.restart_postgres, args.pg_down)
                outage["up_at"] = time.time()
                print(f"PostgreSQL back after {outage['up_at'] - outage['down_at']:.1f} s", flush=True)
                continue
            if len(results) >= args.runs:
                break
            await asyncio.sleep(rng.uniform(*KILL_EVERY_S))
            for attempt in range(30):
                slot = rng.randrange(args.workers)
                record = cluster.worker_records[slot]
                pid = cluster.worker_pid(slot + 1)
                if pid is None or not (record.running() and record.ready()):
                    await asyncio.sleep(0.1)  # still restarting
                    continue
                # Hold the victim's model server briefly: the model calls it has in flight show up waiting.
                with gates[slot].held():
                    await asyncio.sleep(0.15)
                    wire = on_the_wire(pid)
                    model_ok = gates[slot].quiet(0.15) or not args.avoid_model_calls
                    if model_ok and (wire or attempt >= 15):
                        cluster.kill_worker(slot + 1)
                        calls = gates[slot].waiting_tasks()
                        killed.append(Kill(time.time(), slot, pid, wire, calls))
                        print(
                            f"kill {len(killed)}: worker {slot + 1} pid {pid}: {len(wire)} POST(s) and "
                            f"{len(calls)} model call(s) in flight",
                            flush=True,
                        )
                if not record.running():
                    restarts.append(asyncio.create_task(asyncio.to_thread(cluster.restart_worker, slot + 1)))
                    break
                skipped += 1
                await asyncio.sleep(0.1)
        restart_errors = [
            r for r in await asyncio.gather(*restarts, return_exceptions=True) if isinstance(r, BaseException)
        ]
        errors += [f"worker restart failed: {e!r}" for e in restart_errors]
        print(f"storm over after {len(killed)} kills; waiting for {args.runs - len(results)} runs", flush=True)
        done, pending = await asyncio.wait(waiters, timeout=args.timeout)
        for task in pending:
            task.cancel()
        wall = time.monotonic() - t0
        sampler.cancel()
        errors += [repr(t.exception()) for t in done if t.exception() is not None]
        errors += [f"run {i} did not finish in time" for i in range(args.runs) if i not in results]
        if errors:
            for record in cluster.worker_records:
                print(f"--- worker {record.index}\n{tail_of(record.log)}", file=sys.stderr)
        workers_up = all(r.running() for r in cluster.worker_records)
        store = open_store(cluster.store_url)
        try:
            ledger = [e for e in await store.ledger() if e.workflow_id.startswith(queue)]
        finally:
            await store.close()
        completions = await activities_completed(client, ids)
        load_end = os.getloadavg()

    writes = api.writes("/orders")
    effects = api.applied("/orders")
    deliveries_per_key = Counter(d.key for d in writes)
    applied_per_key = Counter(e.key for e in effects)
    per_order = Counter(f"{e.json()['run']}#{e.json()['item']}" for e in effects)
    expected = args.runs * args.posts
    # Recovery as bench.kill_storm (durable_agents/testing/_worker_proc.kill_storm) defines it.
    recovery, model_recovery = recovery_times(killed, writes, gates)
    postgres: dict[str, Any] = {"down_s_requested": args.pg_down}
    if outage:
        up = outage["up_at"]
        after = [(at, kind) for at, kind in completions if at > up]
        first_of: dict[str, float] = {}
        for at, kind in after:
            first_of.setdefault(kind, round(at - up, 2))
        postgres.update(
            down_at_s=round(outage["down_at"] - started_wall, 2),
            down_s=round(up - outage["down_at"], 2),
            first_activity_after_return_s=round(after[0][0] - up, 2) if after else None,
            first_by_activity_type_s=first_of,
            completed_during_outage=sum(1 for at, _ in completions if outage["down_at"] < at <= up),
        )
    statuses = Counter(r.status for r in results.values())
    ledger_states = Counter(str(e.state) for e in ledger)
    return {
        "runs": args.runs,
        "completed": statuses.get("completed", 0),
        "statuses": dict(statuses),
        "wall_s": round(wall, 2),
        "cluster_start_s": round(cluster_start_s, 2),
        "max_run_s": round(max(run_s.values()), 2) if run_s else None,
        "workers": args.workers,
        "workers_up_at_end": workers_up,
        "kills": len(killed),
        "kill_offsets_s": [round(k.at - started_wall, 2) for k in killed],
        "posts_in_flight_at_kills": sum(len(k.in_flight) for k in killed),
        "model_calls_in_flight_at_kills": sum(len(k.model_calls) for k in killed),
        "skipped_kill_windows": skipped,
        "postgres": postgres,
        "deliveries": len(writes),
        "keys": len(deliveries_per_key),
        "applied": len(effects),
        "expected_orders": expected,
        "deliveries_per_key": {str(n): c for n, c in sorted(Counter(deliveries_per_key.values()).items())},
        "applied_per_key": {str(n): c for n, c in sorted(Counter(applied_per_key.values()).items())},
        "keys_applied_twice": sum(1 for n in applied_per_key.values() if n > 1),
        "duplicates_prevented": len(writes) - len(effects),
        "every_order_applied_once": len(per_order) == expected and set(per_order.values()) == {1},
        "ledger_entries": len(ledger),
        "ledger_states": dict(ledger_states),
        "ledger_all_done": bool(ledger) and set(ledger_states) == {"done"},
        "recovery": {"posts": summary(recovery), "model_calls": summary(model_recovery)},
        "recovery_s": sorted(recovery),
        "model_recovery_s": sorted(model_recovery),
        "load_average": {
            "cpus": os.cpu_count(),
            "end_1_5_15": [round(x, 2) for x in load_end],
            "max_1min_during": round(max(loads), 2) if loads else None,
        },
        "errors": errors,
        "params": dict(vars(args)),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cluster-storm-") as tmp:
        figures = asyncio.run(storm(args, Path(tmp)))
    write_results(RESULTS, figures)
    pg, rec, load = figures["postgres"], figures["recovery"], figures["load_average"]
    print(
        f"\nruns completed:        {figures['completed']}/{figures['runs']} {figures['statuses']}\n"
        f"wall time:             {figures['wall_s']} s (cluster start {figures['cluster_start_s']} s, "
        f"slowest run {figures['max_run_s']} s)\n"
        f"kills:                 {figures['kills']} of {figures['workers']} workers "
        f"({figures['posts_in_flight_at_kills']} POSTs and {figures['model_calls_in_flight_at_kills']} "
        f"model calls in flight)\n"
        f"PostgreSQL outage:     {pg.get('down_s')} s at +{pg.get('down_at_s')} s; first activity completed "
        f"{pg.get('first_activity_after_return_s')} s after its return {pg.get('first_by_activity_type_s')}\n"
        f"deliveries:            {figures['deliveries']} for {figures['keys']} keys, per key "
        f"{figures['deliveries_per_key']}\n"
        f"applied effects:       {figures['applied']} (expected {figures['expected_orders']}), per key "
        f"{figures['applied_per_key']}; keys applied twice: {figures['keys_applied_twice']}\n"
        f"ledger:                {figures['ledger_entries']} entries {figures['ledger_states']}\n"
        f"recovery (POSTs):      p50 {rec['posts']['p50_s']} s, p99 {rec['posts']['p99_s']} s "
        f"(n={rec['posts']['n']}; kill -> re-send of an in-flight POST)\n"
        f"recovery (model):      p50 {rec['model_calls']['p50_s']} s, p99 {rec['model_calls']['p99_s']} s "
        f"(n={rec['model_calls']['n']})\n"
        f"load average:          {load['end_1_5_15']} at the end, max 1-min {load['max_1min_during']} "
        f"({load['cpus']} CPUs)\n"
        f"errors:                {figures['errors'] or 'none'}\n"
        f"written to {RESULTS}"
    )
    ok = figures["completed"] == figures["runs"] and figures["keys_applied_twice"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
