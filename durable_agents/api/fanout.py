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


def key(cursor: EventCursor) -> tuple[int, int]:
    return cursor.offset, cursor.seq


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
        return after is not None and bool(self.kept) and key(after) >= key(self.kept[0].cursor)

    async def after(self, cursor: EventCursor | None) -> AsyncIterator[RunEvent]:
        """The feed's events after ``cursor``, live, until the run closes (the reader's error, raised)."""
        seen = key(cursor) if cursor is not None else (-1, -1)
        index = 0  # absolute: position in everything the feed ever read
        while True:
            async with self.changed:
                while index - self.dropped >= len(self.kept) and not self.done:
                    await self.changed.wait()
                batch = self.kept[max(0, index - self.dropped) :]
                index = self.dropped + len(self.kept)
                finished, error = self.done, self.error
            for event in batch:
                if key(event.cursor) > seen:
                    seen = key(event.cursor)
                    yield event
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
