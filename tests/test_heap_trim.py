"""``durable_agents.heap``: a worker gives the heap that a burst freed back to the operating system.

The burst is made in a fresh interpreter (a long-running test process's heap has holes that would
take the blocks): 64 MB in 32 KB blocks, each followed by a 1 KB block that stays, so that glibc
cannot give the freed blocks back by shrinking the top of its heap, only by a trim. The machines
``make test`` runs on are Debian (glibc): the trimmer must be available there.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
import structlog.testing

from durable_agents.heap import HeapTrimmer, Trim, trim_heap_forever
from durable_agents.testing._worker_proc import ROOT
from tests.waiting import eventually

BURST = """
import json
from durable_agents.heap import HeapTrimmer
trimmer = HeapTrimmer()
kept, freed = [], []
for _ in range(2048):
    freed.append(bytearray(32 * 1024))  # zero-filled: its pages are resident
    kept.append(bytearray(1024))
del freed
free = trimmer.free_bytes()
trim = trimmer.trim_if_worth_it()
print(json.dumps({"available": trimmer.available, "free": free, "kept": len(kept),
                  "trim": None if trim is None else [trim.free, trim.rss_before, trim.rss_after]}))
"""


def test_a_trim_gives_back_what_a_burst_freed() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BURST], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    seen = json.loads(done.stdout)
    assert seen["available"] and seen["kept"] == 2048
    assert seen["free"] >= 48 * 2**20, seen  # most of the 64 MB is free inside the heap
    trimmed_free, rss_before, rss_after = seen["trim"]
    assert trimmed_free == seen["free"]
    # Each freed 32 KB block holds 7 whole pages that the trim returns: most of the 64 MB.
    assert rss_before - rss_after >= 40 * 2**20, seen


def test_no_trim_below_the_threshold() -> None:
    assert HeapTrimmer(min_free_bytes=1 << 50).trim_if_worth_it() is None


async def test_the_trimmer_task_trims_until_cancelled() -> None:
    trims: list[Trim] = []

    class Recording(HeapTrimmer):
        def trim_if_worth_it(self) -> Trim | None:
            trim = super().trim_if_worth_it()
            if trim is not None:
                trims.append(trim)
            return trim

    with structlog.testing.capture_logs() as events:
        task = asyncio.create_task(trim_heap_forever(0.01, Recording(min_free_bytes=0)))
        try:
            await eventually(lambda: len(trims) >= 2, "two trims")
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    logged = [e for e in events if e["event"] == "heap_trimmed"]
    fields = {"free_mb", "rss_mb_before", "rss_mb_after", "took_ms"}  # each trim's log line names them
    assert len(logged) >= 2 and fields <= set(logged[0])
