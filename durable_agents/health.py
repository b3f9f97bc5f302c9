"""Liveness and readiness of a worker process over HTTP (``AGENT_HEALTH_PORT``).

``GET /healthz`` (liveness) answers 200 whenever the process's event loop
answers at all: a worker whose loop is blocked or dead gets no answer, and the
orchestrator restarts it.

``GET /readyz`` (readiness) answers 200 only while the worker is polling:

- the Temporal worker has started (``Worker.is_running``: its pollers run),
- its shutdown has not begun (from SIGTERM on, while in-flight tasks drain, it
  answers 503; the SDK has no public flag for this, so the worker's shutdown
  event is read, see :func:`shutdown_requested`), and
- the last Temporal connection check succeeded less than ``STALE_AFTER_S``
  ago: every ``CHECK_INTERVAL_S`` the worker asks the frontend's gRPC health
  service (``client.service_client.check_health()``, one cheap unary call on
  the worker's own connection). A frontend that stops answering turns the
  worker unready within ``STALE_AFTER_S``.

Otherwise 503. Both answer ``{"status": ..., "task_queue": ..., "polling": bool}``;
``HEAD`` is answered like ``GET``, other methods get 405 and other paths 404.
The server binds ``0.0.0.0`` (probes come from outside the container); it speaks
just enough HTTP/1.x for probes: one request per connection, then it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import structlog
from temporalio.worker import Worker

from activities.settings import ConfigurationError

log = structlog.get_logger("health")

CHECK_INTERVAL_S = 10.0  # how often the Temporal connection is checked
CHECK_TIMEOUT_S = 5.0  # one check's deadline
STALE_AFTER_S = 30.0  # a worker whose last good check is older than this is not ready
READ_TIMEOUT_S = 5.0  # a client that sends no complete request head within this is dropped
MAX_LINE = 8 * 1024  # longest request line or header line
MAX_HEADERS = 100

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def shutdown_requested(worker: Worker) -> bool:
    """Whether ``worker.shutdown()`` was called (also by leaving ``async with worker``), complete or not.

    ``Worker.is_shutdown`` only turns true once the drain has finished; the event that
    ``shutdown()`` sets first is private (``_shutdown_event``, temporalio 1.35), so it is read
    defensively. tests/test_health.py fails if an SDK upgrade renames it.
    """
    event = getattr(worker, "_shutdown_event", None)
    return worker.is_shutdown or (isinstance(event, asyncio.Event) and event.is_set())


class WorkerHealth:
    """The readiness of one worker: its running state plus periodic Temporal connection checks."""

    def __init__(self, worker: Worker, *, check: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.worker = worker
        self.task_queue: str = worker.config().get("task_queue", "")
        self._check = check or self._check_temporal
        self.last_ok: float | None = None  # time.monotonic() of the last successful check
        self.last_error = ""

    async def _check_temporal(self) -> bool:
        client = self.worker.client
        return await client.service_client.check_health(timeout=timedelta(seconds=CHECK_TIMEOUT_S))

    async def check_once(self) -> bool:
        try:
            ok = await asyncio.wait_for(self._check(), CHECK_TIMEOUT_S + 1)
        except Exception as exc:  # any failure means "not reachable": report it, keep checking
            ok, error = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        else:
            error = "" if ok else "Temporal frontend reports NOT_SERVING"
        if ok:
            if self.last_error:
                log.info("temporal_reachable_again")
            self.last_ok, self.last_error = time.monotonic(), ""
        elif error != self.last_error:
            log.warning("temporal_check_failed", error=error)
            self.last_error = error
        return ok

    async def check_forever(self, interval_s: float = CHECK_INTERVAL_S) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(interval_s)

    @property
    def connected(self) -> bool:
        return self.last_ok is not None and not self.last_error and time.monotonic() - self.last_ok < STALE_AFTER_S

    @property
    def polling(self) -> bool:
        return self.worker.is_running and not shutdown_requested(self.worker) and self.connected

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        polling = self.polling
        if path == "/healthz":
            return 200, {"status": "ok", "task_queue": self.task_queue, "polling": polling}
        if path == "/readyz":
            code, status = (200, "ready") if polling else (503, "not_ready")
            return code, {"status": status, "task_queue": self.task_queue, "polling": polling}
        return 404, {"status": "not_found", "task_queue": self.task_queue, "polling": polling}


class HealthServer:
    """``/healthz`` and ``/readyz`` for one worker on ``host:port``, with the connection checks running."""

    def __init__(self, health: WorkerHealth, port: int, host: str = "0.0.0.0") -> None:
        self.health, self.port, self.host = health, port, host
        self._server: asyncio.Server | None = None
        self._checks: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_LINE)
        except OSError as exc:
            raise ConfigurationError(f"AGENT_HEALTH_PORT={self.port}: cannot listen on {self.host}: {exc}") from None
        if self.port == 0:  # tests ask for any free port
            self.port = self._server.sockets[0].getsockname()[1]
        self._checks = asyncio.create_task(self.health.check_forever(), name="health-checks")
        log.info("health_listening", port=self.port)

    async def stop(self) -> None:
        if self._checks is not None:
            self._checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checks
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            code, body, head_only = await asyncio.wait_for(self._request(reader), READ_TIMEOUT_S)
            if code:
                await self._respond(writer, code, body, head_only=head_only)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away or never finished its request: nothing to answer
        except Exception as exc:  # a probe server must never die of one bad request
            log.warning("health_request_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _request(self, reader: asyncio.StreamReader) -> tuple[int, dict[str, Any], bool]:
        """The answer to one request: (status, body, HEAD?); status 0 when there is nothing to answer."""
        bad: tuple[int, dict[str, Any], bool] = (400, {"status": "bad_request"}, False)
        try:
            line = await reader.readline()
        except ValueError:  # a line longer than MAX_LINE
            return bad
        if not line:
            return 0, {}, False
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
            return bad
        for _ in range(MAX_HEADERS + 1):
            try:
                header = await reader.readline()
            except ValueError:
                return bad
            if header in (b"\r\n", b"\n", b""):
                break
        else:
            return bad
        method, path = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, {"status": "method_not_allowed"}, False
        code, body = self.health.answer(path)
        return code, body, method == "HEAD"

    async def _respond(self, writer: asyncio.StreamWriter, code: int, body: dict[str, Any], *, head_only: bool) -> None:
        payload = json.dumps(body).encode()
        head = (
            f"HTTP/1.1 {code} {_REASONS[code]}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n"
            "Cache-Control: no-store\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        writer.write(head if head_only else head + payload)
        await writer.drain()
