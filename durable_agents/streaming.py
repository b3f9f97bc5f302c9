"""Reading a run's streamed model text: the ``deltas`` source ``AgentClient.events`` merges.

A :class:`DeltaReader` reads the run store's delta channel (``activities.streaming``) beside the same
``AGENT_STORE_URL`` the workers use; it keeps no state of its own, so any number of readers in any
number of processes read the same runs. Reading is also what tells the workers someone listens: every
``read`` and ``wait`` renews the run's listener row (at most every ``RENEW_S``), and a model turn that
starts while it is fresh streams; otherwise the turn makes the plain request and only its whole reply
arrives (as a progress event). The reader does not check tenants: its caller (``AgentClient``) checks
the run is the caller's before it reads::

    reader = DeltaReader.from_settings(Settings.from_env())
    seq = 0
    while True:
        for event in await reader.read(workflow_id, after_seq=seq, limit=100):
            if event.data["restart"]:
                ...  # a retried model call: drop what this turn printed so far
            print(event.text, end="", flush=True)
            seq = event.cursor.seq
        await reader.wait(workflow_id, after_seq=seq, timeout_s=5.0)
"""

from __future__ import annotations

import time

from activities.settings import Settings
from activities.streaming import DeltaChannel, open_channel
from activities.streaming.base import LISTEN_TTL_S, READ_LIMIT
from durable_agents.agent_client._types import EventCursor, RunEvent

RENEW_S = 5.0  # well inside LISTEN_TTL_S, so a reader between two waits never looks absent


class DeltaReader:
    """Reads and waits for a run's text deltas as ``RunEvent(kind="delta")``; announces the reader."""

    def __init__(self, channel: DeltaChannel) -> None:
        self.channel = channel
        self._renewed: dict[str, float] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> DeltaReader:
        """A reader of the channel beside ``settings.store_url`` (and its key ring, for sealed text)."""
        return cls(open_channel(settings))

    async def listen(self, workflow_id: str) -> None:
        """Say someone reads ``workflow_id``'s text now (``read`` and ``wait`` do it too), so its next model
        turn streams. Call it before the run starts its turn to get that turn streamed."""
        await self.channel.listen(workflow_id, LISTEN_TTL_S)
        self._renewed[workflow_id] = time.monotonic()
        if len(self._renewed) > 10_000:  # a long-lived API process reads many runs: forget the old ones
            cutoff = time.monotonic() - LISTEN_TTL_S
            self._renewed = {w: t for w, t in self._renewed.items() if t > cutoff}

    async def _renew(self, workflow_id: str) -> None:
        if time.monotonic() - self._renewed.get(workflow_id, float("-inf")) >= RENEW_S:
            await self.listen(workflow_id)

    async def read(self, workflow_id: str, after_seq: int, limit: int = READ_LIMIT) -> list[RunEvent]:
        """The run's deltas after ``after_seq`` in order (at most ``limit``), each with ``cursor.seq`` its own.

        ``data["restart"]`` is True on the first delta of a retried model call: the text streamed
        earlier for the same ``turn`` is to be discarded. ``cursor.offset`` is 0: the caller merges
        the progress offset in.
        """
        await self._renew(workflow_id)
        return [
            RunEvent(
                kind="delta",
                cursor=EventCursor(offset=0, seq=d.seq),
                text=d.text,
                turn=d.turn,
                attempt=d.attempt,
                data={"restart": d.restart},
            )
            for d in await self.channel.read(workflow_id, max(0, after_seq), max(1, limit))
        ]

    async def wait(self, workflow_id: str, after_seq: int, timeout_s: float) -> None:
        """Return when the run may have deltas after ``after_seq`` (woken by PostgreSQL's ``NOTIFY``,
        polled on SQLite), or after ``timeout_s``; renews the listener while it waits."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            await self._renew(workflow_id)
            left = deadline - time.monotonic()
            if left <= 0:
                return
            step = min(left, RENEW_S)
            await self.channel.wait(workflow_id, after_seq, step)
            if step == left or (await self.channel.read(workflow_id, after_seq, 1)):
                return

    async def close(self) -> None:
        await self.channel.close()
