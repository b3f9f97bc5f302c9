"""Questions a model asks a person (``ask_human``): open, wait, and hand the answer to the model.

Deterministic workflow code used by :class:`workflows.tool_calls.ToolCallRunner`. A question is kept in
the run's :class:`workflows.approvals.ApprovalBook` as a pending entry of kind ``question``, so it is
listed, expires, reaches a parent run and is decided (``answer``) like an approval.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow

from workflows.approvals import ApprovalBook, Verdict
from workflows.human_wait import pending_entry, wait_for_decision
from workflows.identity import approval_id
from workflows.policy import Decision
from workflows.types import (
    AgentInput,
    AskHumanArgs,
    Carry,
    DecisionRecord,
    Message,
    ToolCall,
    TranscriptEntry,
)

Emit = Callable[..., None]


class Questions:
    def __init__(self, book: ApprovalBook, emit: Emit) -> None:
        self.book = book
        self.emit = emit

    async def ask(self, inp: AgentInput, carry: Carry, call: ToolCall, decision: Decision, seq: int) -> None:
        """Wait for a person's answer (or the question's expiry) and put it at the call's transcript position."""
        args = AskHumanArgs.model_validate(call.arguments)
        now = workflow.now()
        expires_at = now + timedelta(seconds=decision.approval_timeout_s)
        scope = carry.key_scope or workflow.info().workflow_id
        qid = "q_" + approval_id(scope, carry.step, call.id, call.name, call.arguments)[3:]
        entry = pending_entry(
            inp, carry, call, decision, qid, now, kind="question", question=args.question,
            options=args.options, allow_free_text=args.allow_free_text or not args.options,
        )  # fmt: skip
        self.book.open(entry, expires_at)
        offered = f" [{' / '.join(args.options)}]" if args.options else ""
        self.emit(
            "question_asked",
            f"turn {carry.step}: question {qid}: {args.question[:300]}{offered}",
            call.name,
            approval_id=qid,
            options=args.options,
            expires_at=expires_at.isoformat(),
        )
        await wait_for_decision(self.book, carry, qid, f"question {qid} expires")
        if qid not in self.book.decided:
            self.book.record(qid, Verdict("expired"))
            self.book.audit(
                DecisionRecord(
                    approval_id=qid, kind="question", tool=call.name, decision="expired",
                    at=workflow.now().isoformat(), step=carry.step,
                )
            )  # fmt: skip
            self.emit("question_answered", f"turn {carry.step}: question {qid} expired unanswered", call.name)
        verdict = self.book.decided[qid]
        if verdict.outcome == "answered":
            message = Message(role="tool", content=verdict.note, tool_call_id=call.id, name=call.name)
        else:
            text = (
                f"Nobody answered the question before it expired at {expires_at.isoformat()}. "
                "Go on without the answer, or say what you need."
            )
            message = Message(role="tool", content=text, tool_call_id=call.id, name=call.name, is_error=True)
        self.emit("tool_finished", f"turn {carry.step}: {call.name} {verdict.outcome}", call.name, ok=True)
        carry.pending.append(TranscriptEntry(seq=seq, message=message))
