"""Long-term memory stores on real SQLite (FTS5) and real PostgreSQL (tsvector), plaintext and encrypted:
ranking, namespace isolation, idempotent saves, bounds, TTL, hostile queries, and deletion that leaves the
text in none of the database's files."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from activities.memory.base import MAX_TEXT_BYTES, MemoryLimits, MemoryStore, MemoryStoreError
from activities.memory.postgres import PostgresMemoryStore
from activities.memory.sealing import Sealer
from activities.memory.sqlite import SQLiteMemoryStore
from tests.crypto_keys import TEST_ONLY_K1, TEST_ONLY_K2, ring
from tests.pg import StoppablePostgres

Opener = Callable[..., MemoryStore]


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "sqlite-sealed", "postgres", "postgres-sealed"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens memory stores of one kind on one database; every store it opened is closed afterwards."""
    kind = str(request.param)
    sealer = Sealer(ring(TEST_ONLY_K1)) if kind.endswith("sealed") else None
    url = str(request.getfixturevalue("postgres_db_url")) if kind.startswith("postgres") else ""
    opened: list[MemoryStore] = []

    def open_one(limits: MemoryLimits | None = None, clock: Callable[[], float] | None = None) -> MemoryStore:
        extra = {} if clock is None else {"clock": clock}
        store: MemoryStore
        if url:
            store = PostgresMemoryStore(url, sealer, limits, **extra)
        else:
            store = SQLiteMemoryStore(tmp_path / "store.sqlite3", sealer, limits, **extra)
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.close()


async def test_the_best_match_comes_first(opener: Opener) -> None:
    memory = opener()
    await memory.save("t", "u", "pets", "The user has a cat named Miso and a dog.", "i1")
    await memory.save("t", "u", "stack", "The user deploys Python services on Kubernetes with Helm.", "i2")
    await memory.save("t", "u", "pyk8s", "Python on Kubernetes: the user wants Python 3.12, Kubernetes 1.30.", "i3")
    await memory.save("t", "u", "food", "The user is vegetarian.", "i4")
    found = await memory.search("t", "u", "which Python version on Kubernetes?", 5)
    assert [e.key for e in found][:2] == ["pyk8s", "stack"]
    assert "pets" not in [e.key for e in found] and "food" not in [e.key for e in found]
    assert found[0].score >= found[1].score > 0
    assert found[0].text.startswith("Python on Kubernetes")
    assert [e.key for e in await memory.search("t", "u", "cat", 5)] == ["pets"]
    assert await memory.search("t", "u", "giraffe", 5) == []


async def test_namespaces_never_see_each_other(opener: Opener) -> None:
    memory = opener()
    for tenant, user in (("a", "u"), ("b", "u"), ("a", ""), ("", "u")):
        await memory.save(tenant, user, "k", f"secret plan of {tenant or 'none'} {user or 'none'}", f"{tenant}/{user}")
    for tenant, user in (("a", "u"), ("b", "u"), ("a", ""), ("", "u")):
        found = await memory.search(tenant, user, "secret plan", 10)
        assert [e.text for e in found] == [f"secret plan of {tenant or 'none'} {user or 'none'}"]
        assert [e.text for e in await memory.list(tenant, user, 10)] == [e.text for e in found]
    assert await memory.count("a", None) == 2 and await memory.count("a", "u") == 1
    assert len(await memory.list("a", None, 10)) == 2
    assert not await memory.delete("b", "x", "k")
    assert await memory.delete("b", "u", "k")
    assert await memory.search("b", "u", "secret", 10) == []
    assert len(await memory.search("a", "u", "secret", 10)) == 1
    assert await memory.forget("a", None) == 2
    assert await memory.count("a", None) == 0
    assert [e.key for e in await memory.search("", "u", "plan", 10)] == ["k"]


async def test_a_save_is_idempotent_by_its_key_and_replaces_by_entry_key(opener: Opener) -> None:
    memory = opener()
    first = await memory.save("t", "u", "", "likes green tea", "call-1")
    again = await memory.save("t", "u", "", "likes green tea", "call-1")
    assert again.key == first.key and again.text == first.text
    assert await memory.count("t", "u") == 1
    await memory.save("t", "u", first.key, "likes black coffee now", "call-2")
    assert await memory.count("t", "u") == 1
    assert [e.text for e in await memory.search("t", "u", "coffee", 5)] == ["likes black coffee now"]
    assert await memory.search("t", "u", "tea", 5) == []  # the replaced text is out of the index


