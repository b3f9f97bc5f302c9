"""``starter.py serve``: the HTTP API and the approval inbox (``durable_agents/api``) over this Temporal.

Without ``AGENT_API_TOKENS_FILE`` it refuses to start, unless ``--insecure-local``: then every request
is a local admin and it listens on 127.0.0.1 only, whatever ``--host`` says.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from temporalio.client import Client

from activities.settings import Settings
from durable_agents import logs
from durable_agents.cli.codec import port_number
from durable_agents.cli.common import EXIT_OK, EXIT_USAGE, CliError
from durable_agents.streaming import DeltaReader

LOCAL_HOST = "127.0.0.1"


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "serve",
        help="serve the HTTP API and the approval inbox (tenant tokens: AGENT_API_TOKENS_FILE)",
        description="The HTTP API (/v1/..., /openapi.json) and the approval inbox (/) over this Temporal. "
        "Requests need a bearer token listed in AGENT_API_TOKENS_FILE.",
    )
    parser.add_argument("--port", type=port_number, default=None, help="default AGENT_API_PORT (8080); 0: any")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument(
        "--insecure-local",
        action="store_true",
        help="no tokens file: every request is a local admin, listening on 127.0.0.1 only",
    )


async def cmd_serve(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    from activities.extras import require

    for module in ("fastapi", "uvicorn"):
        require(module, "server", "the HTTP API")
    from durable_agents.agent_client import AgentClient
    from durable_agents.api.app import bind, create_app, server
    from durable_agents.api.tokens import TokenError, TokenRegistry

    api = settings.api
    host = args.host
    tokens: TokenRegistry | None = None
    if api.tokens_file:
        try:
            tokens = TokenRegistry(api.tokens_file)
        except TokenError as exc:
            raise CliError(str(exc), code=EXIT_USAGE) from None
    elif args.insecure_local:
        host = LOCAL_HOST
    else:
        raise CliError(
            "no AGENT_API_TOKENS_FILE: set it to the tenant tokens, or pass --insecure-local to serve "
            "127.0.0.1 without tokens",
            code=EXIT_USAGE,
        )
    port = api.port if args.port is None else args.port
    logs.configure(settings.observability.log_level, secrets=settings.secret_values())
    try:  # the streamed model text, beside the workers' run store (the same AGENT_STORE_URL)
        deltas: DeltaReader | None = DeltaReader.from_settings(settings)
    except Exception as exc:  # the events endpoints still serve progress and whole replies
        print(f"warning: no streamed text: the run store cannot be read ({type(exc).__name__})", file=sys.stderr)
        deltas = None
    agents = AgentClient(
        client,
        task_queue=settings.task_queue,
        approval_key=settings.approval_key,
        store_url=settings.store_url,
        deltas=deltas,
    )
    app = create_app(
        agents,
        tokens=tokens,
        local_reviewer=settings.reviewer,
        max_body_bytes=api.max_body_bytes,
        rate_per_minute=api.rate_per_minute,
        ui_url=settings.temporal.ui_url,
        namespace=settings.temporal.namespace,
    )
    try:
        sock = bind(host, port)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", code=EXIT_USAGE) from None
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(
        f"API on http://{shown}:{bound_port} (tokens {api.tokens_file or 'none: local admin only'}; bodies up to "
        f"{api.max_body_bytes} bytes; {api.rate_per_minute} requests a minute a token)",
        flush=True,
    )
    web = server(app)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(web, "should_exit", True))
    try:
        await web.serve(sockets=[sock])
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        sock.close()
        if deltas is not None:
            await deltas.close()
    print("API stopped", file=sys.stderr, flush=True)
    return EXIT_OK
