"""Workspace checkpoints on the E2B backend, through the engine, against the fake E2B and a real SQLite store.

The fake runs the backend's checkpoint scripts with a real bash, GNU find and tar against a
directory per fake VM (tests/fakes/fake_e2b.py), so what is checked here is what those tools do.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import e2b
import pytest

import activities.sandbox.e2b.checkpoints as e2b_checkpoints
from activities.checkpoints import engine
from activities.checkpoints.engine import EMPTY
from activities.sandbox.base import SandboxMissing, SandboxTransient
from activities.sandbox.checkpointable import MAX_ENTRIES, CheckpointError, CheckpointMarker, CheckpointTooLarge
from activities.sandbox.e2b.backend import E2BSandbox, E2BSandboxBackend
from activities.sandbox.e2b.checkpoints import MARKER_PATH, extract_files, parse_scan
from activities.sandbox.local.backend import LocalLimits
from activities.settings import E2BConfig
from activities.store.sqlite import SQLiteRunStore
from tests.fakes.fake_e2b import FakeCloud, FakeDisk

MB = 1024 * 1024
SID = "sbx-ckpt-e2b-test"


@pytest.fixture
def cloud() -> FakeCloud:
    return FakeCloud()


@pytest.fixture
def backend(cloud: FakeCloud) -> E2BSandboxBackend:
    config = E2BConfig(timeout_s=3600, limits=LocalLimits(timeout_s=20, output_bytes=64 * 1024))
    return E2BSandboxBackend(cloud.api_key, config, sdk=cloud.sdk())


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteRunStore]:
    made = SQLiteRunStore(tmp_path / "run.db")
    yield made
    await made.close()


@pytest.fixture
async def sbx(backend: E2BSandboxBackend) -> E2BSandbox:
    return await backend.create(SID)


def disk(cloud: FakeCloud, sandbox: E2BSandbox) -> FakeDisk:
    return cloud.vms[sandbox.ref].files


def ws(cloud: FakeCloud, sandbox: E2BSandbox, rel: str = "") -> str:
    """Where the VM's ``/workspace/<rel>`` is on the host."""
    return disk(cloud, sandbox).host(f"/workspace/{rel}" if rel else "/workspace")