async def test_bounds_refuse_a_save_with_a_reason(opener: Opener) -> None:
    memory = opener(MemoryLimits(max_entries=2, max_bytes=100))
    await memory.save("t", "u", "a", "x" * 40, "1")
    await memory.save("t", "u", "b", "y" * 40, "2")
    with pytest.raises(MemoryStoreError, match="AGENT_MEMORY_MAX_ENTRIES"):
        await memory.save("t", "u", "c", "z", "3")
    await memory.save("t", "u", "b", "y" * 50, "4")  # a replacement counts the new size only
    with pytest.raises(MemoryStoreError, match="AGENT_MEMORY_MAX_MB"):
        await memory.save("t", "u", "a", "x" * 60, "5")
    await memory.save("other", "u", "c", "z", "3")  # another namespace has its own bounds
    with pytest.raises(MemoryStoreError, match=f"at most {MAX_TEXT_BYTES} bytes"):
        await opener().save("t", "u", "big", "é" * MAX_TEXT_BYTES, "6")
    for key in ("", "k" * 129, "bad\nkey"):
        with pytest.raises(MemoryStoreError, match="memory key"):
            await memory.save("t", "v", key or "\x00", "text", f"k-{key}")
    with pytest.raises(MemoryStoreError, match="needs some text"):
        await memory.save("t", "v", "k", "   ", "blank")
    assert await memory.count("t", "u") == 2


async def test_entries_expire_by_ttl_and_the_reaper_deletes_them(opener: Opener) -> None:
    clock = Clock()
    memory = opener(MemoryLimits(ttl_s=3600.0), clock)
    saved = await memory.save("t", "u", "k", "the meeting is on friday", "1")
    assert saved.expires_at == clock.now + 3600.0
    clock.now += 1800
    await memory.save("t", "u", "k2", "friday is a holiday", "2")
    assert len(await memory.search("t", "u", "friday", 5)) == 2
    clock.now += 1801  # past the first entry's expiry only
    assert [e.key for e in await memory.search("t", "u", "friday", 5)] == ["k2"]
    assert [e.key for e in await memory.list("t", "u", 5)] == ["k2"]
    assert await memory.count("t", "u") == 2  # expired but not yet reaped
    assert await memory.expire(clock.now) == 1
    assert await memory.count("t", "u") == 1
    assert await memory.expire(clock.now) == 0


@pytest.mark.parametrize(
    "query",
    ["a AND (b", '"unbalanced', "NEAR(x y)", "col:term", "x* OR -y", "' | ! & :*", "\x00\u202e", "))))", "^start"],
)
async def test_hostile_queries_are_only_words(opener: Opener, query: str) -> None:
    memory = opener()
    await memory.save("t", "u", "k", "a b near x y col term start unbalanced", "1")
    found = await memory.search("t", "u", query, 5)
    words = [w for w in ("a", "b", "near", "x", "y", "col", "term", "start", "unbalanced") if w in query.lower()]
    assert [e.key for e in found] == (["k"] if words else [])


async def test_empty_and_oversized_queries(opener: Opener) -> None:
    memory = opener()
    await memory.save("t", "u", "k", "word " * 100, "1")
    assert await memory.search("t", "u", "", 5) == []
    assert await memory.search("t", "u", "  ?!  ", 5) == []
    assert len(await memory.search("t", "u", "word " * 10_000, 5)) == 1


async def test_sealed_text_survives_a_key_rotation(tmp_path: Path) -> None:
    old = SQLiteMemoryStore(tmp_path / "s.sqlite3", Sealer(ring(TEST_ONLY_K1)))
    await old.save("t", "u", "k", "rotation keeps this findable", "1")
    await old.close()
    new = SQLiteMemoryStore(tmp_path / "s.sqlite3", Sealer(ring(f"{TEST_ONLY_K2},{TEST_ONLY_K1}")))
    await new.save("t", "u", "k2", "a newer findable note", "2")
    assert {e.key for e in await new.search("t", "u", "findable", 5)} == {"k", "k2"}
    await new.close()


def _files_hold(directory: Path, marker: bytes) -> list[str]:
    return [p.name for p in directory.iterdir() if p.is_file() and marker in p.read_bytes()]


@pytest.mark.parametrize("how", ["forget", "delete", "expire"])
async def test_deleted_text_is_in_no_sqlite_file(tmp_path: Path, how: str) -> None:
    marker = b"zqxjmarker42"
    clock = Clock()
    memory = SQLiteMemoryStore(tmp_path / "store.sqlite3", None, MemoryLimits(ttl_s=10.0), clock)
    for i in range(50):  # neighbours, so the marker's pages are not simply dropped whole
        await memory.save("t", "u", f"n{i}", f"neighbour note number {i} about weather", f"n{i}")
    await memory.save("t", "u", "m", f"the code is {marker.decode()} keep it", "m")
    assert _files_hold(tmp_path, marker), "positive control: the plaintext marker is in the files"
    if how == "forget":
        assert await memory.forget("t", "u") == 51
    elif how == "delete":
        assert await memory.delete("t", "u", "m")
    else:
        clock.now += 11
        assert await memory.expire(clock.now) == 51
    assert _files_hold(tmp_path, marker) == []
    if how == "delete":
        assert len(await memory.search("t", "u", "weather", 100)) == 50
    await memory.close()


