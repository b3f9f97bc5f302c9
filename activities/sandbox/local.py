"""The local sandbox backend: bubblewrap namespaces plus rlimits around one workspace directory per sandbox.

Every command runs through ``bwrap`` with fresh user/pid/net/ipc/uts/cgroup
namespaces (network: loopback only), no capabilities, a read-only ``/usr``, an
empty environment and only ``/workspace`` writable and persistent. When ``bwrap``
is missing or cannot create namespaces, :class:`SandboxUnavailable` is raised:
this backend never runs anything unsandboxed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from activities.sandbox.base import CommandResult, SandboxError, SandboxUnavailable

SANDBOX_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")
MAX_READ_BYTES = 1024 * 1024
WORKSPACE = "/workspace"
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
_KILL_GRACE_S = 5.0  # how long to wait for pipes to close after a SIGKILL before giving up on them


@dataclass(frozen=True)
class LocalLimits:
    """Per-command resource limits; ``from_env`` reads the ``AGENT_SANDBOX_*`` overrides."""

    timeout_s: float = 60.0  # wall time; a run's own timeout_s is capped at this
    memory_mb: int = 1024  # RLIMIT_AS
    cpu_s: int = 60  # RLIMIT_CPU
    output_bytes: int = 64 * 1024  # kept per stream (stdout, stderr)
    fsize_mb: int = 64  # RLIMIT_FSIZE: largest file a command may write
    nofile: int = 256  # RLIMIT_NOFILE
    tmpfs_mb: int = 64  # size of the in-memory /tmp and /dev/shm

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
        )


# --- bwrap discovery (cached per process) ---------------------------------------

_probe_lock = threading.Lock()
_probe_cache: dict[str, str] = {}  # bwrap path -> "" when it works, else the failure text


def clear_probe_cache() -> None:
    """Forget probe results (tests; or after installing bubblewrap into a running worker)."""
    with _probe_lock:
        _probe_cache.clear()


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


def require_bwrap() -> str:
    """Path of a working ``bwrap``; raises :class:`SandboxUnavailable` otherwise (result cached per process)."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(f"{INSTALL_HINT} (no `bwrap` on PATH)")
    with _probe_lock:
        if path not in _probe_cache:
            _probe_cache[path] = _probe(path)
        failure = _probe_cache[path]
    if failure:
        raise SandboxUnavailable(f"{INSTALL_HINT} ({failure})")
    return path


