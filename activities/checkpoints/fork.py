"""The ``fork_prepare`` activity: a new run starts from another run's first N steps and its workspace then.

The source's transcript (wherever it is now: the ``status`` query names its conversation, a branch
after a rewind included) is copied up to the end of step N into the fork's own conversation; the
checkpoint is the last one a tool recorded in those steps. Nothing of steps 1..N runs again: the
fork's first model turn is step N + 1, and its workspace is restored from that checkpoint when its
first sandbox tool runs. The source is only read.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity
from temporalio.client import WorkflowQueryFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.checkpoints.ids import unsaved_base
from activities.runtime import Runtime
from activities.store.base import StoredMessage
from workflows.types import ForkRequest, ForkResult, Message, StatusView

MAX_FORK_ENTRIES = 100_000
QUERY_TIMEOUT = timedelta(seconds=30)


class ForkActivities:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @activity.defn(name="fork_prepare")
    async def fork_prepare(self, req: ForkRequest) -> ForkResult:
        """Copy the source's first ``req.source.step`` steps into ``req.conversation_id`` (idempotent)."""
        view = await _source_status(req)
        if not view.conversation_id:
            raise _refused(f"{req.source.workflow_id} has not started its transcript yet")
        transcript = await self._rt.store.transcript(view.conversation_id, limit=MAX_FORK_ENTRIES)
        end = end_of_step(transcript, req.source.step)
        if end is None:
            steps = sum(1 for entry in transcript if entry.message.role == "assistant")
            raise _refused(
                f"{req.source.workflow_id} has {steps} complete step(s) in the run store; "
                f"cannot fork at step {req.source.step}"
            )
        checkpoint = checkpoint_at(transcript, end)
        if unsaved_base(checkpoint) is not None:
            raise _refused(no_checkpoint_message(req.source.workflow_id, req.source.step, transcript))
        await self._rt.store.copy_messages(view.conversation_id, req.conversation_id, end)
        length = end
        original_task = transcript[1].message.content if len(transcript) > 1 else ""
        if req.task and req.task != original_task:  # a new instruction after the source's steps
            await self._rt.store.put_message(req.conversation_id, end, Message(role="user", content=req.task))
            length += 1
        return ForkResult(
            source_conversation=view.conversation_id,
            transcript_len=length,
            step=req.source.step,
            checkpoint=checkpoint,
            model=view.model,
        )


def end_of_step(transcript: list[StoredMessage], step: int) -> int | None:
    """The transcript length at the end of ``step`` (0: just the opening), or None if it is not complete.

    Every model turn stores exactly one assistant message, followed by one result per tool call.
    """
    turns = [i for i, entry in enumerate(transcript) if entry.message.role == "assistant"]
    if step == 0:
        return turns[0] if turns else (2 if len(transcript) >= 2 else None)
    if step > len(turns):
        return None
    start = turns[step - 1]
    end = start + 1 + len(transcript[start].message.tool_calls)
    return end if end <= len(transcript) else None


def checkpoint_at(transcript: list[StoredMessage], end: int) -> str:
    """The last workspace checkpoint a tool recorded before ``end`` ("" when none: an empty workspace)."""
    for entry in reversed(transcript[:end]):
        checkpoint = entry.meta.get("checkpoint")
        if entry.message.role == "tool" and isinstance(checkpoint, str) and checkpoint:
            return checkpoint
    return ""


def no_checkpoint_message(workflow_id: str, step: int, transcript: list[StoredMessage]) -> str:
    """Why a fork at ``step`` is refused: its workspace has no checkpoint; the latest step that has one."""
    earlier = step - 1
    while earlier > 0:
        end = end_of_step(transcript, earlier)
        if end is not None and unsaved_base(checkpoint_at(transcript, end)) is None:
            break
        earlier -= 1
    return (
        f"step {step} of {workflow_id} has no workspace checkpoint of its own (its checkpoints had stopped at "
        f"AGENT_CHECKPOINT_RUN_MAX_MB/_COUNT, or that step's files could not be checkpointed); "
        f"fork at step {earlier} or earlier"
    )


async def _source_status(req: ForkRequest) -> StatusView:
    handle = activity.client().get_workflow_handle(req.source.workflow_id, run_id=req.source.run_id or None)
    try:
        # Bounded: a source whose workers are gone must not hold the fork's start for the activity's timeout.
        view: StatusView = await handle.query("status", result_type=StatusView, rpc_timeout=QUERY_TIMEOUT)
        return view
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise _refused(f"no run {req.source.workflow_id!r} to fork") from None
        raise
    except WorkflowQueryFailedError as err:
        raise _refused(f"{req.source.workflow_id} cannot be forked: {err}") from None


def _refused(message: str) -> ApplicationError:
    return ApplicationError(message, type="InvalidInput", non_retryable=True)
