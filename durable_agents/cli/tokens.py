"""The model's text as it streams, for ``run --follow`` and ``chat``: printed between the progress lines.

A :class:`TokenPrinter` reads the run's text deltas from the run store beside the workers
(:class:`durable_agents.streaming.DeltaReader`). Reading is what makes a model turn stream, so
``listen`` is called before the run is started (or the session sent its message). When the store
cannot be read from here (another machine's SQLite file, a database this process may not reach), the
printer turns itself off without a word: the progress lines and the whole reply still come.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TextIO

from activities.settings import Settings
from durable_agents.agent_client import RunEvent
from durable_agents.streaming import DeltaReader

WAIT_S = 1.0  # one wait for new text; the pump stops when the run (or the reply) is done
RETRIED = "(the model call is being retried: the text above is discarded)"


class TokenPrinter:
    """Prints ``workflow_id``'s streamed text, each turn's on its own indented lines; until cancelled."""

    def __init__(
        self, reader: DeltaReader | None, workflow_id: str, *, file: TextIO | None = None, prefix: str = "  "
    ) -> None:
        self.reader = reader
        self.workflow_id = workflow_id
        self.file = file if file is not None else sys.stdout
        self.prefix = prefix  # the first line of a turn's text starts with it; the others are indented as wide
        self.turn_text = ""  # the text of the last line of streamed text (its turn's, as printed)
        self.seq = 0  # the last delta printed (or skipped)
        self.turn = -1  # the turn whose text the open line holds
        self.open = False  # a line of streamed text is not ended yet
        # Text is shown once the progress lines have shown its turn start (``started``), so that it never
        # comes before the lines of the turn before (the two are read apart, the text much sooner).
        self.shown_turn = 0
        self.held: list[RunEvent] = []

    @classmethod
    def from_settings(
        cls, settings: Settings, workflow_id: str, *, file: TextIO | None = None, prefix: str = "  "
    ) -> TokenPrinter:
        try:
            reader: DeltaReader | None = DeltaReader.from_settings(settings)
        except Exception:  # no store from here: progress lines only
            reader = None
        return cls(reader, workflow_id, file=file, prefix=prefix)

    async def listen(self) -> None:
        """Say someone reads the run's text, so its next model turn streams (call it before it starts)."""
        await self._guarded(lambda reader: reader.listen(self.workflow_id))

    async def skip(self) -> None:
        """Pass over the text the run streamed so far (a chat joining a session prints only what comes)."""
        await self._guarded(self._skip)

    async def _skip(self, reader: DeltaReader) -> None:
        while batch := await reader.read(self.workflow_id, self.seq):
            self.seq = batch[-1].cursor.seq

    @contextlib.asynccontextmanager
    async def printing(self) -> AsyncIterator[None]:
        """Print the text as it arrives while the block runs; then what came last, and end the line."""
        pump = asyncio.ensure_future(self._guarded(self._pump))
        try:
            yield
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            await self._guarded(self._catch_up)  # the run ended between two reads: its last text
            self.started(max((d.turn for d in self.held), default=0))  # it is over: whatever is held
            self.end_line()

    async def _pump(self, reader: DeltaReader) -> None:
        while True:
            await self._show_new(reader)
            await reader.wait(self.workflow_id, self.seq, WAIT_S)

    async def _catch_up(self, reader: DeltaReader) -> None:
        while await self._show_new(reader):
            pass

    async def _show_new(self, reader: DeltaReader) -> bool:
        """Print the deltas after the last one printed; whether there were any."""
        batch = await reader.read(self.workflow_id, self.seq)
        for delta in batch:
            self.seq = max(self.seq, delta.cursor.seq)
            if delta.turn <= self.shown_turn and not self.held:
                self.show(delta)
            else:
                self.held.append(delta)
        return bool(batch)

    def started(self, turn: int) -> None:
        """The progress lines have shown turn ``turn`` start: its text (and any earlier turn's) may show."""
        self.shown_turn = max(self.shown_turn, turn)
        while self.held and self.held[0].turn <= self.shown_turn:
            self.show(self.held.pop(0))

    def streamed(self, text: str) -> bool:
        """Whether the last line of streamed text was ``text`` (a reply already shown whole); forgets it."""
        shown, self.turn_text = self.turn_text, ""
        return bool(text.strip()) and shown.strip() == text.strip()

    def show(self, delta: RunEvent) -> None:
        """One delta: a retried call's first says its earlier text is void; a new turn starts a new line."""
        if delta.data.get("restart"):
            self.end_line()
            print(f"{' ' * len(self.prefix)}{RETRIED}", file=self.file)
        if delta.turn != self.turn:
            self.end_line()
            self.turn = delta.turn
        if not self.open:
            self.file.write(self.prefix)
            self.open = True
            self.turn_text = ""  # kept when the line ends: a chat compares it with the reply (``streamed``)
        self.turn_text += delta.text
        self.file.write(delta.text.replace("\n", "\n" + " " * len(self.prefix)))
        self.file.flush()

    def end_line(self) -> None:
        """End the streamed text's open line (before a progress line, and at the end)."""
        if self.open:
            self.file.write("\n")
            self.file.flush()
            self.open = False
            self.turn = -1  # what streams next starts a line of its own

    async def _guarded(self, work: Callable[[DeltaReader], Awaitable[object]]) -> None:
        if self.reader is None:
            return
        try:
            await work(self.reader)
        except asyncio.CancelledError:
            raise
        except Exception:  # the store went away mid-run: stop printing text, the progress lines go on
            await self.close()

    async def close(self) -> None:
        self.end_line()
        reader, self.reader = self.reader, None
        if reader is not None:
            try:
                await reader.close()
            except Exception:  # closing a channel that already failed
                return
