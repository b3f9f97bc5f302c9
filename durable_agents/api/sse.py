"""``GET /v1/runs/{id}/events`` as Server-Sent Events, resumable on any API process.

Each event is ``id: <EventCursor>`` / ``event: <kind>`` / ``data: <RunEvent JSON>``. A client that
reconnects sends the last id back (``Last-Event-ID``, or ``?after=`` for a first connection that
starts part way) and gets the events after it: the cursor names a position in the run's own event
stream, which ``AgentClient.events`` reads from the run and the streaming channel, so any process
serves the rest (each process reads a followed run once for all its clients: ``fanout``). A comment
line every ``heartbeat_s`` keeps proxies from closing a quiet stream; ``event: end`` is the last event,
sent when the run (its last continued run) closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.types import Message

from durable_agents.agent_client import AgentClientError, EventCursor, RunEvent

HEARTBEAT_S = 15.0


def cursor_of(last_event_id: str | None, after: str | None) -> EventCursor | None:
    """The cursor to resume after (``Last-Event-ID`` wins over ``?after=``); ValueError when it is not one."""
    text = last_event_id if last_event_id else after
    return EventCursor.parse(text) if text else None


async def disconnected(receive: Callable[[], Awaitable[Message]]) -> None:
    """Returns when the ASGI server reports the client gone (``http.disconnect``)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def frame(event: RunEvent) -> bytes:
    data = event.model_dump_json(exclude_none=True)
    return f"id: {event.cursor}\nevent: {event.kind}\ndata: {data}\n\n".encode()


async def stream(
    events: AsyncIterator[RunEvent], gone: Awaitable[object], *, heartbeat_s: float = HEARTBEAT_S
) -> AsyncIterator[bytes]:
    """The SSE body: every event, a heartbeat comment whenever none came for ``heartbeat_s``, then ``end``.

    ``gone`` completes when the client disconnects: the stream stops then, not at its next write (a
    stream waiting for a quiet run would otherwise hold its reader and its slot until the heartbeat).
    """
    pending: asyncio.Task[RunEvent] | None = asyncio.ensure_future(anext(events))
    left = asyncio.ensure_future(gone)
    yield b"retry: 1000\n\n"
    try:
        while pending is not None:
            done, _ = await asyncio.wait({pending, left}, timeout=heartbeat_s, return_when=asyncio.FIRST_COMPLETED)
            if left in done:
                return
            if not done:
                yield b": heartbeat\n\n"
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                pending = None
                break
            except Exception as exc:  # the run stopped answering, Temporal refused: say so, the client reconnects
                pending = None
                detail = (
                    str(exc) if isinstance(exc, AgentClientError) else f"reading the run failed: {type(exc).__name__}"
                )
                yield f"event: error\ndata: {json.dumps({'detail': detail[:500]})}\n\n".encode()
                return
            yield frame(event)
            pending = asyncio.ensure_future(anext(events))
        yield b"event: end\ndata: {}\n\n"
    finally:
        # The client went away (or the run ended): stop reading the run for it.
        left.cancel()
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
