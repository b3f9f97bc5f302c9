"""``starter.py send`` and ``close``: talk to a session (an ``AgentWorkflow`` started with ``"session"``).

``send`` is one update-with-start: a running session takes the message; an id with no run, or
whose session has ended, starts one under that id (``AgentInput(session=SessionSpec())`` on the
settings' task queue) and the woken session goes on with its conversation and workspace
(``session_open``). A run that is not a session refuses the message (``not_a_session``): a
running one answers so itself; an ended one is checked first (its input, from history), so that
``send`` never starts a session under the id of a finished plain run. ``--wait`` waits for the
reply to this message (the status query's ``replied`` reaches its number and the session is idle,
or the run ended); ``--follow`` prints the progress events from the message on until that reply.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from typing import Any

from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.settings import Settings
from durable_agents.agent_client._errors import RunNotOpen
from durable_agents.cli.common import (
    EXIT_RUN,
    EXIT_USAGE,
    QUERY_TIMEOUT,
    RPC_TIMEOUT,
    CliError,
    agent_client,
    check_agent_run,
    cli_command,
    client_errors,
    closed_result,
    ended_state,
    following,
    on_interrupt,
    raise_if_cancelled,
    warn_when_no_worker,
)
from durable_agents.cli.watch import EventPrinter, events, mode_for
from workflows.agent import AgentWorkflow
from workflows.session_types import (
    MAX_MESSAGE_CHARS,
    MAX_MESSAGE_ID_CHARS,
    SessionSpec,
)
from workflows.types import AgentInput, StatusView

POLL_S = 0.5  # between status queries while --wait waits for a reply
MAX_STDIN_BYTES = 4 * MAX_MESSAGE_CHARS + 1  # UTF-8: at most 4 bytes a character
WAITING = "keeps waiting (Ctrl-C stops waiting, not the session)"


def add_send_command(sub: argparse._SubParsersAction[Any]) -> None:
    send = sub.add_parser(
        "send", help="send a message to a session (starts or wakes it: an ended session goes on where it was)"
    )
    send.add_argument("workflow_id", help="the session's id")
    send.add_argument("text", help="the message (- reads it from stdin)")
    mode = send.add_mutually_exclusive_group()
    mode.add_argument("--wait", action="store_true", help="wait for the reply to this message and print it")
    mode.add_argument("--follow", action="store_true", help="show progress until the reply to this message")
    send.add_argument("--message-id", type=_message_id, help="the message's id (a retry with it is one message)")
    send.add_argument("--sender", default="", help="who sends it (kept with the message)")


def add_close_command(sub: argparse._SubParsersAction[Any]) -> None:
    close = sub.add_parser("close", help="end a session now (a later send wakes it again)")
    close.add_argument("workflow_id", help="the session's id")
    close.add_argument("--reason", default="", help="why (kept in the session's output)")


def _message_id(text: str) -> str:
    if not text.strip() or len(text) > MAX_MESSAGE_ID_CHARS:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_MESSAGE_ID_CHARS} characters")
    return text


def read_message(text: str) -> str:
    """The message: the argument, or stdin for ``-``; never blank, never over the session's size cap."""
    if text == "-":
        if sys.stdin.isatty():
            print("reading the message from the terminal; end it with Ctrl-D", file=sys.stderr, flush=True)
        data = sys.stdin.buffer.read(MAX_STDIN_BYTES)
        try:
            text = data.decode("utf-8").rstrip("\n")
        except UnicodeDecodeError as exc:
            where = f"byte 0x{data[exc.start]:02X} at offset {exc.start}"
            raise CliError(f"stdin: not UTF-8 text ({where})", EXIT_USAGE) from None
    if not text.strip():
        raise CliError("the message is empty", code=EXIT_USAGE)
    if len(text) > MAX_MESSAGE_CHARS:
        raise CliError(f"the message is {len(text):,} characters; a session takes at most {MAX_MESSAGE_CHARS:,}", 2)
    return text


async def _describe(client: Client, workflow_id: str) -> WorkflowExecutionDescription | None:
    try:
        desc = await client.get_workflow_handle(workflow_id).describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    check_agent_run(desc)
    return desc


def session_marker(row: dict[str, Any]) -> str:
    """``  [session, 3 messages]`` after a listed session's id; empty for a run."""
    if not row.get("session"):
        return ""
    count = row.get("messages")
    return "  [session]" if count is None else f"  [session, {count} message{'s' if count != 1 else ''}]"


