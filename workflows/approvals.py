"""The approval book: pending approvals of a run, their decisions and who may make them.

Pure bookkeeping used by ``AgentWorkflow``; every check here is deterministic
(it depends only on workflow state and ``workflow.now()`` passed in), so a
decision is accepted or refused identically on replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from workflows.types import PendingApproval

Outcome = Literal["approved", "rejected", "expired", "retry", "mark_done", "fail"]
# Which decisions answer which kind of approval.
DECISIONS = {
    "tool_call": ("approve", "reject"),
    "resolve_unknown_outcome": ("retry", "mark_done", "fail"),
}


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

    def open(self, approval: PendingApproval, expires_at: datetime) -> None:
        self.pending[approval.approval_id] = approval
        self.expires[approval.approval_id] = expires_at

    def problem(self, approval_id: str, decision: str, reviewer: str, signature: str, now: datetime) -> str:
        """Why a decision must be refused, or ``""`` when it may be recorded (signature aside)."""
        if approval_id in self.decided:
            return f"approval {approval_id} was already decided ({self.decided[approval_id].outcome})"
        if approval_id not in self.pending:
            return f"no pending approval {approval_id}"
        if now >= self.expires[approval_id]:
            return f"approval {approval_id} expired at {self.pending[approval_id].expires_at}"
        allowed = DECISIONS.get(self.pending[approval_id].kind, ())
        if decision not in allowed:
            return (
                f"{decision!r} does not answer a {self.pending[approval_id].kind} approval (use {' / '.join(allowed)})"
            )
        if not reviewer.strip():
            return "a reviewer name is required"
        if self.approvers and reviewer not in self.approvers:
            return f"reviewer {reviewer!r} is not an approver of this run"
        if self.signing_required and not signature:
            return "this worker requires signed decisions (AGENT_APPROVAL_KEY); the decision carried no signature"
        return ""

    def refuse(self, message: str) -> None:
        self.refused = [*self.refused[-19:], message]

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
