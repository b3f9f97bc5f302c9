"""Every bad input a new user might type: one line on stderr, a documented exit code, never a traceback.

Each case runs ``starter.py`` as a real process against the session's dev server
(``dev_env``): usage and input errors exit 2, run-level failures 1, Ctrl-C 130
(see ``durable_agents/cli/main.py``). Runs that need a worker get an in-process
one on a fresh task queue, with the fake LLM as their model; runs that must find
no worker go to a task queue nobody polls.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import WorkerFactory, start_agent, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.interrupts import as_from_a_terminal
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.types import AgentResult, Limits

ROOT = Path(__file__).resolve().parent.parent
ASK_EVERYTHING = {"rules": [{"tool": "*", "decision": "ask"}]}
Arg = str | bytes


@pytest.fixture
def cache_mode() -> str:
    """One worker mode is enough: these tests are about the command line."""
    return "cached"


@pytest.fixture
def address(dev_env: WorkflowEnvironment) -> str:
    return dev_env.client.service_client.config.target_host


def nobody() -> str:
    """A task queue no worker polls."""
    return f"nobody-{uuid.uuid4().hex[:8]}"


def cli_env(address: str, task_queue: str = "", **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "TEMPORAL_ADDRESS": address,
        "AGENT_TASK_QUEUE": task_queue or nobody(),
        **extra,
    }


def starter(
    env: dict[str, str], *args: Arg, stdin: bytes | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "starter.py"), *args],
        env=env,
        cwd=ROOT,
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
    )
    out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    return subprocess.CompletedProcess(done.args, done.returncode, out, err)


def clean(result: subprocess.CompletedProcess[str]) -> None:
    for text in (result.stdout, result.stderr):
        assert "Traceback" not in text and "Exception ignored" not in text, text


def one_line(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The process exited ``code`` with exactly one stderr line containing each needle; that line."""
    clean(result)
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- arguments and input -----------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 au lait")
    (tmp_path / "blank.txt").write_text("  \n\t\n")
    (tmp_path / "task.txt").write_text("a task\n")
    (tmp_path / "dir").mkdir()
    return {
        "LATIN1": str(tmp_path / "latin1.txt"),
        "BLANK": str(tmp_path / "blank.txt"),
        "TASK": str(tmp_path / "task.txt"),
        "DIR": str(tmp_path / "dir"),
        "MISSING": str(tmp_path / "missing.txt"),
    }


BAD_INPUT: list[tuple[tuple[Arg, ...], int, str]] = [
    (("run", ""), 2, "the task is empty"),
    (("run", "  \n\t "), 2, "the task is empty"),
    (("run", b"\xff"), 2, "the task is not valid UTF-8 text (byte 0xFF at character 0)"),
    (("run", b"ok \xed\xa0\x80"), 2, "the task is not valid UTF-8"),  # an encoded lone surrogate (U+D800)
    (("run", "x", "--id", b"run-\xfe"), 2, "the run id is not valid UTF-8"),
    (("run", "x", "--tenant", b"\xc3"), 2, "--tenant is not valid UTF-8"),
    (("run",), 2, "run needs a task"),
    (("run", "x", "--task-file", "TASK"), 2, "not both"),
    (("run", "--task-file", "MISSING"), 2, "No such file"),
    (("run", "--task-file", "DIR"), 2, "Is a directory"),
    (("run", "--task-file", "LATIN1"), 2, "not UTF-8 text (byte 0xE9 at offset 3)"),
    (("run", "--task-file", "BLANK"), 2, "the task is empty"),
    (("run", "x", "--timeout", "99999999999999999999"), 2, "--timeout"),
    (("run", "x", "--timeout", "1e15"), 2, "--timeout"),
    (("run", "x", "--max-steps", "0"), 2, "--max-steps"),
    (("run", "x", "--model", "m" * 500), 2, "invalid run input: model"),
    (("status", b"\xff"), 2, "the run id is not valid UTF-8"),
    (("watch", "no-such-run"), 1, "no run with id 'no-such-run'"),
    (("cancel", "no-such-run"), 1, "no run with id 'no-such-run'"),
    (("pending", "no-such-run"), 1, "no run with id 'no-such-run'"),
    (("approve", "no-such-run", "--reviewer", "a", "--comment", "c" * 5000), 2, "--comment"),
    (("reject", "no-such-run", "--reviewer", "a", "--reason", " "), 2, "non-empty --reason"),
    (("approve", "no-such-run", "--reviewer", "r" * 300), 2, "--reviewer"),
    (("frobnicate",), 2, "invalid choice"),
]


