"""The bubblewrap backend's API: workspaces, files, limits, metadata, reaping, seccomp program, fail closed.

The attacks (environment, network, host files, fork bomb, memory, output floods,
runaway and lingering processes, dangerous syscalls) are in test_sandbox_escape.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from activities.sandbox.base import SandboxError, SandboxMissing, SandboxUnavailable
from activities.sandbox.factory import backend_for
from activities.sandbox.local import backend as local
from activities.sandbox.local import processes, seccomp
from activities.sandbox.local.backend import LocalLimits, LocalSandbox, LocalSandboxBackend
from activities.sandbox.reaper import reap
from activities.settings import ConfigurationError, LocalSandboxSettings, SandboxSettings, Settings
from tests.conftest import remove_all
from tests.waiting import eventually

PROJECT = Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"


def require_bwrap() -> None:
    if shutil.which("bwrap") is None:
        pytest.fail(
            "bubblewrap (bwrap) is required for the sandbox tests: install it with `apt-get install bubblewrap`"
        )


def host_exists(path: str) -> bool:
    return Path(path).exists()


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LocalSandboxBackend]:
    require_bwrap()
    made = LocalSandboxBackend(tmp_path / "sandboxes", LocalLimits(timeout_s=20, output_bytes=64 * 1024))
    yield made
    await remove_all(made)


@pytest.fixture
async def sandbox(backend: LocalSandboxBackend) -> AsyncIterator[LocalSandbox]:
    box = await backend.create("run-1", metadata={})
    yield box
    await box.kill()


async def py(box: LocalSandbox, code: str) -> tuple[int, str, str]:
    result = await box.run([PY, "-c", code])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.asyncio
async def test_python_runs_and_prints(sandbox: LocalSandbox) -> None:
    result = await sandbox.run([PY, "-c", "import os, sys; print('hello', os.getcwd(), sys.executable)"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "hello /workspace /usr/bin/python3\n"
    assert not result.timed_out and not result.truncated
    assert "exit_code: 0" in result.render()


@pytest.mark.asyncio
async def test_stdin_and_cwd(sandbox: LocalSandbox) -> None:
    await sandbox.write_file("sub/dir/keep.txt", b"")
    result = await sandbox.run(["/bin/sh", "-c", "pwd; cat"], stdin=b"fed via stdin", cwd="sub/dir")
    assert result.stdout == "/workspace/sub/dir\nfed via stdin"
    with pytest.raises(SandboxError):
        await sandbox.run(["/bin/true"], cwd="../..")


@pytest.mark.asyncio
async def test_workspace_persists_and_sandboxes_are_isolated(backend: LocalSandboxBackend) -> None:
    a = await backend.create("iso-a", metadata={})
    b = await backend.create("iso-b", metadata={})
    await a.run(["/bin/sh", "-c", "echo kept > note.txt"])
    again = await backend.connect("iso-a")
    assert (await again.run(["/bin/cat", "note.txt"])).stdout == "kept\n"
    assert await again.read_file("note.txt") == b"kept\n"
    listing = await b.run(["/bin/sh", "-c", "ls -A /workspace; cat /workspace/../iso-a/workspace/note.txt"])
    assert "note.txt" not in listing.stdout and "kept" not in listing.stdout
    with pytest.raises(SandboxError):
        await b.read_file("note.txt")
    assert await backend.create("iso-a", metadata={}) is not None  # create is idempotent: the file survives
    assert await a.read_file("note.txt") == b"kept\n"
    await a.kill()
    await b.kill()


@pytest.mark.asyncio
async def test_output_is_capped(sandbox: LocalSandbox) -> None:
    result = await sandbox.run(
        [PY, "-c", "import sys; sys.stdout.write('x' * 10_000_000); print('err', file=sys.stderr)"]
    )
    assert result.exit_code == 0
    assert result.truncated and len(result.stdout) == 64 * 1024
    assert result.stderr == "err\n"
    assert "truncated" in result.render()


@pytest.mark.asyncio
async def test_cpu_limit(tmp_path: Path) -> None:
    require_bwrap()
    backend = LocalSandboxBackend(tmp_path / "s", LocalLimits(cpu_s=1))
    box = await backend.create("cpu", metadata={})
    try:
        result = await box.run([PY, "-c", "while True: pass"], timeout_s=10)
    finally:
        await remove_all(backend)
    assert not result.timed_out and result.exit_code == 128 + 24  # SIGXCPU
    assert "CPU time limit of 1 s exceeded" in result.stderr


@pytest.mark.asyncio
async def test_file_size_limit(tmp_path: Path) -> None:
    require_bwrap()
    backend = LocalSandboxBackend(tmp_path / "s", LocalLimits(fsize_mb=1))
    box = await backend.create("fsize", metadata={})
    try:
        code, _, err = await py(box, "open('big', 'wb').write(b'x' * (2 * 1024 * 1024))")
        assert code != 0 and "File too large" in err
        with pytest.raises(SandboxError, match="file size limit"):
            await box.write_file("big2", b"x" * (2 * 1024 * 1024))
    finally:
        await remove_all(backend)


@pytest.mark.asyncio
async def test_path_escapes_are_refused(sandbox: LocalSandbox, tmp_path: Path) -> None:
    for bad in ("../x", "a/../../x", "/etc/passwd", "/workspace/../etc/passwd", "", "."):
        with pytest.raises(SandboxError):
            await sandbox.write_file(bad, b"x")
        with pytest.raises(SandboxError):
            await sandbox.read_file(bad)
    await sandbox.run(
        ["/bin/sh", "-c", "ln -s /etc etc_link; ln -s /etc/passwd pw; ln -s .. up; ln -s l2 l1; ln -s l1 l2"]
    )
    with pytest.raises(SandboxError):
        await sandbox.read_file("l1/x")
    for bad in ("etc_link/passwd", "pw", "up/x", "etc_link/evil"):
        with pytest.raises(SandboxError, match="escapes the workspace"):
            await sandbox.read_file(bad)
        with pytest.raises(SandboxError, match="escapes the workspace"):
            await sandbox.write_file(bad, b"x")
    assert not host_exists("/etc/evil")
    # inside paths, including /workspace/... and in-workspace symlinks, are fine
    await sandbox.write_file("/workspace/dir/ok.txt", b"fine")
    await sandbox.run(["/bin/ln", "-s", "dir/ok.txt", "inner_link"])
    assert await sandbox.read_file("inner_link") == b"fine"


@pytest.mark.asyncio
async def test_read_is_capped_at_one_mib(sandbox: LocalSandbox) -> None:
    await sandbox.run(["/bin/sh", "-c", "head -c 1048577 /dev/zero > big"])
    with pytest.raises(SandboxError, match="1 MiB"):
        await sandbox.read_file("big")
    with pytest.raises(SandboxError, match="no such file"):
        await sandbox.read_file("missing.txt")


@pytest.mark.asyncio
async def test_kill_removes_workspace_and_running_commands(backend: LocalSandboxBackend) -> None:
    box = await backend.create("doomed", metadata={})
    await box.write_file("f.txt", b"x")
    running = asyncio.create_task(box.run(["/bin/sleep", "1000"], timeout_s=15))
    await eventually(lambda: backend.running.get("doomed"), "the command to start")
    await box.kill()
    result = await asyncio.wait_for(running, 30)  # ends with the kill, long before its own 15 s limit matters
    assert result.exit_code != 0 and not result.timed_out
    assert not (backend.root / "doomed").exists()
    await box.kill()  # idempotent
    with pytest.raises(SandboxError):
        await backend.connect("doomed")
    with pytest.raises(SandboxError):
        await box.run(["/bin/true"])


@pytest.mark.asyncio
async def test_a_kill_ends_a_command_that_its_bwraps_process_group_signal_misses(
    backend: LocalSandboxBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bwrap killed while it still sets up never kills its pid-namespace init, so signalling its
    process group can leave the command alive: the kill must reach the init as well. Here the group
    signal reaches nothing at all, which is what such a bwrap amounts to."""
    box = await backend.create("stubborn", metadata={})
    running = asyncio.create_task(box.run(["/bin/sleep", "1000"], timeout_s=120))
    await eventually(lambda: backend.running.get("stubborn"), "the command to start")
    monkeypatch.setattr(processes, "killpg", lambda proc: None)
    await box.kill()
    result = await asyncio.wait_for(running, 100)  # before its own 120 s limit
    assert result.exit_code != 0 and not result.timed_out, result
    assert "stubborn" not in backend.running


