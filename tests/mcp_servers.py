"""Real MCP servers for tests: our orders server (``tests.fakes.mcp_orders``) and the pinned third-party
``@modelcontextprotocol/server-everything`` (installed by ``make mcp-servers`` into ``.agent/npm``).

    with orders_http(free_port(), ledger) as proc: ...   # http://127.0.0.1:PORT/mcp
    with everything_http(free_port()) as proc: ...
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
EVERYTHING_VERSION = "2026.8.31"  # keep in step with EVERYTHING_VERSION in the Makefile
START_TIMEOUT_S = 20.0


def everything_entry() -> Path:
    return REPO / ".agent/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"


def require_everything() -> list[str]:
    """The ``[node, entry]`` command of server-everything, or skip the test saying how to get it."""
    node = shutil.which("node")
    entry = everything_entry()
    if node is None:
        pytest.skip(
            "node is missing, so @modelcontextprotocol/server-everything cannot run: install Node.js + npm, "
            "then `make mcp-servers`"
        )
    if not entry.is_file():
        why = "npm is missing" if shutil.which("npm") is None else "it is not installed yet"
        pytest.skip(
            f"@modelcontextprotocol/server-everything@{EVERYTHING_VERSION} is not at {entry} ({why}): "
            "install Node.js + npm, then `make mcp-servers`"
        )
    return [node, str(entry)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def orders_stdio_command() -> list[str]:
    return [sys.executable, "-m", "tests.fakes.mcp_orders"]


def orders_env(ledger_path: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "ORDERS_LEDGER": str(ledger_path), **(extra or {})}


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextmanager
def http_server(cmd: list[str], port: int, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` until ``http://127.0.0.1:port/mcp`` accepts connections; stop it on exit.

    stdout is discarded and stderr goes to a temporary file (a pipe nobody reads could fill and block
    the server); that stderr is in the error when the server dies or never comes up."""
    with tempfile.TemporaryFile() as errlog:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errlog
        )

        def stderr() -> str:
            errlog.seek(0)
            return errlog.read().decode(errors="replace")

        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _accepts(port):
                if proc.poll() is not None:
                    raise RuntimeError(f"{cmd} exited with {proc.returncode} before listening:\n{stderr()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{cmd} did not listen on 127.0.0.1:{port} in {START_TIMEOUT_S}s:\n{stderr()}")
                time.sleep(0.05)
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def orders_http(
    port: int, ledger_path: Path, env: dict[str, str] | None = None
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """The orders server on Streamable HTTP (``http://127.0.0.1:port/mcp``), recording into ``ledger_path``."""
    return http_server([*orders_stdio_command(), "--http", str(port)], port, orders_env(ledger_path, env))


def everything_http(port: int) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """server-everything in ``streamableHttp`` mode; it reads its port from ``$PORT`` (default 3001)
    and serves ``/mcp``."""
    return http_server([*require_everything(), "streamableHttp"], port, {**os.environ, "PORT": str(port)})


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/mcp"


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Every record in an orders ledger (none when the file does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
