"""The data contract of sessions: an ``AgentWorkflow`` that is a conversation.

A run started with ``"session": {...}`` in its input answers each message and then waits for
the next one instead of completing. Messages arrive as the ``message`` signal or the ``send``
update (:class:`SessionMessage`); the update answers with a :class:`SendResult`. ``close``
(a signal, :class:`CloseSignal`) ends a session at once. :class:`SessionCarry` is what a
session hands to itself across continue-as-new.

Pure pydantic (workflow code imports it). New fields always get defaults.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator

from workflows.known_keys import KnownKeys

DEFAULT_IDLE_TIMEOUT_S = 7 * 24 * 3600  # a session with no message for a week completes
DEFAULT_SANDBOX_IDLE_S = 600  # an idle session's sandbox is killed after 10 minutes
MAX_IDLE_S = 365 * 24 * 3600
MAX_MESSAGE_CHARS = 100_000  # of one message's text
MAX_MESSAGE_ID_CHARS = 200
MAX_SENDER_CHARS = 200
MAX_QUEUED = 100  # messages waiting to be taken; one more is refused (``queue_full``)
SEEN_IDS = 1000  # message ids a session remembers (carried across continue-as-new) to answer duplicates
LAST_TEXT_MAX = 32 * 1024  # characters of the last reply a session keeps (its ``output``)
PREVIEW_MAX = 500  # characters of the last message a session shows in its status and the UI

OnBusy = Literal["queue", "interrupt", "reject"]
# Why a message was refused (``SendResult.reason``; also the refusal's kind in ``status.refused_counts``).
RefusalReason = Literal["malformed", "not_a_session", "closed", "busy", "queue_full"]


class SessionSpec(KnownKeys):
    """``AgentInput.session``: the run is a session (a conversation), not a one-shot task."""

    idle_timeout_s: int = Field(default=DEFAULT_IDLE_TIMEOUT_S, ge=1, le=MAX_IDLE_S)  # no message this long: it ends
    # A message that arrives while the agent works: handed to the model at its next turn (``queue``),
    # the model turn in flight cancelled and started again with it (``interrupt``; running tools
    # finish), or refused (``reject``).
    on_busy: OnBusy = "queue"
    sandbox_idle_s: int = Field(default=DEFAULT_SANDBOX_IDLE_S, ge=1, le=MAX_IDLE_S)  # idle this long: sandbox killed


class SessionMessage(KnownKeys):
    """Payload of the ``message`` signal and the ``send`` update (public contract)."""

    # The caller's id of the message: the same id sent again (a retry) is the same message.
    message_id: str = Field(min_length=1, max_length=MAX_MESSAGE_ID_CHARS)
    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)  # what the user says (not blank)
    sender: str = Field(default="", max_length=MAX_SENDER_CHARS)  # who says it (kept with the message)

    @field_validator("text")
    @classmethod
    def _has_text(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("must not be empty or whitespace only")
        return text


class SendResult(BaseModel):
    """The ``send`` update's answer: the message was taken (its number in the session) or refused (why)."""

    accepted: bool  # taken (or taken before: ``duplicate``)
    seq: int = 0  # the message's number in the session (1: the first); 0 when refused
    duplicate: bool = False  # a message with this ``message_id`` was taken before; nothing new was queued
    reason: str = ""  # why it was refused (a ``RefusalReason``); "" when accepted
    message: str = ""  # what happened, in one line


class CloseSignal(KnownKeys):
    """Payload of the ``close`` signal (optional): end the session now."""

    reason: str = Field(default="", max_length=2000)  # kept in the session's output


class QueuedMessage(BaseModel):
    """A message taken by the session and not yet handed to the model."""

    seq: int = Field(ge=1, le=10**9)
    message_id: str = Field(max_length=MAX_MESSAGE_ID_CHARS)
    text: str = Field(max_length=MAX_MESSAGE_CHARS)
    sender: str = Field(default="", max_length=MAX_SENDER_CHARS)
    at: str = Field(default="", max_length=40)  # workflow time it was taken, ISO 8601


class SessionCarry(BaseModel):
    """What a session hands to itself across continue-as-new (``Carry.session``)."""

    messages: int = Field(default=0, ge=0, le=10**9)  # messages taken so far (the last one's ``seq``)
    replied: int = Field(default=0, ge=0, le=10**9)  # the highest message ``seq`` whose work has finished
    queue: list[QueuedMessage] = Field(default_factory=list, max_length=MAX_QUEUED)
    # message id -> its seq, oldest first, the newest SEEN_IDS of them
    seen: dict[Annotated[str, Field(max_length=MAX_MESSAGE_ID_CHARS)], int] = Field(
        default_factory=dict, max_length=SEEN_IDS
    )
    handed: int = Field(default=0, ge=0, le=10**9)  # the highest message ``seq`` handed to the model
    busy: bool = False  # a message's work is in progress (it goes on in the next run)
    closing: bool = False  # ``close`` arrived: the session ends at its next step
    close_reason: str = Field(default="", max_length=2000)
    idle_since: float = Field(default=0.0, ge=0, le=1e11)  # epoch seconds the session last became idle
    last_message_at: str = Field(default="", max_length=40)
    last_message: str = Field(default="", max_length=PREVIEW_MAX)
    last_reply: str = Field(default="", max_length=LAST_TEXT_MAX)


class SessionOpenRequest(BaseModel):
    """Activity ``session_open``: a session's conversation in the run store, made or found."""

    conversation_id: str  # "<workflow id>/session"
    tenant: str = ""  # the session's; a conversation found must be this tenant's
    user: str = ""  # the session's user; a conversation found must be this user's
    system_prompt: str = ""  # stored at position 0 when the conversation is new


class SessionOpenResult(BaseModel):
    """Where a session's conversation stands: new, or what the session's earlier runs left."""

    fresh: bool  # the conversation was empty: the system prompt was stored at position 0
    transcript_len: int = Field(default=1, ge=0)  # entries [0, transcript_len) are stored
    steps: int = Field(default=0, ge=0)  # model turns answered so far (assistant entries)
    messages: int = Field(default=0, ge=0)  # user messages so far
    checkpoint: str = ""  # the last workspace checkpoint a tool recorded ("": an empty workspace)
    last_reply: str = Field(default="", max_length=LAST_TEXT_MAX)
    last_message: str = Field(default="", max_length=PREVIEW_MAX)
    closed_calls: int = 0  # tool calls left without a result by an earlier run, answered now with an error
