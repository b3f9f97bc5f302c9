"""What the ``model`` activity streams through: batches a reply's text deltas into a few channel rows.

Text is written at most every ``FLUSH_S`` (or at once past ``FLUSH_CHARS``), so a reply of a thousand
tokens is a handful of rows, not a thousand. Every write is of the redacted text so far: a configured
secret the model spells out is never written, also when it arrives split over several deltas, because
the last ``holdback`` characters (twice the longest secret) wait for what follows them. The first row of
an attempt after the first carries ``restart``. A channel that fails stops the publishing of this attempt
only: the turn itself, and its whole reply, never depend on the stream.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from activities.redaction import redact
from activities.streaming.base import MAX_TEXT_PER_ATTEMPT, DeltaChannel

FLUSH_S = 0.05
FLUSH_CHARS = 200
log = structlog.get_logger("activities.streaming")


class DeltaPublisher:
    def __init__(self, channel: DeltaChannel, workflow_id: str, turn: int, attempt: int, secrets: list[str]) -> None:
        self.channel = channel
        self.workflow_id = workflow_id
        self.turn = turn
        self.attempt = attempt
        self.secrets = secrets
        self.holdback = 2 * max((len(s) for s in secrets), default=0)
        self.rows = 0
        self._raw: list[str] = []
        self._raw_len = 0
        self._sent = 0  # characters of the redacted text written
        self._restart = attempt > 1
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self._broken = False
        self._last_flush = time.monotonic()

    async def text(self, piece: str) -> None:
        """Take a delta in (``TextSink`` of the provider's ``stream``)."""
        if self._broken or not piece or self._raw_len > MAX_TEXT_PER_ATTEMPT:
            return
        self._raw.append(piece)
        self._raw_len += len(piece)
        if self._raw_len - self._sent >= FLUSH_CHARS + self.holdback:
            await self._flush(final=False)
        elif self._timer is None or self._timer.done():
            self._timer = asyncio.create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(max(0.0, FLUSH_S - (time.monotonic() - self._last_flush)))
        await self._flush(final=False)

    async def _flush(self, final: bool, text: str | None = None) -> None:
        async with self._lock:
            if self._broken:
                return
            clean = text if text is not None else redact("".join(self._raw), self.secrets)
            upto = len(clean) if final else len(clean) - self.holdback
            upto = min(upto, MAX_TEXT_PER_ATTEMPT)
            piece = clean[self._sent : upto]
            self._last_flush = time.monotonic()
            if not piece:
                return
            try:
                await self.channel.append(self.workflow_id, self.turn, self.attempt, self._restart, piece)
            except Exception as exc:  # the stream is a convenience: the turn goes on without it
                self._broken = True
                log.warning("stream_publish_failed", error=type(exc).__name__, workflow_id=self.workflow_id)
                return
            self.rows += 1
            self._restart = False
            self._sent = upto

    async def finish(self, reply_text: str) -> None:
        """Write what is left of the turn's final (redacted) reply text."""
        timer, self._timer = self._timer, None
        if timer is not None:  # awaited, not cancelled: a write cancelled half-way may still land, twice
            await timer
        await self._flush(final=True, text=reply_text)

    def abandon(self) -> None:
        """The call failed: nothing more is written for this attempt (the retry's first row restarts)."""
        self._broken = True
