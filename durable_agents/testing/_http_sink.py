"""A real HTTP server on 127.0.0.1 standing in for a tool destination; it records every request."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class HttpSink:
    """Answers every request with ``{"ok": true, "n": <request number>}`` and records it."""

    received: list[Received] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    delay_s: float = 0.0  # how long each request is held (after it is recorded) before the answer

    def __enter__(self) -> HttpSink:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                sink.received.append(
                    Received(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                n = len(sink.received)
                if sink.delay_s > 0:
                    time.sleep(sink.delay_s)
                payload = json.dumps({"ok": True, "n": n}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def writes(self) -> list[Received]:
        return [r for r in self.received if r.method not in ("GET", "HEAD")]
