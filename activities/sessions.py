"""The ``session_open`` activity: a session's conversation in the run store, made or found again.

A session's conversation id is its workflow id's (``<workflow id>/session``), so a session that
ended and is woken under the same id by a later ``send`` finds its transcript and workspace:
this activity reads the conversation once at the start of every run of a session that does not
continue another, and says where it stands (length, steps, messages, last checkpoint). A new
conversation gets the system prompt at position 0, with the session's tenant in its metadata;
a conversation found must be the same tenant's, or the session is refused (a tenant never
reads another's conversation by naming its workflow id). Tool calls an earlier run left
without a result (a run terminated mid-call) get an error result, so the transcript is one a
model provider accepts.
"""

from __future__ import annotations

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.checkpoints.fork import checkpoint_at
from activities.runtime import Runtime
from activities.store.base import TENANT_META, USER_META, StoredMessage
from activities.store_errors import store_guarded
from workflows.inputs import quote
from workflows.session_types import LAST_TEXT_MAX, PREVIEW_MAX, SessionOpenRequest, SessionOpenResult
from workflows.types import Message

MAX_SESSION_ENTRIES = 1_000_000
log = structlog.get_logger("activities.sessions")


class SessionActivities:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @activity.defn(name="session_open")
    @store_guarded
    async def session_open(self, req: SessionOpenRequest) -> SessionOpenResult:
        """The runs of a session recorded before ``run_config`` opened sessions schedule this (replay)."""
        return await open_session(self._rt, req)


async def open_session(runtime: Runtime, req: SessionOpenRequest) -> SessionOpenResult:
    """Make or find the session's conversation (``run_config`` does, for a new run of a session).

    Refuses (``InvalidInput``) a conversation that another tenant's or user's session made.
    """
    store = runtime.store
    run_id = activity.info().workflow_run_id or ""
    first = await store.get_message(req.conversation_id, 0)
    if first is None:
        meta: dict[str, object] = {"run": run_id, TENANT_META: req.tenant, USER_META: req.user, "session": True}
        stored = await store.put_message(
            req.conversation_id, 0, Message(role="system", content=req.system_prompt), meta
        )
        if stored.meta.get("run") == run_id:  # ours (an earlier attempt of this run's, or this one)
            return SessionOpenResult(fresh=True, transcript_len=1)
        first = stored
    # A conversation a session made names its tenant and user; one a fork copied from a run was checked by the fork.
    for key, ours, what in ((TENANT_META, req.tenant, "tenant"), (USER_META, req.user, "user")):
        if first.meta.get("session") and str(first.meta.get(key, "")) != ours:
            mine = f"{what} {quote(ours)}" if ours else f"no {what}"
            raise ApplicationError(
                f"session conversation {quote(req.conversation_id)} belongs to another {what} than this run's ({mine})",
                type="InvalidInput",
                non_retryable=True,
            )
    transcript = await store.transcript(req.conversation_id, limit=MAX_SESSION_ENTRIES)
    closed = await _close_open_calls(runtime, req.conversation_id, transcript)
    transcript += closed
    result = _standing(transcript)
    result.closed_calls = len(closed)
    log.info(
        "session_reopened",
        conversation=req.conversation_id,
        entries=result.transcript_len,
        steps=result.steps,
        messages=result.messages,
        closed_calls=result.closed_calls,
    )
    return result


async def _close_open_calls(
    runtime: Runtime, conversation_id: str, transcript: list[StoredMessage]
) -> list[StoredMessage]:
    """Error results for the last turn's tool calls that have none (stored at their positions)."""
    turns = [i for i, entry in enumerate(transcript) if entry.message.role == "assistant"]
    if not turns:
        return []
    last = turns[-1]
    calls = transcript[last].message.tool_calls
    written: list[StoredMessage] = []
    for index, call in enumerate(calls):
        seq = last + 1 + index
        if seq < len(transcript):
            continue
        text = f"Error: the session's earlier run ended before {call.name} finished; its outcome is unknown."
        message = Message(role="tool", content=text, tool_call_id=call.id, name=call.name, is_error=True)
        written.append(await runtime.store.put_message(conversation_id, seq, message, {"closed": True}))
    return written


def _standing(transcript: list[StoredMessage]) -> SessionOpenResult:
    users = [e for e in transcript[1:] if e.message.role == "user"]
    replies = [e for e in transcript if e.message.role == "assistant" and not e.message.tool_calls]
    return SessionOpenResult(
        fresh=False,
        transcript_len=len(transcript),
        steps=sum(1 for e in transcript if e.message.role == "assistant"),
        messages=len(users),
        checkpoint=checkpoint_at(transcript, len(transcript)),
        last_reply=replies[-1].message.content[:LAST_TEXT_MAX] if replies else "",
        last_message=users[-1].message.content[:PREVIEW_MAX] if users else "",
    )
