"""``starter.py memory list|search|delete``: a real process on a real SQLite (and PostgreSQL) run store,
encrypted or not, that needs no Temporal server; bad arguments are one line and a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from activities.memory.sealing import Sealer
from activities.memory.sqlite import SQLiteMemoryStore
from tests.crypto_keys import TEST_ONLY_K1, ring

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 60


def memory_command(store_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    environ["TEMPORAL_ADDRESS"] = "127.0.0.1:1"  # nothing listens there: the command must not need Temporal
    environ["AGENT_STORE_URL"] = store_url
    environ.update(env)
    return subprocess.run(
        [sys.executable, "starter.py", "memory", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


async def _fill(path: Path, sealed: bool) -> None:
    memory = SQLiteMemoryStore(path, Sealer(ring(TEST_ONLY_K1)) if sealed else None)
    await memory.save("acme", "ann", "tea", "Ann drinks green tea every morning", "1")
    await memory.save("acme", "ann", "car", "Ann drives an old red car", "2")
    await memory.save("acme", "bob", "tea", "Bob hates tea", "3")
    await memory.save("globex", "ann", "tea", "Globex Ann likes mint tea", "4")
    await memory.close()


@pytest.mark.parametrize("sealed", [False, True])
async def test_list_search_delete(tmp_path: Path, sealed: bool) -> None:
    path = tmp_path / "store.sqlite3"
    await _fill(path, sealed)
    env = {"AGENT_PAYLOAD_KEYS": TEST_ONLY_K1} if sealed else {}
    listed = memory_command(str(path), "list", "--tenant", "acme", **env)
    assert listed.returncode == 0, listed.stderr
    assert "[tea] (ann) Ann drinks green tea" in listed.stdout and "[tea] (bob) Bob hates tea" in listed.stdout
    assert "Globex" not in listed.stdout
    found = memory_command(str(path), "search", "--tenant", "acme", "--user", "ann", "green tea", "--json", **env)
    assert found.returncode == 0, found.stderr
    entries = json.loads(found.stdout)
    assert [e["key"] for e in entries] == ["tea"] and entries[0]["text"] == "Ann drinks green tea every morning"
    gone = memory_command(str(path), "delete", "--tenant", "acme", "--user", "ann", "--key", "tea", **env)
    assert gone.returncode == 0 and "deleted 'tea'" in gone.stdout
    again = memory_command(str(path), "delete", "--tenant", "acme", "--user", "ann", "--key", "tea", **env)
    assert again.returncode == 1 and "no entry 'tea'" in again.stdout
    after = memory_command(str(path), "list", "--tenant", "acme", "--user", "ann", **env)
    assert "[car]" in after.stdout and "[tea]" not in after.stdout
    others = memory_command(str(path), "search", "--tenant", "globex", "--user", "ann", "tea", **env)
    assert "mint tea" in others.stdout


async def test_the_postgres_store(postgres_db_url: str) -> None:
    listed = memory_command(postgres_db_url, "list", "--tenant", "nobody")
    assert listed.returncode == 0, listed.stderr
    assert "no entries in tenant 'nobody'" in listed.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["list"], "--tenant"),
        (["search", "--tenant", "a"], "query"),
        (["delete", "--tenant", "a"], "--key"),
        (["search", "--tenant", "a", "?!"], "no words"),
        (["list", "--tenant", "a", "--limit", "0"], "--limit"),
        (["purge", "--tenant", "a"], "purge"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    done = memory_command(str(tmp_path / "store.sqlite3"), *args)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr
