"""The local cluster (``scripts/cluster.py``): 3 workers sharing only Temporal and a PostgreSQL run store.

10 runs POST orders through ``http_request`` to a destination that dedupes by
``Idempotency-Key``, while PostgreSQL is stopped for 5 s and started again and
one worker is SIGKILLed with a POST on the wire (then replaced). Every run must
complete, every order be applied once, and every ledger entry end ``done``.
The CLI's ``start``/``stop`` must leave no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.store import open_store
from scripts.cluster import ROOT, Cluster, start_ticks, tail_of
from tests.fakes.dedupe_server import DedupeServer
from tests.fakes.llm_server import FakeLLMServer
from tests.fakes.worker_proc import (
    ModelGate,
    cluster_worker_env,
    free_port,
    open_client_ports,
    orders_model,
    write_policy,
)
from workflows.types import AgentInput, AgentResult, Limits

RUNS = 10
POSTS = 3  # per run
WORKERS = 3
PG_DOWN_S = 5.0
POLICY = {"rules": [{"tool": "http_request", "decision": "allow"}]}


@pytest.fixture
def api() -> Iterator[DedupeServer]:
    with DedupeServer() as server:
        # Half before the order is applied, half after: a kill can land on either side of the effect.
        server.add_delay(before_s=0.5, after_s=0.5, method="POST", path_prefix="/orders")
        yield server


async def test_cluster_survives_a_postgres_restart_and_a_killed_worker(tmp_path: Path, api: DedupeServer) -> None:
    t0 = time.monotonic()
    gates = [ModelGate(orders_model(f"{api.url}/orders", POSTS)) for _ in range(WORKERS)]
    with contextlib.ExitStack() as stack:
        llms = [stack.enter_context(FakeLLMServer(default=gate)) for gate in gates]
        policy = write_policy(tmp_path / "policy.json", POLICY)
        cluster = Cluster(
            tmp_path / "cluster",
            workers=WORKERS,
            env=cluster_worker_env(llm_url=llms[0].openai_url, policy_file=policy),
            # One model server per worker: the killer can see whether a worker has a model call in flight
            # (the model activity has no heartbeat, so killing one mid-call costs its 180 s timeout).
            per_worker={i + 1: {"OPENAI_BASE_URL": llm.openai_url} for i, llm in enumerate(llms)},
            task_queue=f"cluster-{uuid.uuid4().hex[:8]}",
        )
        await asyncio.to_thread(cluster.start)
        stack.callback(cluster.stop)
        started_s = time.monotonic() - t0
        client = await Client.connect(cluster.address, data_converter=pydantic_data_converter)

        async def run(i: int) -> AgentResult:
            await asyncio.sleep(0.3 * i)
            handle = await client.start_workflow(
                "AgentWorkflow",
                AgentInput(task=f"cluster run {i}", tools=["http_request"], limits=Limits(max_steps=10)),
                id=f"{cluster.queue}-run-{i}",
                task_queue=cluster.queue,
                result_type=AgentResult,
            )
            result: AgentResult = await handle.result()
            return result

        runs = [asyncio.create_task(run(i)) for i in range(RUNS)]

        # PostgreSQL goes away mid-way: after a few orders, with runs mid-flight.
        await wait_for(lambda: len(api.applied("/orders")) >= 4, 30, "the first orders")
        applied_before_outage = len(api.applied("/orders"))
        await asyncio.to_thread(cluster.restart_postgres, PG_DOWN_S)
        assert cluster.postgres_running()

        # Then one worker dies with a POST on the wire (and no model call in flight), and is replaced.
        victim, in_flight = await kill_a_worker_mid_post(cluster, api, gates)
        await asyncio.to_thread(cluster.restart_worker, victim)

        done, pending = await asyncio.wait(runs, timeout=75)
        for task in pending:
            task.cancel()
        logs = "\n".join(f"--- worker {r.index}\n{tail_of(r.log)}" for r in cluster.worker_records)
        errors = [repr(t.exception()) for t in done if t.exception() is not None]
        assert not pending and not errors, f"{len(pending)} runs unfinished, errors {errors}\n{logs}"
        statuses = [t.result().status for t in done]
        assert statuses == ["completed"] * RUNS, f"{statuses}\n{logs}"

        # Exactly one applied effect per idempotency key, and one per order.
        keys = {d.key for d in api.writes("/orders")}
        effects = api.applied("/orders")
        assert all(keys) and len(keys) == RUNS * POSTS
        per_key: dict[str, int] = {}
        per_order: dict[str, int] = {}
        for effect in effects:
            per_key[effect.key] = per_key.get(effect.key, 0) + 1
            order = effect.json()
            name = f"{order['run']}#{order['item']}"
            per_order[name] = per_order.get(name, 0) + 1
        assert per_key == dict.fromkeys(keys, 1)
        assert len(per_order) == RUNS * POSTS and set(per_order.values()) == {1}

        # The ledger in PostgreSQL: one entry per key, every one done.
        store = open_store(cluster.store_url)
        try:
            ledger = [e for e in await store.ledger() if e.workflow_id.startswith(cluster.queue)]
        finally:
            await store.close()
        assert {e.key for e in ledger} == keys
        assert [e.state for e in ledger] == ["done"] * len(keys), [(e.key, e.state, e.note) for e in ledger]
        # Every worker process that was started is still up (none exited on the outage).
        assert all(r.running() for r in cluster.worker_records), logs
        print(
            f"\ncluster up in {started_s:.1f} s; {applied_before_outage} orders before the outage; "
            f"killed worker {victim} with {len(in_flight)} POST(s) in flight; "
            f"{len(api.writes('/orders'))} deliveries for {len(keys)} keys; total {time.monotonic() - t0:.1f} s"
        )


async def kill_a_worker_mid_post(
    cluster: Cluster, api: DedupeServer, gates: list[ModelGate], within_s: float = 20.0
) -> tuple[int, list[str]]:
    """SIGKILL a worker that has a POST on the wire and no model call in flight; (its index, the POSTs' keys)."""
    deadline = time.monotonic() + within_s
    while True:
        for index in range(1, len(gates) + 1):
            pid = cluster.worker_pid(index)
            assert pid is not None
            with gates[index - 1].held():  # its model calls now wait at its model server, where we see them
                await asyncio.sleep(0.15)
                latest = {d.client_port: d.key for d in api.writes("/orders")}
                ports = open_client_ports(pid)
                wire = sorted({key for port, key in latest.items() if port in ports})
                if gates[index - 1].quiet(0.15) and (wire or time.monotonic() > deadline):
                    cluster.kill_worker(index)
                    return index, wire
        await asyncio.sleep(0.05)


async def wait_for(predicate: object, within_s: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


def children_of(pids: set[int]) -> set[int]:
    """Every live process whose parent is in ``pids`` (PostgreSQL's backends, a worker's helpers)."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) in pids:
                found.add(int(entry))
    return found


def test_cli_start_and_stop_leave_no_process_behind(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENT_MODEL": "scripted:demo"}
    cli = [sys.executable, "-m", "scripts.cluster", "--dir", str(state)]
    port = free_port()
    t0 = time.monotonic()
    started = subprocess.run(
        [*cli, "start", "--workers", "2", "--headless", "--port", str(port)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    start_s = time.monotonic() - t0
    recorded = json.loads((state / "cluster.json").read_text()) if (state / "cluster.json").exists() else {}
    pids = {recorded["temporal"]["pid"], recorded["postgres"]["pid"], *(w["pid"] for w in recorded["workers"])}
    descendants: set[int] = set()
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"TEMPORAL_ADDRESS=127.0.0.1:{port}" in started.stdout and "starter.py run" in started.stdout
        assert len(pids) == 4 and all(start_ticks(pid) is not None for pid in pids), recorded
        descendants = children_of(pids)
        assert descendants, "PostgreSQL runs without backends?"
        status = subprocess.run([*cli, "status"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert "4 process(es) running" in status.stdout, status.stdout
    finally:
        t1 = time.monotonic()
        stopped = subprocess.run([*cli, "stop"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        stop_s = time.monotonic() - t1
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # Gone (a zombie waiting for an init that does not reap counts as gone: it no longer runs).
    left = [pid for pid in pids | descendants if start_ticks(pid) is not None]
    assert not left, f"still running after stop: {left}"
    again = subprocess.run([*cli, "stop"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    status = subprocess.run([*cli, "status"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert "0 process(es) running" in status.stdout, status.stdout
    print(f"\nCLI start {start_s:.1f} s, stop {stop_s:.1f} s")
