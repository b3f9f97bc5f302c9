"""A run's conversation (messages, replies, tool calls) read from its history.

Where the entries come from: the Temporal history of every execution of the id, oldest first
(``ListWorkflowExecutions`` by ``WorkflowId``: the runs a continue-as-new chain left and the earlier
lives of a session that was woken by a ``send``), decoded with the client ``AgentClient`` has, so
an encrypted run reads with the same key ring as ``status`` and no run store is needed.

- **message**: the run's ``task`` (its started event, when the run was not continued: a session's
  first message, a plain run's task), each ``message`` signal and each accepted ``send`` update
  (their request payload). A ``send``'s number (``seq``) is the one its ``SendResult`` in history
  says; a signal's is the next number. A ``message_id`` seen before is the same message and is not
  listed twice. A refused ``send`` never reaches history (the validator refuses it); a signal the
  session refused (malformed, or sent while it was closing, its queue full, or ``reject`` and busy)
  is in history too: a malformed one is skipped, the others are listed (the run's own refusal is
  only in its state, not in the history).
- **reply**: a completed ``model`` activity whose ``ModelTurn`` has no tool calls; its ``seq`` is
  the newest message taken before that model turn was scheduled (the turn answers up to it).
- **tool_call**: each tool call of a completed ``model`` activity (name and arguments); its result is
  the ``ToolOutcome.preview`` of the tool activity that ran it (matched by the call id of its
  ``ToolInvocation``), or the activity's failure. A call the model got an error for without a run
  (a bad call) shows that error. A call with no activity (a sub-agent, a denied approval) has an
  empty result.

A fork's own history starts after the steps it copied from its source: those are in the source's
transcript, not listed again. Progress events are not used: they live in the workflow's state (a
stream whose older events are dropped), not in history. What reading costs is one
``ListWorkflowExecutions`` plus one history per execution, every event of it fetched
(``bench/transcript_cost.py`` measures time and bytes).
Output is bounded per entry: tool results and arguments are cut to ``SHORT_CHARS``, texts to
``TEXT_CHARS`` in the text rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.agent_client._errors import RunNotFound
from durable_agents.agent_client._reading import RPC_TIMEOUT, VISIBILITY_PAGE, check_agent_run, query_literal
from workflows.session_types import SendResult, SessionMessage
from workflows.types import AgentInput, ModelTurn, ToolInvocation, ToolOutcome

SHORT_CHARS = 200  # of a tool result or a call's arguments
TEXT_CHARS = 2000  # of a message or a reply in the text rendering (JSON keeps what history holds)
MODEL_ACTIVITY = "model"
T = TypeVar("T")
# The event types a conversation is read from (looked up once: a protobuf enum attribute is slow).
_STARTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
_SIGNALED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
_UPDATE_ACCEPTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
_UPDATE_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED
_SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
_COMPLETED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
_FAILED = EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
_TIMED_OUT = EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
_READ = frozenset(
    {_STARTED, _SIGNALED, _UPDATE_ACCEPTED, _UPDATE_COMPLETED, _SCHEDULED, _COMPLETED, _FAILED, _TIMED_OUT}
)


@dataclass
class Entry:
    """One line of a conversation; :meth:`as_json` gives the stable keys of ``--json``."""

    kind: str  # "message" | "reply" | "tool_call"
    seq: int  # the message it is, answers, or was made for
    at: str  # when history recorded it, ISO 8601
    text: str = ""
    sender: str = ""
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    result: str = ""
    ok: bool | None = None  # a tool call's outcome (None: no result in history)

    def as_json(self) -> dict[str, Any]:
        if self.kind == "tool_call":
            return {
                "kind": self.kind,
                "seq": self.seq,
                "name": self.name,
                "arguments": self.arguments,
                "result": self.result,
                "ok": self.ok,
                "at": self.at,
            }
        data: dict[str, Any] = {"kind": self.kind, "seq": self.seq, "text": self.text, "at": self.at}
        if self.kind == "message":
            data["sender"] = self.sender
        return data


@dataclass
class Transcript:
    """The entries, and what reading them cost."""

    workflow_id: str
    entries: list[Entry] = field(default_factory=list)
    executions: int = 0  # histories read
    events: int = 0  # history events fetched
    history_bytes: int = 0  # their serialized size


@dataclass
class _Reader:
    """Walks the histories in order, keeping what numbers the messages across executions."""

    client: Client
    out: Transcript
    last_seq: int = 0  # the newest message number so far
    seen: dict[str, int] = field(default_factory=dict)  # message_id -> seq
    updates: dict[str, tuple[Entry, str]] = field(default_factory=dict)  # update id -> (its entry, message_id)
    model_turns: dict[int, int] = field(default_factory=dict)  # scheduled event id -> messages taken before it
    tools: dict[int, str] = field(default_factory=dict)  # scheduled event id -> call id
    calls: dict[str, Entry] = field(default_factory=dict)  # call id -> its entry

    async def decode(self, payload: Payload, kind: type[T]) -> T | None:
        """One payload as ``kind``; None when it is not one (an encrypted payload without keys raises)."""
        try:
            [value] = await self.client.data_converter.decode([payload], [kind])
        except (ValueError, TypeError, KeyError, RuntimeError):  # not this type (PayloadsEncrypted goes on)
            return None
        return value if isinstance(value, kind) else None

    async def read(self, run_id: str) -> None:
        handle = self.client.get_workflow_handle(self.out.workflow_id, run_id=run_id)
        self.out.executions += 1
        async for event in handle.fetch_history_events(rpc_timeout=RPC_TIMEOUT):
            self.out.events += 1
            self.out.history_bytes += event.ByteSize()
            await self.event(event)

    async def event(self, event: HistoryEvent) -> None:
        kind = event.event_type
        if kind not in _READ:
            return
        at = _iso(event.event_time)
        if kind == _STARTED:
            await self._started(event, at)
        elif kind == _SIGNALED:
            attrs = event.workflow_execution_signaled_event_attributes
            if attrs.signal_name == "message" and len(attrs.input.payloads) == 1:
                message = await self.decode(attrs.input.payloads[0], SessionMessage)
                if message is not None and message.message_id not in self.seen:
                    self._message(message, self.last_seq + 1, at)
        elif kind == _UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name == "send" and len(request.input.args.payloads) == 1:
                message = await self.decode(request.input.args.payloads[0], SessionMessage)
                if message is not None:
                    entry = Entry("message", 0, at, text=message.text, sender=message.sender)
                    self.updates[request.meta.update_id] = (entry, message.message_id)
        elif kind == _UPDATE_COMPLETED:
            await self._update_completed(event)
        elif kind == _SCHEDULED:
            await self._scheduled(event)
        elif kind == _COMPLETED:
            await self._completed(event, at)
        else:
            self._tool_failed(event)

    async def _started(self, event: HistoryEvent, at: str) -> None:
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        inp = await self.decode(payloads[0], AgentInput) if len(payloads) == 1 else None
        if inp is None:
            return
        if inp.carry is not None:  # continued: its task was listed by the run before
            if inp.carry.session is not None:
                self.last_seq = max(self.last_seq, inp.carry.session.messages)
            return
        if inp.task:
            self.out.entries.append(Entry("message", self.last_seq + 1, at, text=inp.task))
            self.last_seq += 1

    def _message(self, message: SessionMessage, seq: int, at: str) -> None:
        self.out.entries.append(Entry("message", seq, at, text=message.text, sender=message.sender))
        self.seen[message.message_id] = seq
        self.last_seq = max(self.last_seq, seq)

    async def _update_completed(self, event: HistoryEvent) -> None:
        attrs = event.workflow_execution_update_completed_event_attributes
        pending = self.updates.pop(attrs.meta.update_id, None)
        if pending is None or not attrs.outcome.HasField("success"):
            return
        entry, message_id = pending
        payloads = attrs.outcome.success.payloads
        answer = await self.decode(payloads[0], SendResult) if len(payloads) == 1 else None
        if answer is None or not answer.accepted or answer.duplicate or message_id in self.seen:
            return
        entry.seq = answer.seq
        self.out.entries.append(entry)
        self.seen[message_id] = answer.seq
        self.last_seq = max(self.last_seq, answer.seq)

    async def _scheduled(self, event: HistoryEvent) -> None:
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_type.name == MODEL_ACTIVITY:
            self.model_turns[event.event_id] = self.last_seq
            return
        if len(attrs.input.payloads) != 1:
            return
        invocation = await self.decode(attrs.input.payloads[0], ToolInvocation)
        if invocation is not None and invocation.call_id in self.calls:
            self.tools[event.event_id] = invocation.call_id

    async def _completed(self, event: HistoryEvent, at: str) -> None:
        attrs = event.activity_task_completed_event_attributes
        scheduled = attrs.scheduled_event_id
        payloads = attrs.result.payloads
        if scheduled in self.model_turns:
            seq = self.model_turns.pop(scheduled)
            turn = await self.decode(payloads[0], ModelTurn) if len(payloads) == 1 else None
            if turn is None:
                return
            if not turn.tool_calls:
                self.out.entries.append(Entry("reply", seq, at, text=turn.text))
            for call in turn.tool_calls:
                entry = Entry("tool_call", seq, at, name=call.name, arguments=call.arguments)
                if call.error:
                    entry.result, entry.ok = short(f"error: {call.error}"), False
                self.calls[call.id] = entry
                self.out.entries.append(entry)
        elif scheduled in self.tools:
            entry = self.calls[self.tools.pop(scheduled)]
            outcome = await self.decode(payloads[0], ToolOutcome) if len(payloads) == 1 else None
            if outcome is not None:
                entry.result, entry.ok, entry.at = short(outcome.preview), outcome.ok and not outcome.unknown, at

    def _tool_failed(self, event: HistoryEvent) -> None:
        if event.event_type == _FAILED:
            attrs = event.activity_task_failed_event_attributes
            scheduled, why = attrs.scheduled_event_id, attrs.failure.message
        else:
            timed_out = event.activity_task_timed_out_event_attributes
            scheduled, why = timed_out.scheduled_event_id, "timed out"
        call_id = self.tools.pop(scheduled, None)
        if call_id is not None:
            entry = self.calls[call_id]
            entry.result, entry.ok = short(f"failed: {why}"), False


def _iso(stamp: Timestamp) -> str:
    return stamp.ToDatetime().replace(tzinfo=None).isoformat(timespec="seconds") + "Z" if stamp.seconds else ""


def short(text: str, limit: int = SHORT_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


async def executions(client: Client, workflow_id: str) -> list[str]:
    """The run ids of every execution of ``workflow_id``, oldest first; ``RunNotFound`` for a missing id.

    The listing (visibility) may lag the newest execution a moment: the one ``describe`` names is added.
    """
    handle = client.get_workflow_handle(workflow_id)
    try:
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFound(f"no run with id {workflow_id!r}") from None
        raise
    check_agent_run(desc)
    found: dict[str, datetime] = {}
    query = f"WorkflowId = {query_literal(workflow_id)}"
    async for wf in client.list_workflows(query, page_size=VISIBILITY_PAGE, rpc_timeout=RPC_TIMEOUT):
        if wf.workflow_type == desc.workflow_type:
            found[wf.run_id] = wf.start_time
    found.setdefault(desc.run_id, desc.start_time)
    return sorted(found, key=lambda run_id: found[run_id])


async def read_transcript(client: Client, workflow_id: str) -> Transcript:
    """Every execution's history of ``workflow_id``, oldest first, as one conversation."""
    out = Transcript(workflow_id)
    reader = _Reader(client, out)
    for run_id in await executions(client, workflow_id):
        await reader.read(run_id)
    return out
