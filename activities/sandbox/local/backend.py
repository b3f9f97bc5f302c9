"""The local sandbox backend: bubblewrap namespaces, seccomp and rlimits around one workspace per sandbox.

Every command runs in its own ``bwrap`` with fresh user/pid/net/ipc/uts/cgroup/mount
namespaces (network: loopback only, and nothing listens on it), no capabilities,
no nested user namespaces, a seccomp filter (:mod:`activities.sandbox.local.seccomp`),
a read-only ``/usr``, an empty environment, private ``/tmp`` and only
``/workspace`` writable and persistent. The command's pid namespace dies with it:
nothing it started survives ``run()``.

A root worker runs each sandbox's commands as an unprivileged host uid of its own
(``AGENT_SANDBOX_UID_BASE`` + a hash of the sandbox id, recorded in ``meta.json``),
which owns the workspace; any other worker runs them as its own uid. Inside, the
command always sees uid/gid 1000. When ``bwrap`` is missing or cannot create the
namespaces, :class:`SandboxUnavailable` is raised: this backend never runs anything
unsandboxed.

The workspace is held to ``AGENT_SANDBOX_DISK_MB`` (:mod:`activities.sandbox.local.quota`):
a root worker that can loop-mount gives each sandbox an ext4 image of that size
(``backend.quota_mechanism == "loop"``); otherwise the workspace is measured while
and after each command and before each ``write_file`` (``"measured"``).

The worker's own access to a workspace (``write_file``, ``read_file``, ``cwd``,
``meta.json``, creation, removal, measuring) never blocks on what the sandboxed
code left there, never follows a link it planted, runs on the backend's own
bounded thread pools and has a deadline (:mod:`activities.sandbox.local.hostfs`).

Known limit, ``/proc/self/mountinfo``: inside the sandbox it lists every mount of
the command's namespace. With the ``loop`` quota the workspace shows as ``/`` of
``/dev/loopN`` (no host path). With the ``measured`` quota the workspace is a bind
mount of a host directory, and a bind mount's line always carries the directory's
path inside its host filesystem (e.g. ``/var/lib/agent/sandboxes/<id>/workspace``):
without the right to mount a filesystem of its own the worker cannot hide it. In both
modes the ``uid=`` option of bubblewrap's own tmpfs mounts (``/``, ``/dev``, ``/tmp``)
shows the sandbox's host uid (the kernel prints a tmpfs owner as the initial user
namespace sees it, and unprivileged bubblewrap always builds its root on a tmpfs). Neither
is a secret that grants anything: the path is not reachable from inside, and the uid
is the sandbox's own unprivileged one.

This module keeps the sandboxes (workspaces, ``meta.json``, file access); the rest lives in:

* :mod:`activities.sandbox.local.limits`: :class:`LocalLimits` and the uid settings;
* :mod:`activities.sandbox.local.bwrap`: the ``bwrap`` command line, the child's rlimits
  and uid switch (why a root worker does not run commands as root), the probe;
* :mod:`activities.sandbox.local.processes`: running a command to its end (output caps,
  timeout, emptying its pid namespace);
* :mod:`activities.sandbox.local.hostfs`: non-blocking, no-follow host-side file access;
* :mod:`activities.sandbox.local.checkpoints`: scanning, reading and rewriting the
  workspace for checkpoints (the ``Checkpointable`` methods here are thin wrappers), and
  the checkpoint marker next to ``meta.json``;
* :mod:`activities.sandbox.local.quota`: the workspace quota.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import json
import logging
import os
import secrets
import signal
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from activities.sandbox.base import (
    MAX_READ_BYTES,
    META_RUN,
    META_TENANT,
    SANDBOX_ID_RE,
    WORKSPACE,
    CommandResult,
    Connection,
    SandboxError,
    SandboxMissing,
    SandboxRecord,
    SandboxUnavailable,
    validate_command,
    validate_sandbox_id,
    workspace_relative,
)
from activities.sandbox.checkpointable import CheckpointMarker, ManifestEntry, ScanEntry
from activities.sandbox.local import checkpoints as local_checkpoints
from activities.sandbox.local import quota
from activities.sandbox.local.bwrap import INSTALL_HINT, Spawn, build_spawn, clear_probe_cache, require_bwrap
from activities.sandbox.local.hostfs import (
    CREATE_FLAGS,
    FLATTEN_DEPTH,
    HostExecutor,
    TooLarge,
    Usage,
    locked,
    measure_tree,
    open_dir,
    read_at,
    read_small,
    remove_tree,
    walk,
    write_at,
)
from activities.sandbox.local.limits import DEFAULT_UID_BASE, LocalLimits, host_uid_for
from activities.sandbox.local.processes import execute, killpg

log = logging.getLogger(__name__)
T = TypeVar("T")

META_FILE = "meta.json"
WORKSPACE_DIR = "workspace"

HOST_TIMEOUT_S = 10.0  # one host-side file operation, listing, or preparing a command
CREATE_TIMEOUT_S = 45.0  # the bwrap probe (up to 15 s), mkfs and mount
REMOVE_TIMEOUT_S = 60.0  # kill: unmount, then remove the tree
LOCK_TIMEOUT_S = 8.0  # waiting for another thread or worker creating/removing the same sandbox
IO_THREADS = 8  # quick host work: file access, listing, preparing commands
BULK_THREADS = 4  # slow host work: probes, mkfs/mount, measuring, removing trees

_remove_tree = remove_tree  # the name the removal tests use


# --- workspace paths --------------------------------------------------------------


def _relative(path: str, *, allow_root: bool = False) -> PurePosixPath:
    return workspace_relative(path, allow_root=allow_root)


def _inside(workspace: Path, rel: PurePosixPath, original: str) -> Path:
    """Resolve ``rel`` (following symlinks) and refuse anything that lands outside ``workspace``.

    Only ``lstat``/``readlink`` are used (``realpath``): nothing is opened, so a FIFO
    on the way cannot block. The result is then opened component by component with
    ``O_NOFOLLOW`` (:func:`hostfs.walk`), so a symlink swapped in afterwards is refused.
    """
    root = workspace.resolve()
    try:
        full = (root / rel).resolve()
    except (RuntimeError, OSError) as exc:  # 3.11 raises RuntimeError for symlink loops
        raise SandboxError(f"cannot resolve path {original!r}: {exc}") from None
    if not full.is_relative_to(root):
        raise SandboxError(f"path {original!r} escapes the workspace (via '..' or a symlink); access refused")
    return full


def _read_meta(directory: Path) -> dict[str, Any]:
    raw = read_small(directory / META_FILE)
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _same_directory(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the directory at ``path`` (not removed, nor replaced, meanwhile)."""
    try:
        here, there = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _write_error(path: str, exc: OSError, disk_mb: int) -> SandboxError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SandboxError(
            f"cannot write {path!r}: the workspace is full (its quota is {disk_mb} MiB, {quota.QUOTA_VARIABLE}); "
            "delete files first"
        )
    if exc.errno == errno.EISDIR:
        return SandboxError(f"{path!r} is a directory")
    return SandboxError(f"cannot write {path!r}: {exc.strerror}")


