"""The remote codec server for the Temporal UI and CLI: ``starter.py codec-server``.

It speaks Temporal's remote codec protocol: ``POST /encode`` and ``POST /decode``
take and return ``{"payloads": [{"metadata": {name: base64}, "data": base64}]}``
(the JSON form of ``temporal.api.common.v1.Payloads``), with the namespace in the
``X-Namespace`` header. Decoding uses the worker's key ring
(``AGENT_PAYLOAD_KEYS``), so the UI (``--ui-codec-endpoint``) and
``temporal workflow show --codec-endpoint`` show encrypted runs as plaintext.

- **CORS** for the browser origins in ``AGENT_CODEC_CORS_ORIGINS`` (default the
  dev server's UI, ``http://localhost:8233`` and ``http://127.0.0.1:8233``),
  preflight included (``Authorization``, ``X-Namespace``, ``Content-Type``).
- **A bearer token** when ``AGENT_CODEC_TOKEN`` is set: requests without
  ``Authorization: Bearer <token>`` get 401.
- **Bounded bodies**: over ``MAX_BODY_BYTES`` is 413, and so is a request of more than
  ``AGENT_CODEC_MAX_PAYLOADS`` payloads (default 10,000).
- **Off the event loop, with a deadline**: parsing, decoding and serializing run in
  ``DEFAULT_SLOTS`` worker threads (:mod:`durable_agents.codec_work`), and bodies up to
  ``QUICK_BODY_BYTES`` in threads of their own, so a small request is answered while large
  ones are decoded; a request not done within
  ``AGENT_CODEC_DEADLINE_S`` (default 10 s, waiting for a thread included) is 503/504 and
  its work is abandoned at the next payload.
- A payload the ring cannot decrypt is 400 naming the key id, never a crash.
- Nothing decoded is written anywhere: one log line per request with its path,
  namespace, payload count and status, never a payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Generator, Sequence

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payload

from activities.crypto.codec import AesGcmCodec
from activities.crypto.keyring import KeyRing
from durable_agents.codec_work import (
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_PAYLOADS,
    DEFAULT_SLOTS,
    CodecPool,
    CodecRefusal,
    convert_body,
)

MAX_BODY_BYTES = 8 * 1024 * 1024
QUICK_BODY_BYTES = 64 * 1024
CORS_HEADERS = ["Authorization", "X-Namespace", "Content-Type"]
log = structlog.get_logger("codec_server")


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or ``BodyTooLarge`` as soon as it passes ``limit`` bytes (declared or sent)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(
    keyring: KeyRing,
    *,
    token: str = "",
    origins: Sequence[str] = (),
    max_body: int = MAX_BODY_BYTES,
    max_payloads: int = DEFAULT_MAX_PAYLOADS,
    deadline_s: float = DEFAULT_DEADLINE_S,
    slots: int = DEFAULT_SLOTS,
) -> Starlette:
    """The codec server as an ASGI app (served by :func:`serve`; tests call it directly)."""
    codec = AesGcmCodec(keyring)
    # Small bodies have threads of their own, so they never wait behind large ones for a slot.
    quick, large = CodecPool(slots=slots, deadline_s=deadline_s), CodecPool(slots=slots, deadline_s=deadline_s)
    expected = f"Bearer {token}".encode() if token else b""

    def endpoint(name: str, convert_one: Callable[[Payload], Payload]) -> Callable[..., Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            began = time.perf_counter()
            namespace = request.headers.get("x-namespace", "")[:200]
            count = 0
            status = 200
            try:
                if expected and not hmac.compare_digest(request.headers.get("authorization", "").encode(), expected):
                    status = 401
                    return JSONResponse(
                        {"error": "a bearer token is required"}, 401, headers={"WWW-Authenticate": "Bearer"}
                    )
                try:
                    body = await read_body(request, max_body)
                except BodyTooLarge:
                    status = 413
                    return JSONResponse({"error": f"the body is over {max_body} bytes"}, 413)
                try:
                    pool = quick if len(body) <= QUICK_BODY_BYTES else large
                    answer, count = await pool.run(
                        lambda abandon: convert_body(body, convert_one, max_payloads, abandon)
                    )
                except CodecRefusal as refusal:
                    status, count = refusal.status, refusal.count
                    return JSONResponse({"error": refusal.message}, refusal.status)
                return Response(answer, media_type="application/json")
            finally:
                log.info(
                    "codec_request",
                    path=name,
                    namespace=namespace,
                    payloads=count,
                    status=status,
                    ms=round((time.perf_counter() - began) * 1000, 1),
                )

        return handle

    return Starlette(
        routes=[
            Route("/encode", endpoint("/encode", codec.encode_one), methods=["POST"]),
            Route("/decode", endpoint("/decode", codec.decode_one), methods=["POST"]),
        ],
        middleware=[
            Middleware(
                CORSMiddleware,
                allow_origins=list(origins),
                allow_methods=["POST", "OPTIONS"],
                allow_headers=CORS_HEADERS,
                allow_credentials=True,
                max_age=600,
            )
        ],
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``OSError`` when it cannot be bound)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (the caller stops it through ``should_exit``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve(app: Starlette, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM, then stop cleanly."""
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", server_header=False)
    server = _Server(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    try:
        await server.serve(sockets=[sock])
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
