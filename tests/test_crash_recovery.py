"""Crash recovery with real processes and real SIGKILLs.

``worker.py`` runs as a subprocess and is killed with SIGKILL mid-call; a new
worker process (same SQLite run store, like workers on one machine) takes over.
The destination is a real HTTP server that dedupes by ``Idempotency-Key`` and
records every delivery, so the tests can count what actually happened out there.
One test kills and restarts the Temporal dev server itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.store.ledger import LedgerEntry
from activities.store.sqlite import SQLiteRunStore
from tests.fakes.dedupe_server import DedupeServer
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.fakes.worker_proc import (
    DevServer,
    WorkerProc,
    kill_storm,
    task_of,
    wait_until,
    worker_env,
    write_policy,
)
from workflows.types import AgentInput, AgentResult, ResolveSignal, StatusView

RESULT_WITHIN_S = 90.0  # generous bound on every wait; recovery itself takes one heartbeat timeout (≤ 15 s)


def one_call_per_task(calls: dict[str, tuple[str, dict[str, Any], str]]) -> Callable[[dict[str, Any]], Scripted]:
    """A model that, for each task, calls one tool once and then answers; keyed by the task text.

    Decided by the transcript, so a repeated turn (a model call whose worker died) gets the same reply.
    """

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body.get("messages", [])
        tool, args, final = calls[task_of(body)]
        if any(m.get("role") == "tool" for m in messages):
            return Scripted(text=final)
        return Scripted(tool_calls=[(tool, json.dumps(args))])

    return reply


def tool_results(llm: FakeLLMServer, task: str) -> list[str]:
    """The content of every tool message in the last model request of the run doing ``task``."""
    bodies = [r["body"] for r in llm.requests if task_of(r["body"]) == task]
    return [str(m.get("content")) for m in bodies[-1].get("messages", []) if m.get("role") == "tool"]


class Rig:
    """Worker subprocesses on one task queue sharing one state dir (hence one SQLite run store)."""

    def __init__(self, client: Client, address: str, llm: FakeLLMServer, tmp: Path) -> None:
        self.client = client
        self.address = address
        self.llm = llm
        self.tmp = tmp
        self.state_dir = tmp / "state"
        self.policy = write_policy(tmp / "policy.json")
        self.task_queue = f"crash-{uuid.uuid4().hex[:8]}"
        self.workers: list[WorkerProc] = []

    async def spawn(self, **extra_env: str) -> WorkerProc:
        env = worker_env(
            address=self.address,
            task_queue=self.task_queue,
            llm_url=self.llm.openai_url,
            state_dir=self.state_dir,
            policy_file=self.policy,
            **extra_env,
        )
        proc = WorkerProc(env, self.tmp / f"worker-{len(self.workers) + 1}.log")
        self.workers.append(proc)
        return await proc.async_wait_ready()

    async def start(self, task: str, tools: list[str]) -> WorkflowHandle[Any, AgentResult]:
        return await self.client.start_workflow(
            "AgentWorkflow",
            AgentInput(task=task, tools=tools),
            id=f"{self.task_queue}-{task.split()[0]}",
            task_queue=self.task_queue,
            result_type=AgentResult,
        )

    async def result(self, handle: WorkflowHandle[Any, AgentResult]) -> AgentResult:
        try:
            return await asyncio.wait_for(handle.result(), RESULT_WITHIN_S)
        except TimeoutError:
            raise AssertionError(f"run {handle.id} did not finish in {RESULT_WITHIN_S}s\n{self.logs()}") from None

    async def ledger(self, workflow_id: str) -> list[LedgerEntry]:
        store = SQLiteRunStore(self.state_dir / "store.sqlite3")
        try:
            return await store.ledger(workflow_id)
        finally:
            await store.close()

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path.name} (pid {w.pid})\n{w.tail(1500)}" for w in self.workers)

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop()


async def wait_for(api: DedupeServer, predicate: Callable[[], bool], what: str, within_s: float = 30.0) -> None:
    if not await asyncio.to_thread(api.wait_for, predicate, within_s):
        raise AssertionError(f"timed out after {within_s}s waiting for {what}; deliveries: {api.deliveries}")


async def pending_unknown(handle: WorkflowHandle[Any, AgentResult], within_s: float = 60.0) -> StatusView:
    """Poll the ``status`` query until the run waits for a human to resolve an unknown outcome."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        status: StatusView = await handle.query("status", result_type=StatusView)
        if any(p.kind == "resolve_unknown_outcome" for p in status.pending_approvals):
            return status
        if status.state not in ("running", "waiting_approval"):
            raise AssertionError(f"the run ended instead of pausing: {status}")
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no resolve_unknown_outcome approval after {within_s}s: {status}")
        await asyncio.sleep(0.2)


