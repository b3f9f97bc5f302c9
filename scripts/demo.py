"""``make demo``: one real, offline agent run through the public path.

Serves a small inventory API on 127.0.0.1, starts ``worker.py`` allowed to reach
only that API, and runs ``starter.py run ... --follow`` with the deterministic
``scripted:demo`` model: it writes and runs Python in the sandbox, GETs the
stock level, then asks to POST a reservation. Policy pauses that write for a
human; the demo's approver answers through the public path (``starter.py
pending`` / ``starter.py approve``), the POST goes out with its
``Idempotency-Key``, and the run finishes. The demo prints the answer, the run
id and its Temporal UI link, and stops the worker. The dev server keeps running
so the link works (``make stop`` ends it).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from activities.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


class InventoryHandler(BaseHTTPRequestHandler):
    def _send(self, status: int, payload: dict[str, object]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, {"service": "inventory", "sku": "DA-42", "in_stock": 17, "warehouse": "ams-1"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("Idempotency-Key", "")
        self._send(201, {"reservation": "R-0001", "sku": "DA-42", "quantity": 1, "idempotency_key": key})

    def log_message(self, format: str, *args: object) -> None:
        pass


def approve_when_asked(run_id: str, env: dict[str, str]) -> None:
    """Play the human reviewer: wait for the approval request, then approve it with the starter."""
    starter = [PY, str(ROOT / "starter.py")]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        out = subprocess.run([*starter, "pending", run_id, "--json"], cwd=ROOT, env=env, capture_output=True, text=True)
        waiting = json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []
        if waiting:
            time.sleep(1.0)  # let the reader see the pause
            print(f"\n[demo approver] approving {waiting[0]['approval_id']} with starter.py approve", flush=True)
            subprocess.run(
                [
                    *starter,
                    "approve",
                    run_id,
                    waiting[0]["approval_id"],
                    "--reviewer",
                    "demo-approver",
                    "--comment",
                    "approved by make demo",
                ],
                cwd=ROOT,
                env=env,
            )
            return
        time.sleep(0.3)


def main() -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), InventoryHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/inventory/DA-42"
    queue = f"agents-demo-{uuid.uuid4().hex[:6]}"
    settings = Settings.from_env()
    env = {
        **settings.environ,
        "AGENT_MODEL": settings.variable("DEMO_MODEL", "scripted:demo"),
        "AGENT_HTTP_ALLOW": f"127.0.0.1:{port}",
        "AGENT_TASK_QUEUE": queue,
        "AGENT_LOG_LEVEL": settings.variable("AGENT_LOG_LEVEL", "WARNING"),
    }
    worker = subprocess.Popen([PY, str(ROOT / "worker.py")], cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    started = time.monotonic()
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    approver = threading.Thread(target=approve_when_asked, args=(run_id, env), daemon=True)
    try:
        task = f"Compute some prime statistics in the sandbox, check the stock level at {url} and reserve one unit."
        print(f"demo: task queue {queue}, local inventory API {url}\n")
        approver.start()
        rc = subprocess.call(
            [PY, str(ROOT / "starter.py"), "run", task, "--id", run_id, "--follow"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,  # not a terminal: the follower prints the approve commands instead of asking
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
        server.shutdown()
    print(
        f"demo finished in {time.monotonic() - started:.1f} s with exit code {rc}; worker stopped. "
        "The dev server is still up for the UI link; `make stop` stops it."
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
