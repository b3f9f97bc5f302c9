"""The typed values ``AgentClient`` takes and returns (also the HTTP API's bodies)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from workflows.progress import ProgressEvent
from workflows.types import PendingApproval

Decision = Literal["approve", "reject", "answer", "resolve"]


class RunRef(BaseModel):
    """A started run: what ``start`` and ``fork`` answer (``POST /v1/runs`` too)."""

    workflow_id: str
    run_id: str


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


class PendingItem(PendingApproval):
    """A pending approval or question, with the run to decide it on (``GET /v1/approvals``)."""

    # PendingApproval.workflow_id names a sub-agent's run for relayed entries; here it is always
    # the run that owns the approval, the one a decision goes to.


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