@pytest.mark.parametrize(("args", "code", "says"), BAD_INPUT, ids=[repr(case[0])[:60] for case in BAD_INPUT])
def test_bad_input_is_one_line(
    address: str, files: dict[str, str], args: tuple[Arg, ...], code: int, says: str
) -> None:
    argv = [files.get(arg, arg) if isinstance(arg, str) else arg for arg in args]
    one_line(starter(cli_env(address), *argv), code, says)


def test_bad_configuration_and_no_server_are_one_line(address: str) -> None:
    loud = starter(cli_env(address, AGENT_LOG_LEVEL="LOUD"), "list")
    assert one_line(loud, 2) == "error: AGENT_LOG_LEVEL='LOUD': expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
    one_line(starter(cli_env("127.0.0.1:1"), "list"), 2, "cannot reach Temporal at 127.0.0.1:1")


async def test_the_starter_never_loads_operator_modules(
    address: str, dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "boom_tools.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('boom')\n")
    env = cli_env(
        address,
        AGENT_TOOL_MODULES="does_not_exist,boom_tools",
        AGENT_PROVIDER_MODULES="does_not_exist",
        PYTHONPATH=str(tmp_path),
    )
    listing = await asyncio.to_thread(starter, env, "list", "--limit", "1")
    started = await asyncio.to_thread(starter, env, "run", "modules are the worker's", "--json")
    for result in (listing, started):
        clean(result)
        assert result.returncode == 0 and result.stderr == "", result.stderr
    assert not marker.exists()
    await dev_env.client.get_workflow_handle(json.loads(started.stdout)["workflow_id"]).terminate("test over")


async def test_a_running_id_is_refused(address: str, dev_env: WorkflowEnvironment) -> None:
    env = cli_env(address)
    workflow_id = f"taken-{uuid.uuid4().hex[:8]}"
    first = await asyncio.to_thread(starter, env, "run", "x", "--id", workflow_id)
    assert first.returncode == 0, first.stderr
    again = await asyncio.to_thread(starter, env, "run", "x", "--id", workflow_id)
    one_line(again, 1, f"a run with id {workflow_id} is already running", f"python starter.py watch {workflow_id}")
    await dev_env.client.get_workflow_handle(workflow_id).terminate("test over")


