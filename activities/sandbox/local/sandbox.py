"""One local sandbox (:class:`LocalSandbox`): its commands, its files and its checkpoint methods.

Every host-side operation runs on its backend's bounded thread pools with a deadline, on the
workspace as it is now (never following a link the sandboxed code planted); see
:mod:`activities.sandbox.local` for the isolation, the quota and the uid each command runs as.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, TypeVar

from activities.sandbox.base import (
    MAX_READ_BYTES,
    WORKSPACE,
    CommandResult,
    SandboxError,
    SandboxMissing,
    validate_command,
    workspace_relative,
)
from activities.sandbox.checkpointable import CheckpointMarker, ManifestEntry, ScanEntry
from activities.sandbox.local import checkpoints as local_checkpoints
from activities.sandbox.local import quota
from activities.sandbox.local.bwrap import Spawn, build_spawn, require_bwrap
from activities.sandbox.local.hostfs import HostExecutor, TooLarge, open_dir, read_at, walk, write_at
from activities.sandbox.local.limits import LocalLimits
from activities.sandbox.local.processes import Commands, execute
from activities.sandbox.local.trees import Usage, measure_tree

T = TypeVar("T")

META_FILE = "meta.json"
WORKSPACE_DIR = "workspace"

HOST_TIMEOUT_S = 10.0  # one host-side file operation, listing, or preparing a command
CREATE_TIMEOUT_S = 45.0  # the bwrap probe (up to 15 s), mkfs and mount


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


def _write_error(path: str, exc: OSError, disk_mb: int) -> SandboxError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SandboxError(
            f"cannot write {path!r}: the workspace is full (its quota is {disk_mb} MiB, {quota.QUOTA_VARIABLE}); "
            "delete files first"
        )
    if exc.errno == errno.EISDIR:
        return SandboxError(f"{path!r} is a directory")
    return SandboxError(f"cannot write {path!r}: {exc.strerror}")


class Host(Protocol):
    """What a sandbox needs of its backend (:class:`~activities.sandbox.local.backend.LocalSandboxBackend`)."""

    root: Path
    limits: LocalLimits
    uid_base: int
    running: dict[str, Commands]  # by sandbox id: the commands running now
    io: HostExecutor  # quick host work
    bulk: HostExecutor  # slow host work

    async def kill(self, sandbox_id: str) -> bool: ...


class LocalSandbox:
    """One sandbox: a workspace (loop-mounted image or plain directory) mounted at ``/workspace`` for each command."""

    def __init__(
        self,
        backend: Host,
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
        monitor = None
        if self.quota_mechanism == quota.MEASURED:
            usage = await self._usage()
            # A command that starts over the quota may run to delete files: only growing it further stops it.
            began = usage.used_bytes if usage is not None and not usage.incomplete else 0
            monitor = functools.partial(self._over_quota, began)
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
            monitor=monitor,
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

    async def _over_quota(self, began_bytes: int = 0) -> str:
        """Why the workspace is over its quota, or ""; not while it holds no more than ``began_bytes``."""
        usage = await self._usage()
        if usage is None or (not usage.incomplete and usage.used_bytes <= began_bytes):
            return ""
        return quota.over_quota(usage, self._backend.limits.disk_mb)

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
