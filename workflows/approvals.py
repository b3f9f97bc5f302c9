"""The approval book: pending approvals of a run, their decisions and who may make them.

Pure bookkeeping used by ``AgentWorkflow``; every check here is deterministic
(it depends only on workflow state and ``workflow.now()`` passed in), so a
decision is accepted or refused identically on replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

from workflows.identity import canonical_json
from workflows.inputs import quote
from workflows.types import (
    MAX_DECISIONS_KEPT,
    MAX_REMEMBERED,
    DecisionRecord,
    PendingApproval,
    RememberedApproval,
    ToolCall,
)

Outcome = Literal["approved", "rejected", "expired", "retry", "mark_done", "fail", "answered"]
# Which decisions answer which kind of approval.
DECISIONS = {
    "tool_call": ("approve", "reject"),
    "resolve_unknown_outcome": ("retry", "mark_done", "fail"),
    "question": ("answer",),
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
    reviewer: str = ""  # who decided (a quorum: every approver, comma-separated)
    note: str = ""  # comment on approval, reason on rejection, the answer to a question
    arguments: dict[str, Any] | None = None  # the call as a reviewer edited it (None: as the model made it)
    remembered: bool = False  # approved by an approval remembered from an earlier call


class ApprovalBook:
    def __init__(self, approvers: list[str], signing_required: bool) -> None:
        self.approvers = list(approvers)
        self.signing_required = signing_required
        self.pending: dict[str, PendingApproval] = {}
        self.expires: dict[str, datetime] = {}
        self.decided: dict[str, Verdict] = {}
        self.refused: list[str] = []
        self.refused_counts: dict[str, int] = {}
        self.remember_tool_allowed: dict[str, bool] = {}  # approval id -> whether ``remember tool`` may be granted
        self.remembered: list[RememberedApproval] = []
        self.decisions: list[DecisionRecord] = []  # the audit, newest last (bounded)
        self.decisions_total = 0
        self.calls: dict[str, ToolCall] = {}  # approval id -> the call as the model made it (edits re-check it)
        self.on_open: Callable[[str], None] | None = None  # told each approval id as it opens

    def open(self, approval: PendingApproval, expires_at: datetime) -> None:
        self.pending[approval.approval_id] = approval
        self.expires[approval.approval_id] = expires_at
        if self.on_open is not None:
            self.on_open(approval.approval_id)

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
        pending = self.pending[approval_id]
        if decision == "approve" and reviewer in pending.approved_by:
            return Problem(
                "already_counted",
                f"{quote(reviewer)} already approved {approval_id} "
                f"({len(pending.approved_by)}/{pending.approvals_required}); a quorum needs distinct reviewers",
            )
        return None

    def answer_problem(self, approval_id: str, text: str) -> Problem | None:
        """Why an answer does not answer the question (outside its options when free text is off)."""
        question = self.pending[approval_id]
        if not text.strip():
            return Problem("empty_answer", "an answer needs text")
        if question.options and not question.allow_free_text and text not in question.options:
            return Problem(
                "not_an_option",
                f"{quote(text)} is not one of the options ({', '.join(quote(o) for o in question.options)})",
            )
        return None

    def count_approval(self, approval_id: str, reviewer: str, arguments: dict[str, Any] | None) -> bool:
        """Count one reviewer's approval; True when the quorum is reached (the call may run).

        An edit changes the call the earlier approvers saw, so it starts the count again from its editor.
        """
        pending = self.pending[approval_id]
        approved_by = [*pending.approved_by, reviewer]
        edited = pending.edited_args
        if arguments is not None and (edited is None or canonical_json(arguments) != canonical_json(edited)):
            approved_by, edited = [reviewer], arguments
        self.pending[approval_id] = pending.model_copy(update={"approved_by": approved_by, "edited_args": edited})
        return len(approved_by) >= pending.approvals_required

    # --- remembered approvals ------------------------------------------------------------

    def remembered_for(self, tool: str, args: dict[str, Any]) -> RememberedApproval | None:
        """The remembered approval that covers this call, if any (``tool`` scope, or identical arguments)."""
        canonical = canonical_json(args)
        for entry in self.remembered:
            if entry.tool == tool and (entry.scope == "tool" or canonical_json(entry.args) == canonical):
                return entry
        return None

    def remember(self, entry: RememberedApproval) -> None:
        if self.remembered_for(entry.tool, entry.args or {}) is None or entry.scope == "tool":
            self.remembered = [*self.remembered, entry][-MAX_REMEMBERED:]

    def forget(self) -> int:
        forgotten, self.remembered = len(self.remembered), []
        return forgotten

    # --- the audit -----------------------------------------------------------------------

    def audit(self, record: DecisionRecord) -> None:
        self.decisions = [*self.decisions, record][-MAX_DECISIONS_KEPT:]
        self.decisions_total += 1

    def refuse(self, kind: str, message: str) -> None:
        """Keep the last ``REFUSED_KEPT`` messages (bounded by their makers) and count every refusal."""
        self.refused = [*self.refused[-(REFUSED_KEPT - 1) :], message]
        self.refused_counts[kind] = self.refused_counts.get(kind, 0) + 1

    @property
    def refused_total(self) -> int:
        return sum(self.refused_counts.values())

    def record(self, approval_id: str, verdict: Verdict) -> None:
        self.pending.pop(approval_id, None)
        self.calls.pop(approval_id, None)
        self.decided[approval_id] = verdict

    def expire(self, approval_id: str) -> None:
        if approval_id in self.pending:
            self.record(approval_id, Verdict("expired"))

    def pending_expiry(self, approval_id: str) -> str:
        return self.expires[approval_id].isoformat() if approval_id in self.expires else "?"

    def views(self) -> list[PendingApproval]:
        return list(self.pending.values())

    def questions_pending(self) -> bool:
        return any(a.kind == "question" for a in self.pending.values())
