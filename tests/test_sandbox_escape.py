"""Hostile code in the local (bubblewrap) sandbox: every attempt is contained, and the worker stays healthy.

Each test runs one kind of attack through ``LocalSandbox.run`` — as model-generated
code would arrive — then checks both that it got nowhere and that the process
running the tests (standing in for the worker) can still spawn processes and
threads and run the next sandboxed command. bubblewrap is required: without it
these tests fail (with the install command), they are never skipped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from activities.sandbox.local.backend import LocalLimits, LocalSandbox, LocalSandboxBackend

PROJECT = Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"
TEMPORAL_PORT = 7233
SECRET = "s3cr3t-escape-test-value"


def require_bwrap() -> None:
    if shutil.which("bwrap") is None:
        pytest.fail(
            "bubblewrap (bwrap) is required for the sandbox escape tests: install it with "
            "`apt-get install bubblewrap` (make test does this when run as root)"
        )


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LocalSandboxBackend]:
    require_bwrap()
    made = LocalSandboxBackend(tmp_path / "sandboxes", LocalLimits(timeout_s=20, nproc=64))
    yield made
    for record in await made.list_sandboxes():  # a loop-mounted workspace would stay mounted otherwise
        await made.kill(record.sandbox_id)
    made.close()


@pytest.fixture
async def box(backend: LocalSandboxBackend) -> AsyncIterator[LocalSandbox]:
    # unique per run: a root worker derives the sandbox's host uid from its id, and the fork bomb
    # test counts that uid's processes (other test sessions on the same host must not share it)
    sandbox = await backend.create(f"escape-{uuid.uuid4().hex[:12]}", metadata={"conversation_id": "conv-escape"})
    yield sandbox
    await sandbox.kill()


async def assert_worker_healthy(box: LocalSandbox) -> None:
    """The test process can still fork/exec and start threads, and the sandbox still answers."""
    assert subprocess.run(["/bin/true"], check=False, timeout=10).returncode == 0  # noqa: ASYNC221
    seen: list[int] = []
    worker = threading.Thread(target=lambda: seen.append(1))
    worker.start()
    worker.join(10)
    assert seen == [1]
    after = await box.run(["/bin/echo", "still here"], timeout_s=10)
    assert after.exit_code == 0 and after.stdout == "still here\n", after


def host_has(path: str) -> bool:
    return os.path.exists(path)


def host_processes(marker: str) -> list[str]:
    """Command lines of host processes containing ``marker`` (the test's own excluded)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if marker in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found


def processes_of(uid: int) -> list[str]:
    """Live (non-zombie) host processes of ``uid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            status = Path(entry.path, "status").read_text()
            uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
            state = next(line for line in status.splitlines() if line.startswith("State:"))
            if int(uid_line.split()[1]) == uid and "zombie" not in state:
                found.append(entry.name)
    return found


async def py(box: LocalSandbox, code: str, timeout_s: float = 20) -> tuple[int, str, str]:
    result = await box.run([PY, "-c", code], timeout_s=timeout_s)
    return result.exit_code, result.stdout, result.stderr


# --- secrets and the host's files ----------------------------------------------------------


async def test_worker_environment_and_proc_environ_are_invisible(
    box: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", SECRET)
    monkeypatch.setenv("E2B_API_KEY", SECRET)
    script = (
        "import os, glob\n"
        "print(dict(os.environ))\n"
        "for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/task/*/environ'):\n"
        "    try:\n"
        "        print(p, open(p, 'rb').read())\n"
        "    except OSError as e:\n"
        "        print(p, 'unreadable', e)\n"
        f"print('worker visible' if os.path.exists('/proc/{os.getpid()}/cmdline') and "
        f"b'pytest' in open('/proc/{os.getpid()}/cmdline', 'rb').read() else 'worker invisible')\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    code, out, err = await py(box, script)
    assert code == 0, err
    assert "/proc/1/environ" in out and "worker invisible" in out
    assert SECRET not in out + err and "SECRET_TOKEN" not in out + err and "E2B_API_KEY" not in out + err
    shell = await box.run(["/bin/sh", "-c", "env; cat /proc/1/environ /proc/self/environ; ps -ef 2>/dev/null"])
    assert SECRET not in shell.stdout + shell.stderr
    assert "HOME=/workspace" in shell.stdout
    await assert_worker_healthy(box)


async def test_project_checkout_and_ssh_keys_are_not_visible(
    box: LocalSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_test").write_text("-----BEGIN FAKE KEY-----\n")
    monkeypatch.setenv("HOME", str(home))
    paths = [
        str(PROJECT),
        str(PROJECT / "pyproject.toml"),
        str(PROJECT / ".agent"),
        str(home / ".ssh" / "id_test"),
        "/root/.ssh",
        "/root",
        "/home",
        str(Path.home()),
    ]
    script = (
        "import os\n"
        f"for path in {paths!r}:\n"
        "    print('VISIBLE' if os.path.exists(path) else 'absent', path)\n"
        "print('home is', os.path.expanduser('~'))\n"
        "print(sorted(os.listdir('/')))\n"
    )
    code, out, err = await py(box, script)
    assert code == 0, err
    assert "VISIBLE" not in out and out.count("absent") == len(paths)
    assert "home is /workspace" in out
    assert "FAKE KEY" not in out
    find = await box.run(["/bin/sh", "-c", "find / -path /proc -prune -o -name id_test -print 2>/dev/null"])
    assert find.stdout == ""
    await assert_worker_healthy(box)


async def test_writes_outside_the_workspace_fail(box: LocalSandbox) -> None:
    targets = ["/etc/evil", "/usr/evil", "/usr/bin/evil", "/evil", str(PROJECT / "evil.txt"), "/dev/evil", "/proc/evil"]
    script = (
        "import os\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        "        open(path, 'w').write('x')\n"
        "        print('WROTE', path)\n"
        "    except OSError as e:\n"
        "        print('denied', path, e.strerror)\n"
        "open('/workspace/inside.txt', 'w').write('fine')\n"
        "open('/tmp/scratch.txt', 'w').write('fine')\n"
    )
    code, out, err = await py(box, script)
    assert code == 0, err
    # A checkout under /tmp (CI clones there) lands in the sandbox's private /tmp: writable inside, and
    # invisible outside, which is what containment means. Every other target must be refused outright.
    private = [t for t in targets if t.startswith("/tmp/")]
    assert [line for line in out.splitlines() if line.startswith("WROTE")] == [f"WROTE {t}" for t in private]
    assert out.count("denied") == len(targets) - len(private)
    assert [t for t in targets if host_has(t)] == []
    assert await box.read_file("inside.txt") == b"fine"
    await assert_worker_healthy(box)


# --- network --------------------------------------------------------------------------------


@pytest.fixture
def listeners() -> Iterator[list[socket.socket]]:
    """A listener on a free port, and one on Temporal's port when it is free (else something already listens)."""
    socks = []
    for port in (0, TEMPORAL_PORT):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        sock.listen(8)
        sock.setblocking(False)
        socks.append(sock)
    yield socks
    for sock in socks:
        sock.close()


async def test_no_connection_to_the_host_or_temporal(box: LocalSandbox, listeners: list[socket.socket]) -> None:
    port = listeners[0].getsockname()[1]
    with socket.create_connection(("127.0.0.1", TEMPORAL_PORT), timeout=3):  # something does listen there
        pass
    for sock in listeners:  # when that something is our own listener, take the check's connection off it
        with contextlib.suppress(BlockingIOError):
            sock.accept()[0].close()
    script = (
        "import socket\n"
        "print([n for _, n in socket.if_nameindex()])\n"
        f"for host, port in (('127.0.0.1', {port}), ('127.0.0.1', {TEMPORAL_PORT}), ('localhost', {TEMPORAL_PORT}),"
        " ('1.1.1.1', 80), ('::1', 7233)):\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=3)\n"
        "        print('CONNECTED', host, port)\n"
        "    except OSError as e:\n"
        "        print('failed', host, port, e)\n"
    )
    code, out, err = await py(box, script)
    assert code == 0, err
    assert "['lo']" in out
    assert "CONNECTED" not in out and out.count("failed") == 5
    for sock in listeners:
        with pytest.raises(BlockingIOError):
            sock.accept()  # nothing from the sandbox reached the host's sockets
    await assert_worker_healthy(box)


# --- the kernel surface (seccomp) ------------------------------------------------------------


async def test_dangerous_syscalls_are_refused_and_python_still_works(box: LocalSandbox) -> None:
    script = r"""
import ctypes, errno, multiprocessing, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, call):
    ctypes.set_errno(0)
    result = call()
    print(name, result, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
attempt('unshare', lambda: libc.unshare(0x10000000))  # CLONE_NEWUSER
attempt('ptrace', lambda: libc.ptrace(0, 0, 0, 0))  # PTRACE_TRACEME
attempt('mount', lambda: libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))
attempt('io_uring_setup', lambda: libc.syscall(425, 1, ctypes.c_void_p(0)))
attempt('keyctl', lambda: libc.syscall(250, 0, 0))
attempt('bpf', lambda: libc.syscall(321, 0, 0, 0))
attempt('perf_event_open', lambda: libc.syscall(298, 0, 0, -1, -1, 0))
attempt('personality', lambda: libc.personality(0x0040000))  # ADDR_NO_RANDOMIZE
attempt('chroot', lambda: libc.chroot(b'/tmp'))
print('subprocess', subprocess.run(['/bin/echo', 'child'], capture_output=True, text=True).stdout.strip())
out = []
t = threading.Thread(target=lambda: out.append('ok')); t.start(); t.join()
print('thread', out[0])
with multiprocessing.Pool(2) as pool:
    print('pool', pool.map(abs, [-1, -2, -3]))
pid = os.fork()
if pid == 0:
    os._exit(7)
print('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    if os.uname().machine not in ("x86_64", "amd64"):
        script = script.replace("syscall(425", "syscall(425").replace("syscall(250", "syscall(219")
        script = script.replace("syscall(321", "syscall(280").replace("syscall(298", "syscall(241")
    code, out, err = await py(box, script)
    assert code == 0, err
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    for name in ("unshare", "ptrace", "mount", "io_uring_setup", "keyctl", "bpf", "perf_event_open", "personality"):
        assert lines[name] == "-1 EPERM", (name, out)
    assert lines["chroot"] == "-1 EPERM"
    assert lines["subprocess"] == "child" and lines["thread"] == "ok" and lines["pool"] == "[1, 2, 3]"
    assert lines["fork"] == "7"
    await assert_worker_healthy(box)


# --- resources ---------------------------------------------------------------------------------


async def test_fork_bomb_is_capped_and_cleaned_up(box: LocalSandbox) -> None:
    # Every process of the bomb forks until RLIMIT_NPROC refuses it (EAGAIN), then says so and exits.
    bomb = (
        "import errno, os\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError as exc:\n"
        "        if exc.errno == errno.EAGAIN:\n"
        "            os.write(1, b'capped\\n')\n"
        "            os._exit(0)"
    )
    code, out, _ = await py(box, bomb, timeout_s=3)
    assert "capped\n" in out, (code, out)  # the sandbox's process cap said no, not the host's pid space
    assert code in (0, -9)  # every process gave up, or the rest were killed at the 3 s timeout
    # Only builtins after the bomb: bash retries a refused fork with a growing back-off, so a
    # command that needs a new process there would measure the back-off, not the cap.
    shell = await box.run(["/bin/bash", "-c", ":(){ :|:& };:; echo survived"], timeout_s=6)
    assert "survived\n" in shell.stdout
    after = await box.run(["/bin/echo", "next command"], timeout_s=30)
    assert after.exit_code == 0 and after.stdout == "next command\n"
    if box.owner is not None:
        assert processes_of(box.owner[0]) == []  # nothing of the sandbox's uid left on the host
    await assert_worker_healthy(box)


async def test_unbounded_memory_is_refused(box: LocalSandbox) -> None:
    code, _, err = await py(box, "chunks = []\nwhile True:\n    chunks.append(bytearray(100 * 1024 * 1024))")
    assert code != 0 and "MemoryError" in err
    code, _, err = await py(box, "b = bytearray(8 * 1024 ** 3)")
    assert code != 0 and "MemoryError" in err
    await assert_worker_healthy(box)


async def test_printing_gigabytes_is_cut_short(box: LocalSandbox) -> None:
    result = await box.run(["/bin/sh", "-c", "yes | head -c 3G"])
    assert result.truncated and len(result.stdout) == 64 * 1024
    assert result.exit_code == -9 and "printed more than" in result.stderr
    loud = await box.run([PY, "-c", "import sys\nwhile True: sys.stderr.write('e' * 65536)"])
    assert loud.truncated and loud.exit_code == -9
    await assert_worker_healthy(box)


async def test_sleeping_forever_times_out(box: LocalSandbox) -> None:
    result = await box.run(["/bin/sh", "-c", "echo started; sleep infinity"], timeout_s=1)
    assert result.timed_out and result.exit_code == -9 and result.stdout == "started\n"
    assert "(timed out)" in result.render()
    spin = await box.run([PY, "-c", "while True: pass"], timeout_s=0.5)
    assert spin.timed_out
    await assert_worker_healthy(box)


async def test_processes_do_not_outlive_their_command(box: LocalSandbox) -> None:
    marker = "7261.5"  # a sleep duration no one else uses
    script = (
        f"nohup sleep {marker} >/dev/null 2>&1 &\n"
        f"setsid sh -c 'sleep {marker} & exit 0' &\n"  # a double-forked daemon in a new session
        f"{PY} -c 'import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep({marker})' &\n"
        "sleep 0.3; echo launched\n"
    )
    result = await box.run(["/bin/sh", "-c", script], timeout_s=10)
    assert result.exit_code == 0 and result.stdout == "launched\n", result
    assert host_processes(marker) == []  # gone the moment run() returned
    # also when the command is killed at its timeout while its children run
    late = await box.run(["/bin/sh", "-c", f"nohup sleep {marker} & sleep infinity"], timeout_s=1)
    assert late.timed_out and host_processes(marker) == []
    # and inside: the next command's pid namespace holds only bwrap's init, sh, ls and grep
    ps = await box.run(["/bin/sh", "-c", "ls /proc | grep -c '^[0-9]'"])
    assert int(ps.stdout.strip()) <= 4
    await assert_worker_healthy(box)


async def test_killing_everything_it_can_see_hurts_only_itself(box: LocalSandbox) -> None:
    worker = os.getpid()  # a host pid: meaningless inside the sandbox's pid namespace
    result = await box.run(["/bin/sh", "-c", f"kill -9 {worker}; kill -9 -1; kill -9 1; echo done"], timeout_s=5)
    assert not result.timed_out
    await assert_worker_healthy(box)
