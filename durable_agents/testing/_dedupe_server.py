"""A real HTTP server on 127.0.0.1 modelling a payment/order API that dedupes retried writes.

Writes (POST/PUT/PATCH/DELETE) carrying ``Idempotency-Key`` (or ``X-Charge-Key``)
apply their effect once per key: a repeat gets the first response back with
``Idempotent-Replayed: true`` and applies nothing. Writes with neither header
apply every time (the server cannot tell a retry from a new request). Every
request is recorded as a ``Delivery``; every applied write as an ``Effect``.

``GET /charges?key=K`` answers 200 with the effect applied under charge key
``K`` (404 when there is none) — the lookup a ``reconcile`` check uses.

Delays model a slow destination, so that a request can be in flight when its
client is killed: ``delay_before_s`` waits before the effect is applied (a
client killed then never caused it), ``delay_after_s`` waits after the effect
is applied and before the response (the effect happened; the client never
hears). Handlers run in their own threads, so a delayed request never blocks
the others.

    with DedupeServer() as api:
        api.add_delay(after_s=3, method="POST", times=1)
        ...  # POST {api.url}/orders with Idempotency-Key: k1
        api.wait_for(lambda: len(api.writes()) >= 1, timeout=20)
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class Delivery:
    """One request as the server received it."""

    method: str
    path: str
    key: str  # Idempotency-Key, or X-Charge-Key when only that is set; "" when neither
    charge_key: str
    body: bytes
    at: float  # time.time() at receipt
    client_port: int

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True)
class Effect:
    """One applied write: what a real API would have charged, booked or sent."""

    effect_id: str
    key: str  # "" for writes without a key
    charge_key: str
    method: str
    path: str
    body: bytes
    at: float
    response: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class Delay:
    before_s: float = 0.0
    after_s: float = 0.0
    method: str = ""  # "" matches every method
    path_prefix: str = ""
    times: int | None = None  # None: every matching request; n: the next n matching requests

    def matches(self, method: str, path: str) -> bool:
        return (not self.method or self.method == method) and path.startswith(self.path_prefix)


@dataclass
class DedupeServer:
    deliveries: list[Delivery] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    _delays: list[Delay] = field(default_factory=list)
    _by_key: dict[str, Effect] = field(default_factory=dict)
    _by_charge_key: dict[str, Effect] = field(default_factory=dict)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> DedupeServer:
        if self._server is not None:
            return self
        self._stopping.clear()
        server = QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="dedupe-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()  # wakes handlers sleeping on a delay
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> DedupeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("DedupeServer is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # --- configuration and inspection -----------------------------------------------

    def add_delay(
        self,
        *,
        before_s: float = 0.0,
        after_s: float = 0.0,
        method: str = "",
        path_prefix: str = "",
        times: int | None = None,
    ) -> None:
        """Delay matching requests; the first matching rule (in the order added) with uses left applies."""
        with self._cond:
            self._delays.append(Delay(before_s, after_s, method.upper(), path_prefix, times))

    def clear_delays(self) -> None:
        with self._cond:
            self._delays.clear()

    def writes(self, path_prefix: str = "") -> list[Delivery]:
        """Every write delivery (applied or deduped), in arrival order."""
        with self._cond:
            return [d for d in self.deliveries if d.method in WRITE_METHODS and d.path.startswith(path_prefix)]

    def applied(self, path_prefix: str = "") -> list[Effect]:
        with self._cond:
            return [e for e in self.effects if e.path.startswith(path_prefix)]

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` holds (checked after every delivery and effect) or ``timeout`` passes."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout=timeout)

    def summary(self) -> dict[str, int]:
        with self._cond:
            writes = [d for d in self.deliveries if d.method in WRITE_METHODS]
            return {
                "deliveries": len(writes),
                "applied": len(self.effects),
                "deduplicated": len(writes) - len(self.effects),
                "keys": len({d.key for d in writes if d.key}),
            }

    # --- request handling (called from handler threads) -------------------------------

    def _delay_for(self, method: str, path: str) -> Delay:
        with self._cond:
            for rule in self._delays:
                if rule.matches(method, path) and (rule.times is None or rule.times > 0):
                    if rule.times is not None:
                        rule.times -= 1
                    return rule
        return Delay()

    def _receive(self, delivery: Delivery) -> None:
        with self._cond:
            self.deliveries.append(delivery)
            self._cond.notify_all()

    def _apply(self, d: Delivery) -> tuple[Effect, bool]:
        """The effect for this write and whether it was replayed (already applied under its key)."""
        with self._cond:
            earlier = self._by_key.get(d.key) if d.key else None
            if earlier is None and d.charge_key:
                earlier = self._by_charge_key.get(d.charge_key)
            if earlier is not None:
                return earlier, True
            effect_id = f"eff_{len(self.effects) + 1}"
            response = json.dumps(
                {"id": effect_id, "key": d.key, "charge_key": d.charge_key, "path": d.path, "request": d.json()}
            ).encode()
            effect = Effect(effect_id, d.key, d.charge_key, d.method, d.path, d.body, time.time(), response)
            self.effects.append(effect)
            if d.key:
                self._by_key[d.key] = effect
            if d.charge_key:
                self._by_charge_key[d.charge_key] = effect
            self._cond.notify_all()
            return effect, False

    def _lookup_charge(self, key: str) -> Effect | None:
        with self._cond:
            return self._by_charge_key.get(key)

    def _sleep(self, seconds: float) -> bool:
        """Sleep; False when the server is stopping (the handler then drops the connection)."""
        return seconds <= 0 or not self._stopping.wait(seconds)


class QuietServer(ThreadingHTTPServer):
    """Clients that die mid-request (the point of crash tests) are not server errors worth a traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler_for(api: DedupeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if len(body) < length:
                # The client died mid-body (a worker killed while sending): a real server gets a short
                # read, answers nothing and applies nothing; http.server would hand us the fragment.
                self.close_connection = True
                return
            split = urlsplit(self.path)
            idem = self.headers.get("Idempotency-Key", "")
            charge_key = self.headers.get("X-Charge-Key", "")
            delivery = Delivery(
                method=self.command,
                path=split.path,
                key=idem or charge_key,
                charge_key=charge_key,
                body=body,
                at=time.time(),
                client_port=int(self.client_address[1]),
            )
            api._receive(delivery)
            delay = api._delay_for(delivery.method, delivery.path)
            if not api._sleep(delay.before_s):
                self.close_connection = True
                return
            if self.command == "GET" and split.path == "/charges":
                key = parse_qs(split.query).get("key", [""])[0]
                found = api._lookup_charge(key) if key else None
                if found is None:
                    self._send(404, json.dumps({"error": f"no charge with key {key!r}"}).encode(), {})
                else:
                    self._send(200, found.response, {})
                return
            if self.command not in WRITE_METHODS:
                self._send(200, json.dumps({"ok": True, "path": split.path}).encode(), {})
                return
            effect, replayed = api._apply(delivery)
            if not api._sleep(delay.after_s):
                self.close_connection = True
                return
            self._send(200 if replayed else 201, effect.response, {"Idempotent-Replayed": "true"} if replayed else {})

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:  # the client died while we were delaying: nobody is listening any more
                self.close_connection = True

    return Handler
