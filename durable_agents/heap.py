"""Giving a worker's freed heap back to the operating system (glibc only).

A burst of work (a deploy's replays, hundreds of approvals at once, a wave of run starts) allocates
and then frees many small objects. CPython hands the memory back to ``malloc``, but glibc keeps the
freed pages inside its heap, so the process's RSS stays at the burst's peak while it waits for the
next one. ``HeapTrimmer`` looks every ``AGENT_HEAP_TRIM_INTERVAL_S`` seconds at how much of the heap
is free (``mallinfo2``) and, when it is at least ``MIN_FREE_BYTES``, calls ``malloc_trim(0)``, which
returns the free pages (``madvise``) without moving anything.

The trim runs in a thread: it walks the heap (tens of milliseconds at a few hundred MB) and must not
hold up the event loop. On a C library without ``malloc_trim`` (musl, macOS) the trimmer does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import time
from dataclasses import dataclass

import structlog

log = structlog.get_logger("worker")

# Below this much free heap a trim is not worth its walk of the heap.
MIN_FREE_BYTES = 16 * 1024 * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",  # free bytes in the heap's chunks
            "keepcost",
        )
    ]


@dataclass(frozen=True)
class Trim:
    """One trim: the heap's free bytes before it, the process's RSS before and after (bytes), how long it took."""

    free: int
    rss_before: int
    rss_after: int
    took_s: float


def rss_bytes() -> int:
    """This process's resident set size (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    """``malloc_trim`` when at least ``min_free_bytes`` of the heap is free; a no-op without glibc."""

    def __init__(self, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        self.min_free_bytes = min_free_bytes
        self._libc: ctypes.CDLL | None = None
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name)
            libc.malloc_trim.argtypes = [ctypes.c_size_t]
            libc.malloc_trim.restype = ctypes.c_int
            libc.mallinfo2.restype = _MallInfo2
            self._libc = libc
        except (OSError, AttributeError):  # not glibc (or glibc before 2.33, without mallinfo2)
            self._libc = None

    @property
    def available(self) -> bool:
        return self._libc is not None

    def free_bytes(self) -> int:
        """Bytes of the heap that are free (0 without glibc)."""
        if self._libc is None:
            return 0
        return int(self._libc.mallinfo2().fordblks)

    def trim_if_worth_it(self) -> Trim | None:
        """Trim when enough of the heap is free; what the trim did, or None when it was not worth it."""
        if self._libc is None:
            return None
        before = self.free_bytes()
        if before < self.min_free_bytes:
            return None
        rss, began = rss_bytes(), time.perf_counter()
        self._libc.malloc_trim(0)
        return Trim(before, rss, rss_bytes(), time.perf_counter() - began)


async def trim_heap_forever(interval_s: float, trimmer: HeapTrimmer | None = None) -> None:
    """Every ``interval_s`` seconds, ``trimmer.trim_if_worth_it()`` in a thread; until cancelled."""
    trimmer = trimmer or HeapTrimmer()
    if not trimmer.available:
        log.debug("heap_trim_unavailable", reason="the C library has no malloc_trim/mallinfo2")
        return
    while True:
        await asyncio.sleep(interval_s)
        trim = await asyncio.to_thread(trimmer.trim_if_worth_it)
        if trim is not None:
            log.debug(
                "heap_trimmed",
                free_mb=round(trim.free / 2**20, 1),
                rss_mb_before=round(trim.rss_before / 2**20, 1),
                rss_mb_after=round(trim.rss_after / 2**20, 1),
                took_ms=round(trim.took_s * 1000, 1),
            )
