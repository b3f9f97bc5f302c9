"""``make demo``: one real, offline agent run through the public path.

Serves a small inventory API on 127.0.0.1, starts ``worker.py`` allowed to reach
only that API, and runs ``starter.py run ... --follow`` with the deterministic
``scripted:demo`` model: it writes and runs Python in the sandbox, GETs the
stock level, then asks to POST a reservation. Policy pauses that write for a
human; the demo's approver answers through the public path (``starter.py
pending`` / ``starter.py approve``), the POST goes out with its
``Idempotency-Key``, and the run finishes. The demo prints the answer, the run
id and its Temporal UI link.

Then a session (a conversation, through the Temporal client): it starts one,
sends two messages with the ``send`` update (the second asks to check the stock
again, and the reply compares it with the first), prints each reply and the
session's status, and closes it. The demo stops the worker; the dev server keeps
running so the links work (``make stop`` ends it).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from activities.settings import Settings
from durable_agents import AgentInput, AgentResult, SendResult, SessionMessage, SessionSpec, StatusView, connect
from durable_agents.cli.run import ui_link

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


SESSION_MESSAGES = (
    "Check the stock level at {url}.",
    "Check it again: has it changed?",
)


async def replied(handle: WorkflowHandle[Any, Any], seq: int, within_s: float = 120.0) -> StatusView:
    """The session's status once it has answered message ``seq`` and waits for the next one."""
    deadline = time.monotonic() + within_s
    while True:
        view: StatusView = await handle.query("status", result_type=StatusView)
        if (view.replied >= seq and view.state == "idle") or view.state in ("completed", "failed"):
            return view
        if time.monotonic() > deadline:
            raise TimeoutError(f"no reply to message {seq} within {within_s:.0f} s (state {view.state})")
        await asyncio.sleep(0.2)


def indented(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


async def session_demo(settings: Settings, env: dict[str, str], session_id: str, url: str) -> int:
    """A two-message session through the Temporal client: start, send, reply, send, reply, close."""
    client: Client = await connect(settings.temporal, keyring=settings.encryption.keyring)
    print(f"\ndemo: a session (a conversation that waits for the next message): {session_id}")
    handle = await client.start_workflow(
        "AgentWorkflow",
        AgentInput(session=SessionSpec(), tools=["http_request"]),
        id=session_id,
        task_queue=env["AGENT_TASK_QUEUE"],
        result_type=AgentResult,
    )
    for number, template in enumerate(SESSION_MESSAGES, 1):
        text = template.format(url=url)
        sent = await handle.execute_update(
            "send", SessionMessage(message_id=f"m{number}", text=text, sender="demo"), result_type=SendResult
        )
        print(f"\n[you] message {sent.seq}: {text}  (send: accepted={sent.accepted})", flush=True)
        view = await replied(handle, sent.seq)
        if view.state != "idle":
            print(f"demo: the session ended early ({view.state}): {view.output}")
            return 1
        print(f"[agent] reply {view.replied}:\n{indented(view.output)}", flush=True)
    print(f"\nstatus: {view.state}, {view.messages} messages, {view.replied} replied, {view.step} model turns")
    show_transcript(session_id, env)
    await handle.signal("close")
    done = await handle.result()
    link = ui_link(settings.temporal.ui_url, client.namespace, session_id, None)
    print(f"session closed: {done.status}, {done.steps} model turns; UI: {link}")
    return 0


def show_transcript(session_id: str, env: dict[str, str]) -> None:
    """``starter.py transcript``, when this checkout's CLI has the command."""
    starter = [PY, str(ROOT / "starter.py")]
    probe = subprocess.run([*starter, "transcript", "--help"], cwd=ROOT, env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        return
    print(f"\ntranscript (starter.py transcript {session_id}):", flush=True)
    subprocess.run([*starter, "transcript", session_id], cwd=ROOT, env=env, stdin=subprocess.DEVNULL)


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
        if rc == 0:
            rc = asyncio.run(session_demo(settings, env, f"{run_id}-session", url))
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
