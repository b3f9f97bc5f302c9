"""The approval book: pending approvals of a run, their decisions and who may make them.

Pure bookkeeping used by ``AgentWorkflow``; every check here is deterministic
(it depends only on workflow state and ``workflow.now()`` passed in), so a
decision is accepted or refused identically on replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

from workflows.inputs import quote
from workflows.types import PendingApproval

Outcome = Literal["approved", "rejected", "expired", "retry", "mark_done", "fail"]
# Which decisions answer which kind of approval.
DECISIONS = {
    "tool_call": ("approve", "reject"),
    "resolve_unknown_outcome": ("retry", "mark_done", "fail"),
}


ALREADY_DECIDED = "already_decided"  # the one refusal a ``decide`` update answers (accepted: false), not fails
REFUSED_KEPT = 20  # refusal messages the status view lists; all of them are counted


class Problem(NamedTuple):
    """Why a decision is refused: a reason kind (counted in the status view) and its text."""

    kind: str
    text: str


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reviewer: str = ""
    note: str = ""  # comment on approval, reason on rejection


class ApprovalBook:
    def __init__(self, approvers: list[str], signing_required: bool) -> None:
        self.approvers = list(approvers)
        self.signing_required = signing_required
        self.pending: dict[str, PendingApproval] = {}
        self.expires: dict[str, datetime] = {}
        self.decided: dict[str, Verdict] = {}
        self.refused: list[str] = []
        self.refused_counts: dict[str, int] = {}

    def open(self, approval: PendingApproval, expires_at: datetime) -> None:
        self.pending[approval.approval_id] = approval
        self.expires[approval.approval_id] = expires_at

    def problem(self, approval_id: str, decision: str, reviewer: str, signature: str, now: datetime) -> Problem | None:
        """Why a decision must be refused, or None when it may be recorded (signature aside)."""
        if approval_id in self.decided:
            return Problem(
                ALREADY_DECIDED, f"approval {approval_id} was already decided ({self.decided[approval_id].outcome})"
            )
        if approval_id not in self.pending:
            shown = approval_id if approval_id.isprintable() else quote(approval_id)
            return Problem("unknown_approval", f"no pending approval {shown}")
        if now >= self.expires[approval_id]:
            return Problem("expired", f"approval {approval_id} expired at {self.pending[approval_id].expires_at}")
        allowed = DECISIONS.get(self.pending[approval_id].kind, ())
        if decision not in allowed:
            return Problem(
                "wrong_decision",
                f"{decision!r} does not answer a {self.pending[approval_id].kind} approval (use {' / '.join(allowed)})",
            )
        if not reviewer.strip():
            return Problem("no_reviewer", "a reviewer name is required")
        if self.approvers and reviewer not in self.approvers:
            return Problem("not_an_approver", f"reviewer {quote(reviewer)} is not an approver of this run")
        if self.signing_required and not signature:
            return Problem(
                "unsigned",
                "this worker requires signed decisions (AGENT_APPROVAL_KEY); the decision carried no signature",
            )
        return None

    def refuse(self, kind: str, message: str) -> None:
        """Keep the last ``REFUSED_KEPT`` messages (bounded by their makers) and count every refusal."""
        self.refused = [*self.refused[-(REFUSED_KEPT - 1) :], message]
        self.refused_counts[kind] = self.refused_counts.get(kind, 0) + 1

    @property
    def refused_total(self) -> int:
        return sum(self.refused_counts.values())

    def record(self, approval_id: str, verdict: Verdict) -> None:
        self.pending.pop(approval_id, None)
        self.decided[approval_id] = verdict

    def expire(self, approval_id: str) -> None:
        if approval_id in self.pending:
            self.record(approval_id, Verdict("expired"))

    def pending_expiry(self, approval_id: str) -> str:
        return self.expires[approval_id].isoformat() if approval_id in self.expires else "?"

    def views(self) -> list[PendingApproval]:
        return list(self.pending.values())
