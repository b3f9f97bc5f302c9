"""The typed values ``AgentClient`` takes and returns (also the HTTP API's bodies)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from workflows.progress import ProgressEvent
from workflows.session_types import SendResult
from workflows.types import AgentResult, PendingApproval, StatusView

# ``resolve`` answers an unknown outcome with ``resolution=``; ``retry``/``mark_done``/``fail`` name it directly.
Decision = Literal["approve", "reject", "answer", "resolve", "retry", "mark_done", "fail"]


class RunRef(BaseModel):
    """A started run: what ``start`` and ``fork`` answer (``POST /v1/runs`` too)."""

    workflow_id: str
    run_id: str


class PendingItem(PendingApproval):
    """A pending approval or question, with the run to decide it on (``GET /v1/approvals``)."""

    # PendingApproval.workflow_id names a sub-agent's run for relayed entries; here it is always
    # the run that owns the approval, the one a decision goes to.
    via: str = ""  # the run it was found under (asked for by id), when that is not the owner: a sub-agent's


class RunSummary(BaseModel):
    """One row of ``list``."""

    workflow_id: str
    run_id: str = ""
    state: str = ""  # the agent's own state (AgentState), or Temporal's when the run closed early
    tenant: str = ""
    model: str = ""
    started_at: str = ""  # ISO 8601
    closed_at: str = ""
    session: bool = False
    messages: int | None = None  # a session's messages so far (None: not known)
    execution_status: str = ""  # Temporal's word for it: running, completed, failed, terminated, ...


class RunPage(BaseModel):
    """One page of ``list_page``: the runs, the next page's token ("" at the end), and how many match
    in all (None: the server did not say)."""

    runs: list[RunSummary]
    next_page_token: str = ""
    total: int | None = None


class PendingPage(BaseModel):
    """One page of ``pending_page``: the pending entries and what a front end says about the rest."""

    items: list[PendingItem]
    next_page_token: str = ""
    more: int = 0  # waiting runs beyond this page
    unanswered: int = 0  # listed runs whose worker did not answer (each one warned about)
    state: str = ""  # for one run: its state (a closed run's is how it ended)


class RunDescription(BaseModel):
    """Everything ``status`` knows of a run, whether or not a worker answers (the CLI's ``status``)."""

    workflow_id: str
    run_id: str = ""
    execution_status: str = ""  # Temporal's word: running, completed, failed, terminated, timed_out, ...
    state: str = ""  # the agent's (a closed run's outcome; a running run's recorded state without a worker)
    view: StatusView | None = None  # a running run's status query answer
    result: AgentResult | None = None  # a closed run's result (returned, or in its workflow's failure)
    error: str = ""  # why a run without a result ended (its failure)
    no_answer: str = ""  # a running run no worker answered for: why ("no worker answered: ...")
    # What the server recorded without a worker (a running run no worker answered for).
    task_queue: str = ""
    started_at: str = ""  # ISO 8601, seconds
    pending_approval_count: int | None = None
    model: str = ""
    cost_usd: float | None = None


class EventCursor(BaseModel):
    """Where a reader of a run's events is: the progress offset and the streamed-text sequence
    it has seen. ``str()``/``parse`` give the SSE ``id`` / ``Last-Event-ID`` form ``"<offset>.<seq>"``."""

    offset: int = Field(default=0, ge=0)  # progress events seen (the stream's global offset)
    seq: int = Field(default=0, ge=0)  # streamed-text deltas seen

    def __str__(self) -> str:
        return f"{self.offset}.{self.seq}"

    @classmethod
    def parse(cls, text: str) -> EventCursor:
        """The cursor an SSE client sent back; ``ValueError`` when it is not ``"<int>.<int>"``."""
        offset, _, seq = text.strip().partition(".")
        if not offset.isdigit() or not (seq or "0").isdigit() or len(text) > 40:
            raise ValueError(f"not an event cursor: {text[:40]!r}")
        return cls(offset=int(offset), seq=int(seq or 0))


class RunEvent(BaseModel):
    """One event of a run: a progress event (``kind`` is its kind) or a streamed text delta
    (``kind == "delta"``: ``text`` continues turn ``turn``'s reply; a delta of a retried attempt
    has ``attempt`` > the previous one's and ``data["restart"] = True`` on its first delta, so a
    client discards the partial text of the earlier attempt)."""

    kind: str
    cursor: EventCursor  # resume after this event with this cursor
    progress: ProgressEvent | None = None  # set for progress events
    text: str = ""  # a delta's text
    turn: int = 0
    attempt: int = 0
    data: dict[str, Any] = Field(default_factory=dict)


class SessionSend(BaseModel):
    """What ``send_session`` did: the session's answer, and whether the message started or woke it."""

    workflow_id: str
    result: SendResult
    task_queue: str = ""
    started: bool = False  # no run had the id: the message started the session
    woke: str = ""  # the session had ended (this is how): the message woke it; "" when it was running
