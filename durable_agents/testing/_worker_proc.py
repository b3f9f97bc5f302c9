"""Real processes for crash tests and the kill-storm bench: ``worker.py`` workers, a Temporal dev server.

``WorkerProc`` runs ``worker.py`` as a subprocess (SIGKILL-able, replaceable by a
new process with the same environment). ``DevServer`` runs ``temporal server
start-dev`` on a SQLite file and a fixed port, so it can be killed and started
again on the same state. ``kill_storm`` drives many runs through workers that are
killed at random, and reports what the destination saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.store.sqlite import SQLiteRunStore
from durable_agents.testing._dedupe_server import DedupeServer
from durable_agents.testing._llm_server import FakeLLMServer, Scripted
from durable_agents.testing._ports import free_port as free_port
from durable_agents.testing._ports import inherited_path
from durable_agents.testing._ports import port_open as port_open
from workflows.types import AgentInput, AgentResult, Limits

ROOT = Path(__file__).resolve().parent.parent.parent
TEMPORAL_CLI = Path(sys.executable).parent / "temporal"
CRASH_TOOLS = "tests.fakes.crash_tools"
ALLOW_ALL_POLICY = {"rules": [{"tool": "*", "decision": "allow"}]}
SEARCH_ATTRIBUTES = ["AgentState=Keyword", "AgentPendingApprovals=Int", "AgentTenant=Keyword"]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it holds; ``TimeoutError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


async def async_wait_until(predicate: Callable[[], bool], within_s: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


def open_client_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` holds open (Linux ``/proc``); empty when unknown."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f, None)
            for line in f:
                cols = line.split()
                if len(cols) > 9 and cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def write_policy(path: Path, policy: dict[str, Any] | None = None) -> Path:
    path.write_text(json.dumps(policy or ALLOW_ALL_POLICY))
    return path


def worker_env(
    *, address: str, task_queue: str, llm_url: str, state_dir: Path, policy_file: Path, **extra: str
) -> dict[str, str]:
    """The environment of a ``worker.py`` subprocess: shared SQLite store under ``state_dir``, crash tools loaded."""
    env = {
        "PATH": inherited_path(),
        "PYTHONPATH": str(ROOT),
        "TEMPORAL_ADDRESS": address,
        "AGENT_TASK_QUEUE": task_queue,
        "AGENT_MODEL": "openai:test-model",
        "OPENAI_BASE_URL": llm_url,
        "OPENAI_API_KEY": "sk-crash-test",
        "AGENT_STATE_DIR": str(state_dir),
        "AGENT_HTTP_ALLOW": "127.0.0.1:1024-65535",
        "AGENT_TOOL_MODULES": CRASH_TOOLS,
        "AGENT_POLICY_FILE": str(policy_file),
        "AGENT_LOG_LEVEL": "INFO",
    }
    env.update(extra)
    return env


CLUSTER_VARIABLES = ("TEMPORAL_ADDRESS", "AGENT_TASK_QUEUE", "AGENT_STATE_DIR")


def cluster_worker_env(*, llm_url: str, policy_file: Path, **extra: str) -> dict[str, str]:
    """``worker_env`` for a ``scripts.cluster.Cluster``: without what the cluster sets (address, queue, state dir)."""
    env = worker_env(address="", task_queue="", llm_url=llm_url, state_dir=Path(), policy_file=policy_file, **extra)
    for name in CLUSTER_VARIABLES:
        env.pop(name)
    return env


class WorkerProc:
    """One ``worker.py`` process; ``kill()`` is a real SIGKILL (no cleanup, no graceful shutdown)."""

    def __init__(self, env: dict[str, str], log_path: Path, argv: list[str] | None = None) -> None:
        """``argv`` runs another worker program (it too must print ``worker_started`` when it polls)."""
        self.env = env
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in _closed)
        self.proc = subprocess.Popen(
            argv or [sys.executable, str(ROOT / "worker.py")],
            env=env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        """The worker connected to Temporal and is about to poll (it logged ``worker_started``)."""
        return b"worker_started" in self.log_path.read_bytes()

    def wait_ready(self, timeout: float = 30.0) -> WorkerProc:
        def check() -> bool:
            if not self.alive():
                raise RuntimeError(f"worker {self.pid} exited with {self.proc.returncode}:\n{self.tail()}")
            return self.ready()

        wait_until(check, timeout, f"worker {self.pid} to start ({self.log_path})")
        return self

    async def async_wait_ready(self, within_s: float = 30.0) -> WorkerProc:
        def check() -> bool:
            if not self.alive():
                raise RuntimeError(f"worker {self.pid} exited with {self.proc.returncode}:\n{self.tail()}")
            return self.ready()

        await async_wait_until(check, within_s, f"worker {self.pid} to start ({self.log_path})")
        return self

    def kill(self) -> None:
        """SIGKILL, and reap the process."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._closed()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (graceful shutdown); SIGKILL when it does not exit in time. Returns the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._closed()
        return self.proc.returncode

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _closed(self) -> None:
        with contextlib.suppress(OSError):
            self._log.close()


