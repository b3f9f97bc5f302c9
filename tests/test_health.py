"""``AGENT_HEALTH_PORT``: /healthz answers while the loop does, /readyz only while the worker polls."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import ExtensionSettings, Settings, WorkerSettings
from durable_agents import health
from durable_agents.health import WorkerHealth
from tests.conftest import start_agent
from tests.fakes import slow_tools
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from worker import build_worker

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def raw(port: int, data: bytes) -> bytes:
    """Send ``data`` as it is and read the whole answer (the server closes after one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, Any]]:
    answer = await raw(port, f"{method} {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, (json.loads(body) if body else {})


async def wait_for_status(port: int, path: str, status: int) -> dict[str, Any]:
    """The body of ``path`` once it answers ``status``."""

    async def answered() -> tuple[dict[str, Any]] | None:
        try:
            code, body = await get(port, path)
        except OSError as exc:
            raise AssertionError(f"not listening: {exc}") from None
        assert code == status, (code, body)
        return (body,)

    found: dict[str, Any] = (await eventually(answered, f"{path} answers {status}", every_s=0.1))[0]
    return found


def with_health(settings: Settings, port: int, **changes: Any) -> Settings:
    return replace(settings, worker=WorkerSettings(health_port=port), **changes)


async def test_ready_while_polling_not_ready_once_shutdown_begins(
    dev_env: WorkflowEnvironment, settings: Settings, llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slow_tools, "SLOW_S", 4.0)  # an activity in flight keeps the worker draining
    port = free_port()
    tools = ExtensionSettings(tool_modules=(*settings.extensions.tool_modules, "tests.fakes.slow_tools"))
    runtime = Runtime.from_settings(with_health(settings, port, extensions=tools))
    task_queue = f"health-{uuid.uuid4().hex[:8]}"
    worker = build_worker(dev_env.client, runtime, task_queue=task_queue)
    run = asyncio.create_task(worker.run())
    try:
        body = await wait_for_status(port, "/readyz", 200)
        assert body == {"status": "ready", "task_queue": task_queue, "polling": True}
        assert await get(port, "/healthz") == (200, {"status": "ok", "task_queue": task_queue, "polling": True})
        assert (await get(port, "/readyz", "HEAD"))[0] == 200
        assert (await get(port, "/readyz?verbose=1"))[0] == 200

        llm.enqueue(Scripted(tool_calls=[("slow_lookup", '{"key": "k"}')]), Scripted(text="done"))
        handle = await start_agent(dev_env.client, task_queue, tools=["slow_lookup"])

        async def slow_tool_started() -> bool:
            return bool((await handle.describe()).raw_description.pending_activities)

        await eventually(slow_tool_started, "the slow tool starts")

        shutdown = asyncio.create_task(worker.shutdown())
        body = await wait_for_status(port, "/readyz", 503)
        assert body == {"status": "not_ready", "task_queue": task_queue, "polling": False}
        assert not shutdown.done(), "the drain was over before readiness was asked: the test proves nothing"
        assert await get(port, "/healthz") == (200, {"status": "ok", "task_queue": task_queue, "polling": False})
        await shutdown
        await run
    finally:
        if not run.done():
            await worker.shutdown()
        await runtime.aclose()
    with pytest.raises(OSError):  # the server stopped with the worker
        await get(port, "/healthz")


async def test_other_paths_methods_and_bad_requests(dev_env: WorkflowEnvironment, settings: Settings) -> None:
    port = free_port()
    runtime = Runtime.from_settings(with_health(settings, port))
    worker = build_worker(dev_env.client, runtime, task_queue=f"health-{uuid.uuid4().hex[:8]}")
    try:
        async with worker:
            await wait_for_status(port, "/readyz", 200)
            assert (await get(port, "/"))[0] == 404
            assert (await get(port, "/healthz/x"))[0] == 404
            assert (await get(port, "/metrics"))[0] == 404
            assert (await get(port, "/healthz", "POST"))[0] == 405
            for junk in (
                b"\x00\x01\x02 garbage\r\n\r\n",
                b"GET\r\n\r\n",
                b"GET healthz HTTP/1.1\r\n\r\n",
                b"GET /healthz SMTP/1.0\r\n\r\n",
                b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
                b"GET /healthz HTTP/1.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
            ):
                assert (await raw(port, junk)).startswith(b"HTTP/1.1 400 "), junk[:40]
            # A client that connects and leaves, or sends half a request and leaves.
            for partial in (b"", b"GET /readyz HT"):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(partial)
                writer.close()
            # Still answering, still ready.
            assert (await get(port, "/readyz"))[0] == 200
            assert (await get(port, "/healthz"))[0] == 200
    finally:
        await runtime.aclose()


class FakeWorker:
    """Just what ``WorkerHealth`` reads of a ``Worker``."""

    def __init__(self) -> None:
        self.is_running = True
        self.is_shutdown = False
        self._shutdown_event = asyncio.Event()

    def config(self) -> dict[str, Any]:
        return {"task_queue": "q"}


async def test_readiness_follows_the_temporal_connection_check(monkeypatch: pytest.MonkeyPatch) -> None:
    results: list[bool | Exception] = [True, RuntimeError("connection refused"), False, True]

    async def check() -> bool:
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    fake = FakeWorker()
    state = WorkerHealth(fake, check=check)  # type: ignore[arg-type]
    assert not state.polling, "no check has succeeded yet"
    assert await state.check_once() and state.polling
    assert not await state.check_once() and not state.polling and "connection refused" in state.last_error
    assert not await state.check_once() and not state.polling  # NOT_SERVING
    assert await state.check_once() and state.polling
    monkeypatch.setattr(health, "STALE_AFTER_S", 0.0)  # the last good check is too old
    assert not state.polling
    monkeypatch.setattr(health, "STALE_AFTER_S", 30.0)
    fake._shutdown_event.set()
    assert not state.polling and state.answer("/readyz")[0] == 503 and state.answer("/healthz")[0] == 200


async def test_a_bound_port_stops_the_worker_with_one_line(dev_env: WorkflowEnvironment, settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runtime = Runtime.from_settings(with_health(settings, port))
        worker = build_worker(dev_env.client, runtime, task_queue=f"health-{uuid.uuid4().hex[:8]}")
        try:
            with pytest.raises(Exception, match=f"AGENT_HEALTH_PORT={port}: cannot listen"):
                await worker.run()
        finally:
            await runtime.aclose()


def test_worker_process_serves_health_with_its_settings(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    """``worker.py`` itself: the health port and the AGENT_MAX_* settings reach the worker; SIGTERM unreadies it."""
    port = free_port()
    task_queue = f"health-proc-{uuid.uuid4().hex[:8]}"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "AGENT_STATE_DIR": str(tmp_path / "agent"),
        "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "AGENT_TASK_QUEUE": task_queue,
        "AGENT_HEALTH_PORT": str(port),
        "AGENT_MAX_CACHED_WORKFLOWS": "7",
        "AGENT_MAX_CONCURRENT_ACTIVITIES": "9",
        "AGENT_MAX_CONCURRENT_WORKFLOW_TASKS": "5",
        "AGENT_REAP_INTERVAL_S": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "worker.py")], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        body = asyncio.run(wait_for_status(port, "/readyz", 200))
        assert body == {"status": "ready", "task_queue": task_queue, "polling": True}
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    events = [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]
    started = next(e for e in events if e.get("event") == "worker_started")
    assert started["health_port"] == port
    assert (started["max_cached_workflows"], started["max_concurrent_activities"]) == (7, 9)
    assert started["max_concurrent_workflow_tasks"] == 5
