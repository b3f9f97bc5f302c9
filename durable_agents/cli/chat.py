"""``starter.py chat [ID]``: a conversation with a session in the terminal.

Each line typed at ``you> `` is one message, sent with the ``send`` update through
update-with-start: the same call starts a new session, joins a running one and wakes
one that has ended (same id, same conversation and workspace). Then the session's
progress stream is followed from where this command last read it until the session
has replied to the message (its ``replied`` event), showing tool calls as they
happen and asking ``approve? [y/n]`` for each approval the session waits for (and
for the answer to each question its model asks, ``ask_human``); the decision is
sent as ``starter.py approve`` / ``reject`` / ``answer`` send it (the ``decide``
update, signed with ``AGENT_APPROVAL_KEY`` when it is set). The reply is the
session's ``output`` (its status query) once it has replied.

Lines are read in a thread of their own, so the event loop keeps following the
session while the prompt is open, and so the process can leave with that thread
still blocked in ``input()``. Ctrl-C (exit 130) and end of input (Ctrl-D, exit 0)
leave the session running and say how to come back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from pydantic import ValidationError
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.service import RPCError, RPCStatusCode

from activities.settings import Settings
from durable_agents.agent_client._client import AgentClient
from durable_agents.agent_client._errors import MessageRefused
from durable_agents.cli.approval_text import question_lines
from durable_agents.cli.approvals import add_run_options, load_run_policy, running_view
from durable_agents.cli.common import (
    EXIT_USAGE,
    QUERY_TIMEOUT,
    RPC_TIMEOUT,
    CliError,
    check_agent_run,
    cli_command,
    closed_result,
    ended_state,
    name_list,
    on_interrupt,
    positive_int,
    raise_if_cancelled,
    warn_when_no_worker,
)
from durable_agents.cli.decisions import Decision, Extras, send_decision
from durable_agents.cli.names import check_model, check_tools
from durable_agents.cli.owners import owned, tree
from durable_agents.cli.review import read_answer
from durable_agents.cli.tokens import TokenPrinter
from durable_agents.cli.watch import ASKING, EventPrinter, events, mode_for
from workflows.agent import AgentWorkflow
from workflows.call_view import call_lines
from workflows.progress import ProgressEvent
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, Limits, PendingApproval, StatusView

PROMPT = "you> "
REPLY = "agent> "
APPROVE_PROMPT = "approve? [y/n] "
# Events the chat shows while the agent works; the rest (turns, the reply itself) it says its own way.
SHOWN = frozenset(
    {
        "tool_started",
        "tool_finished",
        "approval_decided",
        "decision_refused",
        "message_refused",
        "interrupted",
        "idle",
        "finished",
    }
)
Stream = AsyncGenerator[tuple[int, ProgressEvent], None]
IDLE_WAITING = "idle: waiting"  # the text of the event a session emits as it starts to wait (workflows/session.py)
WAITING = "shows the reply once one does (Ctrl-C leaves the session running)"

# input() runs here, not in the loop's default executor: asyncio.run() joins that executor on
# exit, which would hang a chat left with Ctrl-C until someone pressed Enter.
_LINES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chat-input")


class Leave(Exception):
    """The user ended the input (Ctrl-D): the chat ends, the session goes on."""


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    chat = sub.add_parser("chat", help="talk with a session in the terminal (a new one when no id is given)")
    chat.add_argument("workflow_id", nargs="?", help="the session to join or wake (default: a new chat-<id>)")
    chat.add_argument("--model", default="", help="a new or woken session's model (default: the worker's)")
    chat.add_argument("--tools", type=name_list, help="comma-separated tool names (default: all)")
    chat.add_argument("--max-steps", type=positive_int, help="model turns per message before limit_exceeded")
    chat.add_argument("--timeout", type=positive_int, dest="timeout_s", help="seconds of work per message")
    chat.add_argument("--tenant", default="", help="tenant label for a new session")
    chat.add_argument("--user", default="", help="the tenant's user a new session acts for")
    add_run_options(chat)
    for action in chat._actions:  # run's --reviewer, said for the chat
        if "--reviewer" in action.option_strings:
            action.help = "your name: the sender of your messages and the reviewer of your decisions (default: $USER)"


def session_input(args: argparse.Namespace) -> AgentInput:
    """The input of a session this chat starts or wakes; any bad value is a one-line usage error."""
    chosen = {"max_steps": args.max_steps, "timeout_s": args.timeout_s}
    try:
        return AgentInput(
            session=SessionSpec(),
            model=args.model,
            tools=args.tools,
            limits=Limits(**{name: value for name, value in chosen.items() if value}),
            tenant=args.tenant,
            user=args.user,
            approvers=args.approvers,
            policy=load_run_policy(args.policy_file),
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "input"
        raise CliError(f"invalid session input: {where}: {first['msg']}", code=EXIT_USAGE) from None


def resume_lines(session_id: str) -> list[str]:
    return [
        f"session {session_id} goes on; resume with: {cli_command(f'chat {session_id}')}",
        f"  or send one message: {cli_command(f'send {session_id} TEXT')}",
    ]


async def cmd_chat(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    inp = session_input(args)
    check_model(inp.model, settings)
    check_tools(inp.tools, settings)
    session_id = args.workflow_id or f"chat-{uuid.uuid4().hex[:8]}"
    reviewer = (args.reviewer if args.reviewer is not None else settings.reviewer).strip()
    if not reviewer:
        raise CliError("--reviewer must name who decides", code=EXIT_USAGE)
    chat = Chat(client, session_id, inp, settings, reviewer)
    on_interrupt(f"no message was taken: session {session_id} was not started by this chat")
    try:
        await chat.join(new=args.workflow_id is None)
        while True:
            text = await ask(PROMPT)
            if text.strip():
                await chat.say(text)
    except Leave:
        print()
        if chat.exists:
            print("\n".join(resume_lines(session_id)), flush=True)
        else:
            print(f"no message was taken: session {session_id} was not started by this chat", flush=True)
        return 0
    except asyncio.CancelledError:  # Ctrl-C: main's "interrupted: ..." line goes below the prompt, not after it
        print(flush=True)
        raise


async def ask(prompt: str) -> str:
    """One line from stdin (the prompt on stdout); ``Leave`` at end of input."""
    try:
        line = await asyncio.get_running_loop().run_in_executor(_LINES, input, prompt)
    except EOFError:
        raise Leave from None
    except UnicodeDecodeError:
        print("error: that line is not UTF-8 text; type it again", file=sys.stderr, flush=True)
        return ""
    if not sys.stdin.isatty():  # read from a pipe or a file: echoed, so the output reads as the conversation
        print(line, flush=True)
    return line


class Chat:
    """One terminal's conversation with session ``session_id``."""

    def __init__(self, client: Client, session_id: str, inp: AgentInput, settings: Settings, reviewer: str) -> None:
        self.client, self.session_id, self.inp, self.settings = client, session_id, inp, settings
        self.reviewer = reviewer
        self.task_queue = settings.temporal.task_queue
        self.exists = False  # the session exists (found, or started by a send): leaving says how to come back
        self.chain = ""  # first run id of the execution chain read (a woken session is a new chain)
        self.offset = 0  # the next progress event of that chain to read
        self.mine: set[str] = set()  # message ids this chat sent (their message_received is not shown)
        self.decided: set[str] = set()  # approvals asked here already
        self.sent: set[str] = set()  # approvals decided here (their approval_decided is not shown again)
        self.printer = EventPrinter(session_id, mode=mode_for(False, sys.stdout), show_commands=False, indent="  ")
        # The model's text as it streams, on the reply's own ``agent>`` line (``follow``).
        self.tokens = TokenPrinter.from_settings(settings, session_id, prefix=REPLY)

    # --- joining ---------------------------------------------------------------------------

    async def join(self, *, new: bool) -> None:
        """Say what this chat talks to; answer what a running session waits for (approvals, a reply)."""
        handle = self.client.get_workflow_handle(self.session_id)
        try:
            desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            what = "new session" if new else "no session yet with this id:"
            print(f"{what} {self.session_id} (your first message starts it; Ctrl-D or Ctrl-C leaves it)", flush=True)
            return
        check_agent_run(desc)
        self._exists()
        await self.tokens.skip()  # what it streamed before this chat joined is not shown again
        if desc.status != WorkflowExecutionStatus.RUNNING:
            if not await _was_session(self.client, handle):
                raise CliError(f"run {self.session_id} was not a session; start one with {cli_command('chat')} (no id)")
            state = await ended_state(self.client, desc.id, desc.run_id, desc.status, desc.typed_search_attributes)
            print(
                f"session {self.session_id} has ended ({state}); your next message wakes it on the same "
                "conversation and workspace",
                flush=True,
            )
            return
        _, view = await running_view(self.client, self.session_id, query_timeout=QUERY_TIMEOUT)
        if view is None or not view.session:
            raise CliError(f"run {self.session_id} is not a session; start one with {cli_command('chat')} (no id)")
        self.tokens.started(view.step)  # the turn at work now started before this chat joined
        self.chain = desc.raw_description.workflow_execution_info.first_run_id or desc.run_id or ""
        self.offset = await WorkflowStreamClient.create(self.client, self.session_id).get_offset()
        print(
            f"joined session {self.session_id}: {view.messages} message(s), {view.state} (Ctrl-D or Ctrl-C leaves it)",
            flush=True,
        )
        if view.output and view.replied:
            print(f"  last reply: {view.output}", flush=True)
        for approval in view.pending_approvals:
            await self.review(approval.approval_id)
        if view.replied < view.messages:  # it still works on a message: its reply comes first
            await self.follow(view.messages)

    # --- one exchange ----------------------------------------------------------------------

    async def say(self, text: str) -> None:
        """Send ``text``; show the progress and the reply, or the one line of a refusal."""
        try:
            message = SessionMessage(message_id=f"chat-{uuid.uuid4().hex}", text=text, sender=self.reviewer)
        except ValidationError as exc:
            print(f"refused: the message: {exc.errors(include_url=False)[0]['msg']}", flush=True)
            return
        self.mine.add(message.message_id)
        await self.tokens.listen()  # before the send: the reply's model turns stream to this terminal
        result = await self.send(message)
        if result is not None:
            await self.follow(result.seq)

    async def send(self, message: SessionMessage) -> SendResult | None:
        """The ``send`` update with start: its answer, or None after printing the refusal."""
        watchdog = asyncio.ensure_future(
            warn_when_no_worker(self.client, self.session_id, self.task_queue, doing=WAITING)
        )
        try:
            result = await AgentClient(self.client, task_queue=self.task_queue).deliver(
                self.session_id, message, start=self.inp, summary=f"chat session of {self.reviewer}"
            )
        except MessageRefused as err:
            print(f"refused: {err.reason}", flush=True)
            return None
        finally:
            watchdog.cancel()
        if not result.accepted:
            print(f"refused: {result.reason}: {result.message}", flush=True)
            return None
        self._exists()
        await self._same_chain()
        return result

    def _exists(self) -> None:
        self.exists = True
        on_interrupt("; ".join(line.strip() for line in resume_lines(self.session_id)))

    async def _same_chain(self) -> None:
        """A send that started or woke the session started a new chain: its events are read from 0."""
        desc = await self.client.get_workflow_handle(self.session_id).describe(rpc_timeout=RPC_TIMEOUT)
        chain = desc.raw_description.workflow_execution_info.first_run_id or desc.run_id or ""
        if chain != self.chain:
            self.chain, self.offset = chain, 0

    async def follow(self, seq: int) -> None:
        """Show the session's progress until it has replied to message ``seq`` (or has ended), then the reply."""
        watchdog = asyncio.ensure_future(
            warn_when_no_worker(self.client, self.session_id, self.task_queue, doing=WAITING)
        )
        status = ""
        try:
            # cast: watch.events is an async generator, typed as the iterator it is used as elsewhere
            stream = cast(Stream, events(self.client, self.session_id, from_offset=self.offset))
            async with self.tokens.printing(), contextlib.aclosing(stream):
                async for offset, event in stream:
                    self.offset = offset + 1
                    if event.kind == "turn_started":
                        self.tokens.started(event.step)
                    if event.kind == "replied" and int(event.data.get("seq") or 0) >= seq:
                        status = str(event.data.get("status") or "completed")
                        break
                    await self.show(event)
                else:
                    await self._ended()
                    return
        except (WorkflowQueryFailedError, WorkflowUpdateFailedError) as err:
            raise CliError(
                f"cannot read the progress of session {self.session_id}: {err.cause or err}; "
                + "; ".join(line.strip() for line in resume_lines(self.session_id))
            ) from None
        finally:
            watchdog.cancel()
        view = await self._status()
        note = "" if status == "completed" else f"({status}) "
        output = view.output if view is not None else "(the reply could not be read)"
        if not self.tokens.streamed(output) or note:
            print(f"{REPLY}{note}{output}", flush=True)  # unless it streamed onto its ``agent>`` line already

    async def show(self, event: ProgressEvent) -> None:
        if event.kind in ASKING:
            approval_id = str(event.data.get("approval_id") or "")
            if approval_id:
                await self.review(approval_id)
            return
        if event.kind == "message_received":
            shown = str(event.data.get("message_id")) not in self.mine  # someone else's message to this session
        elif event.kind in ("approval_decided", "question_answered", "approval_counted"):
            shown = str(event.data.get("approval_id")) not in self.sent  # decided elsewhere
        elif event.kind == "idle":
            shown = not event.text.startswith(IDLE_WAITING)  # a sandbox stopped, a close; not the wait itself
        else:
            shown = event.kind in SHOWN
        if shown:
            self.tokens.end_line()
            self.printer(0, event)

    async def _ended(self) -> None:
        """The session ended while it worked (its budget, a close): say how; the next message wakes it."""
        result = await closed_result(self.client, self.session_id, None)
        self.chain = ""
        if result is not None:
            print(f"{REPLY}({result.status}) {result.output}", flush=True)
        print(f"session {self.session_id} has ended; your next message wakes it", flush=True)

    async def _status(self) -> StatusView | None:
        handle: WorkflowHandle[Any, Any] = self.client.get_workflow_handle(self.session_id)
        try:
            answer = await handle.query(AgentWorkflow.status, rpc_timeout=QUERY_TIMEOUT)
        except (RPCError, RPCTimeoutOrCancelledError, WorkflowQueryFailedError):
            raise_if_cancelled()
            return None
        return StatusView.model_validate(answer)

    # --- approvals -------------------------------------------------------------------------

    async def review(self, approval_id: str) -> None:
        """Ask once whether to approve ``approval_id`` and send the answer, as ``approve`` / ``reject`` would."""
        if approval_id in self.decided:
            return
        self.decided.add(approval_id)
        self.tokens.end_line()
        # Shown and signed as the run that waits for it lists it (a sub-agent's own), never as relayed.
        _, view = await running_view(self.client, self.session_id, query_timeout=QUERY_TIMEOUT)
        runs = await tree(self.client, self.session_id, view) if view is not None else []
        found = [entry for (_, aid), entry in owned(runs, self.session_id).items() if aid == approval_id]
        if not found:
            return  # decided elsewhere meanwhile: its approval_decided event says so
        owner, approval = found[0].workflow_id, found[0].approval
        where = f" of sub-agent run {owner}" if owner != self.session_id else ""
        if approval.kind == "question":
            print(f"  question{where}: {approval.approval_id}")
            print("\n".join(f"    {line}" for line in question_lines(approval)), flush=True)
            text = await read_answer(approval, ask)
            await self._decide(owner, approval, "answer", "", Extras(text=text))
            return
        print(f"  approval needed{where}: {approval.approval_id} (rule {approval.rule or '-'})")
        print("\n".join(f"    {line}" for line in call_lines(approval.tool, approval.args)), flush=True)
        decision = await _yes_or_no()
        note = "" if decision == "approve" else f"rejected in chat by {self.reviewer}"
        await self._decide(owner, approval, decision, note)

    async def _decide(
        self, owner: str, approval: PendingApproval, decision: Decision, note: str, extras: Extras | None = None
    ) -> None:
        try:
            line = await send_decision(
                self.client,
                owner,
                approval.approval_id,
                decision,
                self.reviewer,
                note,
                approval,
                approval_key=self.settings.approval_key,
                extras=extras,
            )
        except CliError as err:  # e.g. refused: not an approver
            print(f"  {err}; the session waits for a decision it accepts (Ctrl-C leaves it waiting)", flush=True)
            return
        self.sent.add(approval.approval_id)
        print(f"  {line}", flush=True)


async def _yes_or_no() -> Decision:
    while True:
        answer = (await ask(APPROVE_PROMPT)).strip().lower()
        if answer in ("y", "yes"):
            return "approve"
        if answer in ("n", "no"):
            return "reject"


async def _was_session(client: Client, handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether a closed run's input had ``session`` (its first history event); True when it cannot be read."""
    try:
        async for event in handle.fetch_history_events(page_size=1, rpc_timeout=RPC_TIMEOUT):
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            [inp] = await client.data_converter.decode(payloads, [AgentInput])
            return isinstance(inp, AgentInput) and inp.session is not None
    except (RPCError, RPCTimeoutOrCancelledError, ValueError, TypeError):
        raise_if_cancelled()
        return True
    return True
