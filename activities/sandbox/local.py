"""The local sandbox backend: bubblewrap namespaces, seccomp and rlimits around one workspace directory per sandbox.

Every command runs in its own ``bwrap`` with fresh user/pid/net/ipc/uts/cgroup/mount
namespaces (network: loopback only, and nothing listens on it), no capabilities,
no nested user namespaces, a seccomp filter (:mod:`activities.sandbox.seccomp`),
a read-only ``/usr``, an empty environment, private ``/tmp`` and only
``/workspace`` writable and persistent. The command's pid namespace dies with it:
nothing it started survives ``run()``.

Who the command runs as (measured on Linux 6.x, bubblewrap 0.8):

* worker running as **root**: ``RLIMIT_NPROC`` is never enforced for host uid 0,
  even inside a new user namespace, so a fork bomb would be uncapped. The command
  therefore runs as an unprivileged host uid of its own (``AGENT_SANDBOX_UID_BASE``
  + a hash of the sandbox id, recorded in ``meta.json``), which owns the workspace.
  ``bwrap`` then runs unprivileged, and to let it reach a workspace below a
  directory that uid may not search (``/root``, pytest's 0700 temp dirs), the
  workspace is first bind-mounted onto ``/mnt`` in a private mount namespace of
  the forked child (invisible to the worker and everyone else).
* worker running as **another uid**: the command runs as that uid, and
  ``RLIMIT_NPROC`` is set to the sandbox's budget plus the tasks that uid already
  has (the limit counts every process and thread of the uid).

Inside, the command always sees uid/gid 1000. When ``bwrap`` is missing or cannot
create the namespaces, :class:`SandboxUnavailable` is raised: this backend never
runs anything unsandboxed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import json
import logging
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from activities.sandbox import seccomp
from activities.sandbox.base import (
    META_RUN,
    META_TENANT,
    WORKSPACE,
    CommandResult,
    Connection,
    SandboxError,
    SandboxMissing,
    SandboxRecord,
    SandboxUnavailable,
    workspace_relative,
)

log = logging.getLogger(__name__)

SANDBOX_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")
MAX_READ_BYTES = 1024 * 1024
INNER_UID = 1000  # the uid/gid a command sees inside the sandbox
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKSPACE,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
INSTALL_HINT = (
    "bubblewrap (bwrap) is not available: install it with `apt-get install bubblewrap` (Debian/Ubuntu; "
    "`dnf install bubblewrap` on Fedora) and make sure user namespaces are enabled; "
    "the local sandbox never runs code unsandboxed"
)
META_FILE = "meta.json"
DEFAULT_UID_BASE = 2_000_000_000
UID_SPAN = 1_000_000
# Where a root worker's forked child bind-mounts the workspace (in its private mount namespace) so
# that the unprivileged bwrap can reach it; the first of these that exists is used.
STAGE_DIRS = ("/mnt", "/media", "/srv", "/opt")
_KILL_GRACE_S = 5.0  # how long to wait for pipes to close after a SIGKILL before giving up on them


@dataclass(frozen=True)
class LocalLimits:
    """Per-command resource limits; ``from_env`` reads the ``AGENT_SANDBOX_*`` overrides."""

    timeout_s: float = 60.0  # wall time; a run's own timeout_s is capped at this
    memory_mb: int = 1024  # RLIMIT_AS, per process
    cpu_s: int = 60  # RLIMIT_CPU, per process
    output_bytes: int = 64 * 1024  # kept per stream (stdout, stderr)
    fsize_mb: int = 64  # RLIMIT_FSIZE: largest file a command may write
    nofile: int = 256  # RLIMIT_NOFILE
    tmpfs_mb: int = 64  # size of the in-memory /tmp and /dev/shm
    nproc: int = 256  # RLIMIT_NPROC: processes + threads of the sandbox at once
    drain_bytes: int = 64 * 1024 * 1024  # output read (and dropped) per stream before the command is killed

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LocalLimits:
        env = os.environ if env is None else env
        default = cls()

        def number(name: str, fallback: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return fallback
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number") from None
            if value <= 0:
                raise ValueError(f"{name}={raw!r} must be positive")
            return value

        return cls(
            timeout_s=number("AGENT_SANDBOX_TIMEOUT_S", default.timeout_s),
            memory_mb=int(number("AGENT_SANDBOX_MEMORY_MB", default.memory_mb)),
            cpu_s=int(number("AGENT_SANDBOX_CPU_S", default.cpu_s)),
            output_bytes=int(number("AGENT_SANDBOX_OUTPUT_BYTES", default.output_bytes)),
            fsize_mb=int(number("AGENT_SANDBOX_FSIZE_MB", default.fsize_mb)),
            nofile=int(number("AGENT_SANDBOX_NOFILE", default.nofile)),
            tmpfs_mb=int(number("AGENT_SANDBOX_TMPFS_MB", default.tmpfs_mb)),
            nproc=int(number("AGENT_SANDBOX_NPROC", default.nproc)),
        )


def uid_base_from_env(env: Mapping[str, str] | None = None) -> int:
    """``AGENT_SANDBOX_UID_BASE``: first host uid a root worker hands to sandboxes."""
    raw = (os.environ if env is None else env).get("AGENT_SANDBOX_UID_BASE", "").strip()
    if not raw:
        return DEFAULT_UID_BASE
    value = int(raw)
    if not 1000 <= value <= 4_000_000_000:
        raise ValueError(f"AGENT_SANDBOX_UID_BASE={raw!r} must be between 1000 and 4000000000")
    return value


def host_uid_for(sandbox_id: str, base: int) -> int:
    """The unprivileged host uid (= gid) a root worker runs ``sandbox_id``'s commands as."""
    digest = hashlib.sha256(sandbox_id.encode()).digest()
    return base + int.from_bytes(digest[:8], "big") % UID_SPAN


