"""A front end in a few lines with ``AgentClient``: start a run, follow its events, approve its call.

    python -m examples.client.inbox [--id ID] [--shop URL]

Starts a run whose task asks the model to check a shop's stock and reserve units, follows its
progress events (read by query: following a run adds nothing to its history), approves the
reservation POST when the run asks for it, and prints the result and the transcript's tool calls.
Without ``--shop`` it serves a small shop on 127.0.0.1 itself. A worker (``worker.py``) must poll
``AGENT_TASK_QUEUE`` and allow the shop's address (``AGENT_HTTP_ALLOW``); the offline
``scripted:demo`` model plays the agent's part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from durable_agents import AgentClient, AgentClientError, AgentInput, Settings, connect, exit_process


class Shop(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._answer({"sku": "A-1001", "in_stock": 12})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self._answer({"reserved": body.get("quantity")})

    def _answer(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def main(run_id: str, shop: str) -> None:
    settings = Settings.from_env()
    agents = AgentClient(
        await connect(settings.temporal, keyring=settings.encryption.keyring),
        task_queue=settings.temporal.task_queue,
        approval_key=settings.approval_key,  # signs decisions when the workers require it
    )
    task = f"Check the stock at {shop}/stock and reserve some units."
    run = await agents.start(AgentInput(task=task, tools=["http_request"]), workflow_id=run_id)
    print(f"run {run.workflow_id} started")

    async for event in agents.events(run.workflow_id):  # ends when the run does
        print(f"event {event.cursor.offset}: {event.kind}")
        if event.kind == "approval_requested":
            items, _ = await agents.pending(run.workflow_id)
            for item in items:
                print(f"approving {item.tool} {item.args['method']} {item.args['url']}")
                await agents.decide(run.workflow_id, item.approval_id, "approve", reviewer="dana")

    result = await agents.result(run.workflow_id)
    print(f"result: {result.status}")
    for entry in await agents.transcript(run.workflow_id):
        if entry["kind"] == "tool_call":
            print(f"tool call: {entry['name']} ok={entry['ok']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--id", default=f"inbox-{uuid.uuid4().hex[:8]}", help="the run's workflow id")
    parser.add_argument("--shop", default="", help="the shop's base URL (default: serve one on 127.0.0.1)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    url = args.shop
    if not url:
        server = ThreadingHTTPServer(("127.0.0.1", 0), Shop)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        asyncio.run(main(args.id, url))
    except AgentClientError as err:
        print(f"error: {err}", file=sys.stderr)
        exit_process(1)
    exit_process(0)
