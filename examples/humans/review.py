"""A reviewer's front end in your own code: answer the model's question, edit the call it wants approved.

    python -m examples.humans.review [--id ID] [--shop URL]

Starts an ``AgentWorkflow`` whose task asks the model to check a shop's stock, ask how many units to
reserve, and reserve them. The script plays the people: it answers the model's ``ask_human`` question
with the ``decide`` update (decision ``answer``), then approves the reservation POST with edited
arguments (another quantity) and ``remember: "call"``, and prints the run's audit of decisions and
what the shop received. Without ``--shop`` it serves a small shop on 127.0.0.1 itself. A worker
(``worker.py``) must poll ``AGENT_TASK_QUEUE`` and allow the shop's address (``AGENT_HTTP_ALLOW``);
the offline ``scripted:demo`` model plays the agent's part.
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

from temporalio.client import Client, WorkflowHandle

from durable_agents import AgentInput, AgentResult, Settings, StatusView, connect, exit_process

RESERVED: list[dict[str, Any]] = []  # what the built-in shop was asked to reserve


class Shop(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._answer({"sku": "A-1001", "in_stock": 12})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        RESERVED.append({"body": body, "idempotency_key": self.headers.get("Idempotency-Key", "")})
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


async def waiting_for(handle: WorkflowHandle[Any, Any], kind: str, within_s: float = 120.0) -> StatusView:
    """The ``status`` query once the run waits for a decision of ``kind`` (``question`` or ``tool_call``)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        view: StatusView = await handle.query("status", result_type=StatusView)
        if any(a.kind == kind for a in view.pending_approvals):
            return view
        if view.state in ("completed", "failed", "cancelled", "limit_exceeded"):
            raise RuntimeError(f"the run ended ({view.state}) before it waited for a {kind}")
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"the run did not wait for a {kind} within {within_s:.0f} s (state {view.state})")
        await asyncio.sleep(0.2)


async def decide(handle: WorkflowHandle[Any, Any], **request: Any) -> str:
    answer = await handle.execute_update("decide", request, result_type=dict)
    return str(answer["message"])


async def main(run_id: str, shop: str) -> None:
    settings = Settings.from_env()
    client: Client = await connect(settings.temporal, keyring=settings.encryption.keyring)
    task = f"Check the stock at {shop}/stock and reserve some units; ask me how many."
    handle = await client.start_workflow(
        "AgentWorkflow",
        AgentInput(task=task, tools=["http_request", "ask_human"]),
        id=run_id,
        task_queue=settings.temporal.task_queue,
        result_type=AgentResult,
    )
    print(f"run {run_id} started")

    view = await waiting_for(handle, "question")
    [question] = [a for a in view.pending_approvals if a.kind == "question"]
    print(f"state: {view.state}")
    print(f"question {question.approval_id[:2]}…: {question.question} options={question.options}")
    said = await decide(handle, approval_id=question.approval_id, decision="answer", reviewer="dana", text="2")
    print(f"answer: {said.split(' ', 1)[1]}")

    view = await waiting_for(handle, "tool_call")
    [approval] = [a for a in view.pending_approvals if a.kind == "tool_call"]
    print(f"approval wanted: {approval.tool} {approval.args['method']} json={approval.args['json']}")
    edited = {**approval.args, "json": {"quantity": 3}}  # the reviewer knows better: three units
    said = await decide(
        handle, approval_id=approval.approval_id, decision="approve", reviewer="dana", arguments=edited, remember="call"
    )
    print(f"approve: {said.split(' ', 1)[1]}")

    result = await handle.result()
    print(f"result: {result.status}")
    for record in result.decisions:
        edits = f" edits={json.dumps(record.edits['json'])}" if record.edits else ""
        remembered = f" remember={record.remember}" if record.remember else ""
        print(f"audit: {record.kind} {record.decision} by {record.reviewer}{edits}{remembered}")
    for reservation in RESERVED:
        print(f"shop received: {reservation['body']} (key {reservation['idempotency_key'][:3]}…)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--id", default=f"review-{uuid.uuid4().hex[:8]}", help="the run's workflow id")
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
    except (RuntimeError, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        exit_process(1)
    exit_process(0)