# --- the privileged bits of the forked child (root worker only) ---------------------

_CLONE_NEWNS = 0x00020000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_libc = ctypes.CDLL(None, use_errno=True)
_unshare = _libc.unshare
_unshare.argtypes = [ctypes.c_int]
_mount = _libc.mount
_mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _stage_dir() -> str:
    for candidate in STAGE_DIRS:
        if os.path.isdir(candidate) and not os.path.islink(candidate):
            return candidate
    raise SandboxUnavailable(f"none of {', '.join(STAGE_DIRS)} exists to stage the workspace on")


@dataclass(frozen=True)
class _Spawn:
    """How to start one bubblewrapped command: argv, the child's setup and the fds it inherits.

    ``info_fd`` is the read end of bwrap's ``--info-fd`` pipe (the parent keeps it):
    bwrap writes ``{"child-pid": N}`` there, N being the host pid of the pid
    namespace's init.
    """

    argv: list[str]
    preexec: Callable[[], None]
    pass_fds: tuple[int, ...]
    info_fd: int = -1

    def close(self) -> None:
        """Close the child's ends (after the spawn, or when it failed)."""
        for fd in self.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_all(self) -> None:
        self.close()
        if self.info_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.info_fd)


def _tasks_of(uid: int) -> int:
    """Processes + threads owned by ``uid`` right now (what RLIMIT_NPROC counts)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as fh:
                text = fh.read()
        except OSError:
            continue
        uid_line = re.search(rb"^Uid:\s+(\d+)", text, re.M)
        threads = re.search(rb"^Threads:\s+(\d+)", text, re.M)
        if uid_line and int(uid_line.group(1)) == uid:
            total += int(threads.group(1)) if threads else 1
    return total


def _child_setup(
    limits: LocalLimits, owner: tuple[int, int] | None, stage: tuple[str, str] | None
) -> Callable[[], None]:
    """``preexec_fn``: rlimits, then (root worker) stage the workspace and drop to the sandbox's uid."""
    memory = limits.memory_mb * 1024 * 1024
    fsize = limits.fsize_mb * 1024 * 1024
    # bwrap and its pid-1 reaper count too; as the worker's own uid, so does every task it already has
    nproc = limits.nproc + 2 + (_tasks_of(os.getuid()) if owner is None else 0)
    stage_src = stage[0].encode() if stage else b""
    stage_dst = stage[1].encode() if stage else b""

    def cap(which: int, soft: int, hard: int | None = None) -> None:
        # never above an existing hard limit (which a non-root worker could not raise)
        current = resource.getrlimit(which)[1]
        ceiling = hard if hard is not None else soft
        if current != resource.RLIM_INFINITY:
            soft, ceiling = min(soft, current), min(ceiling, current)
        resource.setrlimit(which, (soft, ceiling))

    def apply() -> None:
        cap(resource.RLIMIT_AS, memory)
        # soft limit sends SIGXCPU, the hard one a second later SIGKILL
        cap(resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1)
        cap(resource.RLIMIT_FSIZE, fsize)
        cap(resource.RLIMIT_NOFILE, limits.nofile)
        cap(resource.RLIMIT_CORE, 0)  # no core dumps into the workspace
        cap(resource.RLIMIT_NPROC, nproc)
        if stage:
            _check(_unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            _check(_mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
            _check(_mount(stage_src, stage_dst, None, _MS_BIND, None), "bind the workspace")
        if owner is not None:
            uid, gid = owner
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)

    return apply


def _host_root_links() -> list[str]:
    """``/lib``, ``/bin``... as the host has them: symlinks are recreated, real directories bound read-only."""
    args: list[str] = []
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _isolation_args(limits: LocalLimits) -> list[str]:
    """The namespace and filesystem flags shared by the probe and every command."""
    tmpfs_bytes = str(limits.tmpfs_mb * 1024 * 1024)
    return [
        "--unshare-all",
        "--unshare-user",  # --unshare-all only *tries* a user namespace; insist on it
        "--disable-userns",  # no nested user namespaces: less kernel attack surface
        "--die-with-parent",
        "--new-session",  # no controlling tty: blocks TIOCSTI injection into the worker's terminal
        "--cap-drop",
        "ALL",
        "--uid",
        str(INNER_UID),
        "--gid",
        str(INNER_UID),
        "--ro-bind",
        "/usr",
        "/usr",
        *_host_root_links(),
        "--ro-bind-try",
        "/etc/alternatives",
        "/etc/alternatives",
        "--ro-bind-try",
        "/etc/ld.so.cache",
        "/etc/ld.so.cache",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # sized tmpfs mounts so that /tmp and /dev/shm cannot eat the host's memory
        "--size",
        tmpfs_bytes,
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--size",
        tmpfs_bytes,
        "--tmpfs",
        "/tmp",
    ]


def _spawn(
    bwrap: str,
    limits: LocalLimits,
    workspace: Path,
    owner: tuple[int, int] | None,
    chdir: str,
    argv: list[str],
) -> _Spawn:
    """Everything needed to start ``argv`` in a sandbox over ``workspace`` (owned by ``owner`` when root)."""
    try:
        program = seccomp.host_program()
    except seccomp.UnsupportedArchitecture as exc:
        raise SandboxUnavailable(f"cannot build the sandbox's seccomp filter: {exc}") from None
    stage = (str(workspace), _stage_dir()) if owner is not None else None
    source = stage[1] if stage else str(workspace)
    seccomp_read, seccomp_write = os.pipe2(os.O_CLOEXEC)
    try:
        os.write(seccomp_write, program)  # < 1 KiB: never blocks on the pipe buffer
    finally:
        os.close(seccomp_write)
    info_read, info_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    os.set_blocking(info_write, True)
    cmd = [bwrap, *_isolation_args(limits), "--bind", source, WORKSPACE]
    cmd += ["--remount-ro", "/", "--chdir", chdir, "--clearenv"]
    for key, value in SANDBOX_ENV.items():
        cmd += ["--setenv", key, value]
    cmd += ["--info-fd", str(info_write), "--seccomp", str(seccomp_read), "--", *argv]
    return _Spawn(cmd, _child_setup(limits, owner, stage), (seccomp_read, info_write), info_read)


# --- bwrap discovery (cached per process) ---------------------------------------

_probe_lock = threading.Lock()
_probe_cache: dict[tuple[str, int], str] = {}  # (bwrap path, euid) -> "" when it works, else the failure text


def clear_probe_cache() -> None:
    """Forget probe results (tests; or after installing bubblewrap into a running worker)."""
    with _probe_lock:
        _probe_cache.clear()


def require_bwrap() -> str:
    """Path of a working ``bwrap``; raises :class:`SandboxUnavailable` otherwise (result cached per process)."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(f"{INSTALL_HINT} (no `bwrap` on PATH)")
    key = (path, os.geteuid())
    with _probe_lock:
        if key not in _probe_cache:
            _probe_cache[key] = _probe(path)
        failure = _probe_cache[key]
    if failure:
        raise SandboxUnavailable(f"{INSTALL_HINT} ({failure})")
    return path


def _probe(path: str) -> str:
    """Run ``true`` exactly as a command would run (same namespaces, seccomp, uid switch)."""
    owner = None
    if os.geteuid() == 0:
        probe_uid = uid_base_from_env()
        owner = (probe_uid, probe_uid)
    with tempfile.TemporaryDirectory(prefix="da-probe-") as tmp:
        workspace = Path(tmp)
        if owner is not None:
            os.chown(workspace, *owner)
        try:
            spawn = _spawn(path, LocalLimits(), workspace, owner, WORKSPACE, ["/usr/bin/true"])
        except SandboxUnavailable as exc:
            return str(exc)
        try:
            done = subprocess.run(
                spawn.argv,
                env={},
                capture_output=True,
                timeout=15,
                check=False,
                pass_fds=spawn.pass_fds,
                preexec_fn=spawn.preexec,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"probe `bwrap ... true` failed: {exc}"
        finally:
            spawn.close_all()
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()[:500]
        if owner is None:
            return f"probe `bwrap ... true` exited {done.returncode}: {detail}"
        return (
            f"probe `bwrap ... true` as unprivileged uid {owner[0]} exited {done.returncode}: {detail}; "
            "a root worker runs each sandbox as an unprivileged uid of its own (uid 0 escapes RLIMIT_NPROC), "
            "which needs unprivileged user namespaces: enable them, or run the worker as a non-root user"
        )
    return ""


# --- workspace paths --------------------------------------------------------------


def _relative(path: str, *, allow_root: bool = False) -> PurePosixPath:
    return workspace_relative(path, allow_root=allow_root)


def _inside(workspace: Path, rel: PurePosixPath, original: str) -> Path:
    """Resolve ``rel`` (following symlinks) and refuse anything that lands outside ``workspace``."""
    root = workspace.resolve()
    try:
        full = (root / rel).resolve()
    except (RuntimeError, OSError) as exc:  # 3.11 raises RuntimeError for symlink loops
        raise SandboxError(f"cannot resolve path {original!r}: {exc}") from None
    if not full.is_relative_to(root):
        raise SandboxError(f"path {original!r} escapes the workspace (via '..' or a symlink); access refused")
    return full


class _Capture:
    """Reads one pipe to EOF, keeping at most ``cap`` bytes; past ``drain`` bytes it fires ``flooded``."""

    def __init__(self, cap: int, drain: int, flooded: asyncio.Event) -> None:
        self.cap = cap
        self.drain = drain
        self.flooded = flooded
        self.data = bytearray()
        self.total = 0

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)

    async def pump(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while chunk := await stream.read(64 * 1024):
            self.total += len(chunk)
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if self.total > self.drain:
                self.flooded.set()

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", errors="replace")


def _killpg(proc: asyncio.subprocess.Process) -> None:
    # bwrap leads its own process group (start_new_session); killing it takes --die-with-parent
    # down with it, and the pid namespace's init dying kills everything inside.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class _Init:
    """The sandbox's pid-namespace init, found through bwrap's ``--info-fd``.

    The outer bwrap exits as soon as the init reports the command's exit status,
    *before* the init has finished tearing the namespace down; and when the outer
    bwrap is killed, the init is killed asynchronously (``--die-with-parent``), or,
    if bwrap was still setting up, not at all. The init only counts as exited once
    the kernel has killed and reaped everything else in its namespace
    (``zap_pid_ns_processes``), so ``gone()`` SIGKILLs it and waits on its pidfd:
    when ``run()`` returns, nothing the command started is alive.

    bwrap writes ``{"child-pid": N, "pid-namespace": INODE, ...}`` and closes the fd
    before the sandboxed command may run, so the command cannot forge it; the pidfd
    is only trusted once the process behind it is checked to live in that namespace.
    """

    def __init__(self, info_fd: int) -> None:
        self._fd = info_fd
        self._buffer = bytearray()
        self.pidfd: int | None = None
        loop = asyncio.get_running_loop()
        self._read = loop.create_future()
        loop.add_reader(info_fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if len(self._buffer) < 64 * 1024:
            self._buffer += chunk
        if not chunk:  # read to EOF: closing early would kill bwrap with SIGPIPE mid-write
            self.pidfd = _init_pidfd(bytes(self._buffer))
            self._stop()

    def _stop(self) -> None:
        if not self._read.done():
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._read.set_result(None)

    def kill(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    async def gone(self, timeout_s: float) -> None:
        """Kill the init (a no-op once the command has ended) and wait until the namespace is empty."""
        try:
            await asyncio.wait_for(asyncio.shield(self._read), timeout_s)
            if self.pidfd is not None:
                self.kill()
                await asyncio.wait_for(_exited(self.pidfd), timeout_s)
        except TimeoutError:
            log.warning("sandbox pid namespace still alive %.0f s after its command ended", timeout_s)
        finally:
            self._stop()
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None


def _init_pidfd(info: bytes) -> int | None:
    """A pidfd on the init named in bwrap's info, or None (gone already, or not what bwrap said)."""
    try:
        data = json.loads(info)
        pid, namespace = int(data["child-pid"]), int(data["pid-namespace"])
    except (ValueError, KeyError, TypeError):
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # already exited and reaped: nothing left to wait for
        return None
    try:  # the pidfd pins the process: check it is still bwrap's init, not a reused pid
        if os.stat(f"/proc/{pid}/ns/pid").st_ino == namespace:
            return pidfd
    except OSError:
        pass
    os.close(pidfd)
    return None


async def _exited(pidfd: int) -> None:
    """Resolves when the process behind ``pidfd`` has exited (the pidfd polls readable)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def ready() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, ready)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)


def _read_meta(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / META_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class LocalSandbox:
    """One sandbox: a host directory mounted at ``/workspace`` for each bubblewrapped command."""

    def __init__(self, backend: LocalSandboxBackend, sandbox_id: str, owner: tuple[int, int] | None = None) -> None:
        self.sandbox_id = sandbox_id
        self._backend = backend
        self.directory = backend.root / sandbox_id
        self.workspace = self.directory / "workspace"
        self.owner = owner  # host uid/gid the commands run as (root worker only)

    def _check_alive(self) -> None:
        if not self.workspace.is_dir():
            raise SandboxMissing(f"sandbox {self.sandbox_id!r} does not exist (it was killed or never created)")

    async def run(
        self, argv: list[str], *, stdin: bytes = b"", timeout_s: float = 30.0, cwd: str = ""
    ) -> CommandResult:
        """Run ``argv`` inside the sandbox; the wall time is ``min(timeout_s, limits.timeout_s)``."""
        if not argv:
            raise SandboxError("empty command")
        if timeout_s <= 0:
            raise SandboxError(f"timeout_s must be positive, got {timeout_s}")
        bwrap = await asyncio.to_thread(require_bwrap)
        self._check_alive()
        chdir = WORKSPACE
        if cwd:
            target = _inside(self.workspace, _relative(cwd, allow_root=True), cwd)
            if not target.is_dir():
                raise SandboxError(f"cwd {cwd!r} is not a directory in the workspace")
            chdir = str(PurePosixPath(WORKSPACE) / target.relative_to(self.workspace.resolve()))
        limits = self._backend.limits
        spawn = await asyncio.to_thread(_spawn, bwrap, limits, self.workspace.resolve(), self.owner, chdir, argv)
        return await self._execute(spawn, stdin, min(timeout_s, limits.timeout_s))

    async def _execute(self, spawn: _Spawn, stdin: bytes, timeout_s: float) -> CommandResult:
        limits = self._backend.limits
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *spawn.argv,
                stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                # bwrap's own environ stays readable at /proc/1/environ inside: give it nothing of ours
                env=dict(SANDBOX_ENV),
                start_new_session=True,
                pass_fds=spawn.pass_fds,
                preexec_fn=spawn.preexec,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            spawn.close_all()
            raise SandboxUnavailable(f"could not start the sandbox: {exc}") from None
        spawn.close()
        init = _Init(spawn.info_fd)
        running = self._backend.running.setdefault(self.sandbox_id, set())
        running.add(proc)
        flooded = asyncio.Event()
        out = _Capture(limits.output_bytes, limits.drain_bytes, flooded)
        err = _Capture(limits.output_bytes, limits.drain_bytes, flooded)
        tasks = {
            asyncio.ensure_future(out.pump(proc.stdout)),
            asyncio.ensure_future(err.pump(proc.stderr)),
            asyncio.ensure_future(proc.wait()),
        }
        if stdin:
            tasks.add(asyncio.ensure_future(_feed(proc, stdin)))
        watch = asyncio.ensure_future(flooded.wait())
        timed_out = flooding = False
        deadline = started + timeout_s
        try:
            pending = set(tasks)
            while pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                done, _ = await asyncio.wait(pending | {watch}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if watch in done:
                    flooding = True
                    break
                pending -= done
            if pending:
                init.kill()
                _killpg(proc)
                _, pending = await asyncio.wait(pending, timeout=_KILL_GRACE_S)
                for task in pending:
                    task.cancel()
        finally:
            watch.cancel()
            if proc.returncode is None:  # cancelled (activity cancellation) or the grace ran out
                init.kill()
                _killpg(proc)
                for task in tasks:
                    task.cancel()
                await asyncio.shield(proc.wait())
            await asyncio.shield(init.gone(_KILL_GRACE_S))
            running.discard(proc)
            if not running and self._backend.running.get(self.sandbox_id) is running:
                del self._backend.running[self.sandbox_id]
        killed = timed_out or flooding
        exit_code = -signal.SIGKILL if killed else (proc.returncode if proc.returncode is not None else -1)
        note = self._limit_note(exit_code)
        if flooding:
            note += f"\n[sandbox] killed: printed more than {limits.drain_bytes} bytes of output"
        return CommandResult(
            exit_code=exit_code,
            stdout=out.text(),
            stderr=err.text() + note,
            timed_out=timed_out,
            truncated=out.truncated or err.truncated,
            duration_ms=int((time.monotonic() - started) * 1000),
        )

    def _limit_note(self, exit_code: int) -> str:
        """Say which rlimit killed the command (bwrap reports a signalled command as 128 + signal)."""
        limits = self._backend.limits
        if exit_code == 128 + signal.SIGXCPU:
            return f"\n[sandbox] killed: CPU time limit of {limits.cpu_s} s exceeded"
        if exit_code == 128 + signal.SIGXFSZ:
            return f"\n[sandbox] killed: file size limit of {limits.fsize_mb} MiB exceeded"
        return ""

    async def write_file(self, path: str, content: bytes) -> None:
        """Write ``content`` at ``path`` (workspace-relative), creating parent directories."""
        limit = self._backend.limits.fsize_mb * 1024 * 1024
        if len(content) > limit:
            raise SandboxError(f"{len(content)} bytes is over the sandbox's {limit}-byte file size limit")
        self._check_alive()
        await asyncio.to_thread(self._write_sync, path, content)

    def _makedirs(self, directory: Path) -> None:
        """``mkdir -p`` inside the workspace; new directories belong to the sandbox's uid."""
        root = self.workspace.resolve()
        current = root
        for part in directory.relative_to(root).parts:
            current = current / part
            try:
                os.mkdir(current, 0o755)
            except FileExistsError:
                continue
            if self.owner is not None:
                os.chown(current, *self.owner, follow_symlinks=False)

    def _write_sync(self, path: str, content: bytes) -> None:
        target = _inside(self.workspace, _relative(path), path)
        try:
            self._makedirs(target.parent)
        except OSError as exc:
            raise SandboxError(f"cannot create the directories for {path!r}: {exc.strerror}") from None
        # re-check after mkdir, and O_NOFOLLOW so a symlink swapped in after the check is not followed
        target = _inside(self.workspace, _relative(path), path)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except IsADirectoryError:
            raise SandboxError(f"{path!r} is a directory") from None
        except OSError as exc:
            raise SandboxError(f"cannot write {path!r}: {exc.strerror}") from None
        with os.fdopen(fd, "wb") as fh:
            if self.owner is not None:
                os.fchown(fh.fileno(), *self.owner)
            fh.write(content)

    async def read_file(self, path: str) -> bytes:
        """Bytes of ``path`` (workspace-relative); files over 1 MiB are refused."""
        self._check_alive()
        return await asyncio.to_thread(self._read_sync, path)

    def _read_sync(self, path: str) -> bytes:
        target = _inside(self.workspace, _relative(path), path)
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise SandboxError(f"no such file: {path!r}") from None
        except OSError as exc:
            raise SandboxError(f"cannot read {path!r}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise SandboxError(f"{path!r} is not a regular file")
            if info.st_size > MAX_READ_BYTES:
                raise SandboxError(
                    f"{path!r} is {info.st_size} bytes; read_file returns at most {MAX_READ_BYTES} bytes (1 MiB). "
                    "Read a part of it with a command instead (e.g. head -c)."
                )
            data = fh.read(MAX_READ_BYTES + 1)
        if len(data) > MAX_READ_BYTES:  # grew while we read it
            raise SandboxError(f"{path!r} is over {MAX_READ_BYTES} bytes (1 MiB); read_file refuses it")
        return data

    async def kill(self) -> None:
        """Kill running commands and delete the workspace and its metadata (idempotent)."""
        await self._backend.kill(self.sandbox_id)


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    if proc.stdin is None:
        return
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command exited without reading all its input


def _remove_tree(path: Path) -> None:
    def retry(
        func: Callable[..., object], target: str, info: tuple[type[BaseException], BaseException, object]
    ) -> None:
        exc = info[1]
        if isinstance(exc, FileNotFoundError):
            return
        if not isinstance(exc, PermissionError):
            raise exc
        # a sandboxed command may have chmod'ed a directory to 000: make it usable again and retry
        os.chmod(os.path.dirname(target), 0o700)
        if os.path.isdir(target) and not os.path.islink(target):
            os.chmod(target, 0o700)
            shutil.rmtree(target, onerror=retry)
        else:
            func(target)

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=retry)


class LocalSandboxBackend:
    """Sandboxes under ``root/<sandbox_id>/`` (``workspace/`` plus ``meta.json``), each command bubblewrapped."""

    name = "local"

    def __init__(self, root: Path, limits: LocalLimits | None = None, *, uid_base: int | None = None) -> None:
        self.root = Path(root).absolute()
        self.limits = limits or LocalLimits()
        self.running: dict[str, set[asyncio.subprocess.Process]] = {}
        self.uid_base = uid_base_from_env() if uid_base is None else uid_base

    def _validate(self, sandbox_id: str) -> None:
        if not SANDBOX_ID_RE.match(sandbox_id) or sandbox_id in (".", ".."):
            raise SandboxError(f"invalid sandbox id {sandbox_id!r}: use 1-80 characters of A-Z a-z 0-9 _ . -")

    def _owner(self, sandbox_id: str, meta: Mapping[str, Any]) -> tuple[int, int] | None:
        """The host uid/gid commands run as: ``None`` (the worker's own) unless the worker is root."""
        if os.geteuid() != 0:
            return None
        uid, gid = meta.get("uid"), meta.get("gid")
        if isinstance(uid, int) and isinstance(gid, int) and uid > 0 and gid > 0:
            return uid, gid
        derived = host_uid_for(sandbox_id, self.uid_base)
        return derived, derived

    async def create(self, sandbox_id: str, *, metadata: dict[str, str] | None = None) -> LocalSandbox:
        """Create the workspace and ``meta.json`` (or reuse existing ones); fails closed when bwrap is unusable."""
        self._validate(sandbox_id)
        await asyncio.to_thread(require_bwrap)
        return await asyncio.to_thread(self._create_sync, sandbox_id, dict(metadata or {}))

    def _create_sync(self, sandbox_id: str, metadata: dict[str, str]) -> LocalSandbox:
        directory = self.root / sandbox_id
        meta = _read_meta(directory)
        owner = self._owner(sandbox_id, meta)
        sandbox = LocalSandbox(self, sandbox_id, owner)
        sandbox.workspace.mkdir(parents=True, exist_ok=True)
        if owner is not None:
            os.chown(sandbox.workspace, *owner, follow_symlinks=False)
        if not meta:
            record = {
                "sandbox_id": sandbox_id,
                "metadata": metadata,
                "created_at": time.time(),
                "uid": owner[0] if owner else os.getuid(),
                "gid": owner[1] if owner else os.getgid(),
            }
            tmp = directory / f".{META_FILE}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_text(json.dumps(record, sort_keys=True))
            os.replace(tmp, directory / META_FILE)
        return sandbox

    async def connect(self, sandbox_id: str) -> LocalSandbox:
        """Attach to an existing sandbox; :class:`SandboxMissing` when its workspace does not exist."""
        self._validate(sandbox_id)
        meta = await asyncio.to_thread(_read_meta, self.root / sandbox_id)
        sandbox = LocalSandbox(self, sandbox_id, self._owner(sandbox_id, meta))
        sandbox._check_alive()
        return sandbox

    async def connect_or_recreate(self, sandbox_id: str, *, metadata: dict[str, str] | None = None) -> Connection:
        """``connect``; a missing workspace (killed, or another host's) is created again, once."""
        try:
            return Connection(await self.connect(sandbox_id))
        except SandboxMissing:
            pass
        sandbox = await self.create(sandbox_id, metadata=metadata)
        sandbox._check_alive()
        return Connection(sandbox, recreated=True)

    async def kill(self, sandbox_id: str) -> bool:
        """Kill the sandbox's running commands and delete its directory; ``True`` if it existed."""
        self._validate(sandbox_id)
        for proc in list(self.running.pop(sandbox_id, ())):
            _killpg(proc)
        directory = self.root / sandbox_id
        existed = directory.is_dir()
        await asyncio.to_thread(_remove_tree, directory)
        return existed

    async def list_sandboxes(self) -> list[SandboxRecord]:
        """One record per directory under the root (``meta.json`` supplies the run id)."""
        return await asyncio.to_thread(self._list_sync)

    def _list_sync(self) -> list[SandboxRecord]:
        records: list[SandboxRecord] = []
        try:
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            return records
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False) or not SANDBOX_ID_RE.match(entry.name):
                continue
            meta = _read_meta(Path(entry.path))
            raw = meta.get("metadata")
            metadata = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
            created = meta.get("created_at")
            records.append(
                SandboxRecord(
                    sandbox_id=entry.name,
                    run_id=metadata.get(META_RUN, ""),
                    tenant=metadata.get(META_TENANT, ""),
                    ref=entry.path,
                    created_at=float(created) if isinstance(created, int | float) else None,
                    metadata=metadata,
                )
            )
        return records


__all__ = [
    "INSTALL_HINT",
    "LocalLimits",
    "LocalSandbox",
    "LocalSandboxBackend",
    "clear_probe_cache",
    "require_bwrap",
]
