"""Building one bubblewrapped command: the ``bwrap`` argv, the forked child's setup, and the probe.

:func:`build_spawn` gives everything needed to start a command: ``bwrap`` with fresh
user/pid/net/ipc/uts/cgroup/mount namespaces, no capabilities, no nested user
namespaces, the seccomp filter (:mod:`activities.sandbox.local.seccomp`), a read-only
``/usr``, an empty environment, private sized ``/tmp`` and ``/dev/shm``, and only
``/workspace`` writable; plus the ``preexec_fn`` that sets the rlimits.
:func:`require_bwrap` probes, once per process, that exactly this works here.

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

Inside, the command always sees uid/gid 1000.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import resource
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from activities.sandbox.base import WORKSPACE, SandboxUnavailable
from activities.sandbox.local import seccomp
from activities.sandbox.local.limits import DEFAULT_UID_BASE, LocalLimits

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
# Where a root worker's forked child bind-mounts the workspace (in its private mount namespace) so
# that the unprivileged bwrap can reach it; the first of these that exists is used.
STAGE_DIRS = ("/mnt", "/media", "/srv", "/opt")


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
class Spawn:
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


def bound_host_paths() -> list[str]:
    """The host paths every command sees (read-only): what must never hold a secret of the worker's."""
    args = ["--ro-bind", "/usr", "/usr", *_host_root_links(), "--ro-bind-try", "/etc/alternatives", "/etc/alternatives"]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return [args[i + 1] for i, arg in enumerate(args) if arg in ("--ro-bind", "--ro-bind-try")]


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


def build_spawn(
    bwrap: str,
    limits: LocalLimits,
    workspace: Path,
    owner: tuple[int, int] | None,
    chdir: str,
    argv: list[str],
) -> Spawn:
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
    return Spawn(cmd, _child_setup(limits, owner, stage), (seccomp_read, info_write), info_read)


# --- bwrap discovery (cached per process) ---------------------------------------

_probe_lock = threading.Lock()
_probe_cache: dict[tuple[str, int], str] = {}  # (bwrap path, euid) -> "" when it works, else the failure text


def clear_probe_cache() -> None:
    """Forget probe results (tests; or after installing bubblewrap into a running worker)."""
    with _probe_lock:
        _probe_cache.clear()


def require_bwrap(uid_base: int = DEFAULT_UID_BASE) -> str:
    """Path of a working ``bwrap``; raises :class:`SandboxUnavailable` otherwise (result cached per process).

    A root worker probes as ``uid_base``, the first of the unprivileged uids its sandboxes run as.
    """
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(f"{INSTALL_HINT} (no `bwrap` on PATH)")
    key = (path, os.geteuid())
    with _probe_lock:
        if key not in _probe_cache:
            _probe_cache[key] = _probe(path, uid_base)
        failure = _probe_cache[key]
    if failure:
        raise SandboxUnavailable(f"{INSTALL_HINT} ({failure})")
    return path


def _probe(path: str, uid_base: int) -> str:
    """Run ``true`` exactly as a command would run (same namespaces, seccomp, uid switch)."""
    owner = None
    if os.geteuid() == 0:
        owner = (uid_base, uid_base)
    with tempfile.TemporaryDirectory(prefix="da-probe-") as tmp:
        workspace = Path(tmp)
        if owner is not None:
            os.chown(workspace, *owner)
        try:
            spawn = build_spawn(path, LocalLimits(), workspace, owner, WORKSPACE, ["/usr/bin/true"])
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


__all__ = ["INNER_UID", "INSTALL_HINT", "SANDBOX_ENV", "Spawn", "build_spawn", "clear_probe_cache", "require_bwrap"]
