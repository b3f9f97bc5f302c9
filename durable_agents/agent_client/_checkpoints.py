"""Which steps of a run have a workspace checkpoint of their own, read from its history.

``fork`` and ``rewind`` refuse a step whose workspace was not checkpointed (its run's checkpoints
had stopped at ``AGENT_CHECKPOINT_RUN_MAX_MB`` / ``_COUNT``, or that step's files could not be
checkpointed): the files it would get are an earlier step's, under a transcript that describes
the later one. Such a step's tool results carry an ``unsaved`` id (``activities.checkpoints.ids``).

The state at the end of step N is the last checkpoint a tool result recorded before the model turn
N + 1 was scheduled (or before the end of the history, for its last step). A result the client
cannot decode (a codec it does not have) is skipped; the worker's own check of a fork still holds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from activities.checkpoints.ids import unsaved_base
from durable_agents.agent_client._errors import InvalidRequest

MODEL_ACTIVITY = "model"
_OUTCOME_KEYS = {"ok", "preview", "size_bytes", "checkpoint"}


def checkpoint_states(events: Sequence[HistoryEvent]) -> dict[int, str]:
    """Step N -> the checkpoint id the run's workspace had at the end of step N (steps of this history)."""
    states: dict[int, str] = {}
    current = ""
    last_turn = 0
    scheduled: dict[int, str] = {}
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = attrs.activity_type.name
            turn = _turn(event) if attrs.activity_type.name == MODEL_ACTIVITY else None
            if turn is not None:
                states[turn - 1] = current
                last_turn = max(last_turn, turn)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            if scheduled.get(done.scheduled_event_id) == MODEL_ACTIVITY:
                continue
            checkpoint = _outcome_checkpoint(done.result.payloads)
            if checkpoint:
                current = checkpoint
    if last_turn:
        states[last_turn] = current  # the last step: what its tools left
    return states


def refuse_uncheckpointed(events: Sequence[HistoryEvent], workflow_id: str, step: int, what: str) -> None:
    """``InvalidRequest`` when step ``step`` of the run has no workspace checkpoint of its own."""
    states = checkpoint_states(events)
    if unsaved_base(states.get(step, "")) is None:
        return
    earlier = max((s for s, state in states.items() if s < step and unsaved_base(state) is None), default=0)
    raise InvalidRequest(
        f"step {step} of run {workflow_id} has no workspace checkpoint of its own (its checkpoints had stopped "
        f"at AGENT_CHECKPOINT_RUN_MAX_MB/_COUNT, or that step's files could not be checkpointed): "
        f"{what} at step {earlier} or earlier"
    )


async def decode_results(client: Client, events: Sequence[HistoryEvent]) -> None:
    """Undo the client's payload codec (if any) on the activities' results, in place."""
    codec = client.data_converter.payload_codec
    if codec is None:
        return
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            result = event.activity_task_completed_event_attributes.result
            try:
                decoded = await codec.decode(list(result.payloads))
            except Exception:  # not ours to decode (a key this client lacks): skipped
                continue
            del result.payloads[:]
            result.payloads.extend(decoded)


def _turn(event: HistoryEvent) -> int | None:
    payloads = event.activity_task_scheduled_event_attributes.input.payloads
    if not payloads or payloads[0].metadata.get("encoding", b"json/plain") != b"json/plain":
        return None
    try:
        turn = json.loads(payloads[0].data).get("turn")
    except (ValueError, AttributeError):
        return None
    return turn if isinstance(turn, int) else None


def _outcome_checkpoint(payloads: Sequence[object]) -> str:
    """The checkpoint of a tool result (a ``ToolOutcome`` as JSON), "" for anything else."""
    if len(payloads) != 1:
        return ""
    payload = payloads[0]
    metadata = getattr(payload, "metadata", {})
    if metadata.get("encoding", b"json/plain") != b"json/plain":
        return ""
    try:
        value = json.loads(getattr(payload, "data", b""))
    except ValueError:
        return ""
    if not isinstance(value, dict) or not set(value) >= _OUTCOME_KEYS:
        return ""
    checkpoint = value.get("checkpoint")
    return checkpoint if isinstance(checkpoint, str) else ""
