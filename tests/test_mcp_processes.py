"""MCP servers under real ``worker.py`` processes: bad ``AGENT_MCP_CONFIG`` files stop the worker at start,
a worker SIGKILLed mid-call hands the run to a new worker (the stdio server it spawned does not outlive it),
and a stdio server's stderr reaches the worker's JSON log tagged and redacted.

The shop is ``tests.fakes.mcp_orders`` over stdio; what it did is read from its own delivery ledger file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.fakes.worker_proc import WorkerProc, async_wait_until, task_of, worker_env, write_policy
from tests.mcp_servers import read_ledger
from tests.waiting import DEADLINE_S, eventually
from workflows.types import AgentInput, AgentResult, ResolveSignal, StatusView

ROOT = Path(__file__).resolve().parent.parent
ALLOW_SHOP = {"rules": [{"tool": "mcp__shop__*", "decision": "allow"}]}
RESULT_WITHIN_S = 60.0  # recovery after a SIGKILL is one MCP heartbeat timeout (~15 s) plus backoff
SHOP_TOKEN = "tok-5ecret-7c1a9e"
WORKER_KEY = "sk-mcp-proc-worker-key"  # the worker's own OPENAI_API_KEY: never the stdio server's


def shop_server(ledger: Path, **extra: Any) -> dict[str, Any]:
    env = {"ORDERS_LEDGER": str(ledger), **extra.pop("env", {})}
    return {"command": sys.executable, "args": ["-m", "tests.fakes.mcp_orders"], "cwd": str(ROOT), "env": env, **extra}


# --- 1. a bad AGENT_MCP_CONFIG stops the worker at start -------------------------------------------


def _invalid_json(tmp: Path) -> Path:
    path = tmp / "mcp.json"
    path.write_text('{"mcpServers": {"x": {"command": ')
    return path


def _unknown_field(tmp: Path) -> Path:
    path = tmp / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"x": {"command": sys.executable, "autoApprove": []}}}))
    return path


def _missing_command(tmp: Path) -> Path:
    path = tmp / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"x": {"command": "no-such-mcp-server-binary"}}}))
    return path


def _unset_reference(tmp: Path) -> Path:
    path = tmp / "mcp.json"
    server = {"command": sys.executable, "env": {"TOKEN": "Bearer ${NOT_SET_VAR}"}}
    path.write_text(json.dumps({"mcpServers": {"x": server}}))
    return path


def _no_file(tmp: Path) -> Path:
    return tmp / "does-not-exist.json"


@pytest.mark.parametrize(
    ("make_config", "needle"),
    [
        (_invalid_json, "not valid JSON"),
        (_unknown_field, "mcpServers.x.autoApprove: unknown key 'autoApprove'"),
        (_missing_command, "mcpServers.x.command: 'no-such-mcp-server-binary' is not found on the worker's PATH"),
        (_unset_reference, "mcpServers.x.env.TOKEN: references ${NOT_SET_VAR}, which is not set"),
        (_no_file, "cannot be read"),
    ],
    ids=["invalid-json", "unknown-field", "missing-command", "unset-reference", "no-file"],
)
def test_bad_mcp_config_stops_the_worker_at_start_with_one_line(
    tmp_path: Path, make_config: Callable[[Path], Path], needle: str
) -> None:
    config = make_config(tmp_path)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "AGENT_STATE_DIR": str(tmp_path / "agent"),
        "TEMPORAL_ADDRESS": "127.0.0.1:1",  # never reached: configuration is checked first
        "AGENT_MCP_CONFIG": str(config),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "worker.py")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    record = json.loads(lines[0])
    assert record["event"] == "bad_configuration"
    assert f"AGENT_MCP_CONFIG={config}" in record["error"] and needle in record["error"], record


# --- a worker subprocess rig ----------------------------------------------------------------------


@dataclass
class McpRig:
    client: Client
    llm: FakeLLMServer
    tmp: Path
    env: dict[str, str]
    ledger: Path
    task_queue: str

    def __post_init__(self) -> None:
        self.workers: list[WorkerProc] = []

    @property
    def store_path(self) -> Path:
        return Path(self.env["AGENT_STORE_URL"])

    async def spawn(self) -> WorkerProc:
        proc = WorkerProc(self.env, self.tmp / f"worker-{len(self.workers) + 1}.log")
        self.workers.append(proc)
        return await proc.async_wait_ready()

    async def start(self, task: str) -> WorkflowHandle[Any, AgentResult]:
        return await self.client.start_workflow(
            "AgentWorkflow",
            AgentInput(task=task, tools=["mcp__shop__*"]),
            id=f"{self.task_queue}-{uuid.uuid4().hex[:6]}",
            task_queue=self.task_queue,
            result_type=AgentResult,
        )

    async def result(self, handle: WorkflowHandle[Any, AgentResult]) -> AgentResult:
        try:
            return await asyncio.wait_for(handle.result(), RESULT_WITHIN_S)
        except TimeoutError:
            raise AssertionError(f"run {handle.id} did not finish in {RESULT_WITHIN_S}s\n{self.logs()}") from None

    async def started_event(self) -> dict[str, Any]:
        try:
            await async_wait_until(
                lambda: any(e.get("event") == "started" for e in read_ledger(self.ledger)), 30, "slow_order to start"
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; ledger {read_ledger(self.ledger)}\n{self.logs()}") from None
        return next(e for e in read_ledger(self.ledger) if e.get("event") == "started")

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path.name} (pid {w.pid})\n{w.tail(2500)}" for w in self.workers)

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop()


@pytest.fixture
def mcp_rig(dev_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Callable[..., McpRig]]:
    """``mcp_rig(servers_for_ledger, **env)``: worker subprocesses with the MCP servers that
    ``servers_for_ledger(ledger path)`` returns, and the ALLOW_SHOP operator policy."""
    rigs: list[McpRig] = []
    with FakeLLMServer() as llm:

        def make(servers: Callable[[Path], dict[str, Any]], **extra_env: str) -> McpRig:
            ledger = tmp_path / "orders.jsonl"
            config = tmp_path / "mcp.json"
            config.write_text(json.dumps({"mcpServers": servers(ledger)}))
            state_dir = tmp_path / "state"
            task_queue = f"mcp-proc-{uuid.uuid4().hex[:8]}"
            env = worker_env(
                address=dev_env.client.service_client.config.target_host,
                task_queue=task_queue,
                llm_url=llm.openai_url,
                state_dir=state_dir,
                policy_file=write_policy(tmp_path / "policy.json", ALLOW_SHOP),
                AGENT_MCP_CONFIG=str(config),
                AGENT_STORE_URL=str(state_dir / "store.sqlite3"),
                **extra_env,
            )
            rig = McpRig(dev_env.client, llm, tmp_path, env, ledger, task_queue)
            rigs.append(rig)
            return rig

        try:
            yield make
        finally:
            for rig in rigs:
                rig.stop_all()


def one_call_then_answer(tool: str, args: dict[str, Any], final: str) -> Callable[[dict[str, Any]], Scripted]:
    """Call ``tool`` once, then answer (decided by the transcript, so a repeated turn gets the same reply)."""

    def reply(body: dict[str, Any]) -> Scripted:
        if any(m.get("role") == "tool" for m in body.get("messages", [])):
            return Scripted(text=final)
        return Scripted(tool_calls=[(tool, json.dumps(args))])

    return reply


def process_gone(pid: int) -> bool:
    """``pid`` has exited (a zombie nobody reaped counts as exited: it runs nothing and holds no pipes)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


