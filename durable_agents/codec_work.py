"""The codec server's work on one request, off the event loop: parse, count, convert, serialize.

A request body is parsed, checked against the payload cap, converted payload by
payload and serialized in a worker thread (:class:`CodecPool`), so the event
loop keeps answering other requests while a large one is decoded. At most
``slots`` requests are worked on at once; one that waits for a slot or works past
its deadline is answered 503 or 504 and its thread stops at the next payload
(``Abandon`` is checked between payloads), so abandoned work frees its slot.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Callable
from typing import Any

import structlog
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload

from activities.crypto.keyring import KeyRingError

DEFAULT_MAX_PAYLOADS = 10_000  # per request; the UI and CLI send the payloads of one event or field at a time
DEFAULT_DEADLINE_S = 10.0
DEFAULT_SLOTS = 2
log = structlog.get_logger("codec_server")
EXPECTED = 'expected {"payloads": [{"metadata": {...}, "data": ...}]}'


class CodecRefusal(Exception):
    """A request the server answers with ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str, count: int = 0) -> None:
        super().__init__(message)
        self.status, self.message, self.count = status, message, count


class Abandoned(Exception):
    """The request's deadline passed; its thread stops here."""


def convert_body(
    body: bytes, convert_one: Callable[[Payload], Payload], max_payloads: int, abandon: threading.Event
) -> tuple[bytes, int]:
    """The response body for ``body`` and its payload count (runs in a worker thread)."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise CodecRefusal(400, EXPECTED) from None
    if not isinstance(document, dict) or set(document) - {"payloads"}:
        raise CodecRefusal(400, EXPECTED)
    items = document.get("payloads", [])
    if not isinstance(items, list):
        raise CodecRefusal(400, EXPECTED)
    count = len(items)
    if count > max_payloads:
        raise CodecRefusal(
            413, f"the request has {count} payloads, over the cap of {max_payloads} per request: send fewer", count
        )
    log.debug("codec_converting", payloads=count)
    out: list[dict[str, Any]] = []
    for item in items:
        if abandon.is_set():
            raise Abandoned
        payload = Payload()
        try:
            json_format.ParseDict(item, payload)
        except (json_format.ParseError, TypeError, ValueError, AttributeError):
            raise CodecRefusal(400, EXPECTED, count) from None
        try:
            converted = convert_one(payload)
        except KeyRingError as exc:
            raise CodecRefusal(400, str(exc), count) from None
        out.append(json_format.MessageToDict(converted))
    return json.dumps({"payloads": out}).encode(), count


class CodecPool:
    """``slots`` worker threads; :meth:`run` gives each call its deadline (waiting for a slot included)."""

    def __init__(self, *, slots: int = DEFAULT_SLOTS, deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self._slots = slots
        self._free: asyncio.Semaphore | None = None
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=slots, thread_name_prefix="codec")

    async def run(self, work: Callable[[threading.Event], tuple[bytes, int]]) -> tuple[bytes, int]:
        """``work(abandon)`` in a thread; ``CodecRefusal`` 503 (no slot in time) or 504 (too slow) past the deadline."""
        loop = asyncio.get_running_loop()
        if self._free is None:
            self._free = asyncio.Semaphore(self._slots)
        free = self._free
        deadline = loop.time() + self.deadline_s
        try:
            await asyncio.wait_for(free.acquire(), self.deadline_s)
        except TimeoutError:
            raise CodecRefusal(
                503, f"the codec server is busy: no worker became free in {self.deadline_s:g} s"
            ) from None
        abandon = threading.Event()
        # The slot is given back when the thread really ends (an abandoned one stops at its next payload).
        job = self._threads.submit(work, abandon)
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(free.release))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(job), max(0.0, deadline - loop.time()))
        except asyncio.CancelledError:  # the client went away
            abandon.set()
            raise
        except TimeoutError:
            abandon.set()
            raise CodecRefusal(
                504, f"decoding took longer than {self.deadline_s:g} s: abandoned, send fewer payloads"
            ) from None
        except Abandoned:  # pragma: no cover - only after the deadline, handled above
            raise CodecRefusal(504, f"decoding took longer than {self.deadline_s:g} s") from None