# --- one crash, four calls caught in it ------------------------------------------------------

ORDER = "order one item"
NOTIFY_MARK_DONE = "mark_done notify the team"
NOTIFY_RETRY = "retry notify the team"
CHARGE = "charge the customer"


@dataclass
class Crash:
    """Four runs on one worker, each with a side-effecting call caught by the same SIGKILL."""

    rig: Rig
    api: DedupeServer
    llm: FakeLLMServer
    handles: dict[str, WorkflowHandle[Any, AgentResult]]


@pytest.fixture(scope="module")
async def crash(dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Crash]:
    """One worker process is SIGKILLed while four runs are mid-call, and a new worker process takes over:

    - ORDER: an ``http_request`` POST is on the wire (the destination applied it and answers after 8 s);
    - NOTIFY_*: ``notify`` POSTed (no idempotency key) and lingers before completing (CRASH_TOOLS_SLEEP_AFTER_S);
    - CHARGE: ``charge`` was recorded by the payment API, which answers after 20 s.
    """
    with DedupeServer() as api, FakeLLMServer() as llm:
        api.add_delay(after_s=8, method="POST", path_prefix="/orders", times=1)
        api.add_delay(after_s=20, method="POST", path_prefix="/charges", times=1)
        llm.default = one_call_per_task(
            {
                ORDER: (
                    "http_request",
                    {"method": "POST", "url": f"{api.url}/orders", "json": {"sku": "A-1"}},
                    "ordered",
                ),
                NOTIFY_MARK_DONE: ("notify", {"url": f"{api.url}/notify/mark_done", "message": "deploy done"}, "sent"),
                NOTIFY_RETRY: ("notify", {"url": f"{api.url}/notify/retry", "message": "deploy done"}, "sent"),
                CHARGE: ("charge", {"url": api.url, "amount": 1299}, "charged"),
            }
        )
        address = dev_env.client.service_client.config.target_host
        rig = Rig(dev_env.client, address, llm, tmp_path_factory.mktemp("crash"))
        try:
            first = await rig.spawn(CRASH_TOOLS_SLEEP_AFTER_S="30")
            handles = {
                ORDER: await rig.start(ORDER, ["http_request"]),
                NOTIFY_MARK_DONE: await rig.start(NOTIFY_MARK_DONE, ["notify"]),
                NOTIFY_RETRY: await rig.start(NOTIFY_RETRY, ["notify"]),
                CHARGE: await rig.start(CHARGE, ["charge"]),
            }
            await wait_for(
                api,
                lambda: all(api.applied(p) for p in ("/orders", "/notify/mark_done", "/notify/retry", "/charges")),
                "all four side effects to reach the destination",
            )
            first.kill()
            await rig.spawn(CRASH_TOOLS_SLEEP_AFTER_S="0")
            yield Crash(rig, api, llm, handles)
        finally:
            rig.stop_all()


