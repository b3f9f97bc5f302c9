"""One reader per run per API process, however many SSE clients follow it.

``AgentClient.events`` reads a run's progress by query; a query per client per poll does not scale
(200 clients on one run fill the server's per-workflow query buffer: RESOURCE_EXHAUSTED). A
:class:`Feed` reads the run once, from its start, keeps the events it read (bounded), and every
subscriber takes the ones after its own cursor from there. It is a cache, not state: any process
builds the same feed from the run, so a client still resumes on any process with its
``Last-Event-ID``. A cursor older than what a feed still keeps gets a reader of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from durable_agents.agent_client import AgentClient, EventCursor, RunEvent

MAX_KEPT = 5_000  # events a feed keeps for late subscribers (a run's progress stream retains 500)


class Feed:
    """The events of one run as one reader reads them; subscribers wait on ``changed``."""

    def __init__(self, client: AgentClient, workflow_id: str) -> None:
        self.workflow_id = workflow_id
        self.kept: list[RunEvent] = []
        self.dropped = 0  # events no longer kept (the oldest first)
        self.done = False
        self.error: BaseException | None = None
        self.subscribers = 0
        self.changed = asyncio.Condition()
        self.task = asyncio.create_task(self._read(client))

    async def _read(self, client: AgentClient) -> None:
        try:
            async for event in client.events(self.workflow_id):
                async with self.changed:
                    self.kept.append(event)
                    if len(self.kept) > MAX_KEPT:
                        del self.kept[0]
                        self.dropped += 1
                    self.changed.notify_all()
        except Exception as exc:  # the subscribers say it and end; the next one starts a fresh feed
            self.error = exc
        finally:
            async with self.changed:
                self.done = True
                self.changed.notify_all()

    def covers(self, after: EventCursor | None) -> bool:
        """Whether every event after ``after`` is still kept (or will be read)."""
        if not self.dropped:
            return True
        first = self.kept[0].cursor if self.kept else None
        return after is not None and first is not None and after.offset >= first.offset and after.seq >= first.seq

    async def after(self, cursor: EventCursor | None) -> AsyncIterator[RunEvent]:
        """The feed's events after ``cursor``, live, until the run closes (the reader's error, raised).

        A cursor is two positions, not one: the progress events read (``offset``) and the deltas read
        (``seq``). How the two interleave depends on when a reader read them, so a feed started later
        (on this process or another) may merge them in another order than the one the client followed.
        An event is new when its own position is past the cursor's (a progress event's offset, a
        delta's seq), and each goes out with a cursor that holds the furthest of both, so the ids a
        client sees only grow and resuming from any of them skips nothing and repeats nothing.
        """
        offset, seq = (cursor.offset, cursor.seq) if cursor is not None else (0, 0)
        index = 0  # absolute: position in everything the feed ever read
        while True:
            async with self.changed:
                while index - self.dropped >= len(self.kept) and not self.done:
                    await self.changed.wait()
                batch = self.kept[max(0, index - self.dropped) :]
                index = self.dropped + len(self.kept)
                finished, error = self.done, self.error
            for event in batch:
                if event.kind == "delta":
                    if event.cursor.seq <= seq:
                        continue
                    seq = event.cursor.seq
                elif event.cursor.offset <= offset:
                    continue
                else:
                    offset = event.cursor.offset
                yield event.model_copy(update={"cursor": EventCursor(offset=offset, seq=seq)})
            if finished and index - self.dropped >= len(self.kept):
                if error is not None:
                    raise error
                return


class Fanout:
    """The feeds of one API process, by run; a feed ends when its last subscriber leaves."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client  # unscoped: each route checks the caller may see the run first
        self.feeds: dict[str, Feed] = {}

    async def events(self, workflow_id: str, after: EventCursor | None) -> AsyncIterator[RunEvent]:
        feed = self.feeds.get(workflow_id)
        if feed is None or (feed.done and feed.error is not None):
            feed = self.feeds[workflow_id] = Feed(self.client, workflow_id)
        if not feed.covers(after):
            async for event in self.client.events(workflow_id, after=after):
                yield event
            return
        feed.subscribers += 1
        try:
            async for event in feed.after(after):
                yield event
        finally:
            feed.subscribers -= 1
            if feed.subscribers == 0 and self.feeds.get(workflow_id) is feed:
                del self.feeds[workflow_id]
                feed.task.cancel()
                with contextlib.suppress(BaseException):
                    await feed.task
