"""Reading a run's history for ``fork`` and ``rewind``: its input, its steps, and where step N ended.

A fork starts a new ``AgentWorkflow`` with the source run's own input (read from the first event
of its history) and ``fork`` set: the worker copies the source's transcript up to the end of step N
(``fork_prepare``) and the fork's first model turn is step N + 1, in the workspace the source had
then. The source is only read.

A rewind resets the run itself (Temporal's ResetWorkflowExecution) to the workflow task that ended
step N: the one that scheduled the model turn of step N + 1. The new run asks its model again from
there, on a branch of its transcript; identical tool calls get their recorded results (same
idempotency keys), and the workspace is restored to step N before the next sandbox tool. Signals
sent after that point are reapplied (Temporal's default). A step that ran in an earlier run of a
continue-as-new chain cannot be rewound to.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.agent_client._errors import AgentClientError, RunNotFound
from durable_agents.agent_client._reading import RPC_TIMEOUT, describe_run
from workflows.types import AgentInput

MODEL_ACTIVITY = "model"
MAX_STEP = 1_000_000  # ForkSpec.step's bound
# What a fork keeps of its source's input (a fork is a run started from outside: no depth, budget, parent).
# A session's fork is a session.
KEPT_FIELDS = (
    "tools", "limits", "policy", "approvers", "tenant", "user", "system_prompt", "subagents", "session",
)  # fmt: skip


class NoSuchStep(AgentClientError):
    """The run has no such step to fork at or rewind to (not reached yet, or in an earlier run of its chain)."""


def steps_done(events: Sequence[HistoryEvent], inp: AgentInput) -> int:
    """The source's steps whose model turn completed, counting those of earlier runs of its chain."""
    completed = {
        event.activity_task_completed_event_attributes.scheduled_event_id
        for event in events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    }
    done = [turn for event_id, (turn, _) in model_turns(events).items() if event_id in completed]
    return max(done, default=inp.carry.step if inp.carry else 0)


def model_turns(events: Sequence[HistoryEvent]) -> dict[int, tuple[int, int]]:
    """Each scheduled ``model`` activity: its event id → (its turn, the WorkflowTaskCompleted that scheduled it).

    The turn is read from the activity's input (a ``ModelRequest`` as JSON); an input that is not
    plain JSON (encrypted by a codec the caller did not undo) is skipped.
    """
    turns: dict[int, tuple[int, int]] = {}
    for event in events:
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_type.name != MODEL_ACTIVITY or not attrs.input.payloads:
            continue
        payload = attrs.input.payloads[0]
        if payload.metadata.get("encoding", b"json/plain") != b"json/plain":
            continue
        try:
            turn = json.loads(payload.data).get("turn")
        except (ValueError, AttributeError):
            continue
        if isinstance(turn, int):
            turns[event.event_id] = (turn, attrs.workflow_task_completed_event_id)
    return turns


def reset_event_for_step(events: Sequence[HistoryEvent], step: int) -> int | None:
    """The id of the WorkflowTaskCompleted event that ended ``step``: the one that scheduled turn ``step + 1``.

    None when this history has no model turn ``step + 1`` (the run ended at ``step``, has not got
    there, or ran it in an earlier run of its continue-as-new chain).
    """
    for turn, completed_id in model_turns(events).values():
        if turn == step + 1:
            return completed_id
    return None


async def describe_at(
    client: Client, workflow_id: str, run_id: str
) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
    if not run_id:
        return await describe_run(client, workflow_id)
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        return handle, await handle.describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            raise RunNotFound(f"no run {run_id!r} of {workflow_id!r}") from None
        raise


async def history(handle: WorkflowHandle[Any, Any]) -> list[HistoryEvent]:
    """The run's whole history (the handle's run: describe's run id, or the one asked for)."""
    events = handle.fetch_history_events(rpc_timeout=RPC_TIMEOUT)
    return [event async for event in events]


async def source_input(client: Client, workflow_id: str, events: Sequence[HistoryEvent]) -> AgentInput:
    """The run's own input, from its ``WorkflowExecutionStarted`` event (a continued run's includes its carry)."""
    if not events or events[0].event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        raise AgentClientError(f"run {workflow_id} has no start event in its history")
    payloads = events[0].workflow_execution_started_event_attributes.input.payloads
    try:
        [inp] = await client.data_converter.decode(payloads, [AgentInput])
    except (ValueError, TypeError) as exc:
        raise AgentClientError(f"run {workflow_id}'s input does not decode as an agent run's: {exc}") from None
    if not isinstance(inp, AgentInput):
        raise AgentClientError(f"run {workflow_id}'s input does not decode as an agent run's")
    return inp


async def first_step(client: Client, events: Sequence[HistoryEvent]) -> int:
    """The step a continued run starts after (its carry's), 0 for a run's first execution."""
    if not events or not events[0].workflow_execution_started_event_attributes.continued_execution_run_id:
        return 0
    try:
        [inp] = await client.data_converter.decode(
            events[0].workflow_execution_started_event_attributes.input.payloads, [AgentInput]
        )
    except (ValueError, TypeError):
        return 0
    return inp.carry.step if isinstance(inp, AgentInput) and inp.carry else 0


async def decode_model_inputs(client: Client, events: Sequence[HistoryEvent]) -> None:
    """Undo the client's payload codec (if any) on the model activities' inputs, in place."""
    codec = client.data_converter.payload_codec
    if codec is None:
        return
    for event in events:
        attrs = event.activity_task_scheduled_event_attributes
        if (
            event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and attrs.activity_type.name == MODEL_ACTIVITY
        ):
            decoded = await codec.decode(list(attrs.input.payloads))
            del attrs.input.payloads[:]
            attrs.input.payloads.extend(decoded)