async def test_http_post_in_flight_is_resent_with_the_same_key_and_applied_once(crash: Crash) -> None:
    rig, api, handle = crash.rig, crash.api, crash.handles[ORDER]
    result = await rig.result(handle)

    assert result.status == "completed" and result.output == "ordered", rig.logs()
    writes = api.writes("/orders")
    keys = {w.key for w in writes}
    assert len(writes) >= 2, f"the new worker should have re-sent the POST: {writes}"
    assert len(keys) == 1 and next(iter(keys)).startswith("ik_"), f"every delivery carries the same key: {keys}"
    assert len(api.applied("/orders")) == 1, "the destination applied the order exactly once"
    ledger = await rig.ledger(handle.id)
    assert [(e.key, e.state) for e in ledger] == [(writes[0].key, "done")]
    assert ledger[0].executions == len(writes)
    # The model saw the destination's (replayed) answer for the one order.
    [effect] = api.applied("/orders")
    assert any(f'"id": "{effect.effect_id}"' in text for text in tool_results(crash.llm, ORDER))


async def _paused_on_unknown(crash: Crash, task: str) -> str:
    """Assert the run paused for a human after the crash; return the approval id to resolve."""
    handle, path = crash.handles[task], f"/notify/{task.split()[0]}"
    # The retry cannot know whether the POST happened (no key to dedupe, nothing to check): it asks a human.
    status = await pending_unknown(handle)
    assert status.state == "waiting_approval"
    [pending] = [p for p in status.pending_approvals if p.kind == "resolve_unknown_outcome"]
    assert pending.tool == "notify" and pending.args["message"] == "deploy done"
    assert len(crash.api.writes(path)) == 1, "nothing was re-sent while waiting for the human"
    [entry] = await crash.rig.ledger(handle.id)
    assert entry.state == "unknown" and entry.executions == 1
    return pending.approval_id


async def test_unkeyed_side_effect_pauses_then_mark_done_by_signal(crash: Crash) -> None:
    rig, api, handle = crash.rig, crash.api, crash.handles[NOTIFY_MARK_DONE]
    approval_id = await _paused_on_unknown(crash, NOTIFY_MARK_DONE)

    await handle.signal("resolve", ResolveSignal(approval_id=approval_id, reviewer="ops-alice", resolution="mark_done"))
    result = await rig.result(handle)

    assert result.status == "completed" and result.output == "sent", rig.logs()
    assert len(api.writes("/notify/mark_done")) == 1, "mark_done must not send again"
    assert any("confirmed done by ops-alice" in text for text in tool_results(crash.llm, NOTIFY_MARK_DONE))
    [entry] = await rig.ledger(handle.id)
    assert entry.state == "done" and entry.note == "resolved: mark_done" and entry.executions == 1


async def test_unkeyed_side_effect_pauses_then_retry_via_starter_sends_again(crash: Crash) -> None:
    rig, api, handle = crash.rig, crash.api, crash.handles[NOTIFY_RETRY]
    approval_id = await _paused_on_unknown(crash, NOTIFY_RETRY)

    # The operator's path: `starter.py resolve` (the decide update), answering at once.
    wrong = await asyncio.to_thread(
        _starter, rig.address, "resolve", handle.id, approval_id, "--as", "bogus", "--reviewer", "ops-bob"
    )
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr
    answer = await asyncio.to_thread(
        _starter, rig.address, "resolve", handle.id, approval_id, "--as", "retry", "--reviewer", "ops-bob"
    )
    assert answer.returncode == 0, answer.stderr
    # The whole call it decides first, then the decision.
    shown = answer.stdout.strip().splitlines()
    assert shown[0].startswith(f"retry {approval_id} of run {handle.id}"), answer.stdout
    assert shown[-1].startswith(f"resolved (retry) {approval_id}"), answer.stdout
    result = await rig.result(handle)

    assert result.status == "completed" and result.output == "sent", rig.logs()
    assert len(api.writes("/notify/retry")) == 2, "retry means: send again"
    assert len(api.applied("/notify/retry")) == 2
    assert any(text.startswith("HTTP 201") for text in tool_results(crash.llm, NOTIFY_RETRY))
    [entry] = await rig.ledger(handle.id)
    assert entry.state == "done" and entry.executions == 2