def snapshot(root: str) -> dict[str, tuple[str, int, bytes | str]]:
    """path -> (kind, permission bits, content or link text) of everything under ``root``."""
    found: dict[str, tuple[str, int, bytes | str]] = {}
    for top, dirs, names in os.walk(root):
        for name in dirs + names:
            full = os.path.join(top, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("symlink", 0, os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", stat.S_IMODE(st.st_mode), "")
            elif stat.S_ISREG(st.st_mode):
                found[rel] = ("file", stat.S_IMODE(st.st_mode), Path(full).read_bytes())
            else:
                found[rel] = ("other", stat.S_IMODE(st.st_mode), "")
    return found


def put(path: str, data: bytes, mode: int | None = None) -> None:
    Path(path).write_bytes(data)
    if mode is not None:
        os.chmod(path, mode)


def get(path: str) -> bytes:
    return Path(path).read_bytes()


def build_state_a(cloud: FakeCloud, sandbox: E2BSandbox) -> None:
    root = ws(cloud, sandbox)
    os.makedirs(f"{root}/src/pkg")
    os.makedirs(f"{root}/empty")
    os.chmod(f"{root}/empty", 0o750)
    Path(f"{root}/README.md").write_bytes(b"# project\n")
    Path(f"{root}/src/pkg/mod.py").write_bytes(b"x = 1\n" * 100)
    Path(f"{root}/run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(f"{root}/run.sh", 0o755)
    Path(f"{root}/secret.txt").write_bytes(b"s3cret")
    os.chmod(f"{root}/secret.txt", 0o600)
    Path(f"{root}/blob.bin").write_bytes(bytes(range(256)) * 40)
    Path(f"{root}/name with spaces\nand newline.txt").write_bytes(b"odd name")
    Path(f"{root}/shared.txt").write_bytes(b"group-writable")
    os.chmod(f"{root}/shared.txt", 0o664)  # bits a umask would take away: restore sets modes exactly
    os.chmod(f"{root}/src", 0o775)
    os.symlink("src/pkg/mod.py", f"{root}/link-to-mod")
    os.symlink("../README.md", f"{root}/src/up-link")
    os.symlink("src", f"{root}/srcdir")


async def test_take_modify_take_reads_only_changed(
    cloud: FakeCloud, sbx: E2BSandbox, store: SQLiteRunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_state_a(cloud, sbx)
    total = sum(len(v[2]) for v in snapshot(ws(cloud, sbx)).values() if v[0] == "file")
    asked: list[list[str]] = []
    original = sbx.read_workspace_files

    async def spy(paths: list[str], *, max_bytes: int) -> dict[str, bytes]:
        asked.append(sorted(paths))
        return await original(paths, max_bytes=max_bytes)

    monkeypatch.setattr(sbx, "read_workspace_files", spy)

    first = await engine.take(sbx, store, max_bytes=10 * MB)
    assert first.files == 7 and first.total_bytes == total and first.read_bytes == total
    assert await engine.current(sbx) == first.checkpoint_id
    manifest = await engine.load_manifest(store, first.checkpoint_id)
    kinds = {e.path: (e.kind, e.mode, e.target) for e in manifest.entries}
    assert kinds["run.sh"] == ("file", 0o755, "") and kinds["secret.txt"] == ("file", 0o600, "")
    assert kinds["empty"] == ("dir", 0o750, "") and kinds["src/pkg"][0] == "dir"
    assert kinds["link-to-mod"][::2] == ("symlink", "src/pkg/mod.py")
    assert kinds["srcdir"][::2] == ("symlink", "src") and kinds["src/up-link"][::2] == ("symlink", "../README.md")
    for entry in manifest.entries:
        if entry.kind == "file":
            assert await store.get_blob(entry.hash) == get(ws(cloud, sbx, entry.path))

    again = await engine.take(sbx, store, max_bytes=10 * MB)
    assert again.checkpoint_id == first.checkpoint_id and again.read_bytes == 0
    assert len(asked) == 1  # nothing changed: nothing read

    await sbx.write_file("src/pkg/mod.py", b"x = 2\n")  # a different size: the stamp surely changes
    changed = await engine.take(sbx, store, max_bytes=10 * MB)
    assert changed.checkpoint_id != first.checkpoint_id
    assert asked[-1] == ["src/pkg/mod.py"] and changed.read_bytes == len(b"x = 2\n")
    # the marker lives outside the workspace, and no staging file is left behind
    assert MARKER_PATH in disk(cloud, sbx) and not MARKER_PATH.startswith("/workspace/")
    assert not [p for p in os.listdir(disk(cloud, sbx).host("/tmp")) if p.startswith(".da-ckpt-")]
    vm = cloud.vms[sbx.ref]
    assert vm.commands and all(c.envs == {} for c in vm.commands)


def mutate_everything(root: str) -> None:
    Path(f"{root}/README.md").write_bytes(b"# rewritten, longer\n")
    os.chmod(f"{root}/run.sh", 0o644)
    os.unlink(f"{root}/secret.txt")
    os.unlink(f"{root}/link-to-mod")
    Path(f"{root}/link-to-mod").write_bytes(b"now a file")
    os.rmdir(f"{root}/empty")
    Path(f"{root}/empty").write_bytes(b"now a file too")
    os.unlink(f"{root}/srcdir")
    os.makedirs(f"{root}/srcdir/deep")
    Path(f"{root}/srcdir/deep/x").write_bytes(b"x")
    os.makedirs(f"{root}/build/out")
    Path(f"{root}/build/out/a.o").write_bytes(b"\0" * 1000)
    os.chmod(f"{root}/build/out", 0o555)  # read-only: restore must still empty it
    os.chmod(f"{root}/src/pkg", 0o700)
    Path(f"{root}/new.txt").write_bytes(b"new")


async def test_restore_an_older_checkpoint_exactly(cloud: FakeCloud, sbx: E2BSandbox, store: SQLiteRunStore) -> None:
    build_state_a(cloud, sbx)
    root = ws(cloud, sbx)
    state_a = snapshot(root)
    a = await engine.take(sbx, store, max_bytes=10 * MB)

    mutate_everything(root)  # step 2 changes everything it can: contents, modes, kinds, extras
    state_b = snapshot(root)
    b = await engine.take(sbx, store, max_bytes=10 * MB)
    assert b.checkpoint_id != a.checkpoint_id

    written = await engine.restore(sbx, store, a.checkpoint_id, max_bytes=10 * MB)
    assert snapshot(root) == state_a
    assert await engine.current(sbx) == a.checkpoint_id
    # unchanged files were kept, not rewritten: only what differed came from the store
    assert 0 < written < sum(len(v[2]) for v in state_a.values() if v[0] == "file")
    # a checkpoint right after a restore reads nothing: the marker's stamps are the restored files'
    assert (await engine.take(sbx, store, max_bytes=10 * MB)).read_bytes == 0

    await engine.restore(sbx, store, b.checkpoint_id, max_bytes=10 * MB)
    assert snapshot(root) == state_b
    await engine.restore(sbx, store, EMPTY, max_bytes=10 * MB)
    assert snapshot(root) == {}


async def test_the_vm_expires_between_steps(
    cloud: FakeCloud, backend: E2BSandboxBackend, sbx: E2BSandbox, store: SQLiteRunStore
) -> None:
    build_state_a(cloud, sbx)
    state_a = snapshot(ws(cloud, sbx))
    taken = await engine.take(sbx, store, max_bytes=10 * MB)

    cloud.advance(3600 + 1)  # nobody used it for AGENT_E2B_TIMEOUT_S: E2B reaps the VM
    with pytest.raises(SandboxMissing):
        await sbx.scan_workspace(max_entries=MAX_ENTRIES)
    with pytest.raises(SandboxMissing):
        await sbx.checkpoint_marker()

    connection = await backend.connect_or_recreate(SID)
    fresh = connection.sandbox
    assert connection.recreated and isinstance(fresh, E2BSandbox) and fresh.ref != sbx.ref
    assert snapshot(ws(cloud, fresh)) == {}
    assert await engine.current(fresh) == EMPTY != taken.checkpoint_id  # the workflow sees the mismatch
    await engine.restore(fresh, store, taken.checkpoint_id, max_bytes=10 * MB)
    assert snapshot(ws(cloud, fresh)) == state_a
    assert await engine.current(fresh) == taken.checkpoint_id
    assert (await engine.take(fresh, store, max_bytes=10 * MB)).checkpoint_id == taken.checkpoint_id


def build_hostile(root: str) -> None:
    Path(f"{root}/ok.txt").write_bytes(b"ok")
    os.symlink("/etc/passwd", f"{root}/abs-out")
    os.makedirs(f"{root}/d")
    os.symlink("../../etc/passwd", f"{root}/d/rel-out")
    os.mkfifo(f"{root}/fifo")
    Path(os.fsdecode(os.fsencode(root) + b"/bad-\xff-name")).write_bytes(b"not utf-8")
    # a name tar would take for options if it read its list of names as arguments
    Path(f"{root}/--checkpoint=1").write_bytes(b"a")
    Path(f"{root}/--checkpoint-action=exec=touch pwned").write_bytes(b"b")


async def test_hostile_entries_are_not_stored(cloud: FakeCloud, sbx: E2BSandbox, store: SQLiteRunStore) -> None:
    root = ws(cloud, sbx)
    build_hostile(root)
    taken = await engine.take(sbx, store, max_bytes=10 * MB)
    manifest = await engine.load_manifest(store, taken.checkpoint_id)
    kept = ["--checkpoint-action=exec=touch pwned", "--checkpoint=1", "bad-\udcff-name", "d", "ok.txt"]
    assert sorted(e.path for e in manifest.entries) == kept  # a name that is not UTF-8 is kept (its bytes)
    assert "pwned" not in snapshot(root)

    # restoring makes the workspace exactly the checkpoint: the hostile leftovers go
    await engine.restore(sbx, store, taken.checkpoint_id, max_bytes=10 * MB)
    assert sorted(snapshot(root)) == kept


async def test_names_that_are_not_utf8_survive_a_restore(
    cloud: FakeCloud, sbx: E2BSandbox, store: SQLiteRunStore
) -> None:
    root = os.fsencode(ws(cloud, sbx))
    os.makedirs(root + b"/d\xff")
    for name, data in {b"caf\xe9.txt": b"latin-1", b"d\xff/in\xfe": b"nested"}.items():
        write_raw(root + b"/" + name, data)
    os.symlink(b"caf\xe9.txt", root + b"/link\xe9")
    taken = await engine.take(sbx, store, max_bytes=10 * MB)
    manifest = await engine.load_manifest(store, taken.checkpoint_id)
    names = sorted(os.fsencode(e.path) for e in manifest.entries)
    assert names == [b"caf\xe9.txt", b"d\xff", b"d\xff/in\xfe", b"link\xe9"]
    assert (await engine.take(sbx, store, max_bytes=10 * MB)).read_bytes == 0  # the marker holds their stamps

    for name in (b"caf\xe9.txt", b"d\xff/in\xfe", b"link\xe9"):
        os.unlink(root + b"/" + name)
    os.rmdir(root + b"/d\xff")
    await engine.restore(sbx, store, taken.checkpoint_id, max_bytes=10 * MB)
    assert read_raw(root + b"/caf\xe9.txt") == b"latin-1"
    assert read_raw(root + b"/d\xff/in\xfe") == b"nested"
    assert os.readlink(root + b"/link\xe9") == b"caf\xe9.txt"


def test_parse_scan_is_defensive() -> None:
    def rec(kind: str, name: bytes, link: bytes = b"", mode: bytes = b"644") -> bytes:
        return b"\0".join([kind.encode(), mode, b"5", b"1.5", b"2.25", b"7", link, name]) + b"\0"

    listing = (
        rec("f", b"a.txt")
        + rec("d", b"dir", mode=b"755")
        + rec("l", b"dir/in", b"../a.txt")
        + rec("l", b"dir/out", b"../../x")
        + rec("l", b"abs", b"/etc")
        + rec("p", b"fifo")
        + rec("s", b"sock")
        + rec("c", b"dev")
        + rec("f", b"bad\xff")
        + rec("f", b"../up")
        + rec("f", b"x/./y")
    )
    entries = parse_scan(listing, max_entries=10)
    assert [(e.path, e.kind, e.mode, e.target) for e in entries] == [
        ("a.txt", "file", 0o644, ""),
        ("dir", "dir", 0o755, ""),
        ("dir/in", "symlink", 0o644, "../a.txt"),
        ("bad\udcff", "file", 0o644, ""),  # not UTF-8: its bytes, kept
    ]
    assert entries[0].stamp == "5:1.5:2.25:7" and entries[0].size == 5 and entries[1].size == 0
    assert parse_scan(b"", max_entries=10) == []
    for bad in (listing[:-1], listing + b"f\0", rec("f", b"a", mode=b"9x"), rec("ff", b"a")):
        with pytest.raises(CheckpointError):
            parse_scan(bad, max_entries=10)
    with pytest.raises(CheckpointTooLarge):
        parse_scan(rec("f", b"a") + rec("f", b"b"), max_entries=1)


def crafted_tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def test_extract_files_takes_only_requested_regular_files() -> None:
    archive = crafted_tar(
        [
            (member("a.txt"), b"wanted"),
            (member("extra.txt"), b"not asked for"),
            (member("b.txt", tarfile.SYMTYPE, "/etc/passwd"), b""),
            (member("c.txt", tarfile.LNKTYPE, "a.txt"), b""),
            (member("../evil"), b"outside"),
            (member("/etc/cron.d/evil"), b"absolute"),
            (member("sub/../a2"), b"dotted"),
            (member("d", tarfile.DIRTYPE), b""),
            (member("f", tarfile.FIFOTYPE), b""),
            (member("dev", tarfile.CHRTYPE), b""),
        ]
    )
    wanted = {"a.txt", "b.txt", "c.txt", "../evil", "/etc/cron.d/evil", "sub/../a2", "d", "f", "dev", "missing"}
    assert extract_files(archive, wanted, max_bytes=1000) == {"a.txt": b"wanted"}
    with pytest.raises(CheckpointTooLarge):
        extract_files(archive, {"a.txt"}, max_bytes=5)
    for junk in (b"not a tar at all" * 64, archive[:700]):
        with pytest.raises(CheckpointError):
            extract_files(junk, {"a.txt"}, max_bytes=1000)


async def test_max_bytes(cloud: FakeCloud, sbx: E2BSandbox, store: SQLiteRunStore) -> None:
    root = ws(cloud, sbx)
    put(f"{root}/big.bin", os.urandom(200_000))
    put(f"{root}/small.txt", b"small")
    with pytest.raises(CheckpointTooLarge, match="AGENT_CHECKPOINT_MAX_MB"):
        await engine.take(sbx, store, max_bytes=100_000)
    assert await engine.current(sbx) == EMPTY  # no checkpoint, no marker
    # the archive itself is bounded, whatever a (lying) scan said
    with pytest.raises(CheckpointTooLarge):
        await sbx.read_workspace_files(["big.bin"], max_bytes=100_000)
    assert await sbx.read_workspace_files(["small.txt", "big.bin", "gone"], max_bytes=300_000) == {
        "small.txt": b"small",
        "big.bin": get(f"{root}/big.bin"),
    }
    taken = await engine.take(sbx, store, max_bytes=300_000)
    with pytest.raises(CheckpointTooLarge):
        await engine.restore(sbx, store, taken.checkpoint_id, max_bytes=100_000)


async def test_the_marker(cloud: FakeCloud, sbx: E2BSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    assert await sbx.checkpoint_marker() is None
    marker = CheckpointMarker(checkpoint_id="sha256:" + "a" * 64, stamps={"a": "1:2:3:4"}, hashes={"a": "sha256:b"})
    await sbx.set_checkpoint_marker(marker)
    assert await sbx.checkpoint_marker() == marker
    files = disk(cloud, sbx)
    files[MARKER_PATH] = b"{not json"
    assert await sbx.checkpoint_marker() is None
    files[MARKER_PATH] = b'{"checkpoint_id": 5, "stamps": []}'
    assert await sbx.checkpoint_marker() is None
    monkeypatch.setattr(e2b_checkpoints, "MAX_MARKER_BYTES", 100)
    files[MARKER_PATH] = marker.model_dump_json().encode() + b" " * 200
    assert await sbx.checkpoint_marker() is None
    os.unlink(files.host(MARKER_PATH))
    os.symlink("/etc/passwd", files.host(MARKER_PATH))
    assert await sbx.checkpoint_marker() is None


async def test_sdk_failures_map_to_the_backend_errors(cloud: FakeCloud, sbx: E2BSandbox, store: SQLiteRunStore) -> None:
    put(ws(cloud, sbx, "a.txt"), b"a")
    rate_limit: Any = e2b.RateLimitException("429: Rate limit exceeded")  # type: ignore[no-untyped-call]
    cloud.fail_next("run", rate_limit)
    with pytest.raises(SandboxTransient):
        await engine.take(sbx, store, max_bytes=MB)
    cloud.fail_next("get_info", e2b.TimeoutException("Request timed out"))
    with pytest.raises(SandboxTransient):
        await sbx.checkpoint_marker()
    taken = await engine.take(sbx, store, max_bytes=MB)  # then it works
    assert taken.files == 1
    cloud.vms[sbx.ref].state = "killed"
    with pytest.raises(SandboxMissing):
        await engine.restore(sbx, store, taken.checkpoint_id, max_bytes=MB)


def read_raw(path: bytes) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write_raw(path: bytes, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
