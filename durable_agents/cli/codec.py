"""``starter.py codec-server``: decode encrypted payloads for the Temporal UI and CLI (no Temporal connection)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from activities.settings import Settings
from durable_agents import logs
from durable_agents.cli.common import EXIT_OK, EXIT_USAGE, CliError

DEFAULT_PORT = 8081


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return value


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "codec-server",
        help="serve Temporal's remote codec protocol (/encode, /decode) with AGENT_PAYLOAD_KEYS",
        description="Decrypt payloads for the Temporal UI (--ui-codec-endpoint) and CLI (--codec-endpoint). "
        "Browser origins: AGENT_CODEC_CORS_ORIGINS; bearer token: AGENT_CODEC_TOKEN.",
    )
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")


async def cmd_codec_server(args: argparse.Namespace, settings: Settings) -> int:
    enc = settings.encryption
    if enc.keyring is None:
        raise CliError(
            "the codec server needs the key ring: set AGENT_PAYLOAD_KEYS or AGENT_PAYLOAD_KEYS_FILE", code=EXIT_USAGE
        )
    from activities.extras import require

    for module in ("starlette", "uvicorn"):
        require(module, "server", "the codec server")
    from durable_agents.codec_server import MAX_BODY_BYTES, bind, build_app, serve

    logs.configure(settings.observability.log_level, secrets=settings.secret_values())
    token = enc.codec_token.get_secret_value() if enc.codec_token is not None else ""
    app = build_app(
        enc.keyring,
        token=token,
        origins=enc.codec_origins,
        max_payloads=enc.codec_max_payloads,
        deadline_s=enc.codec_deadline_s,
    )
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", code=EXIT_USAGE) from None
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"codec server on http://{shown}:{port} (keys {', '.join(enc.keyring.ids)}; encrypts with "
        f"{enc.keyring.primary}; token {'required' if token else 'not required'}; "
        f"CORS origins {', '.join(enc.codec_origins) or 'none'}; bodies up to {MAX_BODY_BYTES} bytes and "
        f"{enc.codec_max_payloads} payloads; deadline {enc.codec_deadline_s:g} s)",
        flush=True,
    )
    await serve(app, sock)
    print("codec server stopped", file=sys.stderr, flush=True)
    return EXIT_OK