async def pending_unknown(handle: WorkflowHandle[Any, AgentResult], within_s: float = DEADLINE_S) -> StatusView:
    async def waiting() -> StatusView | None:
        status: StatusView = await handle.query("status", result_type=StatusView)
        return status if any(p.kind == "resolve_unknown_outcome" for p in status.pending_approvals) else None

    return await eventually(waiting, "a resolve_unknown_outcome approval", within_s=within_s, every_s=0.2)


def split_ledger(ledger: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    events = read_ledger(ledger)
    starts = [e for e in events if e.get("event") == "started"]
    deliveries = [e for e in events if e.get("tool") == "slow_order" and "event" not in e]
    return starts, deliveries


# --- 2. a worker SIGKILLed while an MCP call is in flight -----------------------------------------

SLOW_ORDER = ("mcp__shop__slow_order", {"item": "x", "seconds": 3})


async def test_worker_killed_mid_mcp_call_idempotent_by_key_completes_on_a_new_worker_once(
    mcp_rig: Callable[..., McpRig],
) -> None:
    rig = mcp_rig(lambda ledger: {"shop": shop_server(ledger, tools={"slow_order": {"recovery": "idempotent_by_key"}})})
    rig.llm.default = one_call_then_answer(*SLOW_ORDER, "ordered")
    first = await rig.spawn()
    handle = await rig.start("order x with a key")
    started = await rig.started_event()
    first.kill()
    await rig.spawn()
    result = await rig.result(handle)

    assert result.status == "completed" and result.output == "ordered", rig.logs()
    starts, deliveries = split_ledger(rig.ledger)
    assert len(deliveries) == 1, f"the order was delivered {len(deliveries)} times: {read_ledger(rig.ledger)}"
    keys = {s["key"] for s in starts}
    assert len(keys) == 1 and next(iter(keys)).startswith("ik_"), f"every attempt carries one key: {starts}"
    assert deliveries[0]["key"] == started["key"]
    # The killed worker's stdio server sees EOF on stdin and exits; it is not orphaned forever.
    await async_wait_until(
        lambda: process_gone(started["pid"]), 10, f"the killed worker's orders server (pid {started['pid']}) to exit"
    )


async def test_worker_killed_mid_mcp_call_unknown_outcome_waits_for_a_human_then_mark_done(
    mcp_rig: Callable[..., McpRig],
) -> None:
    rig = mcp_rig(lambda ledger: {"shop": shop_server(ledger)})  # default recovery: unknown
    rig.llm.default = one_call_then_answer(*SLOW_ORDER, "done after review")
    first = await rig.spawn()
    handle = await rig.start("order x without a key")
    started = await rig.started_event()
    first.kill()
    await rig.spawn()

    status = await pending_unknown(handle, RESULT_WITHIN_S)
    [pending] = [p for p in status.pending_approvals if p.kind == "resolve_unknown_outcome"]
    assert pending.tool == "mcp__shop__slow_order" and pending.args == SLOW_ORDER[1], pending
    starts, _ = split_ledger(rig.ledger)
    assert len(starts) == 1, f"nothing is sent again while the run waits for a human: {starts}"
    await handle.signal(
        "resolve", ResolveSignal(approval_id=pending.approval_id, reviewer="ops-al", resolution="mark_done")
    )
    result = await rig.result(handle)

    assert result.status == "completed" and result.output == "done after review", rig.logs()
    starts, deliveries = split_ledger(rig.ledger)
    assert len(starts) == 1 and len(deliveries) <= 1, read_ledger(rig.ledger)
    answers = [str(m.get("content")) for m in rig.llm.requests[-1]["body"]["messages"] if m.get("role") == "tool"]
    assert any("confirmed done by ops-al" in text for text in answers), answers
    await async_wait_until(
        lambda: process_gone(started["pid"]), 10, f"the killed worker's orders server (pid {started['pid']}) to exit"
    )


# --- 3. server stderr in the worker's log; secrets redacted everywhere -----------------------------


async def test_server_stderr_is_logged_tagged_and_secrets_never_leave_the_server(
    mcp_rig: Callable[..., McpRig],
) -> None:
    rig = mcp_rig(
        lambda ledger: {"shop": shop_server(ledger, env={"SHOP_TOKEN": "${SHOP_TOKEN}"})},
        SHOP_TOKEN=SHOP_TOKEN,
        OPENAI_API_KEY=WORKER_KEY,
    )
    task = "show me the env"

    def reply(body: dict[str, Any]) -> Scripted:
        assert task_of(body) == task
        done = [m for m in body.get("messages", []) if m.get("role") == "tool"]
        if len(done) == 0:
            return Scripted(tool_calls=[("mcp__shop__show_env", json.dumps({"name": "SHOP_TOKEN"}))])
        if len(done) == 1:
            return Scripted(tool_calls=[("mcp__shop__show_env", json.dumps({"name": "OPENAI_API_KEY"}))])
        return Scripted(text="seen")

    rig.llm.default = reply
    worker = await rig.spawn()
    handle = await rig.start(task)
    result = await rig.result(handle)
    assert result.status == "completed" and result.output == "seen", rig.logs()

    # What the model got: the token redacted, and no trace of the worker's own key.
    bodies = [r["body"] for r in rig.llm.requests if task_of(r["body"]) == task]
    assert len(bodies) == 3, bodies
    [token_result] = [str(m.get("content")) for m in bodies[1]["messages"] if m.get("role") == "tool"]
    assert "[REDACTED]" in token_result, token_result
    key_result = [str(m.get("content")) for m in bodies[2]["messages"] if m.get("role") == "tool"][1]
    assert WORKER_KEY not in key_result and "[REDACTED]" not in key_result, (
        f"the stdio server inherited the worker's OPENAI_API_KEY: {key_result!r}"
    )
    assert key_result.strip() in ("", "None"), key_result
    for body in bodies:
        assert SHOP_TOKEN not in json.dumps(body), "the secret reached the model"

    # The server's stderr, as structured log events tagged with the server.
    def stderr_events() -> list[dict[str, Any]]:
        found = []
        for line in worker.log_path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == "mcp_server_stderr":
                found.append(record)
        return found

    try:
        await async_wait_until(
            lambda: any("orders server ready pid=" in str(e.get("line")) for e in stderr_events()),
            10,
            "an mcp_server_stderr event with the shop's ready line",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{rig.logs()}") from None
    ready = [e for e in stderr_events() if "orders server ready pid=" in str(e.get("line"))]
    assert all(e.get("server") == "shop" for e in ready), ready

    # The transcript in the run store, while the worker still has it open (its -wal holds the latest pages).
    open_store = store_bytes(rig.store_path)
    assert b"[REDACTED]" in b"".join(open_store.values()), "the transcript holds the redacted tool result"
    for name, data in open_store.items():
        assert SHOP_TOKEN.encode() not in data, f"the secret is in the run store ({name})"

    worker.stop()
    assert SHOP_TOKEN.encode() not in worker.log_path.read_bytes(), "the secret is in the worker's log"
    for name, data in store_bytes(rig.store_path).items():
        assert SHOP_TOKEN.encode() not in data, f"the secret is in the run store ({name}, after the worker stopped)"

    history = await handle.fetch_history()
    raw_history = b"".join(event.SerializeToString() for event in history.events)  # payload bytes as they are
    assert b"[REDACTED]" in raw_history, "the history's result preview is the redacted text"
    assert SHOP_TOKEN.encode() not in raw_history, "the secret is in the history"
    assert SHOP_TOKEN not in history.to_json(), "the secret is in the history"


def store_bytes(store: Path) -> dict[str, bytes]:
    """The bytes of the SQLite run store and its -wal / -shm files (whichever exist)."""
    found = {p.name: p.read_bytes() for p in store.parent.iterdir() if p.name.startswith(store.name) and p.is_file()}
    assert store.name in found, f"no run store at {store}: {sorted(p.name for p in store.parent.iterdir())}"
    return found
