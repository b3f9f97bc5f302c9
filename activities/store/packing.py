"""Transcript entries at rest in SQLite: JSON text, zlib-compressed when that saves space.

Tool outputs and model replies are most of a run store's bytes, and text compresses well (a 10 KB
tool output of source code or logs is typically 2-4 KB compressed). A compressed entry is stored
as a BLOB, an uncompressed one as TEXT, so both old and new rows read back the same way.
(PostgreSQL compresses large TEXT values itself, in TOAST.) ``pack_bytes`` / ``unpack_bytes`` frame
bytes the same way for ``EncryptedRunStore``, which compresses before it encrypts, on either backend.
"""

from __future__ import annotations

import zlib

from activities.store.base import StoreError

PACK_AT_CHARS = 512  # shorter entries stay plain text (compression would hardly pay)
MAX_UNPACKED_BYTES = 256 * 1024 * 1024  # a tampered row must not inflate without bound


def pack_text(text: str) -> str | bytes:
    """``text`` as it is stored: compressed bytes when that is smaller, else the text itself."""
    if len(text) < PACK_AT_CHARS:
        return text
    raw = text.encode()
    packed = zlib.compress(raw, 6)
    return packed if len(packed) < len(raw) * 0.9 else text


def unpack_text(stored: str | bytes) -> str:
    """The text of a stored value (``StoreError`` for a compressed value that does not inflate)."""
    if isinstance(stored, str):
        return stored
    return inflate(stored, "a stored transcript entry").decode()


def pack_bytes(data: bytes) -> bytes:
    """``data`` framed for storage: ``b"z"`` and its zlib form when that is smaller, else ``b"r"`` and ``data``."""
    if len(data) >= PACK_AT_CHARS:
        packed = zlib.compress(data, 6)
        if len(packed) < len(data):
            return b"z" + packed
    return b"r" + data


def unpack_bytes(framed: bytes, what: str) -> bytes:
    """The bytes :func:`pack_bytes` framed; ``StoreError`` naming ``what`` for anything else."""
    if framed[:1] == b"r":
        return framed[1:]
    if framed[:1] == b"z":
        return inflate(framed[1:], what)
    raise StoreError(f"{what} has an unknown framing")


def inflate(packed: bytes, what: str) -> bytes:
    """zlib-inflate ``packed``, at most ``MAX_UNPACKED_BYTES`` (a tampered row must not expand without bound)."""
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(packed, MAX_UNPACKED_BYTES)
    except zlib.error as exc:
        raise StoreError(f"{what} does not decompress: {exc}") from None
    if inflater.unconsumed_tail:
        raise StoreError(f"{what} inflates beyond the limit")
    return raw