@pytest.mark.asyncio
async def test_a_kill_while_a_command_starts_ends_that_command_too(backend: LocalSandboxBackend) -> None:
    box = await backend.create("racy", metadata={})
    running = asyncio.create_task(box.run(["/bin/sleep", "1000"], timeout_s=15))
    for _ in range(1_000_000):  # the command registers before its process is spawned: catch that moment
        if "racy" in backend.running:
            break
        await asyncio.sleep(0)
    assert not backend.running["racy"], "the kill is meant to land while the process starts"
    await box.kill()
    result = await asyncio.wait_for(running, 30)
    assert result.exit_code != 0 and not result.timed_out, result
    assert "racy" not in backend.running


@pytest.mark.asyncio
async def test_invalid_sandbox_ids(backend: LocalSandboxBackend) -> None:
    for bad in ("..", ".", "a/b", "", "x" * 81, "spaces here"):
        with pytest.raises(SandboxError):
            await backend.create(bad, metadata={})
    with pytest.raises(SandboxError):
        await backend.connect("never-created")


@pytest.mark.asyncio
async def test_fails_closed_without_bwrap(
    backend: LocalSandboxBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = await backend.create("closed", metadata={})
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    local.clear_probe_cache()
    try:
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            await backend.create("closed-2", metadata={})
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            await box.run(["/bin/sh", "-c", "touch /workspace/ran-unsandboxed"])
        assert not (box.workspace / "ran-unsandboxed").exists()
        assert not (backend.root / "closed-2").exists()
    finally:
        monkeypatch.undo()
        local.clear_probe_cache()


def test_limits_from_env() -> None:
    env = {
        "AGENT_SANDBOX_TIMEOUT_S": "5",
        "AGENT_SANDBOX_MEMORY_MB": "256",
        "AGENT_SANDBOX_CPU_S": "3",
        "AGENT_SANDBOX_OUTPUT_BYTES": "1000",
    }

    def local_of(env: dict[str, str]) -> LocalSandboxSettings:
        return Settings.from_env(env).sandbox.local

    assert local_of(env).limits == LocalLimits(timeout_s=5, memory_mb=256, cpu_s=3, output_bytes=1000)
    more = {"AGENT_SANDBOX_NPROC": "32", "AGENT_SANDBOX_FSIZE_MB": "8", "AGENT_SANDBOX_TMPFS_MB": "16"}
    assert local_of(more).limits == LocalLimits(nproc=32, fsize_mb=8, tmpfs_mb=16)
    assert local_of({}).uid_base == local.DEFAULT_UID_BASE
    assert local_of({"AGENT_SANDBOX_UID_BASE": "500000"}).uid_base == 500000
    with pytest.raises(ConfigurationError, match="AGENT_SANDBOX_UID_BASE"):
        local_of({"AGENT_SANDBOX_UID_BASE": "0"})
    assert local_of({}).limits == LocalLimits()
    with pytest.raises(ConfigurationError, match="AGENT_SANDBOX_MEMORY_MB"):
        local_of({"AGENT_SANDBOX_MEMORY_MB": "lots"})
    with pytest.raises(ConfigurationError, match="AGENT_SANDBOX='docker'"):
        Settings.from_env({"AGENT_SANDBOX": "docker"})


def test_factory(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, sandbox=SandboxSettings(backend="local"))
    backend = backend_for(settings)
    assert isinstance(backend, LocalSandboxBackend) and backend.root == tmp_path / "sandboxes"
    assert backend_for(settings) is backend
    with pytest.raises(SandboxUnavailable, match="E2B_API_KEY"):
        backend_for(Settings(state_dir=tmp_path, sandbox=SandboxSettings(backend="e2b")))
    with pytest.raises(SandboxUnavailable, match="local, e2b"):
        backend_for(Settings(state_dir=tmp_path, sandbox=SandboxSettings(backend="docker")))


@pytest.mark.asyncio
async def test_meta_json_listing_and_kill_by_id(backend: LocalSandboxBackend) -> None:
    box = await backend.create("meta-1", metadata={"conversation_id": "conv-9", "tenant": "acme"})
    meta = json.loads((backend.root / "meta-1" / "meta.json").read_text())
    assert meta["sandbox_id"] == "meta-1" and meta["metadata"] == {"conversation_id": "conv-9", "tenant": "acme"}
    await backend.create("meta-1", metadata={"conversation_id": "other"})  # idempotent: the first record stays
    assert json.loads((backend.root / "meta-1" / "meta.json").read_text()) == meta
    seen = await box.run(["/bin/sh", "-c", "ls -A /workspace /; cat /workspace/../meta.json"])
    assert "conv-9" not in seen.stdout and "meta.json" not in seen.stdout  # next to the workspace, not in it
    (records,) = [r for r in await backend.list_sandboxes() if r.sandbox_id == "meta-1"]
    assert (records.run_id, records.tenant, records.metadata["tenant"]) == ("conv-9", "acme", "acme")
    assert records.created_at is not None and abs(records.created_at - time.time()) < 60
    assert await backend.kill("meta-1") is True
    assert await backend.kill("meta-1") is False
    assert await backend.list_sandboxes() == []


@pytest.mark.asyncio
async def test_reaper_on_local_sandboxes(backend: LocalSandboxBackend) -> None:
    await backend.create("r-closed", metadata={"conversation_id": "conv-closed"})
    await backend.create("r-open", metadata={"conversation_id": "conv-open"})
    (backend.root / "r-legacy" / "workspace").mkdir(parents=True)  # no meta.json

    async def is_run_closed(run_id: str) -> bool:
        return run_id == "conv-closed"

    too_soon = await reap(backend, is_run_closed)  # everything is younger than a minute
    assert too_soon.killed == [] and sorted(too_soon.kept) == ["r-closed", "r-open"]
    report = await reap(backend, is_run_closed, min_age_s=0)
    assert report.checked == 3 and report.killed == ["r-closed"] and report.kept == ["r-open"]
    assert report.unknown == ["r-legacy"] and "killed 1" in report.summary()
    assert sorted(r.sandbox_id for r in await backend.list_sandboxes()) == ["r-legacy", "r-open"]

    async def broken(run_id: str) -> bool:
        raise RuntimeError("temporal unreachable")

    failing = await reap(backend, broken, min_age_s=0)
    assert failing.killed == [] and "temporal unreachable" in failing.errors["r-open"]
    assert (backend.root / "r-open").is_dir()


@pytest.mark.asyncio
async def test_connect_or_recreate(backend: LocalSandboxBackend) -> None:
    box = await backend.create("rec", metadata={"conversation_id": "conv-r"})
    await box.write_file("f.txt", b"x")
    same = await backend.connect_or_recreate("rec", metadata={"conversation_id": "conv-r"})
    assert not same.recreated and same.note() == ""
    await backend.kill("rec")  # e.g. another host's worker, whose disk this one cannot see
    with pytest.raises(SandboxMissing):
        await backend.connect("rec")
    again = await backend.connect_or_recreate("rec", metadata={"conversation_id": "conv-r"})
    assert again.recreated and "files written to /workspace earlier are gone" in again.note()
    with pytest.raises(SandboxError, match="no such file"):
        await again.sandbox.read_file("f.txt")
    assert (await again.sandbox.run(["/bin/echo", "ok"])).stdout == "ok\n"


@pytest.mark.asyncio
async def test_files_belong_to_the_sandbox_user(sandbox: LocalSandbox) -> None:
    await sandbox.write_file("dir/sub/given.txt", b"from the worker\n")
    result = await sandbox.run(["/bin/sh", "-c", "id -u; id -g; echo appended >> dir/sub/given.txt; touch dir/sub/new"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "1000\n1000\n"  # what the command sees, whoever runs it on the host
    assert await sandbox.read_file("dir/sub/given.txt") == b"from the worker\nappended\n"
    if os.geteuid() == 0:  # a root worker hands the sandbox an unprivileged host uid of its own
        assert sandbox.owner is not None and sandbox.owner[0] >= local.DEFAULT_UID_BASE
        for path in ("", "dir", "dir/sub", "dir/sub/given.txt", "dir/sub/new"):
            assert (sandbox.workspace / path).stat().st_uid == sandbox.owner[0], path
        assert sandbox.owner[0] == local.host_uid_for(sandbox.sandbox_id, local.DEFAULT_UID_BASE)
    else:
        assert sandbox.owner is None


def test_seccomp_programs() -> None:
    for arch in ("x86_64", "aarch64"):
        program = seccomp.filter_program(arch)
        assert len(program) % 8 == 0 and 40 < len(program) // 8 < 256
        insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
        assert insns[0] == (0x20, 0, 0, 4)  # load the arch...
        assert insns[1][0] == 0x15 and insns[1][3] == seccomp.AUDIT_ARCH[arch]  # ...and compare it
        assert insns[-1] == (0x06, 0, 0, seccomp.SECCOMP_RET_KILL_PROCESS)  # a foreign arch is killed
        for at, (code, jt, jf, _) in enumerate(insns):
            if code & 0x07 == 0x05:  # jumps stay inside the program
                assert at + 1 + max(jt, jf) < len(insns)
        denied = {k for code, _, _, k in insns if code == 0x15}
        table = seccomp.SYSCALLS[arch]
        assert {table[name] for name in seccomp.DENIED} <= denied
    x86 = seccomp.filter_program("x86_64")
    assert struct.pack("=HBBI", 0x35, 0, 0, 0x40000000)[:2] in x86  # x32 ABI refused
    with pytest.raises(seccomp.UnsupportedArchitecture):
        seccomp.filter_program("riscv64")
    assert seccomp.host_program() == seccomp.filter_program()


def test_workspace_removal_survives_depth_permissions_and_symlinks(tmp_path: Path) -> None:
    """1,100 nested directories made ``shutil.rmtree`` raise RecursionError and left the workspace behind."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the host's file")
    tree = tmp_path / "sandbox"
    deep = tree / "workspace"
    deep.mkdir(parents=True)
    for _ in range(1100):
        deep = deep / "d"
        deep.mkdir()
    (deep / "leaf.txt").write_text("x")
    locked = tree / "workspace" / "locked"
    locked.mkdir()
    (locked / "f").write_text("y")
    locked.chmod(0o000)
    (tree / "workspace" / "link").symlink_to(outside, target_is_directory=True)

    local._remove_tree(tree)

    assert not tree.exists()
    assert (outside / "keep.txt").read_text() == "the host's file", "a symlink was followed"


@pytest.mark.asyncio
async def test_one_sandbox_failing_to_die_does_not_stop_the_reapers_pass(backend: LocalSandboxBackend) -> None:
    await backend.create("r-a-stuck", metadata={"conversation_id": "conv-done"})
    await backend.create("r-b-next", metadata={"conversation_id": "conv-done"})

    class StuckFirst:
        """The real backend, except that removing ``r-a-stuck`` fails the way a deep tree once did."""

        def __getattr__(self, name: str) -> object:
            return getattr(backend, name)

        async def kill(self, sandbox_id: str) -> bool:
            if sandbox_id == "r-a-stuck":
                raise RecursionError("maximum recursion depth exceeded")
            return await backend.kill(sandbox_id)

    async def closed(run_id: str) -> bool:
        return True

    report = await reap(StuckFirst(), closed, min_age_s=0)  # type: ignore[arg-type]
    assert report.killed == ["r-b-next"] and "RecursionError" in report.errors["r-a-stuck"]
    assert not (backend.root / "r-b-next").exists()
