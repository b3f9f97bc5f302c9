"""``memory: {"recall": "auto", "k": 5}``: the namespace's best long-term memories go into the context.

At the start of each message's work (a plain run's first turn; each handed-over batch of a session's
messages) the ``memory_recall`` activity searches the run's (tenant, user) namespace for the task or the
latest message and stores what it found as one transcript entry right after it. The activity writes the
entry itself, so memory text never enters workflow history: history holds how many were recalled.
A failed recall is reported on the run's stream and the work goes on without it.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from workflows.approval_handlers import HOUSEKEEPING_RETRY, HOUSEKEEPING_TIMEOUT
    from workflows.narration import cause_text
    from workflows.types import MEMORY_QUERY_MAX_CHARS, AgentInput, Carry, MemoryRecallRequest

# Runs without ``memory`` (all recorded before it existed) never reach it.
MEMORY_RECALL_PATCH = "memory-recall-v1"

Emit = Callable[..., None]


async def recall(inp: AgentInput, carry: Carry, query: str, emit: Emit) -> None:
    """Recall for ``query`` into the transcript at ``carry.transcript_len`` (moved past it when anything was)."""
    assert inp.memory is not None
    k = inp.memory.k
    try:
        recalled: int = await workflow.execute_activity(
            "memory_recall",
            MemoryRecallRequest(
                conversation_id=carry.conversation_id,
                seq=carry.transcript_len,
                tenant=inp.tenant,
                user=inp.user,
                query=query[:MEMORY_QUERY_MAX_CHARS],
                k=k,
            ),
            result_type=int,
            start_to_close_timeout=HOUSEKEEPING_TIMEOUT,
            retry_policy=HOUSEKEEPING_RETRY,
            summary=f"recall up to {k} memories",
        )
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        emit("memory_recalled", f"memory recall failed: {cause_text(err)}")
        return
    if recalled:
        carry.transcript_len += 1
        emit("memory_recalled", f"recalled {recalled} memories", recalled=recalled)


__all__ = ["MEMORY_RECALL_PATCH", "recall"]
