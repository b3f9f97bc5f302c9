"""Denial of service through a sandbox's workspace: FIFOs, planted links, a full disk, a mount path.

Real bubblewrap, no mocks. What the sandboxed code leaves in its workspace must never
block the worker (a FIFO froze a thread in ``open()`` for good, and six of them
starved the default thread pool the run store uses), never redirect the worker's
writes out of the workspace, and never fill the host's disk
(``AGENT_SANDBOX_DISK_MB``). Every call that once hung is guarded by
``asyncio.wait_for(..., 15)``, and a thread the old code left stuck is released by
opening the FIFO's other end, so that a failing test fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest

from activities.sandbox.base import SandboxError
from activities.sandbox.local import quota, trees
from activities.sandbox.local.backend import LocalLimits, LocalSandbox, LocalSandboxBackend
from activities.settings import Settings
from activities.tools import builtins
from activities.tools.spec import ToolContext, ToolError
from tests.conftest import remove_all, require_bwrap
from tests.waiting import eventually
from workflows.types import ToolInvocation

GUARD_S = 15.0
MIB = 1024 * 1024


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LocalSandboxBackend]:
    require_bwrap()
    made = LocalSandboxBackend(tmp_path / "sandboxes", LocalLimits(timeout_s=20))
    yield made
    await remove_all(made)


@pytest.fixture
async def box(backend: LocalSandboxBackend) -> AsyncIterator[LocalSandbox]:
    yield await backend.create(f"dos-{uuid.uuid4().hex[:10]}", metadata={})


async def shell(box: LocalSandbox, command: str, *, timeout_s: float = 20) -> Any:
    result = await box.run(["/bin/sh", "-c", command], timeout_s=timeout_s)
    assert result.exit_code == 0, result.stderr
    return result


def unjam(paths: Iterable[Path]) -> None:
    """Release worker threads the old code left blocked opening these FIFOs (open the other end)."""
    opened = []
    for path in paths:
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            with contextlib.suppress(OSError):
                opened.append(os.open(path, flags))
    time.sleep(0.2 if opened else 0)
    for fd in opened:
        os.close(fd)


async def refused_quickly(call: Any, match: str, fifos: Iterable[Path], error: type[Exception] = SandboxError) -> None:
    """Await ``call``: it must raise ``error`` matching ``match`` while the FIFOs are still unopened.

    A call that blocked on one would only end when ``unjam`` opens its other end, after the guard:
    ``asyncio.wait_for`` then raises ``TimeoutError``, which is not ``error``.
    """
    try:
        with pytest.raises(error, match=match):
            await asyncio.wait_for(call, GUARD_S)
    finally:
        unjam(fifos)


# --- FIFOs and other non-regular files ---------------------------------------------


@pytest.mark.asyncio
async def test_a_fifo_at_a_write_file_target_is_refused_at_once(box: LocalSandbox) -> None:
    await shell(box, "mkfifo f; ln -s f to_fifo; mkdir d; mkfifo d/g")
    fifo, inner = box.workspace / "f", box.workspace / "d" / "g"
    for name, host in (("f", fifo), ("to_fifo", fifo), ("d/g", inner), ("/workspace/d/g", inner)):
        await refused_quickly(box.write_file(name, b"payload"), "FIFO", [host])
    # nothing was replaced or written: they are still FIFOs, and the sandbox still works
    listing = await shell(box, "test -p f && test -p d/g && test -L to_fifo && echo intact")
    assert listing.stdout == "intact\n"
    await box.write_file("ok.txt", b"fine")
    assert await box.read_file("ok.txt") == b"fine"


@pytest.mark.asyncio
async def test_a_fifo_or_socket_at_a_read_file_target_is_refused_at_once(box: LocalSandbox) -> None:
    await shell(box, "mkfifo f; python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"")
    await refused_quickly(box.read_file("f"), "FIFO", [box.workspace / "f"])
    await refused_quickly(box.read_file("sock"), "socket", [])
    await refused_quickly(box.write_file("sock", b"x"), "socket", [])


@pytest.mark.asyncio
async def test_a_fifo_at_run_pythons_script_name_is_refused_at_once(box: LocalSandbox) -> None:
    code = "print('hello from the script')"
    script = builtins.script_name(code)
    await shell(box, f"mkfifo {script}")
    ctx = ToolContext(
        invocation=ToolInvocation(
            conversation_id="conv-dos",
            workflow_id="wf-dos",
            step=1,
            call_id="call-0",
            call_index=0,
            seq=1,
            tool="run_python",
            arguments={},
            idempotency_key="wf-dos/1/0",
            sandbox_id=box.sandbox_id,
        ),
        settings=Settings(),
        sandbox=box,
    )
    args = builtins.RunPythonArgs(code=code)
    await refused_quickly(builtins.run_python(args, ctx), "FIFO", [box.workspace / script], error=ToolError)
    await shell(box, f"rm {script}")  # the model removes it, and run_python works again
    assert "hello from the script" in await asyncio.wait_for(builtins.run_python(args, ctx), GUARD_S)


@pytest.mark.asyncio
async def test_a_fifo_or_symlink_as_a_parent_directory_is_refused(box: LocalSandbox, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    await shell(box, f"mkfifo p; ln -s p to_p; ln -s {outside} out; mkdir real; ln -s real inner")
    for name in ("p/x", "to_p/x", "p/deeper/x"):
        await refused_quickly(box.write_file(name, b"x"), "FIFO", [box.workspace / "p"])
        await refused_quickly(box.read_file(name), "FIFO", [box.workspace / "p"])
    with pytest.raises(SandboxError, match="escapes the workspace"):
        await box.write_file("out/evil", b"x")
    await box.write_file("inner/fine", b"ok")  # a link that stays inside is followed, as before
    assert (await shell(box, "cat real/fine")).stdout == "ok"
    assert list(outside.iterdir()) == []


@pytest.mark.asyncio
async def test_a_directory_swapped_for_a_symlink_never_redirects_a_write(box: LocalSandbox, tmp_path: Path) -> None:
    """A command swaps ``d`` between a directory and a link out of the workspace while the worker writes ``d/f``.

    The old code resolved the path, then opened it by name (only the last component
    with ``O_NOFOLLOW``), so a swap in between sent the write to the link's target.
    """
    outside = tmp_path / "outside"
    outside.mkdir()
    swapper = (
        "import ctypes, os, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"os.mkdir('d'); os.symlink({str(outside)!r}, 'l'); open('ready', 'w').close()\n"
        "end = time.monotonic() + 60\n"  # until the test says stop (a starved machine may need long)
        "while time.monotonic() < end and not os.path.exists('stop'):\n"
        "    libc.syscall(316, -100, b'd', -100, b'l', 2)  # renameat2(RENAME_EXCHANGE) on x86_64\n"
    )
    if os.uname().machine != "x86_64":
        swapper = swapper.replace("316", "276")  # aarch64
    running = asyncio.ensure_future(box.run(["/usr/bin/python3", "-c", swapper], timeout_s=10))
    # the first write would create d itself: start once the swapper has made d and the link
    await eventually(lambda: (box.workspace / "ready").exists() or running.done(), "the swapper is ready")
    outcomes = {"written": 0, "refused": 0}
    i = 0
    # Write until the swap has been seen a few times (and at least 300 writes), or the swapper gave up.
    while (outcomes["refused"] < 5 or i < 300) and not running.done() and i < 100_000:
        try:
            await asyncio.wait_for(box.write_file(f"d/f{i % 300}", b"x"), GUARD_S)
            outcomes["written"] += 1
        except SandboxError:
            outcomes["refused"] += 1
        i += 1
    (box.workspace / "stop").touch()
    result = await running
    assert result.exit_code == 0, result.stderr
    assert list(outside.iterdir()) == [], f"a write left the workspace ({outcomes})"
    assert outcomes["refused"] > 0, outcomes  # the swap was seen, and refused


@pytest.mark.asyncio
async def test_hostile_file_calls_never_starve_the_default_thread_pool(
    backend: LocalSandboxBackend, box: LocalSandbox
) -> None:
    """40 write_file calls at FIFOs at once (old code: 40 threads stuck, more than asyncio's default pool)."""
    await shell(box, "for i in $(seq 0 39); do mkfifo f$i; done")
    fifos = [box.workspace / f"f{i}" for i in range(40)]
    hostile = [asyncio.ensure_future(asyncio.wait_for(box.write_file(f"f{i}", b"x"), GUARD_S)) for i in range(40)]
    try:
        await asyncio.sleep(0.2)
        # What the run store does: a starved pool would run it only once the FIFOs are unjammed, after the guard.
        await asyncio.wait_for(asyncio.to_thread(time.sleep, 0), GUARD_S)
        outcomes = await asyncio.gather(*hostile, return_exceptions=True)
        assert all(isinstance(o, SandboxError) and "FIFO" in str(o) for o in outcomes), outcomes
    finally:
        unjam(fifos)
        for task in hostile:
            task.cancel()


@pytest.mark.asyncio
async def test_sandbox_file_access_does_not_need_the_default_thread_pool(box: LocalSandbox) -> None:
    """With asyncio's default pool fully busy, the sandbox's own pool still serves file access and commands."""
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    workers = min(32, (os.cpu_count() or 1) + 4)
    busy = [loop.run_in_executor(None, gate.wait, GUARD_S) for _ in range(workers)]
    try:
        await asyncio.sleep(0.1)
        await asyncio.wait_for(box.write_file("a.txt", b"while the pool is busy"), 5)
        assert await asyncio.wait_for(box.read_file("a.txt"), 5) == b"while the pool is busy"
        assert (await asyncio.wait_for(box.run(["/bin/echo", "ran"]), 10)).stdout == "ran\n"
    finally:
        gate.set()
        await asyncio.gather(*busy)


# --- the workspace quota ---------------------------------------------------------------


def mounted_on(path: Path) -> bool:
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == str(path) for line in fh)


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[LocalSandboxBackend]:
    """The default mechanism (loop for a root worker that can mount), 8 MiB of workspace."""
    require_bwrap()
    made = LocalSandboxBackend(tmp_path / "small", LocalLimits(timeout_s=20, disk_mb=8))
    yield made
    await remove_all(made)


