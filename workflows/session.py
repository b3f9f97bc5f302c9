"""The session side of ``AgentWorkflow``: messages in, a reply per message, idle in between.

Mixed into :class:`workflows.agent.AgentWorkflow` (which holds ``_sessions``, ``_state`` and the loop).
A run whose input has ``session`` answers its messages one exchange at a time: the messages waiting
are handed to the model, the agent loop runs until the model answers without tool calls (or the
message's ``max_steps`` / ``timeout_s`` stop it), the reply is kept, and the session waits for the
next message with no activity running, so that it can leave every worker's cache. It ends after
``idle_timeout_s`` without a message, or at ``close``; a later ``send`` (update-with-start) wakes it
again under the same workflow id, on the same conversation and workspace (``session_open``).

``message`` (signal) and ``send`` (update) share one semantics, :meth:`SessionHandlers._take_message`.
The update's validator refuses what cannot be taken, so refusals never reach history; a repeated
``message_id`` is answered with the first one's number and queues nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.approval_handlers import HOUSEKEEPING_RETRY
    from workflows.approvals import ApprovalBook, Verdict
    from workflows.ending import Ending
    from workflows.inputs import NO_PAYLOAD, decode, one_payload, quote, safe
    from workflows.progress import EventKind
    from workflows.session_types import (
        LAST_TEXT_MAX,
        MAX_QUEUED,
        PREVIEW_MAX,
        SEEN_IDS,
        CloseSignal,
        QueuedMessage,
        SendResult,
        SessionCarry,
        SessionMessage,
        SessionSpec,
    )
    from workflows.types import (
        AgentInput,
        AgentResult,
        Carry,
        Message,
        ResultStatus,
        RunState,
        SandboxRequest,
        TranscriptEntry,
    )

if TYPE_CHECKING:
    MessageInput = SessionMessage | RawValue
    CloseInput = CloseSignal | RawValue
else:
    MessageInput = CloseInput = RawValue

MESSAGE_REFUSED = "MessageRefused"  # the type of a refused ``send``'s failure; its first detail is the SendResult
# Between messages a session continues as new once its history is this long, so that every run of the
# chain stays well under Temporal's limits and the chain's total grows with the number of messages.
HISTORY_EVENTS_BEFORE_NEW_RUN = 2_000
HISTORY_BYTES_BEFORE_NEW_RUN = 512 * 1024
CLOSED_BY = "close"  # the "reviewer" of the approvals a close decided (see ``_close_approvals``)
MIN_WAIT_S = 1.0  # the shortest idle timer (timers of a few ms would only wake the session for nothing)


class SessionBook:
    """A session's messages: taken, waiting and seen (pure state over ``SessionCarry``)."""

    def __init__(self, spec: SessionSpec | None, state: SessionCarry) -> None:
        self.spec = spec
        self.state = state
        self.ready = False  # the run knows where its conversation stands: numbers can be given

    @property
    def on(self) -> bool:
        return self.spec is not None

    def refusal(self, message: SessionMessage, *, busy: bool) -> tuple[str, str] | None:
        """``(reason, why)`` when ``message`` cannot be taken now; None when it can (or is a repeat)."""
        if self.spec is None:
            return "not_a_session", 'this run is not a session (a session starts with "session": {} in its input)'
        if message.message_id in self.state.seen:
            return None
        if self.state.closing:
            return "closed", "the session is closing"
        if busy and self.spec.on_busy == "reject":
            return "busy", "the agent is working on an earlier message and this session refuses messages meanwhile"
        if len(self.state.queue) >= MAX_QUEUED:
            return "queue_full", f"{MAX_QUEUED} messages wait to be taken already"
        return None

    def repeat(self, message: SessionMessage) -> SendResult | None:
        seq = self.state.seen.get(message.message_id)
        if seq is None:
            return None
        return SendResult(
            accepted=True,
            seq=seq,
            duplicate=True,
            message=f"message {quote(message.message_id)} was taken before, as message {seq}",
        )

    def take(self, message: SessionMessage, at: str) -> SendResult:
        state = self.state
        state.messages += 1
        seq = state.messages
        state.queue.append(
            QueuedMessage(seq=seq, message_id=message.message_id, text=message.text, sender=message.sender, at=at)
        )
        state.seen[message.message_id] = seq
        while len(state.seen) > SEEN_IDS:
            del state.seen[next(iter(state.seen))]
        state.last_message_at = at
        state.last_message = safe(message.text, PREVIEW_MAX)
        return SendResult(accepted=True, seq=seq, message=f"message {seq} taken")

    def hand_over(self, carry: Carry) -> list[int]:
        """Put the waiting messages at the end of the next model turn's transcript, in arrival order."""
        handed = []
        for queued in self.state.queue:
            entry = Message(role="user", content=queued.text, name=queued.sender)
            carry.pending.append(TranscriptEntry(seq=carry.transcript_len, message=entry))
            carry.transcript_len += 1
            self.state.handed = max(self.state.handed, queued.seq)
            handed.append(queued.seq)
        self.state.queue = []
        return handed