@client_errors
async def cmd_send(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    workflow_id: str = args.workflow_id
    text = read_message(args.text)
    message_id = args.message_id or uuid.uuid4().hex
    agents = agent_client(client, settings)
    desc = await _describe(client, workflow_id)
    task_queue = desc.task_queue if desc is not None else settings.temporal.task_queue
    on_interrupt(f"message {message_id} may or may not have been taken: see {cli_command(f'status {workflow_id}')}")
    watchdog = asyncio.ensure_future(warn_when_no_worker(client, workflow_id, task_queue, doing=WAITING))
    try:
        sent = await agents.send_session(
            workflow_id, text, message_id=message_id, sender=args.sender, start=AgentInput(session=SessionSpec())
        )
    finally:
        watchdog.cancel()
    answer = sent.result
    if sent.started:
        print(f"started session {workflow_id} on task queue {sent.task_queue}")
    elif sent.woke:
        print(f"woke session {workflow_id} (it had ended: {sent.woke})")
    print(f"accepted: message {answer.seq}" + (" (sent before: the same message)" if answer.duplicate else ""))
    sys.stdout.flush()
    code = 0
    if args.wait or args.follow:
        on_interrupt(f"session {workflow_id} goes on; its reply: {cli_command(f'transcript {workflow_id}')}")
        watchdog = asyncio.ensure_future(warn_when_no_worker(client, workflow_id, task_queue, doing=WAITING))
        try:
            if args.follow:
                await _follow(client, workflow_id, answer.seq)
            code = await _print_reply(client, workflow_id, answer.seq)
        finally:
            watchdog.cancel()
    print(next_steps(workflow_id))
    return code


def next_steps(workflow_id: str) -> str:
    send = cli_command(f'send {workflow_id} "..."')
    return f"continue: {send}   transcript: {cli_command(f'transcript {workflow_id}')}"


async def _ended(client: Client, desc: WorkflowExecutionDescription) -> str:
    return await ended_state(client, desc.id, desc.run_id, desc.status, desc.typed_search_attributes)


async def wait_for_reply(client: Client, workflow_id: str, seq: int) -> tuple[str, str]:
    """``(state, reply)`` once message ``seq`` is answered and the session idle, or the run has ended."""
    handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(workflow_id)
    while True:
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
        if desc.status != WorkflowExecutionStatus.RUNNING and desc.status != WorkflowExecutionStatus.CONTINUED_AS_NEW:
            result = await closed_result(client, workflow_id, desc.run_id)
            return await _ended(client, desc), result.output if result is not None else ""
        try:
            view = StatusView.model_validate(await handle.query(AgentWorkflow.status, rpc_timeout=QUERY_TIMEOUT))
        except (RPCError, RPCTimeoutOrCancelledError, WorkflowQueryFailedError, ValueError) as err:
            raise_if_cancelled()
            if isinstance(err, RPCError) and err.status == RPCStatusCode.UNAVAILABLE:
                raise
            view = None  # between runs of a continue-as-new, or no worker yet (the watchdog says so)
        if view is not None and view.replied >= seq and view.state == "idle":
            return view.state, view.output
        await asyncio.sleep(POLL_S)


async def _print_reply(client: Client, workflow_id: str, seq: int) -> int:
    state, reply = await wait_for_reply(client, workflow_id, seq)
    if state == "idle":
        print(f"\nreply to message {seq}:\n{reply}\n")
        return 0
    print(f"\nsession {workflow_id} ended ({state}); its last reply:\n{reply}\n")
    return 0 if state == "completed" else EXIT_RUN


async def _follow(client: Client, workflow_id: str, seq: int) -> None:
    """Progress events from message ``seq`` on, until the ``replied`` event that covers it (or the run ends)."""
    printer = EventPrinter(workflow_id, mode=mode_for(False, sys.stdout))
    started = False
    async for offset, event in events(client, workflow_id):
        following(workflow_id, offset + 1)
        answered = event.kind == "replied" and int(event.data.get("seq", 0)) >= seq
        if event.kind == "message_received" and int(event.data.get("seq", 0)) >= seq:
            started = True
        if started or answered:
            printer(offset, event)
        if answered:
            return


@client_errors
async def cmd_close(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    workflow_id: str = args.workflow_id
    try:
        await agent_client(client, settings).close(workflow_id, reason=args.reason)
    except RunNotOpen as err:
        print(f"session {workflow_id} has already ended ({err.state}); nothing to close")
        return 0
    print(
        f"close sent to session {workflow_id}: it ends after its current step (a send wakes it again; "
        f"its conversation: {cli_command(f'transcript {workflow_id}')})"
    )
    return 0
