"""``GET /v1/runs/{id}/events`` as Server-Sent Events, resumable on any API process.

Each event is ``id: <EventCursor>`` / ``event: <kind>`` / ``data: <RunEvent JSON>``. A client that
reconnects sends the last id back (``Last-Event-ID``, or ``?after=`` for a first connection that
starts part way) and gets the events after it: the cursor names a position in the run's own event
stream, which ``AgentClient.events`` reads from the run and the streaming channel, so any process
serves the rest and nothing is kept here. A comment line every ``heartbeat_s`` keeps proxies from
closing a quiet stream; ``event: end`` is the last event, sent when the run (its last continued run)
closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from durable_agents.agent_client import AgentClientError, EventCursor, RunEvent

HEARTBEAT_S = 15.0
# How long the first event may take before the stream opens anyway: an error the iterator raises at
# once (a bad cursor, say) is then an HTTP error rather than a stream that ends with ``event: error``.
FIRST_EVENT_S = 0.2


def cursor_of(last_event_id: str | None, after: str | None) -> EventCursor | None:
    """The cursor to resume after (``Last-Event-ID`` wins over ``?after=``); ValueError when it is not one."""
    text = last_event_id if last_event_id else after
    return EventCursor.parse(text) if text else None


def frame(event: RunEvent) -> bytes:
    data = event.model_dump_json(exclude_none=True)
    return f"id: {event.cursor}\nevent: {event.kind}\ndata: {data}\n\n".encode()


class Opened:
    """A run's event iterator whose first step already ran (so an error surfaces before any byte is sent)."""

    def __init__(self, events: AsyncIterator[RunEvent], first: asyncio.Task[RunEvent]) -> None:
        self.events = events
        self.first = first


async def open_events(events: AsyncIterator[RunEvent]) -> Opened:
    """Start reading; raises what the iterator raised within :data:`FIRST_EVENT_S`."""
    first: asyncio.Task[RunEvent] = asyncio.ensure_future(anext(events))
    done, _ = await asyncio.wait({first}, timeout=FIRST_EVENT_S)
    if done and first.exception() is not None and not isinstance(first.exception(), StopAsyncIteration):
        raise first.exception()  # type: ignore[misc]
    return Opened(events, first)


async def stream(opened: Opened, *, heartbeat_s: float = HEARTBEAT_S) -> AsyncIterator[bytes]:
    """The SSE body: every event, a heartbeat comment whenever none came for ``heartbeat_s``, then ``end``."""
    pending: asyncio.Task[RunEvent] | None = opened.first
    yield b"retry: 1000\n\n"
    try:
        while pending is not None:
            done, _ = await asyncio.wait({pending}, timeout=heartbeat_s)
            if not done:
                yield b": heartbeat\n\n"
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                pending = None
                break
            except AgentClientError as exc:  # e.g. the run stopped answering: say so, the client may reconnect
                pending = None
                yield f"event: error\ndata: {json.dumps({'detail': str(exc)})}\n\n".encode()
                return
            yield frame(event)
            pending = asyncio.ensure_future(anext(opened.events))
        yield b"event: end\ndata: {}\n\n"
    finally:
        # The client went away (or the run ended): stop reading the run for it.
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(opened.events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
