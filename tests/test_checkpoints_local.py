"""Workspace checkpoints on the local backend: the engine's take/restore over real bubblewrap and a SQLite store.

No mocks: the workspace is changed by commands in the sandbox (as its unprivileged uid)
and by ``write_file``; the hostile cases plant what sandboxed code can plant (links
pointing anywhere, FIFOs, sockets, odd names, a directory symlink where a restored
directory goes) and check that nothing outside the workspace is read or written and
that nothing hangs. Every test runs with each quota mechanism this host offers.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from activities.checkpoints import engine
from activities.sandbox.base import SandboxMissing
from activities.sandbox.checkpointable import MAX_ENTRIES, CheckpointMarker, CheckpointTooLarge, Manifest, ManifestEntry
from activities.sandbox.local import checkpoints as local_checkpoints
from activities.sandbox.local import quota
from activities.sandbox.local.backend import LocalLimits, LocalSandbox, LocalSandboxBackend
from activities.store.sqlite import SQLiteRunStore
from tests.conftest import remove_all, require_bwrap

GUARD_S = 15.0
MAX_BYTES = 200 * 1024 * 1024
MIB = 1024 * 1024
MECHANISMS = [quota.MEASURED] + ([quota.LOOP] if quota.detect()[0] == quota.LOOP else [])


@pytest.fixture(params=MECHANISMS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LocalSandboxBackend]:
    require_bwrap()
    made = LocalSandboxBackend(
        tmp_path / "sandboxes", LocalLimits(timeout_s=20, disk_mb=256), quota_mechanism=request.param
    )
    yield made
    await remove_all(made)


@pytest.fixture
async def box(backend: LocalSandboxBackend) -> LocalSandbox:
    made = await backend.create("ckpt-1", metadata={})
    assert made.quota_mechanism == backend.quota_mechanism
    return made


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteRunStore]:
    made = SQLiteRunStore(tmp_path / "store.sqlite3")
    yield made
    await made.close()


async def sh(box: LocalSandbox, command: str) -> str:
    result = await box.run(["/bin/sh", "-c", command])
    assert result.exit_code == 0, result.stderr
    return result.stdout


async def take(box: LocalSandbox, store: SQLiteRunStore, max_bytes: int = MAX_BYTES) -> engine.Taken:
    return await asyncio.wait_for(engine.take(box, store, max_bytes=max_bytes), GUARD_S)


async def restore(box: LocalSandbox, store: SQLiteRunStore, checkpoint_id: str) -> int:
    return await asyncio.wait_for(engine.restore(box, store, checkpoint_id, max_bytes=MAX_BYTES), GUARD_S)


async def manifest(store: SQLiteRunStore, checkpoint_id: str) -> dict[str, ManifestEntry]:
    return {e.path: e for e in (await engine.load_manifest(store, checkpoint_id)).entries}


def snapshot(workspace: Path) -> dict[str, tuple[Any, ...]]:
    """What the host sees in the workspace: path -> (kind, mode, content or link text)."""
    seen: dict[str, tuple[Any, ...]] = {}
    for top, dirs, files in os.walk(workspace):
        for name in dirs + files:
            full = Path(top, name)
            rel = full.relative_to(workspace).as_posix()
            if rel == "lost+found":
                continue
            info = full.lstat()
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                seen[rel] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(info.st_mode):
                seen[rel] = ("dir", mode)
            elif stat.S_ISREG(info.st_mode):
                seen[rel] = ("file", mode, full.read_bytes())
            else:
                seen[rel] = ("special", stat.S_IFMT(info.st_mode))
        dirs[:] = [
            d for d in dirs if not Path(top, d).is_symlink() and not (Path(top) == workspace and d == "lost+found")
        ]
    return seen


BUILD = (
    "mkdir -p src/pkg data empty && printf 'print(1)\\n' > src/main.py && chmod 755 src/main.py"
    " && printf 'ro' > data/ro.txt && chmod 444 data/ro.txt && printf 'x' > src/pkg/mod.py"
    " && ln -s src/main.py link && ln -s ../data src/up && chmod 750 src && chmod 700 empty"
)


@pytest.mark.asyncio
async def test_take_reads_only_what_changed_and_equal_workspaces_share_an_id(
    box: LocalSandbox, store: SQLiteRunStore
) -> None:
    assert await engine.current(box) == engine.EMPTY
    await sh(box, BUILD)
    await box.write_file("notes/a.txt", b"a" * 1000)
    first = await take(box, store)
    assert first.files == 4 and first.read_bytes == first.total_bytes == len("print(1)\n") + 2 + 1 + 1000
    assert await engine.current(box) == first.checkpoint_id
    entries = await manifest(store, first.checkpoint_id)
    assert set(entries) == {
        "src", "src/main.py", "src/pkg", "src/pkg/mod.py", "src/up", "data", "data/ro.txt", "empty", "link",
        "notes", "notes/a.txt",
    }  # fmt: skip
    assert entries["src/main.py"].mode == 0o755 and entries["data/ro.txt"].mode == 0o444
    assert entries["src"].mode == 0o750 and entries["empty"].kind == "dir"
    assert (entries["link"].kind, entries["link"].target) == ("symlink", "src/main.py")
    assert entries["src/up"].target == "../data"

    again = await take(box, store)
    assert again.checkpoint_id == first.checkpoint_id and again.read_bytes == 0

    await sh(box, "printf 'print(2)\\n' > src/main.py")  # same size: the stamp still sees it (mtime, ctime)
    changed = await take(box, store)
    assert changed.checkpoint_id != first.checkpoint_id and changed.read_bytes == len("print(2)\n")
    await box.write_file("notes/b.txt", b"b" * 10)
    written = await take(box, store)
    assert written.read_bytes == 10 and written.files == 5

    # back to the first workspace's content: the same checkpoint id (stamps are not part of it)
    await sh(box, "printf 'print(1)\\n' > src/main.py && rm notes/b.txt")
    back = await take(box, store)
    assert back.checkpoint_id == first.checkpoint_id and back.read_bytes == len("print(1)\n")


@pytest.mark.asyncio
async def test_restore_brings_back_files_dirs_modes_and_links_exactly(box: LocalSandbox, store: SQLiteRunStore) -> None:
    await sh(box, BUILD)
    await box.write_file("big.bin", os.urandom(300_000))
    before = snapshot(box.workspace)
    first = await take(box, store)

    await sh(
        box,
        "printf changed > src/pkg/mod.py && chmod 600 src/main.py && rm -r data && mkdir -p extra/deep/er"
        " && echo junk > extra/deep/er/f && echo top > top.txt && rm link && echo notalink > link"
        " && chmod 755 src && rmdir empty && echo now-a-file > empty && ln -s src/pkg dirlink",
    )
    await box.write_file("src/new.py", b"new")
    second = await take(box, store)
    assert second.checkpoint_id != first.checkpoint_id
    written = await restore(box, store, first.checkpoint_id)
    assert snapshot(box.workspace) == before
    assert await engine.current(box) == first.checkpoint_id
    assert written == len("ro") + len("x")  # big.bin and main.py (only its mode had changed) were kept
    again = await take(box, store)
    assert again.checkpoint_id == first.checkpoint_id and again.read_bytes == 0  # the marker's stamps are fresh

    # the sandbox's commands own what the restore wrote: they can change it
    out = await sh(
        box,
        "echo more >> src/pkg/mod.py && echo n > data/new.txt && rm data/ro.txt && chmod 644 src/main.py"
        " && cat src/up/new.txt && stat -c '%u' src/pkg/mod.py data",
    )
    assert out.split() == ["n", "1000", "1000"]
    if box.owner is not None:
        for rel in ("src", "src/pkg/mod.py", "data", "link"):
            assert (box.workspace / rel).lstat().st_uid == box.owner[0], rel

    # and the second checkpoint comes back too (only what differs is written)
    await restore(box, store, second.checkpoint_id)
    assert (box.workspace / "top.txt").read_bytes() == b"top\n"
    assert (box.workspace / "extra/deep/er/f").read_bytes() == b"junk\n"
    await restore(box, store, engine.EMPTY)
    assert snapshot(box.workspace) == {}


@pytest.mark.asyncio
async def test_restore_into_a_lost_sandbox(
    backend: LocalSandboxBackend, box: LocalSandbox, store: SQLiteRunStore
) -> None:
    await sh(box, BUILD)
    before = snapshot(box.workspace)
    taken = await take(box, store)
    await backend.kill(box.sandbox_id)
    with pytest.raises(SandboxMissing):
        await box.scan_workspace(max_entries=MAX_ENTRIES)
    for call in (
        box.checkpoint_marker(),
        box.set_checkpoint_marker(CheckpointMarker()),
        box.read_workspace_files(["src/main.py"], max_bytes=MAX_BYTES),
        box.apply_workspace([], {}, keep=set()),
    ):
        with pytest.raises(SandboxMissing):
            await call

    fresh = await backend.create(box.sandbox_id, metadata={})
    assert await engine.current(fresh) == engine.EMPTY and snapshot(fresh.workspace) == {}
    await restore(fresh, store, taken.checkpoint_id)
    assert snapshot(fresh.workspace) == before
    assert await sh(fresh, "cat link && echo y >> src/pkg/mod.py && cat src/pkg/mod.py") == "print(1)\nx" + "y\n"


@pytest.mark.asyncio
async def test_hostile_entries_are_left_out_and_never_block(box: LocalSandbox, store: SQLiteRunStore) -> None:
    await sh(
        box,
        "echo ok > ok.txt && ln -s /etc/passwd passwd && ln -s ../../x up2 && mkdir d && ln -s ../../x d/up3"
        " && ln -s ../ok.txt d/fine && mkfifo fifo d/fifo2 && ln ok.txt hard.txt"
        " && printf s > 'new\nline' && printf z > noread && chmod 000 noread"
        " && python3 -c \"import os, socket; s = socket.socket(socket.AF_UNIX); s.bind('sock');"
        " os.close(os.open(b'bad-\\xff', os.O_CREAT | os.O_WRONLY, 0o644))\"",
    )
    assert stat.S_ISSOCK((box.workspace / "sock").lstat().st_mode)
    scanned = {e.path: e for e in await asyncio.wait_for(box.scan_workspace(max_entries=MAX_ENTRIES), GUARD_S)}
    assert set(scanned) == {"ok.txt", "hard.txt", "d", "d/fine", "new\nline", "noread", "bad-\udcff"}
    # Never blocks on the FIFOs (nothing opens their other end: a blocked read would hit the guard).
    read = await asyncio.wait_for(
        box.read_workspace_files(["fifo", "d/fifo2", "passwd", "sock", "d/up3/../ok.txt", "ok.txt"], max_bytes=MIB),
        GUARD_S,
    )
    assert read == {"ok.txt": b"ok\n"}

    taken = await take(box, store)
    entries = await manifest(store, taken.checkpoint_id)
    assert set(entries) == set(scanned)
    assert entries["hard.txt"].hash == entries["ok.txt"].hash
    assert entries["noread"].mode == 0
    blob = await store.get_blob(taken.checkpoint_id)
    assert blob is not None and b"root:" not in blob and b"passwd" not in blob
    all_blobs = [await store.get_blob(e.hash) for e in entries.values() if e.kind == "file"]
    assert not any(b and b.startswith(b"root:") for b in all_blobs)

    # a restore removes what is not stored (FIFOs and sockets included) without opening it
    await sh(box, "rm -f ok.txt 'new\nline' bad-*")
    await restore(box, store, taken.checkpoint_id)
    left = snapshot(box.workspace)
    assert {p for p, v in left.items() if v[0] == "special"} == set() and "passwd" not in left
    assert left["new\nline"] == ("file", 0o644, b"s") and left["noread"] == ("file", 0, b"z")
    # a name that is not UTF-8 is stored like any other (its bytes) and comes back
    assert left["bad-\udcff"] == ("file", 0o644, b"")


@pytest.mark.asyncio
async def test_a_planted_directory_symlink_never_makes_a_restore_write_or_delete_outside(
    box: LocalSandbox, store: SQLiteRunStore, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    (outside / "d" / "sub").mkdir(parents=True)
    (outside / "victim.txt").write_text("keep me")
    (outside / "d" / "sub" / "f.txt").write_text("outside f")
    (outside / "d" / "junk.txt").write_text("outside junk")
    before = snapshot(outside)

    await sh(box, "mkdir -p d/sub && echo inside > d/sub/f.txt && echo top > t.txt")
    taken = await take(box, store)
    # the sandboxed code replaces the directories with links to the host's directory (text of its choice)
    await sh(box, f"rm -r d && ln -s {outside}/d d && ln -s {outside} gone && ln -s {outside}/victim.txt t.txt.x")
    await sh(box, f"rm t.txt && ln -s {outside}/victim.txt t.txt")
    await restore(box, store, taken.checkpoint_id)
    assert snapshot(outside) == before
    assert (box.workspace / "d").is_dir() and not (box.workspace / "d").is_symlink()
    assert (box.workspace / "d/sub/f.txt").read_text() == "inside\n"
    assert not (box.workspace / "t.txt").is_symlink() and (box.workspace / "t.txt").read_text() == "top\n"
    assert set(snapshot(box.workspace)) == {"d", "d/sub", "d/sub/f.txt", "t.txt"}

    # one level down: d is real, d/sub a link out
    await sh(box, f"rm -r d/sub && ln -s {outside}/d/sub d/sub")
    await restore(box, store, taken.checkpoint_id)
    assert snapshot(outside) == before
    assert (box.workspace / "d/sub/f.txt").read_text() == "inside\n" and not (box.workspace / "d/sub").is_symlink()


@pytest.mark.asyncio
async def test_over_the_limit_is_refused_naming_the_setting(box: LocalSandbox, store: SQLiteRunStore) -> None:
    await sh(box, "head -c 3000000 /dev/zero > big && echo small > small")
    with pytest.raises(CheckpointTooLarge, match="AGENT_CHECKPOINT_MAX_MB"):
        await take(box, store, max_bytes=1_000_000)
    assert await engine.current(box) == engine.EMPTY  # nothing was recorded
    # a file that grew between the scan and the read: the read itself holds the limit
    with pytest.raises(CheckpointTooLarge, match="AGENT_CHECKPOINT_MAX_MB"):
        await box.read_workspace_files(["small", "big"], max_bytes=1_000_000)
    await sh(box, "for i in 1 2 3 4 5 6; do : > f$i; done")
    with pytest.raises(CheckpointTooLarge, match="more than 5"):
        await box.scan_workspace(max_entries=5)
    assert len(await box.scan_workspace(max_entries=8)) == 8


@pytest.mark.asyncio
async def test_the_marker_lives_outside_the_workspace_and_cannot_be_forged(
    box: LocalSandbox, store: SQLiteRunStore
) -> None:
    await sh(box, "echo a > a")
    taken = await take(box, store)
    marker = await box.checkpoint_marker()
    assert marker is not None and marker.checkpoint_id == taken.checkpoint_id and set(marker.hashes) == {"a"}
    assert (box.directory / local_checkpoints.MARKER_FILE).exists()
    forged = json.dumps({"checkpoint_id": "sha256:" + "0" * 64, "stamps": {}, "hashes": {}})
    await sh(
        box,
        f"for d in /workspace /workspace/.. /tmp /; do echo '{forged}' > $d/checkpoint.json 2>/dev/null; done;"
        f" echo '{forged}' > .checkpoint.json; echo '{forged}' > meta.json; true",
    )
    assert await box.checkpoint_marker() == marker
    assert await engine.current(box) == taken.checkpoint_id

    path = box.directory / local_checkpoints.MARKER_FILE
    path.write_bytes(b"{not json")
    assert await box.checkpoint_marker() is None
    path.write_bytes(b'{"checkpoint_id": 5, "stamps": []}')
    assert await box.checkpoint_marker() is None
    path.unlink()
    assert await box.checkpoint_marker() is None and await engine.current(box) == engine.EMPTY
    await box.set_checkpoint_marker(marker)
    assert await box.checkpoint_marker() == marker
    assert [p.name for p in box.directory.iterdir() if p.name.startswith(".checkpoint")] == []  # no temp left


@pytest.fixture
async def loop_box(tmp_path: Path) -> AsyncIterator[LocalSandbox]:
    """A sandbox on a loop-mounted ext4 workspace (the only kind with a lost+found)."""
    require_bwrap()
    made = LocalSandboxBackend(
        tmp_path / "loop-sandboxes", LocalLimits(timeout_s=20, disk_mb=256), quota_mechanism=quota.LOOP
    )
    try:
        yield await made.create("ckpt-loop", metadata={})
    finally:
        await remove_all(made)


@pytest.mark.skipif(quota.LOOP not in MECHANISMS, reason="loop-mounted workspaces need root and losetup")
@pytest.mark.asyncio
async def test_loop_workspace_lost_and_found_is_never_stored_nor_removed(
    loop_box: LocalSandbox, store: SQLiteRunStore
) -> None:
    box = loop_box
    assert box.quota_mechanism == quota.LOOP
    lost = box.workspace / "lost+found"
    lost.mkdir()
    (lost / "#12").write_bytes(b"recovered")
    await sh(box, "echo a > a")
    taken = await take(box, store)
    assert set(await manifest(store, taken.checkpoint_id)) == {"a"}
    await restore(box, store, engine.EMPTY)
    assert (lost / "#12").read_bytes() == b"recovered" and not (box.workspace / "a").exists()
    assert quota.is_mounted(box.workspace)  # the mount point itself is never removed
    await restore(box, store, taken.checkpoint_id)
    assert (box.workspace / "a").read_text() == "a\n"


@pytest.mark.asyncio
async def test_incremental_take_of_a_50_mib_workspace(box: LocalSandbox, store: SQLiteRunStore) -> None:
    await sh(box, "mkdir w && i=0; while [ $i -lt 50 ]; do head -c 1048576 /dev/urandom > w/f$i; i=$((i+1)); done")
    await box.write_file("w/small.txt", b"s" * 10_000)
    first = await take(box, store)
    assert first.read_bytes == 50 * MIB + 10_000
    await box.write_file("w/small.txt", b"t" * 10_000)
    second = await take(box, store)
    assert second.read_bytes == 10_000 and second.files == 51
    await restore(box, store, first.checkpoint_id)
    assert (box.workspace / "w/small.txt").read_bytes() == b"s" * 10_000
    # How long each takes is bench/checkpoints.py's to measure; here only what was read counts.


def test_manifest_of_a_restore_ignores_unsafe_entries(tmp_path: Path) -> None:
    """``apply`` on a plain directory: outward links in a manifest are never created, the rest is."""
    root = tmp_path / "ws"
    root.mkdir()
    outside = tmp_path / "victim"
    outside.mkdir()
    entries = [
        ManifestEntry(path="d", kind="dir", mode=0o755),
        ManifestEntry(path="d/out", kind="symlink", mode=0o777, target="../../victim"),
        ManifestEntry(path="d/in", kind="symlink", mode=0o777, target="../f"),
        ManifestEntry(path="f", kind="file", mode=0o4755, size=1, hash="h"),
    ]
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        local_checkpoints.apply(fd, Manifest(entries=entries).entries, {"h": b"1"}, set(), owner=None)
    finally:
        os.close(fd)
    assert snapshot(root) == {"d": ("dir", 0o755), "d/in": ("symlink", "../f"), "f": ("file", 0o755, b"1")}


@pytest.mark.asyncio
async def test_names_that_are_not_utf8_are_checkpointed_as_bytes(box: LocalSandbox, store: SQLiteRunStore) -> None:
    raw = {b"caf\xe9.txt": b"latin-1 name", b"d\xff/in\xfe.bin": b"nested", b"ok.txt": b"plain"}
    script = (
        "import os; os.mkdir(b'd\\xff');"
        + "".join(f"open({name!r}, 'wb').write({data!r});" for name, data in raw.items())
        + "os.symlink(b'caf\\xe9.txt', b'link\\xe9')"
    )
    await sh(box, f'python3 -c "{script}"')
    taken = await take(box, store)
    entries = await manifest(store, taken.checkpoint_id)
    assert {os.fsencode(p) for p in entries} == {*raw, b"d\xff", b"link\xe9"}
    stored = await store.get_blob(taken.checkpoint_id)
    assert stored is not None and b"/b64/" in stored  # base64 of the raw name on the wire
    assert (await take(box, store)).read_bytes == 0  # the marker's stamps hold such names too

    await sh(box, 'rm -rf -- * && test -z "$(ls -A)"')
    await restore(box, store, taken.checkpoint_id)
    for name, data in raw.items():
        assert read_raw(os.fsencode(box.workspace) + b"/" + name) == data
    assert os.readlink(os.fsencode(box.workspace) + b"/link\xe9") == b"caf\xe9.txt"


def read_raw(path: bytes) -> bytes:
    with open(path, "rb") as f:
        return f.read()
