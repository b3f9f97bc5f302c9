"""One structured log line per request: method, path, status, tenant, duration. Never a body, a query
string (an ``?after=`` cursor is harmless, but a client may put anything there) or a header."""

from __future__ import annotations

import time

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = structlog.get_logger("api")


class AccessLog:
    """ASGI middleware; the tenant is the one the request's token resolved to (``scope["state"]["tenant"]``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 0

        async def recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording)
        finally:
            state = scope.get("state") or {}
            log.info(
                "api.request",
                method=scope["method"],
                path=scope["path"][:300],
                status=status or 499,  # 499: the client went away before an answer
                tenant=state.get("tenant", ""),
                duration_ms=round((time.monotonic() - started) * 1000, 1),
            )