# The kernel hands out ephemeral ports (bind to 0, outgoing connections) from this range, so a
# port picked from it can be taken by another test's server before ours binds it.
_EPHEMERAL = tuple(int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())


def fixed_port() -> int:
    """A free port outside the ephemeral range, for a server that must come back on the same port."""
    low, high = (20000, _EPHEMERAL[0] - 1) if _EPHEMERAL[0] > 21000 else (_EPHEMERAL[1] + 1, 65000)
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def owns_listener(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on ``port`` (``/proc/net/tcp`` state 0A)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return True
    return False


class DevServer:
    """``temporal server start-dev`` on a SQLite file and a fixed port: killable and restartable on the same state."""

    def __init__(self, db_path: Path, log_path: Path, port: int | None = None) -> None:
        self.db_path = db_path
        self.log_path = log_path
        self.port = port or fixed_port()
        self.http_port = fixed_port()
        self.metrics_port = fixed_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> DevServer:
        # A killed server's port can linger briefly; the new one must get the same port.
        wait_until(lambda: not port_open(self.port), 20, f"port {self.port} to be free")
        cmd = [
            str(TEMPORAL_CLI), "server", "start-dev",
            "--db-filename", str(self.db_path),
            "--ip", "127.0.0.1",
            "--port", str(self.port),
            "--http-port", str(self.http_port),
            "--metrics-port", str(self.metrics_port),
            "--headless",
            "--log-level", "error",
        ]  # fmt: skip
        for attribute in SEARCH_ATTRIBUTES:
            cmd += ["--search-attribute", attribute]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"temporal dev server exited with {proc.returncode}: {self.tail()}")
            # Another process on this port would answer too; only our own listener counts.
            return port_open(self.port) and owns_listener(proc.pid, self.port)

        wait_until(up, timeout, f"the Temporal dev server on port {self.port}", interval=0.1)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    async def client(self, within_s: float = 30.0) -> Client:
        """A client once the frontend answers (the port opens before the namespace is ready)."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                return await Client.connect(self.address, data_converter=pydantic_data_converter)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)


# --- the kill storm -----------------------------------------------------------------------


class ModelGate:
    """Wraps the fake model's reply function so the killer can see (and avoid) model calls in flight.

    The ``model`` activity has no heartbeat, so a worker killed during a model call
    leaves that activity to its 180 s start-to-close timeout. Holding the gate makes
    new model requests wait at the fake server; after a short hold, every model call
    the worker had started is waiting there, so ``waiting`` tells whether a kill
    would catch one (and which runs: ``waiting_tasks``). ``calls`` logs every model
    request as ``(time.time(), task)``.
    """

    def __init__(self, reply: Callable[[dict[str, Any]], Scripted]) -> None:
        self._reply = reply
        self._cond = threading.Condition()
        self._held = False
        self._waiting: list[str] = []
        self.last_answer = 0.0
        self.calls: list[tuple[float, str]] = []

    def __call__(self, body: dict[str, Any]) -> Scripted:
        task = task_of(body)
        with self._cond:
            self.calls.append((time.time(), task))
            self._waiting.append(task)
            self._cond.wait_for(lambda: not self._held, timeout=30)
            self._waiting.remove(task)
        try:
            return self._reply(body)
        finally:
            with self._cond:
                self.last_answer = time.monotonic()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._cond:
            self._held = True
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()

    def waiting_tasks(self) -> list[str]:
        with self._cond:
            return list(self._waiting)

    def quiet(self, for_s: float) -> bool:
        """No model call waiting and none answered in the last ``for_s`` seconds (so none is completing)."""
        with self._cond:
            return not self._waiting and time.monotonic() - self.last_answer >= for_s


def task_of(body: dict[str, Any]) -> str:
    """The run's task: the user message of a Chat Completions request."""
    return next((str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user"), "")


def orders_model(orders_url: str, posts: int) -> Callable[[dict[str, Any]], Scripted]:
    """A model that POSTs ``posts`` orders (one per turn, decided by the tool results so far), then answers."""

    def reply(body: dict[str, Any]) -> Scripted:
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
        if done >= posts:
            return Scripted(text=f"placed {done} orders")
        args = {"method": "POST", "url": orders_url, "json": {"run": task_of(body), "item": done}}
        return Scripted(tool_calls=[("http_request", json.dumps(args))])

    return reply


@dataclass
class Kill:
    at: float  # time.time()
    slot: int
    pid: int
    in_flight: list[str]  # idempotency keys of POSTs the victim had on the wire when it died
    model_calls: list[str]  # tasks of the runs whose model call the victim had in flight


def recovery_times(killed: list[Kill], writes: list[Any], gates: list[ModelGate]) -> tuple[list[float], list[float]]:
    """Seconds from each kill to the re-send of every POST the victim had in flight, and to the next model
    request of every run whose model call it had in flight (those that came again at all)."""
    recovery: list[float] = []
    model_recovery: list[float] = []
    model_calls = sorted(call for gate in gates for call in gate.calls)
    for kill in killed:
        for key in kill.in_flight:
            resent = [d.at for d in writes if d.key == key and d.at > kill.at]
            if resent:
                recovery.append(round(min(resent) - kill.at, 2))
        for run_task in kill.model_calls:
            again = [at for at, t in model_calls if t == run_task and at > kill.at]
            if again:
                model_recovery.append(round(min(again) - kill.at, 2))
    return recovery, model_recovery


@dataclass
class StormReport:
    runs: int
    completed: int
    statuses: dict[str, int]
    wall_s: float
    kills: int
    kill_offsets_s: list[float]
    posts_in_flight_at_kills: int
    model_calls_in_flight_at_kills: int
    workers: int
    deliveries: int
    applied: int
    duplicates_prevented: int
    keys: int
    effects_per_order: dict[str, int]
    ledger_done: int
    ledger_states: dict[str, int]
    max_recovery_s: float | None  # a kill -> the re-send, by a new attempt, of a POST the victim had in flight
    recovery_s: list[float]
    max_model_recovery_s: float | None  # a kill -> the re-issued model call of a run the victim was calling for
    model_recovery_s: list[float]
    max_run_s: float | None  # slowest run, start to result
    skipped_kill_windows: int
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


async def kill_storm(
    client: Client,
    address: str,
    workdir: Path,
    *,
    runs: int = 10,
    workers: int = 2,
    kills: int = 4,
    posts: int = 3,
    kill_every_s: tuple[float, float] = (2.0, 3.0),
    storm_s: float = 15.0,
    post_delay_s: float = 1.5,
    start_spread_s: float = 0.0,
    avoid_model_calls: bool = True,
    finish_timeout_s: float = 120.0,
    seed: int | None = None,
    log: Callable[[str], None] = print,
) -> StormReport:
    """``runs`` runs of ``posts`` POSTs each through ``workers`` worker processes sharing one SQLite store.

    Runs start over ``start_spread_s`` seconds. Every ``kill_every_s`` (random in that range) one worker is
    SIGKILLed — preferably one with a POST on the wire, and with ``avoid_model_calls`` only one with no model
    call in flight — and replaced at once, until ``kills`` kills or ``storm_s`` seconds; then the workers stay
    up until every run finishes (or ``finish_timeout_s``). The destination dedupes by ``Idempotency-Key``.
    """
    rng = random.Random(seed)
    os.makedirs(workdir, exist_ok=True)
    state_dir = workdir / "state"
    policy = write_policy(workdir / "policy.json")
    queue = f"storm-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    started_wall = time.time()
    killed: list[Kill] = []
    skipped = 0
    results: dict[int, AgentResult] = {}
    run_s: dict[int, float] = {}
    errors: list[str] = []
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(DedupeServer())
        # Half before the order is applied, half after: kills land on both sides of the effect.
        api.add_delay(before_s=post_delay_s / 2, after_s=post_delay_s / 2, method="POST", path_prefix="/orders")
        gates = [ModelGate(orders_model(f"{api.url}/orders", posts)) for _ in range(workers)]
        llms = [stack.enter_context(FakeLLMServer(default=gate)) for gate in gates]
        generation = [0] * workers

        def spawn(slot: int) -> WorkerProc:
            generation[slot] += 1
            url = llms[slot].openai_url
            env = worker_env(address=address, task_queue=queue, llm_url=url, state_dir=state_dir, policy_file=policy)
            return WorkerProc(env, workdir / f"worker-{slot}-{generation[slot]}.log")

        def on_the_wire(pid: int) -> list[str]:
            """Keys of POSTs the server received from ``pid`` whose connection ``pid`` still holds open."""
            ports = open_client_ports(pid)
            latest = {d.client_port: d.key for d in api.writes("/orders")}  # one request per connection
            return sorted({key for port, key in latest.items() if port in ports})

        async def run(i: int) -> None:
            await asyncio.sleep(start_spread_s * i / max(1, runs))
            t0 = time.monotonic()
            handle = await client.start_workflow(
                "AgentWorkflow",
                AgentInput(task=f"storm {queue} run {i}", tools=["http_request"], limits=Limits(max_steps=10)),
                id=f"{queue}-run-{i}",
                task_queue=queue,
                result_type=AgentResult,
            )
            results[i] = await handle.result()
            run_s[i] = time.monotonic() - t0

        procs = [spawn(slot) for slot in range(workers)]
        try:
            for proc in procs:
                await proc.async_wait_ready()
            waiters = [asyncio.create_task(run(i)) for i in range(runs)]
            storm_ends = time.monotonic() + storm_s
            while len(killed) < kills and time.monotonic() < storm_ends and len(results) < runs:
                await asyncio.sleep(rng.uniform(*kill_every_s))
                for attempt in range(30):
                    slot = rng.randrange(workers)
                    victim = procs[slot]
                    if not victim.ready():
                        await asyncio.sleep(0.1)
                        continue
                    # Hold the victim's model server briefly: the model calls it has in flight show up waiting.
                    with gates[slot].held():
                        await asyncio.sleep(0.15)
                        wire = on_the_wire(victim.pid)
                        model_ok = gates[slot].quiet(0.15) or not avoid_model_calls
                        if model_ok and (wire or attempt >= 15):
                            victim.kill()
                            calls = gates[slot].waiting_tasks()
                            killed.append(Kill(time.time(), slot, victim.pid, wire, calls))
                            log(
                                f"kill {len(killed)}: slot {slot} pid {victim.pid}: {len(wire)} POST(s) and "
                                f"{len(calls)} model call(s) in flight"
                            )
                    if not victim.alive():
                        procs[slot] = spawn(slot)
                        break
                    skipped += 1
                    await asyncio.sleep(0.1)
            log(f"storm over after {len(killed)} kills; waiting for {runs - len(results)} of {runs} runs")
            done, pending = await asyncio.wait(waiters, timeout=finish_timeout_s)
            for task in pending:
                task.cancel()
            errors = [repr(t.exception()) for t in done if t.exception() is not None]
            errors += [f"run {i} did not finish in time" for i in range(runs) if i not in results]
        finally:
            for proc in procs:
                proc.stop()

        wall = time.monotonic() - started
        store = SQLiteRunStore(state_dir / "store.sqlite3")
        try:
            ledger = await store.ledger()
        finally:
            await store.close()

    writes = api.writes("/orders")
    effects = api.applied("/orders")
    per_order: dict[str, int] = {}
    for effect in effects:
        order = effect.json()
        name = f"{order['run']}#{order['item']}"
        per_order[name] = per_order.get(name, 0) + 1
    recovery, model_recovery = recovery_times(killed, writes, gates)
    statuses: dict[str, int] = {}
    for result in results.values():
        statuses[result.status] = statuses.get(result.status, 0) + 1
    states: dict[str, int] = {}
    for entry in ledger:
        states[entry.state] = states.get(entry.state, 0) + 1
    return StormReport(
        runs=runs,
        completed=statuses.get("completed", 0),
        statuses=statuses,
        wall_s=round(wall, 2),
        kills=len(killed),
        kill_offsets_s=[round(k.at - started_wall, 2) for k in killed],
        posts_in_flight_at_kills=sum(len(k.in_flight) for k in killed),
        model_calls_in_flight_at_kills=sum(len(k.model_calls) for k in killed),
        workers=workers,
        deliveries=len(writes),
        applied=len(effects),
        duplicates_prevented=len(writes) - len(effects),
        keys=len({d.key for d in writes}),
        effects_per_order=per_order,
        ledger_done=states.get("done", 0),
        ledger_states=states,
        max_recovery_s=max(recovery) if recovery else None,
        recovery_s=sorted(recovery),
        max_model_recovery_s=max(model_recovery) if model_recovery else None,
        model_recovery_s=sorted(model_recovery),
        max_run_s=round(max(run_s.values()), 2) if run_s else None,
        skipped_kill_windows=skipped,
        errors=errors,
    )