@pytest.fixture
async def measured(tmp_path: Path) -> AsyncIterator[LocalSandboxBackend]:
    require_bwrap()
    made = LocalSandboxBackend(tmp_path / "measured", LocalLimits(timeout_s=20, disk_mb=8), quota_mechanism="measured")
    yield made
    await remove_all(made)


def require_loop(backend: LocalSandboxBackend) -> None:
    if backend.quota_mechanism != quota.LOOP:
        pytest.skip(f"the loop-mounted quota needs a root worker with loop devices ({backend.quota_reason})")


@pytest.mark.asyncio
async def test_loop_quota_stops_a_command_at_the_quota_and_recovers(small: LocalSandboxBackend) -> None:
    require_loop(small)
    box = await small.create("quota-loop", metadata={})
    assert box.quota_mechanism == "loop" and mounted_on(box.workspace)
    result = await box.run(["/bin/sh", "-c", "dd if=/dev/zero of=big bs=1M count=20 2>&1; ls -l big"])
    assert result.exit_code == 0 and "No space left on device" in result.stdout
    assert "the workspace is full" in result.stderr and "8 MiB quota" in result.stderr
    image = box.directory / quota.IMAGE
    assert image.stat().st_blocks * 512 <= 8 * MIB  # the host's disk holds at most the quota
    assert os.statvfs(box.workspace).f_blocks * os.statvfs(box.workspace).f_frsize <= 8 * MIB
    with pytest.raises(SandboxError, match="the workspace is full"):
        await box.write_file("more.bin", b"y" * MIB)
    # the model deletes the file: everything works again
    await box.run(["/bin/rm", "big"])
    await box.write_file("more.bin", b"y" * MIB)
    assert (await box.run(["/bin/sh", "-c", "head -c 2097152 /dev/zero > again && echo ok"])).stdout == "ok\n"
    await box.kill()
    assert not mounted_on(box.workspace) and not box.directory.exists()


