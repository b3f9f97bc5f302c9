"""A session (a conversation) driven from your own code with the Temporal client.

    python -m examples.sessions.chat [--id ID] [FIRST SECOND THIRD]

Starts an ``AgentWorkflow`` with ``"session"`` in its input, sends it two messages with the ``send``
update (the second one twice: the same ``message_id`` is one message), prints each reply and the
``status`` query, closes it with the ``close`` signal, then sends a third message with
update-with-start: the ended session starts again under the same id and goes on with the same
conversation. A worker (``worker.py``) must poll ``AGENT_TASK_QUEUE``; ``TEMPORAL_ADDRESS`` and the
rest come from ``Settings``. The default messages suit any model, and the offline ``scripted:demo``
answers them from what it computed in its sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from typing import Any

from temporalio.client import Client, WithStartWorkflowOperation, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from durable_agents import (
    AgentInput,
    AgentResult,
    SendResult,
    SessionMessage,
    SessionSpec,
    Settings,
    StatusView,
    connect,
    exit_process,
)

MESSAGES = (
    "Compute a few statistics of the primes below 60 in Python.",
    "Which of them is the largest?",
    "Remind me what you found.",
)


async def wait_for_reply(handle: WorkflowHandle[Any, Any], seq: int, within_s: float = 120.0) -> StatusView:
    """The ``status`` query once message ``seq`` is answered and the session waits for the next one."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        view: StatusView = await handle.query("status", result_type=StatusView)
        if view.replied >= seq and view.state == "idle":
            return view
        if view.state in ("completed", "failed", "cancelled", "timed_out"):
            raise RuntimeError(f"the session ended ({view.state}) before it answered message {seq}")
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no reply to message {seq} within {within_s:.0f} s (state {view.state})")
        await asyncio.sleep(0.2)


def show(view: StatusView, note: str = "") -> None:
    print(f"reply {view.replied}{note}:")
    for line in view.output.splitlines():
        print(f"    {line}")


async def send(handle: WorkflowHandle[Any, Any], message_id: str, text: str) -> SendResult:
    sent: SendResult = await handle.execute_update(
        "send", SessionMessage(message_id=message_id, text=text, sender="example"), result_type=SendResult
    )
    print(f"send {message_id}: accepted={sent.accepted} seq={sent.seq} duplicate={sent.duplicate}")
    return sent


async def main(session_id: str, messages: tuple[str, str, str]) -> None:
    settings = Settings.from_env()
    client: Client = await connect(settings.temporal, keyring=settings.encryption.keyring)
    task_queue = settings.temporal.task_queue
    # A session: no task needed; it waits for messages (a week of silence ends it).
    handle = await client.start_workflow(
        "AgentWorkflow",
        AgentInput(session=SessionSpec(idle_timeout_s=3600, on_busy="queue")),
        id=session_id,
        task_queue=task_queue,
        result_type=AgentResult,
    )
    print(f"session {session_id} started")
    for number, text in enumerate(messages[:2], 1):
        sent = await send(handle, f"m{number}", text)
        show(await wait_for_reply(handle, sent.seq))
    await send(handle, "m2", messages[1])  # a retry of message 2: answered with its number, nothing queued

    view: StatusView = await handle.query("status", result_type=StatusView)
    print(f"status: state={view.state} messages={view.messages} replied={view.replied} queued={view.queued}")

    await handle.signal("close")
    ended = await handle.result()
    print(f"closed: {ended.status}")

    # Send to a session that may have ended: one call starts it again when it is not running.
    wake: WithStartWorkflowOperation[Any, AgentResult] = WithStartWorkflowOperation(
        "AgentWorkflow",
        AgentInput(session=SessionSpec(idle_timeout_s=3600)),
        id=session_id,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        result_type=AgentResult,
    )
    woken: SendResult = await client.execute_update_with_start_workflow(
        "send",
        SessionMessage(message_id="m3", text=messages[2], sender="example"),
        start_workflow_operation=wake,
        result_type=SendResult,
    )
    print(f"send m3 (update-with-start): accepted={woken.accepted} seq={woken.seq}")
    again = await wake.workflow_handle()
    show(await wait_for_reply(again, woken.seq), " (the woken session)")
    await again.signal("close")
    print(f"closed again: {(await again.result()).status}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m examples.sessions.chat", description=__doc__.splitlines()[0])
    parser.add_argument("--id", default="", help="the session's workflow id (default: chat-<random>)")
    parser.add_argument("messages", nargs="*", help="three messages (default: a short conversation about primes)")
    args = parser.parse_args(argv)
    if args.messages and len(args.messages) != 3:
        parser.error("give three messages, or none")
    return args


if __name__ == "__main__":
    options = parse_args()
    chosen = tuple(options.messages) if options.messages else MESSAGES
    asyncio.run(main(options.id or f"chat-{uuid.uuid4().hex[:8]}", (chosen[0], chosen[1], chosen[2])))
    sys.stdout.flush()
    exit_process(0)  # a short-lived client process: leave without interpreter teardown