def refused(reason: str, why: str) -> ApplicationError:
    """A refused ``send``: non-retryable (asking again cannot change the answer), the answer as its detail."""
    answer = SendResult(accepted=False, reason=reason, message=why)
    return ApplicationError(f"{reason}: {why}", answer, type=MESSAGE_REFUSED, non_retryable=True)


def history_is_long() -> bool:
    info = workflow.info()
    return (
        info.get_current_history_length() >= HISTORY_EVENTS_BEFORE_NEW_RUN
        or info.get_current_history_size() >= HISTORY_BYTES_BEFORE_NEW_RUN
        or info.is_continue_as_new_suggested()
    )


class SessionHandlers:
    """``message``, ``send`` and ``close`` of ``AgentWorkflow``, over the state its ``__init__`` sets."""

    _sessions: SessionBook
    _book: ApprovalBook
    _state: RunState
    _model_call: asyncio.Task[Any] | None  # the model turn in flight (an activity handle)
    _interrupting: bool  # this run cancelled that turn for a new message (``on_busy: interrupt``)

    def _emit(self, kind: EventKind, text: str, tool: str = "", **data: object) -> None:
        raise NotImplementedError  # AgentWorkflow's: one progress event

    def _refuse(self, kind: str, message: str, approval_id: str = "", event: EventKind = "decision_refused") -> None:
        raise NotImplementedError  # ApprovalHandlers': list, count, log and stream a refusal within bounds

    @workflow.signal(name="message")
    @one_payload
    async def message_signal(self, raw: MessageInput = NO_PAYLOAD, *extra: Any) -> None:
        message = decode(raw, SessionMessage, extra)
        if isinstance(message, str):
            self._refuse("malformed", f"refused message signal: {message}", event="message_refused")
            return
        await self._take_message(message, source="signal")

    @workflow.update(name="send")
    @one_payload
    async def send_update(self, raw: MessageInput = NO_PAYLOAD, *extra: Any) -> SendResult:
        message = decode(raw, SessionMessage, extra)
        if isinstance(message, str):  # the validator refuses these; it is skipped only on replay
            raise refused("malformed", message)
        return await self._take_message(message, source="update")

    @send_update.validator
    @one_payload
    def _validate_send(self, raw: MessageInput = NO_PAYLOAD, *extra: Any) -> None:
        message = decode(raw, SessionMessage, extra)
        if isinstance(message, str):
            raise refused("malformed", message)
        book = self._sessions
        problem = book.refusal(message, busy=self._busy()) if book.ready or not book.on else None
        if problem is not None:
            raise refused(*problem)

    @workflow.signal(name="close")
    @one_payload
    def close_signal(self, raw: CloseInput = NO_PAYLOAD, *extra: Any) -> None:
        request = CloseSignal() if raw is NO_PAYLOAD and not extra else decode(raw, CloseSignal, extra)
        if isinstance(request, str):
            self._refuse("malformed", f"refused close signal: {request}", event="message_refused")
            return
        if not self._sessions.on:
            self._refuse("not_a_session", "refused close signal: this run is not a session", event="message_refused")
            return
        state = self._sessions.state
        if state.closing:
            return
        state.closing, state.close_reason = True, request.reason
        self._emit(
            "idle", "close requested: the session ends" + (f" ({safe(request.reason, 200)})" if request.reason else "")
        )
        self._interrupt()
        self._close_approvals()

    def _close_approvals(self) -> None:
        """Decide what waits for a reviewer, so that ``close`` ends the session at once, not at their expiry.

        A call waiting for approval is not run (rejected, which the model's transcript says); an unknown
        outcome is left unknown (expired), never retried nor marked done on nobody's word.
        """
        book = self._book
        for aid, approval in list(book.pending.items()):
            if approval.kind == "tool_call":
                book.record(aid, Verdict("rejected", CLOSED_BY, "the session was closed before a decision"))
            else:
                book.expire(aid)
            outcome = book.decided[aid].outcome
            self._emit("approval_decided", f"{aid} {outcome}: the session closed", approval_id=aid, outcome=outcome)

    async def _take_message(self, message: SessionMessage, *, source: str) -> SendResult:
        book = self._sessions
        if book.on and not book.ready:  # numbers follow the conversation's earlier messages: known once it is open
            await workflow.wait_condition(lambda: book.ready)
        if book.on and (repeat := book.repeat(message)) is not None:
            return repeat
        problem = book.refusal(message, busy=self._busy())
        if problem is not None:
            reason, why = problem
            self._refuse(
                reason, f"refused message {quote(message.message_id)} via {source}: {why}", event="message_refused"
            )
            if source == "update":
                raise refused(reason, why)
            return SendResult(accepted=False, reason=reason, message=why)
        taken = book.take(message, workflow.now().isoformat())
        sender = f" from {safe(message.sender, 60)}" if message.sender else ""
        self._emit(
            "message_received",
            f"message {taken.seq}{sender}: {safe(message.text, 120)}",
            seq=taken.seq,
            message_id=message.message_id,
            sender=message.sender,
        )
        if self._busy() and book.spec is not None and book.spec.on_busy == "interrupt":
            self._interrupt()
        return taken

    def _busy(self) -> bool:
        return self._sessions.state.busy

    def _interrupt(self) -> None:
        """Cancel the model turn in flight (it starts again with what arrived); a running tool is never cut off."""
        call = self._model_call
        if call is not None and not call.done() and not self._interrupting:
            self._interrupting = True
            call.cancel()

    async def _wait_for_message(self, spec: SessionSpec, carry: Carry, stop_sandbox: Callable[[], Any]) -> str:
        """``message``, ``close`` or ``idle_timeout``: what ended the wait (no activity runs meanwhile)."""
        state = self._sessions.state
        if not state.idle_since:
            state.idle_since = workflow.now().timestamp()
        if self._state != "idle" and not state.queue and not state.closing:
            self._state = "idle"
            self._emit("idle", "idle: waiting for the next message")
        while True:
            if state.closing:
                return "close"
            if state.queue:
                return "message"
            now = workflow.now().timestamp()
            idle_end = state.idle_since + spec.idle_timeout_s
            if now >= idle_end:
                return "idle_timeout"
            sandbox_end = state.idle_since + spec.sandbox_idle_s if carry.sandbox_id and not carry.shared_sandbox else 0
            wake = min(idle_end, sandbox_end) if sandbox_end else idle_end
            try:
                await workflow.wait_condition(
                    lambda: bool(state.queue) or state.closing,
                    timeout=timedelta(seconds=max(MIN_WAIT_S, wake - now)),
                    timeout_summary="idle: no message yet",
                )
            except TimeoutError:
                if sandbox_end and carry.sandbox_id and workflow.now().timestamp() >= sandbox_end:
                    await stop_sandbox()

    async def _run_session(self, inp: AgentInput, spec: SessionSpec, carry: Carry) -> AgentResult:
        """Answer messages until the session closes, idles out, or spends its ``max_tokens``/``max_cost_usd``."""
        book = self._sessions
        state = book.state
        carry.session = state
        book.ready = True
        while True:
            if not state.busy:
                why = await self._wait_for_message(spec, carry, lambda: self._stop_idle_sandbox(carry))
                if why != "message":
                    return await self._end_session(carry, why)
                if history_is_long():  # between messages: the next run starts with this one's state
                    await self._continue_as_new(inp, carry)
                state.busy = True
                now = workflow.now().timestamp()
                carry.message_step, carry.work_started_at, carry.waited_s = carry.step, now, 0.0
                self._state = "running"
            ending = await self._loop(inp, carry)
            if ending.scope == "close":
                return await self._end_session(carry, "close")
            if ending.scope == "run":  # the session's own budget is spent (or the tree's): it ends
                await self._cleanup(carry)
                return self._finish(ending.status, ending.text)
            state.busy = False
            state.replied = state.handed
            state.last_reply = ending.text[:LAST_TEXT_MAX]
            state.idle_since = workflow.now().timestamp()
            self._output = state.last_reply
            self._state = "idle" if not state.queue else "running"
            self._emit(
                "replied",
                f"replied to message {state.replied}" + ("" if ending.status == "completed" else f" ({ending.status})"),
                seq=state.replied,
                status=ending.status,
            )

    async def _stop_idle_sandbox(self, carry: Carry) -> None:
        """Kill an idle session's sandbox; its next sandbox tool restores the workspace from ``carry.checkpoint``."""
        sandbox_id = carry.sandbox_id
        try:
            await workflow.execute_activity(
                "sandbox_kill",
                SandboxRequest(sandbox_id=sandbox_id, conversation_id=carry.conversation_id),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=HOUSEKEEPING_RETRY,
                summary="kill idle sandbox",
            )
        except ActivityError as err:
            workflow.logger.warning("session: killing idle sandbox %s failed: %s", sandbox_id, err)
            return
        carry.sandbox_id = ""
        where = f"checkpoint {carry.checkpoint[:24]}" if carry.checkpoint else "an empty workspace"
        self._emit("idle", f"idle: sandbox stopped; the next sandbox tool restores {where}")

    async def _end_session(self, carry: Carry, why: str) -> AgentResult:
        state = self._sessions.state
        state.busy = False
        await self._cleanup(carry)
        if why == "close":
            reason = f": {safe(state.close_reason, 200)}" if state.close_reason else ""
            self._emit("idle", f"closed{reason}")
        else:
            self._emit("idle", "no message within idle_timeout_s: the session ends (a send wakes it again)")
        return self._finish("completed", state.last_reply)

    # AgentWorkflow's
    async def _loop(self, inp: AgentInput, carry: Carry) -> Ending:
        raise NotImplementedError

    async def _cleanup(self, carry: Carry) -> None:
        raise NotImplementedError

    async def _continue_as_new(self, inp: AgentInput, carry: Carry) -> None:
        raise NotImplementedError

    def _finish(self, status: ResultStatus, output: str) -> AgentResult:
        raise NotImplementedError