@pytest.mark.asyncio
async def test_loop_quota_a_writer_that_never_stops_is_held_and_killed_cleanly(small: LocalSandboxBackend) -> None:
    require_loop(small)
    box = await small.create("quota-writer", metadata={})
    writer = asyncio.ensure_future(
        box.run(["/bin/sh", "-c", "i=0; while :; do head -c 1048576 /dev/zero > f$i; i=$((i+1)); done"], timeout_s=15)
    )
    await asyncio.sleep(1.0)
    assert (box.directory / quota.IMAGE).stat().st_blocks * 512 <= 8 * MIB
    await box.kill()  # while it still writes: the workspace is unmounted and removed
    result = await asyncio.wait_for(writer, 10)
    assert result.exit_code != 0
    assert not mounted_on(box.workspace) and not box.directory.exists()
    assert await small.list_sandboxes() == []


@pytest.mark.asyncio
async def test_loop_workspace_hides_its_host_path_in_mountinfo(small: LocalSandboxBackend, tmp_path: Path) -> None:
    require_loop(small)
    box = await small.create("quota-mountinfo", metadata={})
    shown = (await box.run(["/bin/cat", "/proc/self/mountinfo"])).stdout
    (line,) = [row for row in shown.splitlines() if row.split()[4] == "/workspace"]
    assert line.split()[3] == "/" and "/dev/loop" in line, line
    assert str(tmp_path) not in shown and "sandboxes" not in shown and "quota-mountinfo" not in shown


