"""Content-addressed blobs in the run store, against both backends (SQLite file, real PostgreSQL)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import zlib

import psycopg
import pytest

from activities.store import RunStore, StoreError, open_store
from activities.store.base import MAX_BLOB_BYTES

# ``store_url`` and ``store`` (SQLite and PostgreSQL) come from tests/pg.py.


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def query(url: str, statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Run ``statement`` (written with ``?`` placeholders) on the store's database, behind the store's back."""
    if url.startswith("postgresql://"):
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(statement.replace("?", "%s"), params)
            return list(await cur.fetchall()) if cur.description else []
    with sqlite3.connect(url, isolation_level=None) as conn:
        return conn.execute(statement, params).fetchall()


async def stored_row(url: str, digest: str) -> tuple[object, ...]:
    [row] = await query(url, "SELECT size, encoding, data FROM blobs WHERE digest = ?", (digest,))
    return row


COMPRESSIBLE = b"the same line, again and again\n" * 4000


async def test_round_trip_returns_the_sha256_digest(store: RunStore) -> None:
    data = b"\x89PNG\r\n\x1a\n\x00\x00 an image, NUL bytes included \x00\xff"
    digest = await store.put_blob(data)
    assert digest == sha256(data)
    assert await store.get_blob(digest) == data


async def test_second_put_of_the_same_bytes_stores_nothing_new(store: RunStore, store_url: str) -> None:
    first = await store.put_blob(COMPRESSIBLE)
    [(created_at,)] = await query(store_url, "SELECT created_at FROM blobs WHERE digest = ?", (first,))
    second = await store.put_blob(COMPRESSIBLE)
    assert second == first
    assert await query(store_url, "SELECT digest, created_at FROM blobs") == [(first, created_at)]
    other = await store.put_blob(b"something else")
    assert other != first
    assert {d for (d,) in await query(store_url, "SELECT digest FROM blobs")} == {first, other}


async def test_compressible_data_is_stored_zlib_and_round_trips(store: RunStore, store_url: str) -> None:
    digest = await store.put_blob(COMPRESSIBLE)
    size, encoding, data = await stored_row(store_url, digest)
    assert (size, encoding) == (len(COMPRESSIBLE), "zlib")
    assert isinstance(data, bytes) and len(data) < len(COMPRESSIBLE) // 10
    assert zlib.decompress(data) == COMPRESSIBLE
    assert await store.get_blob(digest) == COMPRESSIBLE


async def test_incompressible_data_is_stored_raw_and_round_trips(store: RunStore, store_url: str) -> None:
    noise = os.urandom(256 * 1024)
    digest = await store.put_blob(noise)
    assert await stored_row(store_url, digest) == (len(noise), "raw", noise)
    assert await store.get_blob(digest) == noise


async def test_empty_bytes_are_a_blob_too(store: RunStore, store_url: str) -> None:
    digest = await store.put_blob(b"")
    assert digest == sha256(b"")
    assert await stored_row(store_url, digest) == (0, "raw", b"")
    assert await store.get_blob(digest) == b""


async def test_blob_of_exactly_the_limit_is_stored(store: RunStore) -> None:
    data = b"\x00" * MAX_BLOB_BYTES
    digest = await store.put_blob(data)
    assert await store.get_blob(digest) == data


async def test_blob_over_the_limit_is_refused(store: RunStore, store_url: str) -> None:
    kept = await store.put_blob(b"kept")
    with pytest.raises(ValueError, match=str(MAX_BLOB_BYTES)):
        await store.put_blob(b"\x00" * (MAX_BLOB_BYTES + 1))
    assert await query(store_url, "SELECT digest FROM blobs") == [(kept,)]


@pytest.mark.parametrize(
    "digest",
    [
        "",
        "sha256:",
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 65,
        "sha256:" + "A" * 64,
        "sha256:" + "g" * 64,
        "sha256:" + "a" * 64 + "\n",
        "SHA256:" + "a" * 64,
        "sha512:" + "a" * 64,
        "a" * 64,
        "sha256:" + "a" * 32 + "' OR '1'='1",
        "sha256:../../" + "a" * 58,
    ],
)
async def test_malformed_digest_is_none(store: RunStore, digest: str) -> None:
    await store.put_blob(b"present")
    assert await store.get_blob(digest) is None


