"""The FastAPI application of ``starter.py serve``: routes, error mapping, limits, access log, the inbox.

The app keeps no state about runs: every answer comes from Temporal through ``AgentClient``, so any
number of processes serve the same runs, approvals and event streams.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Generator
from importlib import resources
from typing import Annotated

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel

from durable_agents.agent_client import (
    AgentClient,
    AgentClientError,
    DecisionRefused,
    InvalidSchedule,
    NoAnswer,
    NoSuchStep,
    NotAnAgentRun,
    RunExists,
    RunNotFound,
    RunNotOpen,
    ScheduleExists,
    ScheduleNotFound,
)
from durable_agents.api import routes_approvals, routes_runs, routes_schedules
from durable_agents.api.access_log import AccessLog
from durable_agents.api.auth import ApiState, Caller, caller
from durable_agents.api.fanout import Fanout
from durable_agents.api.limits import BodyLimit, RateLimiter
from durable_agents.api.tokens import Token, TokenRegistry, local_token
from durable_agents.version import package_version

INBOX_FILES = {"inbox.js": "text/javascript", "inbox.css": "text/css"}
# What a client error of AgentClient is over HTTP; anything else it raises is a 400 with its line.
STATUS_OF: tuple[tuple[type[AgentClientError], int], ...] = (
    (RunNotFound, 404),
    (NotAnAgentRun, 404),
    (RunExists, 409),
    (DecisionRefused, 409),
    (RunNotOpen, 409),
    (NoSuchStep, 409),  # the run has not (or no longer has) that step: its state, not the request's form
    (ScheduleNotFound, 404),
    (ScheduleExists, 409),
    (InvalidSchedule, 400),
    (NoAnswer, 503),
)


class Me(BaseModel):
    """``GET /v1/me``: what the inbox shows about its token and where the Temporal UI is."""

    tenant: str
    reviewer: str
    roles: list[str]
    ui_url: str
    namespace: str


def create_app(
    client: AgentClient,
    *,
    tokens: TokenRegistry | None,
    local_reviewer: str = "local",
    max_body_bytes: int = 1024 * 1024,
    rate_per_minute: int = 600,
    ui_url: str = "",
    namespace: str = "default",
) -> FastAPI:
    """The API over ``client`` (unscoped; each request scopes it to its token's tenant).

    ``tokens`` None serves every request as a local admin: only for ``--insecure-local`` on 127.0.0.1.
    """
    app = FastAPI(
        title="Durable Agents API",
        version=package_version(),
        description="Start, fork and rewind runs, send session messages, follow events, decide approvals, "
        "manage schedules. "
        "Every /v1 route needs `Authorization: Bearer <token>`.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.api = ApiState(
        client=client,
        tokens=tokens,
        local=local_token(local_reviewer),
        limiter=RateLimiter(rate_per_minute),
        fanout=Fanout(client),
        ui_url=ui_url.rstrip("/"),
        namespace=namespace,
    )
    app.include_router(routes_runs.router)
    app.include_router(routes_approvals.router)
    app.include_router(routes_schedules.router)

    @app.exception_handler(AgentClientError)
    async def client_error(request: Request, exc: AgentClientError) -> Response:
        status = next((code for kind, code in STATUS_OF if isinstance(exc, kind)), 400)
        return JSONResponse({"detail": str(exc)[:2000]}, status_code=status)

    @app.get("/v1/me", response_model=Me)
    async def me(who: Annotated[Caller, Depends(caller)], request: Request) -> Me:
        api: ApiState = request.app.state.api
        return Me(
            tenant=who.token.tenant,
            reviewer=who.token.reviewer,
            roles=list(who.token.roles),
            ui_url=api.ui_url,
            namespace=api.namespace,
        )

    @app.get("/", include_in_schema=False)
    async def inbox() -> HTMLResponse:
        return HTMLResponse(_inbox_file("index.html"), headers=_page_headers())

    @app.get("/inbox/{name}", include_in_schema=False)
    async def inbox_asset(name: str) -> Response:
        if name not in INBOX_FILES:
            return JSONResponse({"detail": "not found"}, status_code=404)
        return Response(_inbox_file(name), media_type=INBOX_FILES[name], headers=_page_headers())

    # Outermost first: the access log sees every answer, 413s included.
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(AccessLog)
    return app


def _inbox_file(name: str) -> str:
    return resources.files("durable_agents.api").joinpath("inbox", name).read_text(encoding="utf-8")


def _page_headers() -> dict[str, str]:
    # The page talks only to this origin and runs only its own script: a reviewer's token stays here.
    return {
        "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``OSError`` when it cannot be bound)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
    except OSError:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the caller stops it through ``should_exit``."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def server(app: FastAPI) -> uvicorn.Server:
    """A uvicorn server for ``app`` (``await server.serve(sockets=[sock])``; stop it with ``should_exit``)."""
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="off", server_header=False, timeout_graceful_shutdown=5
    )
    return _Server(config)


__all__ = ["Token", "TokenRegistry", "bind", "create_app", "server"]
