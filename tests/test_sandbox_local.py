"""The bubblewrap sandbox really isolates: no env, no network, no host files, limits enforced, fails closed."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from activities.config import Settings
from activities.sandbox import local
from activities.sandbox.base import SandboxError, SandboxUnavailable
from activities.sandbox.factory import backend_for
from activities.sandbox.local import LocalLimits, LocalSandbox, LocalSandboxBackend

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
def backend(tmp_path: Path) -> LocalSandboxBackend:
    require_bwrap()
    return LocalSandboxBackend(tmp_path / "sandboxes", LocalLimits(timeout_s=20, output_bytes=64 * 1024))


@pytest.fixture
async def sandbox(backend: LocalSandboxBackend) -> AsyncIterator[LocalSandbox]:
    box = await backend.create("run-1", metadata={})
    yield box
    await box.kill()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


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
async def test_environment_is_empty(sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "s3cr3t")
    script = (
        "import os, glob\n"
        "print(dict(os.environ))\n"
        "for p in glob.glob('/proc/[0-9]*/environ'):\n"
        "    print(p, open(p, 'rb').read())\n"
        "print(sorted(os.listdir('/proc')))\n"
    )
    code, out, err = await py(sandbox, script)
    assert code == 0, err
    assert "/proc/1/environ" in out
    assert "s3cr3t" not in out + err
    assert "SECRET_TOKEN" not in out + err
    shell = await sandbox.run(["/bin/sh", "-c", "env; cat /proc/1/environ /proc/self/environ"])
    assert "s3cr3t" not in shell.stdout + shell.stderr
    assert "HOME=/workspace" in shell.stdout


@pytest.mark.asyncio
async def test_no_network(sandbox: LocalSandbox, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    script = (
        "import socket\n"
        "print([n for _, n in socket.if_nameindex()])\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "    print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print('refused', e)\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
        "    print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print('unreachable', e)\n"
    )
    code, out, err = await py(sandbox, script)
    assert code == 0, err
    assert "['lo']" in out
    assert "CONNECTED" not in out and "refused" in out and "unreachable" in out
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing reached the host's socket


@pytest.mark.asyncio
async def test_host_filesystem_is_out_of_reach(sandbox: LocalSandbox, tmp_path: Path) -> None:
    script = (
        "import os\n"
        "for path in ('/usr/evil', '/etc/evil', '/evil', '/dev/evil'):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print('WROTE', path)\n"
        "    except OSError as e:\n"
        "        print('denied', path, e.strerror)\n"
        f"for path in ({str(PROJECT / 'pyproject.toml')!r}, '/root', '/home', '/opt', {str(tmp_path)!r}):\n"
        "    print('exists' if os.path.exists(path) else 'absent', path)\n"
        "print(sorted(os.listdir('/etc')))\n"
    )
    code, out, err = await py(sandbox, script)
    assert code == 0, err
    assert "WROTE" not in out and out.count("denied") == 4
    assert "exists" not in out and out.count("absent") == 5
    assert "['alternatives', 'ld.so.cache']" in out or "['ld.so.cache']" in out
    assert not host_exists("/etc/evil") and not host_exists("/usr/evil")


@pytest.mark.asyncio
async def test_timeout_kills_the_process_group(sandbox: LocalSandbox) -> None:
    started = time.monotonic()
    result = await sandbox.run(["/bin/sh", "-c", "sleep 1000 & echo started; while true; do :; done"], timeout_s=1)
    assert time.monotonic() - started < 5
    assert result.timed_out and result.exit_code in (-9, 124)
    assert result.stdout == "started\n"
    assert "(timed out)" in result.render()
    loop = await sandbox.run([PY, "-c", "while True: pass"], timeout_s=0.5)
    assert loop.timed_out


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
async def test_memory_limit(sandbox: LocalSandbox) -> None:
    code, _, err = await py(sandbox, "b = bytearray(4 * 1024 ** 3)\nprint('allocated')")
    assert code != 0 and "MemoryError" in err


@pytest.mark.asyncio
async def test_cpu_limit(tmp_path: Path) -> None:
    require_bwrap()
    box = await LocalSandboxBackend(tmp_path / "s", LocalLimits(cpu_s=1)).create("cpu", metadata={})
    result = await box.run([PY, "-c", "while True: pass"], timeout_s=10)
    assert not result.timed_out and result.exit_code == 128 + 24  # SIGXCPU
    assert "CPU time limit of 1 s exceeded" in result.stderr


@pytest.mark.asyncio
async def test_file_size_limit(tmp_path: Path) -> None:
    require_bwrap()
    backend = LocalSandboxBackend(tmp_path / "s", LocalLimits(fsize_mb=1))
    box = await backend.create("fsize", metadata={})
    code, _, err = await py(box, "open('big', 'wb').write(b'x' * (2 * 1024 * 1024))")
    assert code != 0 and "File too large" in err
    with pytest.raises(SandboxError, match="file size limit"):
        await box.write_file("big2", b"x" * (2 * 1024 * 1024))


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
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await box.kill()
    result = await asyncio.wait_for(running, 5)
    assert time.monotonic() - started < 5 and result.exit_code != 0
    assert not (backend.root / "doomed").exists()
    await box.kill()  # idempotent
    with pytest.raises(SandboxError):
        await backend.connect("doomed")
    with pytest.raises(SandboxError):
        await box.run(["/bin/true"])


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
    assert LocalLimits.from_env(env) == LocalLimits(timeout_s=5, memory_mb=256, cpu_s=3, output_bytes=1000)
    assert LocalLimits.from_env({}) == LocalLimits()
    with pytest.raises(ValueError, match="AGENT_SANDBOX_MEMORY_MB"):
        LocalLimits.from_env({"AGENT_SANDBOX_MEMORY_MB": "lots"})


def test_factory(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, sandbox="local")
    backend = backend_for(settings)
    assert isinstance(backend, LocalSandboxBackend) and backend.root == tmp_path / "sandboxes"
    assert backend_for(settings) is backend
    with pytest.raises(SandboxUnavailable, match="not implemented yet"):
        backend_for(Settings(state_dir=tmp_path, sandbox="e2b"))
    with pytest.raises(SandboxUnavailable, match="local, e2b"):
        backend_for(Settings(state_dir=tmp_path, sandbox="docker"))
