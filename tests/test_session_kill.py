"""A session's worker is SIGKILLed while a message is being worked on: the reply comes once, the side effect once.

``worker.py`` runs as a subprocess. The session's message makes the model POST an order (the
``http_request`` tool, with its idempotency key) to a real HTTP server on 127.0.0.1 that dedupes by
``Idempotency-Key`` and records every delivery. The server applies the order and holds its answer;
the worker is killed then, and a new worker process (same run store) takes the session over.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.testing import WorkflowEnvironment

from activities.store.sqlite import SQLiteRunStore
from tests.fakes.dedupe_server import DedupeServer
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.fakes.worker_proc import WorkerProc, worker_env, write_policy
from tests.waiting import eventually
from workflows.progress import TOPIC, ProgressEvent
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, AgentResult, StatusView

ORDER = {"sku": "S-23"}


def order_then_answer(orders_url: str) -> Any:
    """Per message: POST one order, then answer (decided by the transcript, so a repeated turn is the same)."""

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body["messages"]
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        if any(m["role"] == "tool" for m in messages[last_user:]):
            return Scripted(text="ordered once")
        args = {"method": "POST", "url": orders_url, "json": ORDER}
        return Scripted(tool_calls=[("http_request", json.dumps(args))])

    return reply


async def progress(handle: WorkflowHandle[Any, Any]) -> list[ProgressEvent]:
    """Every event of the (ended) session's progress stream."""
    stream = WorkflowStreamClient.create(handle._client, handle.id)
    events = []
    async for item in stream.subscribe(TOPIC, 0, result_type=ProgressEvent):
        events.append(item.data)
        if item.data.kind == "finished":
            break
    return events


async def test_sigkill_mid_message_replies_once_and_delivers_once(
    dev_env: WorkflowEnvironment, llm: FakeLLMServer, tmp_path: Path
) -> None:
    client = dev_env.client
    task_queue = f"kill-s-{uuid.uuid4().hex[:8]}"
    state_dir = tmp_path / "state"
    with DedupeServer() as api:
        # The order is applied at once and answered only after 8 s: the worker dies in between.
        api.add_delay(after_s=8, method="POST", path_prefix="/orders", times=1)
        llm.default = order_then_answer(f"{api.url}/orders")
        env = worker_env(
            address=client.service_client.config.target_host,
            task_queue=task_queue,
            llm_url=llm.openai_url,
            state_dir=state_dir,
            policy_file=write_policy(tmp_path / "policy.json"),
        )
        workers = [WorkerProc(env, tmp_path / "worker-1.log")]
        try:
            await workers[0].async_wait_ready()
            handle = await client.start_workflow(
                "AgentWorkflow",
                AgentInput(session=SessionSpec(), tools=["http_request"]),
                id=f"{task_queue}-session",
                task_queue=task_queue,
                result_type=AgentResult,
            )
            sent = await handle.execute_update(
                "send", SessionMessage(message_id="order-1", text="order one item"), result_type=SendResult
            )
            assert sent.accepted and sent.seq == 1

            await eventually(lambda: api.applied("/orders"), "the order to reach the destination")
            workers[0].kill()
            workers.append(WorkerProc(env, tmp_path / "worker-2.log"))
            await workers[1].async_wait_ready()

            async def answered() -> StatusView | None:
                view: StatusView = await handle.query("status", result_type=StatusView)
                return view if view.replied >= 1 and view.state == "idle" else None

            view = await eventually(answered, "the reply after the restart")
            await handle.signal("close", {"reason": "test over"})
            result = await asyncio.wait_for(handle.result(), 60)
            events = await progress(handle)
        finally:
            for worker in workers:
                worker.stop()
        logs = "\n".join(w.tail(1500) for w in workers)

        assert view.replied == 1 and view.messages == 1, view
        assert result.status == "completed" and result.output == "ordered once", logs
        replies = [e for e in events if e.kind == "replied"]
        assert [e.data.get("seq") for e in replies] == [1], [e.text for e in events]
        assert len([e for e in events if e.kind == "message_received"]) == 1

        writes = api.writes("/orders")
        assert len(writes) >= 2, f"the new worker re-sent the POST it never heard back from: {writes}"
        assert len({w.key for w in writes}) == 1, "every delivery carries the same idempotency key"
        assert len(api.applied("/orders")) == 1, "the destination applied the order once"
        store = SQLiteRunStore(state_dir / "store.sqlite3")
        try:
            ledger = await store.ledger(handle.id)
        finally:
            await store.close()
        assert [(e.tool, e.state) for e in ledger] == [("http_request", "done")]
        last_prompt = [r for r in llm.requests if r["path"].endswith("/chat/completions")][-1]["body"]["messages"]
        assert [m["role"] for m in last_prompt] == ["system", "user", "assistant", "tool"]