def _probe(path: str) -> str:
    argv = [path, *_isolation_args(LocalLimits()), "--remount-ro", "/", "--clearenv", "--", "/usr/bin/true"]
    try:
        done = subprocess.run(argv, env={}, capture_output=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"probe `bwrap ... true` failed: {exc}"
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()[:500]
        return f"probe `bwrap ... true` exited {done.returncode}: {detail}"
    return ""


# --- workspace paths --------------------------------------------------------------


def _relative(path: str, *, allow_root: bool = False) -> PurePosixPath:
    """A workspace-relative path from the model's ``path`` (``/workspace/x`` is accepted as ``x``)."""
    if not path or "\x00" in path:
        raise SandboxError(f"invalid path {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        try:
            pure = pure.relative_to(WORKSPACE)
        except ValueError:
            raise SandboxError(f"path {path!r} is outside the workspace; use a path relative to {WORKSPACE}") from None
    if pure == PurePosixPath(".") and not allow_root:
        raise SandboxError(f"path {path!r} names the workspace itself, not a file")
    return pure


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


def _limit_child(limits: LocalLimits) -> Callable[[], None]:
    """``preexec_fn``: rlimits set in the forked child before ``bwrap`` is exec'd (inherited by the command)."""
    memory = limits.memory_mb * 1024 * 1024
    fsize = limits.fsize_mb * 1024 * 1024

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        # soft limit sends SIGXCPU, the hard one a second later SIGKILL
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core dumps into the workspace

    return apply


class _Capture:
    """Reads one pipe to EOF, keeping at most ``cap`` bytes (the rest is drained and counted)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
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

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", errors="replace")


def _killpg(proc: asyncio.subprocess.Process) -> None:
    # bwrap leads its own process group (start_new_session); killing it takes --die-with-parent
    # down with it, and the pid namespace's init dying kills everything inside.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class LocalSandbox:
    """One sandbox: a host directory mounted at ``/workspace`` for each bubblewrapped command."""

    def __init__(self, backend: LocalSandboxBackend, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self._backend = backend
        self.workspace = backend.root / sandbox_id / "workspace"

    def _check_alive(self) -> None:
        if not self.workspace.is_dir():
            raise SandboxError(f"sandbox {self.sandbox_id!r} does not exist (it was killed or never created)")

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
        cmd = [bwrap, *_isolation_args(limits), "--bind", str(self.workspace.resolve()), WORKSPACE]
        cmd += ["--remount-ro", "/", "--chdir", chdir, "--clearenv"]
        for key, value in SANDBOX_ENV.items():
            cmd += ["--setenv", key, value]
        cmd += ["--", *argv]
        return await self._execute(cmd, stdin, min(timeout_s, limits.timeout_s))

    async def _execute(self, cmd: list[str], stdin: bytes, timeout_s: float) -> CommandResult:
        limits = self._backend.limits
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # bwrap's own environ stays readable at /proc/1/environ inside: give it nothing of ours
            env=dict(SANDBOX_ENV),
            start_new_session=True,
            preexec_fn=_limit_child(limits),
        )
        running = self._backend.running.setdefault(self.sandbox_id, set())
        running.add(proc)
        out, err = _Capture(limits.output_bytes), _Capture(limits.output_bytes)
        tasks = [
            asyncio.ensure_future(out.pump(proc.stdout)),
            asyncio.ensure_future(err.pump(proc.stderr)),
            asyncio.ensure_future(proc.wait()),
        ]
        if stdin:
            tasks.append(asyncio.ensure_future(_feed(proc, stdin)))
        timed_out = False
        try:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            if pending:
                timed_out = True
                _killpg(proc)
                _, pending = await asyncio.wait(pending, timeout=_KILL_GRACE_S)
                for task in pending:
                    task.cancel()
        finally:
            if proc.returncode is None:  # cancelled (activity cancellation) or the grace ran out
                _killpg(proc)
                for task in tasks:
                    task.cancel()
                await asyncio.shield(proc.wait())
            running.discard(proc)
            if not running and self._backend.running.get(self.sandbox_id) is running:
                del self._backend.running[self.sandbox_id]
        exit_code = -signal.SIGKILL if timed_out else (proc.returncode if proc.returncode is not None else -1)
        return CommandResult(
            exit_code=exit_code,
            stdout=out.text(),
            stderr=err.text() + self._limit_note(exit_code),
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

    def _write_sync(self, path: str, content: bytes) -> None:
        target = _inside(self.workspace, _relative(path), path)
        target.parent.mkdir(parents=True, exist_ok=True)
        # re-check after mkdir, and O_NOFOLLOW so a symlink swapped in after the check is not followed
        target = _inside(self.workspace, _relative(path), path)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except IsADirectoryError:
            raise SandboxError(f"{path!r} is a directory") from None
        except OSError as exc:
            raise SandboxError(f"cannot write {path!r}: {exc.strerror}") from None
        with os.fdopen(fd, "wb") as fh:
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
        """Kill running commands and delete the workspace (idempotent)."""
        for proc in list(self._backend.running.pop(self.sandbox_id, ())):
            _killpg(proc)
        await asyncio.to_thread(_remove_tree, self._backend.root / self.sandbox_id)


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
    """Sandboxes under ``root/<sandbox_id>/workspace``, each command isolated with bubblewrap."""

    name = "local"

    def __init__(self, root: Path, limits: LocalLimits | None = None) -> None:
        self.root = Path(root).absolute()
        self.limits = limits or LocalLimits()
        self.running: dict[str, set[asyncio.subprocess.Process]] = {}

    def _validate(self, sandbox_id: str) -> None:
        if not SANDBOX_ID_RE.match(sandbox_id) or sandbox_id in (".", ".."):
            raise SandboxError(f"invalid sandbox id {sandbox_id!r}: use 1-80 characters of A-Z a-z 0-9 _ . -")

    async def create(self, sandbox_id: str, *, metadata: dict[str, str] | None = None) -> LocalSandbox:
        """Create the workspace (or reuse an existing one); fails closed when bubblewrap is unusable."""
        self._validate(sandbox_id)
        await asyncio.to_thread(require_bwrap)
        sandbox = LocalSandbox(self, sandbox_id)
        await asyncio.to_thread(sandbox.workspace.mkdir, parents=True, exist_ok=True)
        return sandbox

    async def connect(self, sandbox_id: str) -> LocalSandbox:
        """Attach to an existing sandbox; SandboxError when its workspace does not exist."""
        self._validate(sandbox_id)
        sandbox = LocalSandbox(self, sandbox_id)
        sandbox._check_alive()
        return sandbox