async def test_task_file_and_stdin(address: str, dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    env = cli_env(address)
    long_task = "word " * 60_000  # 300 KB: longer than one argument may be (128 KB on Linux)
    (tmp_path / "long.txt").write_text(long_task)
    from_file = await asyncio.to_thread(starter, env, "run", "--task-file", str(tmp_path / "long.txt"), "--json")
    from_stdin = await asyncio.to_thread(
        starter, env, "run", "--task-file", "-", "--json", stdin="from stdin ✓\n".encode()
    )
    tasks = []
    for result in (from_file, from_stdin):
        clean(result)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        workflow_id = json.loads(result.stdout)["workflow_id"]
        tasks.append(await _task_of(dev_env.client, workflow_id))
        await dev_env.client.get_workflow_handle(workflow_id).terminate("test over")
    assert tasks == [long_task.rstrip(), "from stdin ✓"]


async def _task_of(client: Client, workflow_id: str) -> str:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    task: str = json.loads(started.input.payloads[0].data)["task"]
    return task


# --- never waiting in silence ------------------------------------------------------------


async def test_status_pending_and_watch_answer_at_once_without_a_worker(
    address: str, dev_env: WorkflowEnvironment
) -> None:
    task_queue = nobody()
    env = cli_env(address, task_queue)
    handle = await start_agent(dev_env.client, task_queue, id_prefix="unpolled")

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(starter, env, *args)

    status = await cli("status", handle.id)
    line = one_line(status, 1, f"run {handle.id} is running but no worker answered", f"task queue {task_queue}")
    assert "shown is what the run last recorded" in line
    assert "state: running" in status.stdout and f"task_queue: {task_queue}" in status.stdout
    as_json = await cli("status", handle.id, "--json")
    one_line(as_json, 1, "no worker answered")
    assert json.loads(as_json.stdout)["answered_by_worker"] is False
    pending = await cli("pending", handle.id)
    one_line(
        pending, 1, f"run {handle.id} is running but no worker answered", f"no worker polls task queue {task_queue}"
    )

    await handle.terminate("ended without a worker")
    watched = await cli("watch", handle.id)
    one_line(watched, 1, f"run {handle.id} has ended (terminated)", f"no worker polls task queue {task_queue}")
    cancelled = await cli("cancel", handle.id)
    one_line(cancelled, 1, f"run {handle.id} has already ended: terminated")


def _lines(stream: BinaryIO, into: queue.Queue[str | None]) -> None:
    for raw in stream:
        into.put(raw.decode(errors="replace"))
    into.put(None)


class Started:
    """``starter.py`` as a process whose output is read line by line while it runs."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "starter.py"), *args],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=as_from_a_terminal,
        )
        self.out: queue.Queue[str | None] = queue.Queue()
        self.err: queue.Queue[str | None] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=_lines, args=(stream, into), daemon=True).start()

    def expect(self, where: str, text: str, within_s: float) -> float:
        """Seconds until a line of stdout/stderr contains ``text``."""
        began = time.monotonic()
        lines, source = (self.stdout, self.out) if where == "stdout" else (self.stderr, self.err)
        while not any(text in line for line in lines):
            left = within_s - (time.monotonic() - began)
            assert left > 0, f"no {text!r} on {where}: {self.stdout} {self.stderr}"
            try:
                line = source.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"{where} closed before {text!r}: {self.stdout} {self.stderr}"
            lines.append(line)
        return time.monotonic() - began

    def interrupt(self) -> subprocess.CompletedProcess[str]:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=60)  # a hang guard: a loaded machine exits slowly
        for lines, source in ((self.stdout, self.out), (self.stderr, self.err)):
            while (line := source.get(timeout=5)) is not None:
                lines.append(line)
        return subprocess.CompletedProcess(self.proc.args, code, "".join(self.stdout), "".join(self.stderr))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


@pytest.fixture
def started() -> Iterator[list[Started]]:
    processes: list[Started] = []
    yield processes
    for process in processes:
        process.kill()


async def test_ctrl_c_during_follow_says_the_run_goes_on(
    address: str, dev_env: WorkflowEnvironment, started: list[Started]
) -> None:
    workflow_id = f"followed-{uuid.uuid4().hex[:8]}"
    follow = Started(cli_env(address), "run", "follow me", "--id", workflow_id, "--follow")
    started.append(follow)
    await asyncio.to_thread(follow.expect, "stdout", f"started run {workflow_id}", 60)
    stopped = await asyncio.to_thread(follow.interrupt)
    line = one_line(stopped, 130, "interrupted:", f"run {workflow_id} goes on")
    # The interpreter that ran (``python`` when that is it on PATH, else its full path), then the script.
    assert line.endswith(f"python starter.py watch {workflow_id}") and "reattach with: " in line, line
    handle = dev_env.client.get_workflow_handle(workflow_id)
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    await handle.terminate("test over")


async def test_wait_and_watch_on_a_queue_nobody_polls_say_so(
    address: str, dev_env: WorkflowEnvironment, started: list[Started]
) -> None:
    task_queue = nobody()
    workflow_id = f"waiting-{uuid.uuid4().hex[:8]}"
    env = cli_env(address, task_queue)
    waiting = Started(env, "run", "wait for me", "--id", workflow_id, "--wait")
    started.append(waiting)
    await asyncio.to_thread(waiting.expect, "stdout", f"started run {workflow_id}", 60)
    watching = Started(env, "watch", workflow_id)
    started.append(watching)
    after_s, _ = await asyncio.gather(
        asyncio.to_thread(waiting.expect, "stderr", "no worker polls", 60),
        asyncio.to_thread(watching.expect, "stderr", "no worker polls", 60),
    )
    assert after_s >= 8, after_s  # said once it has waited a while, not at once
    for process, doing in ((waiting, "keeps waiting"), (watching, "shows its progress once one does")):
        stopped = await asyncio.to_thread(process.interrupt)
        clean(stopped)
        assert stopped.returncode == 130
        warning, interrupted = stopped.stderr.strip().splitlines()
        assert warning.startswith(f"warning: no worker polls task queue {task_queue}: run {workflow_id} waits")
        assert doing in warning and f"AGENT_TASK_QUEUE={task_queue} " in warning, warning
        assert warning.endswith("python worker.py)"), warning  # the interpreter running (test_cli_worker_hint.py)
        assert interrupted.startswith(
            f"interrupted: run {workflow_id} goes on (Ctrl-C stops this command, not the run); reattach with: "
        ) and interrupted.endswith(f"python starter.py watch {workflow_id}"), interrupted
    await dev_env.client.get_workflow_handle(workflow_id).terminate("test over")


# --- runs a worker ran ---------------------------------------------------------------------


def by_task(body: dict[str, Any]) -> Scripted:
    task = next((str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user"), "")
    turns = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
    if task.startswith("fail"):
        return Scripted(status=400, text="the model refuses this request")
    if task.startswith(("limit", "wait")) and turns == 0:
        return Scripted(tool_calls=[("always_fails", "{}")])
    return Scripted(text=f"answered {task}")


async def _ended(client: Client, workflow_id: str) -> AgentResult:
    result: AgentResult = await client.get_workflow_handle(workflow_id, result_type=AgentResult).result()
    return result


async def test_list_cancel_and_decisions_show_the_agents_status(
    address: str, dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    llm.default = by_task
    async with run_worker(client, runtime) as task_queue:
        env = cli_env(address, task_queue)
        done = await start_agent(client, task_queue, id_prefix="done", task="answer me")
        failed = await start_agent(client, task_queue, id_prefix="failed", task="fail me")
        limited = await start_agent(
            client, task_queue, id_prefix="limited", task="limit me", limits=Limits(max_steps=1)
        )
        waiting = await start_agent(client, task_queue, id_prefix="waiting", task="wait me", policy=ASK_EVERYTHING)
        results = [await _ended(client, handle.id) for handle in (done, failed, limited)]
        assert [r.status for r in results] == ["completed", "failed", "limit_exceeded"]
        await _until_pending(client, waiting.id)

        # A decision the run refuses is never reported as done.
        refused = await asyncio.to_thread(
            starter, env, "approve", waiting.id, "ap_0123456789abcdef", "--reviewer", "al"
        )
        one_line(refused, 1, "error: refused:", "ap_0123456789abcdef")
        assert refused.stdout == ""

        cancelled = await asyncio.to_thread(starter, env, "cancel", waiting.id)
        assert cancelled.returncode == 0 and cancelled.stderr == "", cancelled.stderr
        assert (await _ended(client, waiting.id)).status == "cancelled"
        again = await asyncio.to_thread(starter, env, "cancel", waiting.id)
        one_line(again, 1, f"run {waiting.id} has already ended: cancelled")
        too_late = await asyncio.to_thread(starter, env, "approve", waiting.id, "--reviewer", "al")
        one_line(too_late, 1, f"run {waiting.id} is not running (cancelled)")

        listing = await asyncio.to_thread(starter, env, "list", "--json", "--limit", "50")
        clean(listing)
        assert listing.returncode == 0, listing.stderr
        rows = {row["workflow_id"]: row for row in json.loads(listing.stdout)}
        expected = {done.id: "completed", failed.id: "failed", limited.id: "limit_exceeded", waiting.id: "cancelled"}
        assert {wid: rows[wid]["status"] for wid in expected} == expected
        assert {rows[wid]["execution_status"] for wid in expected} == {"completed"}
        text = await asyncio.to_thread(starter, env, "list", "--limit", "50")
        for workflow_id, state in expected.items():
            [line] = [ln for ln in text.stdout.splitlines() if ln.endswith(workflow_id)]
            assert f"  {state} " in line, line

    # The worker is gone (its pollers linger for a while): watch still says the run ended.
    watched = await asyncio.to_thread(starter, env, "watch", failed.id)
    one_line(watched, 1, f"run {failed.id} has ended (failed)", f"python starter.py status {failed.id}")


async def _until_pending(client: Client, workflow_id: str) -> None:
    async def pending() -> bool:
        view = await client.get_workflow_handle(workflow_id).query(AgentWorkflow.status)
        return bool(view.pending_approvals)

    await eventually(pending, f"{workflow_id} waits for an approval", every_s=0.2)


async def test_a_closed_stdout_ends_the_command_quietly(
    address: str, dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    llm.default = by_task
    async with run_worker(client, runtime) as task_queue:
        handle = await start_agent(client, task_queue, id_prefix="piped", task="answer me")
        await handle.result()
        env = cli_env(address, task_queue)
        command = f"{sys.executable} {ROOT / 'starter.py'}"

        def shell(pipeline: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["bash", "-c", pipeline], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30
            )

        head = await asyncio.to_thread(shell, f"{command} watch {handle.id} | head -1")
        # `true` has exited before the starter prints: its first write fails (EPIPE).
        closed = await asyncio.to_thread(shell, f"{command} watch {handle.id} | true; exit ${{PIPESTATUS[0]}}")
        listed = await asyncio.to_thread(shell, f"{command} list | true; exit ${{PIPESTATUS[0]}}")
    clean(head)
    assert head.returncode == 0 and head.stderr == "", head.stderr
    assert len(head.stdout.splitlines()) == 1 and "started" in head.stdout
    for result in (closed, listed):
        clean(result)
        assert result.returncode == 0 and result.stderr == "", result.stderr


async def test_scripted_demo_says_the_task_is_not_read(
    address: str, dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    named = await asyncio.to_thread(starter, cli_env(address), "run", "x", "--model", "scripted:demo", "--json")
    one_line(named, 0, "note: scripted:demo is the offline demo model: the task is not read by a real model")
    await dev_env.client.get_workflow_handle(json.loads(named.stdout)["workflow_id"]).terminate("test over")

    # The worker's default model: the starter learns it from the run.
    async with run_worker(dev_env.client, with_settings(runtime, model="scripted:demo")) as task_queue:
        env = cli_env(address, task_queue)
        waited = await asyncio.to_thread(starter, env, "run", "hello", "--tools", "http_request", "--wait")
        followed = await asyncio.to_thread(starter, env, "run", "hello", "--tools", "http_request", "--follow")
    for result in (waited, followed):
        one_line(result, 0, "the task is not read by a real model, it plays a fixed demo plan")
        assert "status: completed" in result.stdout
    assert "model: scripted:demo" in followed.stdout
