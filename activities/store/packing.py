"""Transcript entries at rest in SQLite: JSON text, zlib-compressed when that saves space.

Tool outputs and model replies are most of a run store's bytes, and text compresses well (a 10 KB
tool output of source code or logs is typically 2-4 KB compressed). A compressed entry is stored
as a BLOB, an uncompressed one as TEXT, so both old and new rows read back the same way.
(PostgreSQL compresses large TEXT values itself, in TOAST.)
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
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(stored, MAX_UNPACKED_BYTES)
    except zlib.error as exc:
        raise StoreError(f"a stored transcript entry does not decompress: {exc}") from None
    if inflater.unconsumed_tail:
        raise StoreError("a stored transcript entry inflates beyond the limit")
    return raw.decode()