class LocalSandbox:
    """One sandbox: a workspace (loop-mounted image or plain directory) mounted at ``/workspace`` for each command."""

    def __init__(
        self,
        backend: LocalSandboxBackend,
        sandbox_id: str,
        owner: tuple[int, int] | None = None,
        quota_mechanism: str = quota.MEASURED,
    ) -> None:
        self.sandbox_id = sandbox_id
        self._backend = backend
        self.directory = backend.root / sandbox_id
        self.workspace = self.directory / WORKSPACE_DIR
        self.owner = owner  # host uid/gid the commands run as (root worker only)
        self.quota_mechanism = quota_mechanism  # how this sandbox's workspace is held to the quota

    # --- checks and paths (run on the backend's pools) ---

    def _alive_sync(self) -> None:
        if self.quota_mechanism == quota.LOOP:
            if quota.is_mounted(self.workspace):
                return
            if os.path.lexists(self.directory / quota.IMAGE):
                raise SandboxError(f"the workspace of sandbox {self.sandbox_id!r} is not mounted; try again")
        else:
            try:
                if stat.S_ISDIR(os.lstat(self.workspace).st_mode):
                    return
            except OSError:
                pass
        raise SandboxMissing(f"sandbox {self.sandbox_id!r} does not exist (it was killed or never created)")

    def _parts(self, path: str, *, allow_root: bool = False) -> tuple[str, ...]:
        target = _inside(self.workspace, _relative(path, allow_root=allow_root), path)
        parts = target.relative_to(self.workspace.resolve()).parts
        if not parts and not allow_root:
            raise SandboxError(f"path {path!r} names the workspace itself, not a file")
        return parts

    # --- commands ---

    async def run(
        self, argv: list[str], *, stdin: bytes = b"", timeout_s: float = 30.0, cwd: str = ""
    ) -> CommandResult:
        """Run ``argv`` inside the sandbox; the wall time is ``min(timeout_s, limits.timeout_s)``."""
        validate_command(argv, timeout_s)
        backend = self._backend
        bwrap = await backend.bulk.run(
            "checking bubblewrap", CREATE_TIMEOUT_S, functools.partial(require_bwrap, backend.uid_base)
        )
        limits = backend.limits
        if self.quota_mechanism == quota.MEASURED:
            usage = await self._usage()
            if usage is not None:  # one file may take at most what is left of the quota
                limits = dataclasses.replace(
                    limits, fsize_mb=min(limits.fsize_mb, quota.left_mb(usage, limits.disk_mb))
                )
        spawn = await backend.io.run(
            "preparing the command", HOST_TIMEOUT_S, functools.partial(self._prepare_sync, bwrap, cwd, argv, limits)
        )
        result = await execute(
            spawn,
            stdin=stdin,
            timeout_s=min(timeout_s, limits.timeout_s),
            limits=limits,
            running=backend.running,
            sandbox_id=self.sandbox_id,
            monitor=self._over_quota if self.quota_mechanism == quota.MEASURED else None,
            monitor_min_s=quota.MONITOR_MIN_S,
        )
        return await self._after_command(result, limits)

    def _prepare_sync(self, bwrap: str, cwd: str, argv: list[str], limits: LocalLimits) -> Spawn:
        self._alive_sync()
        chdir = WORKSPACE
        if cwd:
            parts = self._parts(cwd, allow_root=True)
            root_fd = open_dir(self.workspace)
            try:
                os.close(walk(root_fd, parts, cwd))
            except FileNotFoundError:
                raise SandboxError(f"cwd {cwd!r} is not a directory in the workspace") from None
            finally:
                os.close(root_fd)
            chdir = str(PurePosixPath(WORKSPACE, *parts))
        return build_spawn(bwrap, limits, self.workspace.resolve(), self.owner, chdir, argv)

    async def _after_command(self, result: CommandResult, limits: LocalLimits) -> CommandResult:
        """Say when the command filled the workspace (loop) or left it over the quota (measured: it fails)."""
        disk_mb = limits.disk_mb
        if self.quota_mechanism == quota.LOOP:
            try:
                note = await self._backend.io.run(
                    "checking the workspace",
                    HOST_TIMEOUT_S,
                    functools.partial(quota.full_note, self.workspace, disk_mb),
                )
            except SandboxError:  # only a hint: never lose the command's result over it
                note = ""
            return result.model_copy(update={"stderr": result.stderr + note}) if note else result
        if result.exit_code == 128 + signal.SIGXFSZ and limits.fsize_mb < self._backend.limits.fsize_mb:
            result = result.model_copy(
                update={
                    "stderr": result.stderr + f"\n[sandbox] (a file may grow to at most the {limits.fsize_mb} MiB "
                    f"left of the workspace's {disk_mb} MiB quota, {quota.QUOTA_VARIABLE})"
                }
            )
        try:
            reason = await self._over_quota()
        except SandboxError as exc:
            reason = f"the workspace quota could not be checked: {exc}"
        if not reason:
            return result
        return result.model_copy(
            update={
                "exit_code": result.exit_code or 1,
                "stderr": result.stderr + f"\n[sandbox] failed: {reason}; delete files (e.g. rm) to continue",
            }
        )

    async def _usage(self) -> Usage | None:
        """Measured mode: what the workspace holds (``None`` once it is gone)."""
        try:
            return await self._backend.bulk.run(
                "measuring the workspace", HOST_TIMEOUT_S, functools.partial(self._measure_sync)
            )
        except OSError:
            return None

    def _measure_sync(self) -> Usage:
        return measure_tree(
            self.workspace,
            max_entries=quota.MAX_ENTRIES,
            max_depth=quota.MAX_DEPTH,
            budget_s=quota.MEASURE_BUDGET_S,
        )

    async def _over_quota(self) -> str:
        usage = await self._usage()
        return quota.over_quota(usage, self._backend.limits.disk_mb) if usage is not None else ""

    # --- files ---

    async def write_file(self, path: str, content: bytes) -> None:
        """Write ``content`` at ``path`` (workspace-relative), creating parent directories.

        The file is written under a fresh name and renamed over ``path``: a FIFO,
        socket, device, directory or symlink already at ``path`` is refused, never opened.
        """
        limits = self._backend.limits
        limit = limits.fsize_mb * 1024 * 1024
        if len(content) > limit:
            raise SandboxError(f"{len(content)} bytes is over the sandbox's {limit}-byte file size limit")
        if self.quota_mechanism == quota.MEASURED:
            usage = await self._usage()
            if usage is not None:
                grown = Usage(usage.used_bytes + len(content), usage.entries, usage.incomplete)
                reason = quota.over_quota(grown, limits.disk_mb)
                if reason:
                    raise SandboxError(f"cannot write {len(content)} bytes to {path!r}: {reason}; delete files first")
        await self._backend.io.run(
            f"writing {path!r}", HOST_TIMEOUT_S, functools.partial(self._write_sync, path, content)
        )

    def _write_sync(self, path: str, content: bytes) -> None:
        self._alive_sync()
        parts = self._parts(path)
        root_fd = open_dir(self.workspace)
        try:
            directory = walk(root_fd, parts[:-1], path, create=True, owner=self.owner)
            try:
                write_at(directory, parts[-1], content, path, owner=self.owner)
            finally:
                os.close(directory)
        except OSError as exc:
            raise _write_error(path, exc, self._backend.limits.disk_mb) from None
        finally:
            os.close(root_fd)

    async def read_file(self, path: str) -> bytes:
        """Bytes of ``path`` (workspace-relative); files over 1 MiB, and anything not a regular file, are refused."""
        return await self._backend.io.run(f"reading {path!r}", HOST_TIMEOUT_S, functools.partial(self._read_sync, path))

    def _read_sync(self, path: str) -> bytes:
        self._alive_sync()
        parts = self._parts(path)
        root_fd = open_dir(self.workspace)
        try:
            directory = walk(root_fd, parts[:-1], path)
            try:
                return read_at(directory, parts[-1], path, max_bytes=MAX_READ_BYTES)
            finally:
                os.close(directory)
        except FileNotFoundError:
            raise SandboxError(f"no such file: {path!r}") from None
        except TooLarge as exc:
            raise SandboxError(
                f"{path!r} is {exc.size} bytes; read_file returns at most {MAX_READ_BYTES} bytes (1 MiB). "
                "Read a part of it with a command instead (e.g. head -c)."
            ) from None
        except OSError as exc:
            raise SandboxError(f"cannot read {path!r}: {exc.strerror}") from None
        finally:
            os.close(root_fd)

    async def kill(self) -> None:
        """Kill running commands and delete the workspace and its metadata (idempotent)."""
        await self._backend.kill(self.sandbox_id)

    # --- checkpoints (``activities.checkpoints.engine``; the work is in ``local_checkpoints``) ---

    async def scan_workspace(self, *, max_entries: int) -> list[ScanEntry]:
        return await self._backend.bulk.run(
            "scanning the workspace",
            local_checkpoints.SCAN_BUDGET_S + local_checkpoints.MARGIN_S,
            functools.partial(
                self._in_workspace, local_checkpoints.scan, max_entries=max_entries, skip_root=self._skip_root()
            ),
        )

    async def read_workspace_files(self, paths: list[str], *, max_bytes: int) -> dict[str, bytes]:
        return await self._backend.bulk.run(
            "reading the workspace's files",
            local_checkpoints.READ_BUDGET_S + local_checkpoints.MARGIN_S,
            functools.partial(self._in_workspace, local_checkpoints.read_files, paths, max_bytes=max_bytes),
        )

    async def apply_workspace(
        self, entries: list[ManifestEntry], contents: dict[str, bytes], *, keep: set[str]
    ) -> None:
        await self._backend.bulk.run(
            "restoring the workspace",
            local_checkpoints.APPLY_BUDGET_S + local_checkpoints.MARGIN_S,
            functools.partial(
                self._in_workspace,
                local_checkpoints.apply,
                entries,
                contents,
                keep,
                owner=self.owner,
                skip_root=self._skip_root(),
            ),
        )

    async def checkpoint_marker(self) -> CheckpointMarker | None:
        return await self._backend.io.run("reading the checkpoint marker", HOST_TIMEOUT_S, self._marker_sync)

    async def set_checkpoint_marker(self, marker: CheckpointMarker) -> None:
        await self._backend.io.run(
            "writing the checkpoint marker", HOST_TIMEOUT_S, functools.partial(self._set_marker_sync, marker)
        )

    def _marker_sync(self) -> CheckpointMarker | None:
        self._alive_sync()
        return local_checkpoints.read_marker(self.directory)

    def _set_marker_sync(self, marker: CheckpointMarker) -> None:
        self._alive_sync()
        local_checkpoints.write_marker(self.directory, marker)

    def _skip_root(self) -> frozenset[str]:
        return local_checkpoints.LOOP_ROOT_SKIP if self.quota_mechanism == quota.LOOP else frozenset()

    def _in_workspace(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(workspace_fd, ...)`` on the workspace as it is now (in ``loop`` mode: the mounted image, never
        the bare mount point under it)."""
        self._alive_sync()
        try:
            root_fd = open_dir(self.workspace)
        except FileNotFoundError:
            raise SandboxMissing(
                f"sandbox {self.sandbox_id!r} does not exist (it was killed or never created)"
            ) from None
        try:
            if self.quota_mechanism == quota.LOOP and os.fstat(root_fd).st_dev == os.lstat(self.directory).st_dev:
                raise SandboxError(f"the workspace of sandbox {self.sandbox_id!r} is not mounted; try again")
            return fn(root_fd, *args, **kwargs)
        finally:
            os.close(root_fd)


class LocalSandboxBackend:
    """Sandboxes under ``root/<sandbox_id>/`` (``workspace/``, ``meta.json``, maybe ``workspace.ext4``).

    ``quota`` forces a quota mechanism (``"loop"`` or ``"measured"``; tests); by
    default the backend picks ``loop`` when it can (:func:`quota.detect`). The
    mechanism in force is ``quota_mechanism`` (``quota_reason`` says why), and each
    sandbox records its own in ``meta.json``: a sandbox whose image cannot be made
    (loop devices exhausted, say) falls back to ``measured`` with a warning.
    """

    name = "local"

    def __init__(
        self,
        root: Path,
        limits: LocalLimits | None = None,
        *,
        uid_base: int = DEFAULT_UID_BASE,
        quota_mechanism: str | None = None,
    ) -> None:
        self.root = Path(root).absolute()
        self.limits = limits or LocalLimits()
        self.running: dict[str, set[asyncio.subprocess.Process]] = {}
        self.uid_base = uid_base
        self.io = HostExecutor("sandbox-io", IO_THREADS)
        self.bulk = HostExecutor("sandbox-bulk", BULK_THREADS)
        mechanism, why, tools = quota.detect()
        if quota_mechanism is not None:
            if quota_mechanism not in quota.MECHANISMS:
                raise ValueError(f"quota mechanism {quota_mechanism!r}: use one of {', '.join(quota.MECHANISMS)}")
            if quota_mechanism == quota.LOOP and tools is None:
                raise SandboxUnavailable(f"the loop-mounted workspace quota is not possible here: {why}")
            if quota_mechanism != mechanism:
                why = "chosen by the caller"
            mechanism = quota_mechanism
        self.quota_mechanism = mechanism
        self.quota_reason = why
        self._tools = tools
        log.info(
            "local sandboxes under %s: workspace quota %d MiB (%s), %s: %s",
            self.root,
            self.limits.disk_mb,
            quota.QUOTA_VARIABLE,
            mechanism,
            why,
        )

    def close(self) -> None:
        """Stop the backend's thread pools (work already running finishes on its own)."""
        self.io.shutdown()
        self.bulk.shutdown()

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
        validate_sandbox_id(sandbox_id)
        await self.bulk.run("checking bubblewrap", CREATE_TIMEOUT_S, functools.partial(require_bwrap, self.uid_base))
        return await self.bulk.run(
            f"creating sandbox {sandbox_id!r}",
            CREATE_TIMEOUT_S,
            functools.partial(self._open_sync, sandbox_id, dict(metadata or {}), create=True),
        )

    async def connect(self, sandbox_id: str) -> LocalSandbox:
        """Attach to an existing sandbox (mounting its workspace again if needed); :class:`SandboxMissing` if none."""
        validate_sandbox_id(sandbox_id)
        return await self.io.run(
            f"connecting to sandbox {sandbox_id!r}",
            CREATE_TIMEOUT_S,
            functools.partial(self._open_sync, sandbox_id, {}, create=False),
        )

    async def connect_or_recreate(self, sandbox_id: str, *, metadata: dict[str, str] | None = None) -> Connection:
        """``connect``; a missing workspace (killed, or another host's) is created again, once."""
        try:
            return Connection(await self.connect(sandbox_id))
        except SandboxMissing:
            pass
        sandbox = await self.create(sandbox_id, metadata=metadata)
        return Connection(sandbox, recreated=True)

    # --- creating and opening (on the pools, under the sandbox directory's lock) ---

    def _open_sync(self, sandbox_id: str, metadata: dict[str, str], *, create: bool) -> LocalSandbox:
        directory = self.root / sandbox_id
        for _ in range(3):
            if create:
                os.makedirs(self.root, exist_ok=True)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(directory, 0o755)
            try:
                fd = open_dir(directory)
            except FileNotFoundError:
                if create:
                    continue  # removed between the mkdir and the open
                raise SandboxMissing(
                    f"sandbox {sandbox_id!r} does not exist (it was killed or never created)"
                ) from None
            except OSError as exc:
                raise SandboxError(f"the directory of sandbox {sandbox_id!r} is not usable: {exc.strerror}") from None
            try:
                with locked(fd, f"sandbox {sandbox_id!r}", LOCK_TIMEOUT_S):
                    if not _same_directory(fd, directory):
                        continue  # removed (and maybe made again) while we waited for the lock
                    return self._open_locked(sandbox_id, metadata, create=create)
            finally:
                os.close(fd)
        raise SandboxError(f"sandbox {sandbox_id!r} kept being removed while it was being opened; try again")

    def _open_locked(self, sandbox_id: str, metadata: dict[str, str], *, create: bool) -> LocalSandbox:
        directory = self.root / sandbox_id
        workspace = directory / WORKSPACE_DIR
        meta = _read_meta(directory)
        owner = self._owner(sandbox_id, meta)
        if meta:
            mechanism = meta.get("quota")
            if mechanism not in quota.MECHANISMS:
                mechanism = quota.MEASURED  # made before the quota existed: a plain directory
            sandbox = LocalSandbox(self, sandbox_id, owner, str(mechanism))
            if mechanism == quota.LOOP:
                self._ensure_mounted(sandbox)
            elif not self._workspace_is_dir(workspace):
                if not create:
                    raise SandboxMissing(f"sandbox {sandbox_id!r} does not exist (it was killed or never created)")
                self._make_directory(workspace, owner)
            return sandbox
        if not create:
            if self._workspace_is_dir(workspace):  # no meta.json: left by hand or by a crash; usable as it is
                return LocalSandbox(self, sandbox_id, owner, quota.MEASURED)
            raise SandboxMissing(f"sandbox {sandbox_id!r} does not exist (it was killed or never created)")
        mechanism = self.quota_mechanism
        if mechanism == quota.LOOP and self._holds_files(workspace):
            mechanism = quota.MEASURED  # a workspace made before quotas, with files: never hide them under a mount
        if mechanism == quota.LOOP:
            try:
                self._make_image(directory, owner)
            except (OSError, SandboxError) as exc:
                log.warning(
                    "sandbox %s: cannot make its %d MiB workspace image (%s); its quota is measured instead",
                    sandbox_id,
                    self.limits.disk_mb,
                    exc,
                )
                self._discard_image(directory)
                mechanism = quota.MEASURED
        if mechanism == quota.MEASURED:
            self._make_directory(workspace, owner)
        record = {
            "sandbox_id": sandbox_id,
            "metadata": metadata,
            "created_at": time.time(),
            "uid": owner[0] if owner else os.getuid(),
            "gid": owner[1] if owner else os.getgid(),
            "quota": mechanism,
            "disk_mb": self.limits.disk_mb,
        }
        self._write_meta(directory, record)
        return LocalSandbox(self, sandbox_id, owner, mechanism)

    @staticmethod
    def _workspace_is_dir(workspace: Path) -> bool:
        try:
            return stat.S_ISDIR(os.lstat(workspace).st_mode)
        except OSError:
            return False

    @staticmethod
    def _holds_files(workspace: Path) -> bool:
        try:
            fd = open_dir(workspace)
        except OSError:
            return False
        try:
            with os.scandir(fd) as scan:
                return any(True for _ in scan)
        finally:
            os.close(fd)

    @staticmethod
    def _make_directory(workspace: Path, owner: tuple[int, int] | None) -> None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(workspace, 0o755)
        if not stat.S_ISDIR(os.lstat(workspace).st_mode):
            raise SandboxError(f"{workspace} is not a directory")
        if owner is not None:
            os.chown(workspace, *owner, follow_symlinks=False)

    def _make_image(self, directory: Path, owner: tuple[int, int] | None) -> None:
        """A fresh ``disk_mb`` ext4 image, mounted on the workspace and given to ``owner``."""
        assert self._tools is not None
        workspace = directory / WORKSPACE_DIR
        image = directory / quota.IMAGE
        quota.unmount(workspace)  # left by a creation that crashed before writing meta.json
        with contextlib.suppress(FileNotFoundError):
            os.unlink(image)
        with contextlib.suppress(FileExistsError):
            os.mkdir(workspace, 0o700)  # the mount point: root-only while nothing is mounted on it
        if not stat.S_ISDIR(os.lstat(workspace).st_mode):
            raise SandboxError(f"{workspace} is not a directory")
        quota.make_image(image, self.limits.disk_mb, self._tools)
        quota.mount_image(image, workspace, self._tools)
        if owner is not None:
            os.chown(workspace, *owner)
        os.chmod(workspace, 0o755)
        with contextlib.suppress(OSError):
            os.rmdir(workspace / "lost+found")  # the workspace starts empty (e2fsck makes it again if it needs it)

    @staticmethod
    def _discard_image(directory: Path) -> None:
        with contextlib.suppress(SandboxError):
            quota.unmount(directory / WORKSPACE_DIR)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / quota.IMAGE)

    def _ensure_mounted(self, sandbox: LocalSandbox) -> None:
        """A ``loop`` sandbox's image is mounted on its workspace (again after a reboot); SandboxMissing without one."""
        if quota.is_mounted(sandbox.workspace):
            return
        image = sandbox.directory / quota.IMAGE
        if not os.path.lexists(image):
            raise SandboxMissing(f"sandbox {sandbox.sandbox_id!r} does not exist (its workspace image is gone)")
        if self._tools is None:
            raise SandboxError(
                f"sandbox {sandbox.sandbox_id!r} has a loop-mounted workspace, which this worker cannot mount "
                f"({self.quota_reason})"
            )
        quota.mount_image(image, sandbox.workspace, self._tools)

    @staticmethod
    def _write_meta(directory: Path, record: dict[str, Any]) -> None:
        tmp = directory / f".{META_FILE}.{secrets.token_hex(6)}"
        fd = os.open(tmp, CREATE_FLAGS, 0o644)
        try:
            os.write(fd, json.dumps(record, sort_keys=True).encode())
        finally:
            os.close(fd)
        os.replace(tmp, directory / META_FILE)

    # --- killing and listing ---

    async def kill(self, sandbox_id: str) -> bool:
        """Kill the sandbox's running commands, unmount and delete its directory; ``True`` if it existed."""
        validate_sandbox_id(sandbox_id)
        for proc in list(self.running.pop(sandbox_id, ())):
            killpg(proc)
        return await self.bulk.run(
            f"removing sandbox {sandbox_id!r}", REMOVE_TIMEOUT_S, functools.partial(self._kill_sync, sandbox_id)
        )

    def _kill_sync(self, sandbox_id: str) -> bool:
        directory = self.root / sandbox_id
        try:
            fd = open_dir(directory)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            os.unlink(directory)  # not a directory (never one of ours): remove the name, follow nothing
            return True
        try:
            with locked(fd, f"sandbox {sandbox_id!r}", LOCK_TIMEOUT_S):
                if not _same_directory(fd, directory):
                    return False
                quota.unmount(directory / WORKSPACE_DIR)
                remove_tree(directory, budget_s=REMOVE_TIMEOUT_S)
        finally:
            os.close(fd)
        return True

    async def list_sandboxes(self) -> list[SandboxRecord]:
        """One record per directory under the root (``meta.json`` supplies the run id)."""
        return await self.io.run("listing the sandboxes", HOST_TIMEOUT_S, self._list_sync)

    def _list_sync(self) -> list[SandboxRecord]:
        records: list[SandboxRecord] = []
        try:
            with os.scandir(self.root) as scan:
                entries = sorted(scan, key=lambda e: e.name)
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
    "DEFAULT_UID_BASE",
    "FLATTEN_DEPTH",
    "INSTALL_HINT",
    "MAX_READ_BYTES",
    "SANDBOX_ID_RE",
    "LocalLimits",
    "LocalSandbox",
    "LocalSandboxBackend",
    "clear_probe_cache",
    "host_uid_for",
    "require_bwrap",
]