def _starter(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parent.parent
    env = {"PATH": os.environ["PATH"], "TEMPORAL_ADDRESS": address}
    return subprocess.run(
        [sys.executable, str(root / "starter.py"), *args], env=env, capture_output=True, text=True, timeout=60
    )


async def test_charge_is_reconciled_by_lookup_not_sent_again(crash: Crash) -> None:
    rig, api, handle = crash.rig, crash.api, crash.handles[CHARGE]
    result = await rig.result(handle)

    assert result.status == "completed" and result.output == "charged", rig.logs()
    assert len(api.writes("/charges")) == 1, "the charge was looked up, not sent again"
    [charge] = api.applied("/charges")
    lookups = [d for d in api.deliveries if d.method == "GET" and d.path == "/charges"]
    assert lookups, "the new worker asked the destination whether the charge happened"
    [entry] = await rig.ledger(handle.id)
    assert entry.key == charge.charge_key and entry.state == "done" and entry.note == "reconciled"
    assert entry.executions == 1
    results = tool_results(crash.llm, CHARGE)
    assert any("reconciled" in text and charge.effect_id in text for text in results), results


async def test_temporal_server_restart_mid_run(llm: FakeLLMServer, tmp_path: Path) -> None:
    server = DevServer(tmp_path / "t.sqlite", tmp_path / "server.log").start()
    rig = Rig(await server.client(), server.address, llm, tmp_path)
    api = DedupeServer().start()
    try:
        order = {"method": "POST", "url": f"{api.url}/orders", "json": {"sku": "B-7"}}
        # Turn 1 takes 3 s: the Temporal server dies and comes back while the model activity runs.
        llm.enqueue(Scripted(tool_calls=[("http_request", json.dumps(order))], delay_s=3))
        llm.default = Scripted(text="survived the restart")
        await rig.spawn()
        handle = await rig.start("restart the server", ["http_request"])
        await asyncio.to_thread(wait_until, lambda: len(llm.requests) >= 1, 30, "the first model call")

        server.kill()
        await asyncio.to_thread(server.start)  # same port, same SQLite file
        rig.client = await server.client()
        handle = rig.client.get_workflow_handle(handle.id, result_type=AgentResult)
        result = await rig.result(handle)

        assert result.status == "completed" and result.output == "survived the restart", rig.logs()
        assert result.steps == 2
        assert len(api.applied("/orders")) == 1
        assert [e.state for e in await rig.ledger(handle.id)] == ["done"]
        assert all(w.alive() for w in rig.workers), "the worker reconnected by itself; it did not exit"
    finally:
        rig.stop_all()
        server.stop()
        api.stop()


async def test_kill_storm_small(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    address = dev_env.client.service_client.config.target_host
    report = await kill_storm(
        dev_env.client, address, tmp_path / "storm", runs=10, workers=2, kills=4, posts=3, storm_s=14, seed=7
    )
    print(
        f"\nkill storm: {report.completed}/{report.runs} completed in {report.wall_s}s, {report.kills} kills "
        f"({report.posts_in_flight_at_kills} POSTs in flight), {report.deliveries} deliveries, "
        f"{report.applied} applied, {report.duplicates_prevented} duplicates prevented, "
        f"recovery {report.recovery_s}"
    )
    assert not report.errors, report.errors
    assert report.completed == 10, report.statuses
    assert report.kills >= 1
    assert report.applied == 30, report.effects_per_order
    assert sorted(report.effects_per_order.values()) == [1] * 30, "every order applied exactly once"
    assert report.keys == 30, "one idempotency key per order, identical on every re-send"
    assert report.ledger_done == 30 and report.ledger_states == {"done": 30}, report.ledger_states
