"""What approvals and questions share: the pending entry a call opens, and the durable wait for its decision.

Deterministic workflow code used by :class:`workflows.tool_calls.ToolCallRunner` (approvals) and
:class:`workflows.questions.Questions` (``ask_human``).
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow

from workflows.approvals import ApprovalBook
from workflows.policy import Decision
from workflows.types import AgentInput, Carry, PendingApproval, ToolCall


def pending_entry(
    inp: AgentInput, carry: Carry, call: ToolCall, decision: Decision, aid: str, now: datetime, **fields: Any
) -> PendingApproval:
    """The entry ``call`` waits under: who may decide, the rule that asked, and when it expires."""
    return PendingApproval(
        approval_id=aid,
        tool=call.name,
        args=call.arguments,
        requested_at=now.isoformat(),
        expires_at=(now + timedelta(seconds=decision.approval_timeout_s)).isoformat(),
        reviewers=inp.approvers,
        rule=decision.rule,
        step=carry.step,
        call_id=call.id,
        **fields,
    )


async def wait_for_decision(book: ApprovalBook, carry: Carry, aid: str, summary: str) -> None:
    """Wait on a durable timer until ``aid`` is decided or expires; the wait counts as time spent on people."""
    began = workflow.now()
    remaining = book.expires[aid] - began
    if remaining.total_seconds() > 0:
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(lambda: aid in book.decided, timeout=remaining, timeout_summary=summary)
    carry.waited_s += (workflow.now() - began).total_seconds()
