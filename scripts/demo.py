"""``make demo``: one real, offline agent run through the public path.

Serves a small JSON endpoint on 127.0.0.1, starts ``worker.py`` allowed to reach
only that endpoint, runs ``starter.py run ... --follow`` with the deterministic
``scripted:demo`` model (it writes and runs Python in the sandbox, then GETs the
endpoint), prints the answer, the run id and its Temporal UI link, and stops the
worker. The dev server keeps running so the link works (``make stop`` ends it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


class InventoryHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"service": "inventory", "sku": "DA-42", "in_stock": 17, "warehouse": "ams-1"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), InventoryHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/inventory/DA-42"
    queue = f"agents-demo-{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "AGENT_MODEL": os.environ.get("DEMO_MODEL", "scripted:demo"),
        "AGENT_HTTP_ALLOW": f"127.0.0.1:{port}",
        "AGENT_TASK_QUEUE": queue,
        "AGENT_LOG_LEVEL": os.environ.get("AGENT_LOG_LEVEL", "WARNING"),
    }
    worker = subprocess.Popen([PY, str(ROOT / "worker.py")], cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    started = time.monotonic()
    try:
        task = f"Compute some prime statistics in the sandbox, then check the stock level at {url}."
        print(f"demo: task queue {queue}, local endpoint {url}\n")
        rc = subprocess.call([PY, str(ROOT / "starter.py"), "run", task, "--follow"], cwd=ROOT, env=env)
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
