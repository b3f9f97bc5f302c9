"""Request limits: bodies over a size are 413 (before the app reads them); each token gets a request rate (429).

The rate limit is per API process (a token bucket per token digest, in memory): with N replicas behind a
load balancer a token gets at most N times the rate. It keeps the API stateless, which is what lets
several processes serve the same runs; a shared limit belongs in the load balancer.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BUCKETS = 100_000  # tokens tracked at once; the least recently seen is dropped first


class BodyLimit:
    """ASGI middleware: a request body larger than ``limit`` bytes is answered 413 and never reaches the app.

    The body is read (up to the limit) before the app runs, so a declared ``Content-Length`` over the limit
    and a chunked body that grows past it both get the same answer, and nothing half-processed is left.
    """

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await too_large(send, self.limit)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await too_large(send, self.limit)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)


async def too_large(send: Send, limit: int) -> None:
    await respond(send, 413, {"detail": f"request body larger than {limit} bytes"})


async def respond(send: Send, status: int, body: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": data})


class RateLimiter:
    """A token bucket per key: ``per_minute`` requests a minute, in bursts of up to ``burst``."""

    def __init__(self, per_minute: int, *, burst: int | None = None) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(burst if burst is not None else max(1, per_minute // 6))
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: str, now: float | None = None) -> float:
        """0 when the request may go on; otherwise the seconds until one would be allowed."""
        now = time.monotonic() if now is None else now
        with self._lock:
            level, last = self._buckets.pop(key, (self.burst, now))
            level = min(self.burst, level + (now - last) * self.rate)
            if level >= 1.0:
                self._buckets[key] = (level - 1.0, now)
                wait = 0.0
            else:
                self._buckets[key] = (level, now)
                wait = (1.0 - level) / self.rate
            while len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        return wait


def retry_after(wait: float) -> str:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait)))
