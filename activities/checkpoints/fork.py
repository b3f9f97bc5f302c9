"""The ``fork_prepare`` activity: a new run starts from another run's first N steps and its workspace then.

The source's transcript (wherever it is now: the ``status`` query names its conversation, a branch
after a rewind included) is copied up to the end of step N into the fork's own conversation; the
checkpoint is the last one a tool recorded in those steps. Nothing of steps 1..N runs again: the
fork's first model turn is step N + 1, and its workspace is restored from that checkpoint when its
first sandbox tool runs. The source is only read.

Nothing the fork's caller sends decides whose run is read: the source must be an agent run of the
fork's own tenant and user, as the source's own start input (in its history, the first run of its
chain's too) and its ``AgentTenant`` search attribute say, and the conversation its ``status`` names must
be one of the source's own. ``AGENT_ALLOW_FORK_INPUT=0`` refuses every fork. A refusal copies
nothing and fails the fork with ``invalid run input: fork: ...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import WorkflowExecutionStartedEventAttributes
from temporalio.client import WorkflowHandle, WorkflowQueryFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.checkpoints.ids import unsaved_base
from activities.runtime import Runtime
from activities.store.base import StoredMessage
from workflows.inputs import quote
from workflows.progress import TENANT
from workflows.trust import is_conversation_of
from workflows.types import AgentInput, ForkRequest, ForkResult, Message, StatusView

MAX_FORK_ENTRIES = 100_000
QUERY_TIMEOUT = timedelta(seconds=30)


class ForkActivities:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @activity.defn(name="fork_prepare")
    async def fork_prepare(self, req: ForkRequest) -> ForkResult:
        """Copy the source's first ``req.source.step`` steps into ``req.conversation_id`` (idempotent)."""
        if not self._rt.settings.allow_fork_input:
            raise _refused("forking from run input is turned off on this worker (AGENT_ALLOW_FORK_INPUT=0)")
        source = await _source_run(req)
        view = await _source_status(req, source.handle)
        if not view.conversation_id:
            raise _refused(f"{req.source.workflow_id} has not started its transcript yet")
        if not is_conversation_of(req.source.workflow_id, view.conversation_id, run=source.first_run, branches=True):
            raise _refused(f"{req.source.workflow_id} names a conversation that is not its own")
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


@dataclass(frozen=True)
class SourceRun:
    handle: WorkflowHandle[Any, Any]  # pinned to the run read (the latest when ``run_id`` was not given)
    first_run: str  # the first run of its continue-as-new chain: its conversations are ``<id>/<first run>...``


async def _source_run(req: ForkRequest) -> SourceRun:
    """The source, once it is known to be an agent run of the fork's tenant (``InvalidInput`` otherwise)."""
    wid = req.source.workflow_id
    client = activity.client()
    try:
        desc = await client.get_workflow_handle(wid, run_id=req.source.run_id or None).describe(
            rpc_timeout=QUERY_TIMEOUT
        )
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            raise _refused(f"no run {wid!r} to fork") from None
        raise
    handle = client.get_workflow_handle(wid, run_id=desc.run_id)
    started = await _start_event(handle)
    if started is None:
        raise _refused(f"{wid} has no start event in its history")
    owners = {await _owner(wid, started)}
    first_run = started.first_execution_run_id or desc.run_id
    if first_run != desc.run_id:  # a continued run: its chain's first run says it too (unless it is gone)
        first = await _start_event(client.get_workflow_handle(wid, run_id=first_run))
        if first is not None:
            owners.add(await _owner(wid, first))
    tenants = {tenant for tenant, _ in owners}
    attribute = desc.typed_search_attributes.get(TENANT)
    if attribute is not None:
        tenants.add(attribute)
    if tenants != {req.tenant}:
        mine = f"tenant {quote(req.tenant)}" if req.tenant else "no tenant"
        raise _refused(f"{wid} is not a run of this run's tenant ({mine}); a fork's source must have its tenant")
    if {user for _, user in owners} != {req.user}:
        mine = f"user {quote(req.user)}" if req.user else "no user"
        raise _refused(f"{wid} is not a run of this run's user ({mine}); a fork's source must have its user")
    return SourceRun(handle=handle, first_run=first_run)


async def _start_event(handle: WorkflowHandle[Any, Any]) -> WorkflowExecutionStartedEventAttributes | None:
    """The run's ``WorkflowExecutionStarted`` event (None when its history is gone)."""
    try:
        async for event in handle.fetch_history_events(page_size=1, rpc_timeout=QUERY_TIMEOUT):
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                return None
            return event.workflow_execution_started_event_attributes
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return None


async def _owner(wid: str, started: WorkflowExecutionStartedEventAttributes) -> tuple[str, str]:
    """The tenant and user of the agent run that ``started`` started: from its own input, never the fork's."""
    if started.workflow_type.name != "AgentWorkflow":
        raise _refused(f"{wid} is not an agent run")
    try:
        [inp] = await activity.client().data_converter.decode(list(started.input.payloads), [AgentInput])
    except Exception:  # anything the converter raises for an input that is not an agent run's
        raise _refused(f"{wid}'s input does not decode as an agent run's") from None
    if not isinstance(inp, AgentInput):
        raise _refused(f"{wid}'s input does not decode as an agent run's")
    return inp.tenant, inp.user


async def _source_status(req: ForkRequest, handle: WorkflowHandle[Any, Any]) -> StatusView:
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
