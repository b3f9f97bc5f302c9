"""A run's events: its progress stream read by query, merged with streamed model text when a source is given.

Progress events live in the run's durable Workflow Stream (topic ``progress``, ``workflows/progress.py``).
``temporalio.contrib.workflow_streams`` subscribes by the ``__temporal_workflow_stream_poll`` *update*,
and every update is an event in the run's history (the Temporal UI showed a dozen of them in a demo's
two dozen rows). Here the stream is read by the *query* of the same name, which answers at once with the
retained items from an offset and adds nothing to the history: it is asked again after a short
cooldown while the run is caught up, and at full speed while a backlog drains (``more_ready``).

Offsets are the stream's global ones, which carry across continue-as-new: the query goes to the
latest run of the id, so a reader follows the chain. Once the latest run has closed, one last read
delivers what it published before closing, and the iterator ends.

Streamed text deltas (model output that never enters history) come from a :class:`DeltaSource`,
implemented elsewhere (the worker's out-of-band channel); without one, ``events`` yields progress only.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Protocol

from temporalio.api.common.v1 import Payload
from temporalio.client import Client, RPCTimeoutOrCancelledError, WorkflowExecutionStatus
from temporalio.contrib.workflow_streams import PollInput, PollResult
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.agent_client._reading import RPC_TIMEOUT, raise_if_cancelled, workflow_not_ready
from durable_agents.agent_client._types import EventCursor, RunEvent
from workflows.progress import TOPIC, ProgressEvent

POLL_QUERY = "__temporal_workflow_stream_poll"  # the stream's handler name: a query here, never the update
POLL_COOLDOWN = timedelta(milliseconds=100)  # between reads while caught up
POLL_TIMEOUT = timedelta(seconds=10)  # one read; a worker that just restarted replays the run first
DELTA_BATCH = 500  # deltas read at once from a source
# While caught up, whether the run has closed is asked at the first idle read and then every this many
# (about once a second): a run that ends without a last event (terminated, timed out) ends the reader too.
CLOSE_CHECK_EVERY = 10


class DeltaSource(Protocol):
    """Where ``events`` reads a run's streamed text deltas (``RunEvent`` of kind ``delta``).

    ``read`` answers up to ``limit`` deltas of the run with a sequence number above ``after_seq``, in
    order, each with ``cursor.seq`` its own number; ``wait`` returns once the run has a delta above
    ``after_seq`` or ``timeout_s`` has passed (whichever comes first), so a reader sleeps on it
    instead of a fixed cooldown.
    """

    async def read(self, workflow_id: str, after_seq: int, limit: int) -> list[RunEvent]: ...

    async def wait(self, workflow_id: str, after_seq: int, timeout_s: float) -> None: ...


CLOSED = (
    WorkflowExecutionStatus.COMPLETED,
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.CANCELED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
)


async def progress(
    client: Client, workflow_id: str, from_offset: int = 0, *, poll_cooldown: timedelta = POLL_COOLDOWN
) -> AsyncIterator[tuple[int, ProgressEvent]]:
    """``(offset, event)`` pairs of the run's progress stream from ``from_offset``, until its last run has
    closed and its last events were read. Reads by query only: nothing is added to the run's history."""
    async for offset, event, _ in _polled(client, workflow_id, from_offset, poll_cooldown, None, 0):
        if event is not None:
            yield offset, event


async def run_events(
    client: Client,
    workflow_id: str,
    after: EventCursor,
    *,
    deltas: DeltaSource | None = None,
    poll_cooldown: timedelta = POLL_COOLDOWN,
) -> AsyncIterator[RunEvent]:
    """The run's progress events after ``after.offset`` merged with its deltas after ``after.seq``."""
    offset, seq = after.offset, after.seq
    async for at, event, delta in _polled(client, workflow_id, after.offset, poll_cooldown, deltas, after.seq):
        if event is not None:
            offset = at + 1
            yield RunEvent(kind=event.kind, progress=event, cursor=EventCursor(offset=offset, seq=seq))
        elif delta is not None:
            seq = max(seq, delta.cursor.seq)
            yield delta.model_copy(update={"cursor": EventCursor(offset=offset, seq=seq)})


async def _polled(
    client: Client,
    workflow_id: str,
    from_offset: int,
    poll_cooldown: timedelta,
    deltas: DeltaSource | None,
    after_seq: int,
) -> AsyncIterator[tuple[int, ProgressEvent | None, RunEvent | None]]:
    offset, seq = from_offset, after_seq
    converter = client.data_converter.payload_converter
    closing = False  # the latest run has closed: one more read, then the end
    idle = 0  # reads in a row that found nothing new
    ending = False  # the last event was the run's last (``finished``): look for its close at every idle read
    while True:
        result = await _read(client, workflow_id, offset, poll_cooldown)
        for item in result.items if result is not None else ():
            payload = Payload()
            payload.ParseFromString(base64.b64decode(item.data))
            event = converter.from_payload(payload, ProgressEvent)
            ending = event.kind == "finished"
            yield item.offset, event, None
        if result is not None:
            offset = max(offset, result.next_offset)
        if deltas is not None:
            for delta in await deltas.read(workflow_id, seq, DELTA_BATCH):
                seq = max(seq, delta.cursor.seq)
                yield offset, None, delta
        if result is not None and result.more_ready:
            continue
        if closing and result is not None:
            return
        idle = idle + 1 if result is not None and not result.items else 0
        if idle and (ending or idle % CLOSE_CHECK_EVERY == 1) and await _closed(client, workflow_id):
            closing = True  # what it published between this read and its close: read once more
            continue
        if deltas is not None:
            await deltas.wait(workflow_id, seq, poll_cooldown.total_seconds())
        else:
            await asyncio.sleep(poll_cooldown.total_seconds())


async def _read(client: Client, workflow_id: str, offset: int, poll_cooldown: timedelta) -> PollResult | None:
    """One query of the latest run's stream from ``offset``; None when no worker answered in time (the run
    waits for one, and so does the reader). A query the worker failed, or an RPC error, is raised."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        result: PollResult = await handle.query(
            POLL_QUERY, PollInput(topics=[TOPIC], from_offset=offset), result_type=PollResult, rpc_timeout=POLL_TIMEOUT
        )
        return result
    except RPCTimeoutOrCancelledError:
        raise_if_cancelled()
        return None
    except RPCError as err:
        # The client's own deadline can also come back as CANCELLED "Timeout expired" (the transport's timer).
        timed_out = err.status == RPCStatusCode.CANCELLED and "timeout expired" in err.message.lower()
        if err.status == RPCStatusCode.DEADLINE_EXCEEDED or timed_out or workflow_not_ready(err):
            raise_if_cancelled()
            await asyncio.sleep(poll_cooldown.total_seconds())
            return None
        raise


async def _closed(client: Client, workflow_id: str) -> bool:
    desc = await client.get_workflow_handle(workflow_id).describe(rpc_timeout=RPC_TIMEOUT)
    return desc.status in CLOSED