@pytest.mark.parametrize("malformed", ["upper case", "trailing newline", "65 hex digits"])
async def test_malformed_digest_is_none_even_if_such_a_row_exists(
    store: RunStore, store_url: str, malformed: str
) -> None:
    await store.put_blob(b"present")
    digest = sha256(b"x")
    key = {
        "upper case": "sha256:" + digest.removeprefix("sha256:").upper(),
        "trailing newline": digest + "\n",
        "65 hex digits": digest + "0",
    }[malformed]
    await query(
        store_url,
        "INSERT INTO blobs (digest, size, encoding, data, created_at) VALUES (?, ?, ?, ?, ?)",
        (key, 1, "raw", b"x", 0.0),
    )
    assert await store.get_blob(key) is None


async def test_unknown_digest_is_none(store: RunStore) -> None:
    await store.put_blob(b"present")
    assert await store.get_blob(sha256(b"absent")) is None


NOISE = os.urandom(4096)
CORRUPTIONS: dict[str, tuple[bytes, str]] = {  # name: (blob, the statement that corrupts its row)
    "raw bytes flipped": (NOISE, "UPDATE blobs SET data = ? WHERE digest = ?"),
    "zlib of other bytes": (COMPRESSIBLE, "UPDATE blobs SET data = ? WHERE digest = ?"),
    "zlib stream garbled": (COMPRESSIBLE, "UPDATE blobs SET data = ? WHERE digest = ?"),
    "wrong size": (COMPRESSIBLE, "UPDATE blobs SET size = size - 1 WHERE digest = ?"),
    "unknown encoding": (COMPRESSIBLE, "UPDATE blobs SET encoding = 'lz4' WHERE digest = ?"),
    "raw read as zlib": (NOISE, "UPDATE blobs SET encoding = 'zlib' WHERE digest = ?"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
async def test_corrupted_row_is_a_store_error_naming_the_digest(store: RunStore, store_url: str, name: str) -> None:
    data, change = CORRUPTIONS[name]
    digest = await store.put_blob(data)
    _, _, stored = await stored_row(store_url, digest)
    assert isinstance(stored, bytes)
    if name == "raw bytes flipped":
        params: tuple[object, ...] = (bytes([stored[0] ^ 0x01]) + stored[1:], digest)
    elif name == "zlib of other bytes":
        params = (zlib.compress(COMPRESSIBLE.replace(b"again", b"agaiN", 1)), digest)
    elif name == "zlib stream garbled":
        params = (stored[:2] + bytes(b ^ 0x5A for b in stored[2:]), digest)
    else:
        params = (digest,)
    await query(store_url, change, params)
    with pytest.raises(StoreError) as caught:
        await store.get_blob(digest)
    assert digest in str(caught.value)


async def test_corrupt_zlib_cannot_inflate_past_the_recorded_size(store: RunStore, store_url: str) -> None:
    digest = await store.put_blob(b"small")
    bomb = zlib.compress(b"\x00" * (8 * 1024 * 1024))  # 8 MiB of zeros, recorded as a 5-byte blob
    await query(store_url, "UPDATE blobs SET encoding = 'zlib', data = ? WHERE digest = ?", (bomb, digest))
    with pytest.raises(StoreError, match="6 bytes where 5"):
        await store.get_blob(digest)


async def test_blobs_survive_reopening_the_store(store_url: str) -> None:
    first = open_store(store_url)
    try:
        digest = await first.put_blob(COMPRESSIBLE)
    finally:
        await first.close()
    again = open_store(store_url)
    try:
        assert await again.get_blob(digest) == COMPRESSIBLE
        assert await again.put_blob(COMPRESSIBLE) == digest
    finally:
        await again.close()
    assert len(await query(store_url, "SELECT digest FROM blobs")) == 1