async def test_sealed_memory_is_not_plaintext_in_the_files(tmp_path: Path) -> None:
    marker = "zqxjsealed77"
    memory = SQLiteMemoryStore(tmp_path / "store.sqlite3", Sealer(ring(TEST_ONLY_K1)))
    await memory.save("tenant-a", "u", "k", f"the marker {marker} and more words", "1")
    assert [e.key for e in await memory.search("tenant-a", "u", marker, 5)] == ["k"]
    await memory.close()
    assert _files_hold(tmp_path, marker.encode()) == []
    assert _files_hold(tmp_path, b"more words") == []


async def test_forget_vacuums_postgres(postgres_db_url: str) -> None:
    import psycopg

    memory = PostgresMemoryStore(postgres_db_url)
    for i in range(20):
        await memory.save("t", "u", f"k{i}", f"note {i}", f"i{i}")
    assert await memory.forget("t", None) == 20
    await memory.close()
    with psycopg.connect(postgres_db_url) as conn:
        row = conn.execute(
            "SELECT n_dead_tup, last_vacuum FROM pg_stat_user_tables WHERE relname = 'memory_entries'"
        ).fetchone()
    assert row is not None and row[1] is not None  # VACUUM ran on the table


async def test_words_are_cut_the_same_way_on_every_store(opener: Opener) -> None:
    memory = opener()
    await memory.save("t", "u", "k", "Mail ann@example.com about v3.12 at https://docs.example.org/a-b", "1")
    for query in ("example", "ann", "12", "docs", "b", "MAIL", "https://docs.example.org/a-b"):
        assert [e.key for e in await memory.search("t", "u", query, 5)] == ["k"], query


def _tree_holds(root: Path, marker: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if marker in path.read_bytes():
                    found.append(str(path.relative_to(root)))
            except OSError:
                continue  # a file the server removed meanwhile
    return found


async def test_sealed_memory_is_not_plaintext_in_postgres_files(stoppable_postgres: StoppablePostgres) -> None:
    import psycopg

    pgdata = Path(stoppable_postgres._server.pgdata)
    plain_marker, sealed_marker = b"zqxjpgplain31", b"zqxjpgsealed64"
    plain = PostgresMemoryStore(stoppable_postgres.url)
    sealed = PostgresMemoryStore(stoppable_postgres.url, Sealer(ring(TEST_ONLY_K1)))
    try:
        await plain.save("t", "u", "p", f"plain {plain_marker.decode()}", "1")
        await sealed.save("t", "v", "s", f"sealed {sealed_marker.decode()}", "2")
        assert [e.key for e in await sealed.search("t", "v", sealed_marker.decode(), 5)] == ["s"]
    finally:
        await plain.close()
        await sealed.close()
    with psycopg.connect(stoppable_postgres.url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")  # the rows reach the tables' files, not only the WAL
    assert _tree_holds(pgdata, plain_marker), "positive control: the plaintext marker is in the server's files"
    assert _tree_holds(pgdata, sealed_marker) == []


async def test_a_word_most_entries_hold_is_left_out_beside_a_rarer_one(opener: Opener) -> None:
    memory = opener()
    for i in range(20):
        await memory.save("t", "u", f"n{i}", f"note {i} about the project", f"n{i}")
    await memory.save("t", "u", "deadline", "the project deadline is in may", "d")
    found = await memory.search("t", "u", "the project deadline", 3)
    assert found[0].key == "deadline"  # SQLite and the keyed index score "deadline" alone (the others: every entry)
    assert len(await memory.search("t", "u", "the project", 30)) == 21  # common words alone are all kept


def test_selective_keeps_common_words_when_nothing_rarer_is_found() -> None:
    from activities.memory.scoring import selective

    assert selective({"the": 90, "deadline": 3}, 100) == {"deadline": 3}
    assert selective({"the": 90, "nowhere": 0}, 100) == {"the": 90, "nowhere": 0}
    assert selective({"the": 90, "a": 80}, 100) == {"the": 90, "a": 80}


async def test_sealed_entries_without_the_key_ring_are_a_clear_error(tmp_path: Path) -> None:
    from activities.store.base import StoreError

    sealed = SQLiteMemoryStore(tmp_path / "s.sqlite3", Sealer(ring(TEST_ONLY_K1)))
    await sealed.save("t", "u", "k", "a sealed note", "1")
    await sealed.close()
    plain = SQLiteMemoryStore(tmp_path / "s.sqlite3")
    try:
        with pytest.raises(StoreError, match="AGENT_PAYLOAD_KEYS"):
            await plain.list("t", "u", 5)
    finally:
        await plain.close()