@pytest.mark.asyncio
async def test_measured_quota_fails_the_command_refuses_writes_and_recovers(measured: LocalSandboxBackend) -> None:
    box = await measured.create("quota-measured", metadata={})
    assert measured.quota_mechanism == box.quota_mechanism == "measured" and not mounted_on(box.workspace)
    result = await box.run(["/bin/sh", "-c", "for i in 1 2 3; do head -c 4194304 /dev/zero > f$i; done"])
    assert result.exit_code != 0  # killed while it wrote f3, or failed once it ended: both say why
    assert re.search(
        r"\[sandbox\] failed: the workspace holds \d+\.\d MiB, over its quota of 8 MiB \(AGENT_SANDBOX_DISK_MB\); "
        r"delete files \(e\.g\. rm\) to continue",
        result.stderr,
    ), result.stderr
    with pytest.raises(SandboxError, match="over its quota of 8 MiB"):
        await box.write_file("more.bin", b"y" * MIB)
    # while over, a command may still write 1 MiB per file; read-only commands run (and fail), so the model can
    # look and delete
    assert "f1" in (await box.run(["/bin/ls"])).stdout
    cleaned = await box.run(["/bin/sh", "-c", "rm -f f2 f3"])
    assert cleaned.exit_code == 0, cleaned.stderr
    await box.write_file("more.bin", b"y" * MIB)
    assert (await box.run(["/bin/echo", "ok"])).exit_code == 0
    # one file can take at most what is left (RLIMIT_FSIZE is lowered to it): it never overshoots
    single = await box.run(["/bin/sh", "-c", "head -c 20971520 /dev/zero > big"])
    assert single.exit_code == 128 + 25, single.stderr  # SIGXFSZ
    left = re.search(r"a file may grow to at most the (\d) MiB left of the workspace's 8 MiB quota", single.stderr)
    assert left and os.stat(box.workspace / "big").st_size == int(left.group(1)) * MIB <= 3 * MIB, single.stderr


@pytest.mark.asyncio
async def test_measured_quota_kills_a_writer_that_never_stops(measured: LocalSandboxBackend) -> None:
    box = await measured.create("quota-measured-writer", metadata={})
    result = await box.run(
        # Paced at most ~50 MiB/s, so that the bound below holds through a second of a starved host.
        ["/bin/sh", "-c", "i=0; while :; do head -c 1048576 /dev/zero > f$i; i=$((i+1)); sleep 0.02; done"],
        timeout_s=60,
    )
    # Killed by the quota, not by the command's time limit (that would say so instead).
    assert result.exit_code != 0, result.stderr
    assert "[sandbox] killed: the workspace holds" in result.stderr
    used = trees.measure_tree(box.workspace, max_entries=10**6, max_depth=1000, budget_s=10).used_bytes
    assert used < 8 * MIB + 64 * MIB, used  # bounded by what it writes between two checks (50 ms apart)
    await box.kill()
    assert not box.directory.exists()


def test_measuring_is_bounded_and_never_follows_links(tmp_path: Path) -> None:
    tree = tmp_path / "ws"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "data").write_bytes(b"z" * (2 * MIB))
    os.link(tree / "a" / "b" / "data", tree / "hardlink")  # counted once
    (tree / "up").symlink_to(tmp_path)  # never followed
    usage = trees.measure_tree(tree, max_entries=100, max_depth=10, budget_s=5)
    assert not usage.incomplete and 2 * MIB <= usage.used_bytes < 3 * MIB
    deep = tree
    for _ in range(20):
        deep = deep / "d"
        deep.mkdir()
    assert "deeper than 10" in trees.measure_tree(tree, max_entries=100, max_depth=10, budget_s=5).incomplete
    for i in range(50):
        (tree / f"n{i}").touch()
    assert "more than 30 files" in trees.measure_tree(tree, max_entries=30, max_depth=100, budget_s=5).incomplete
