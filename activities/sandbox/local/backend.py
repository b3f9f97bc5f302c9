"""The local backend (:class:`LocalSandboxBackend`): the sandboxes under its root directory.

Each sandbox is ``root/<sandbox_id>/``: ``workspace/`` (a loop-mounted ext4 image, ``workspace.ext4``,
or a plain directory; :mod:`activities.sandbox.local.quota`) and ``meta.json`` (its run, tenant, host
uid and quota mechanism). Creating, opening, mounting, killing and listing them happen here, on the
backend's thread pools and under the sandbox directory's lock; :class:`LocalSandbox` is one of them.
See :mod:`activities.sandbox.local` for the isolation.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from activities.sandbox.base import (
    MAX_READ_BYTES,
    META_RUN,
    META_TENANT,
    SANDBOX_ID_RE,
    Connection,
    SandboxError,
    SandboxMissing,
    SandboxRecord,
    SandboxUnavailable,
    validate_sandbox_id,
)
from activities.sandbox.local import quota
from activities.sandbox.local.bwrap import INSTALL_HINT, clear_probe_cache, require_bwrap
from activities.sandbox.local.hostfs import CREATE_FLAGS, HostExecutor, locked, open_dir, read_small
from activities.sandbox.local.limits import DEFAULT_UID_BASE, LocalLimits, host_uid_for
from activities.sandbox.local.processes import Commands
from activities.sandbox.local.sandbox import CREATE_TIMEOUT_S, HOST_TIMEOUT_S, META_FILE, WORKSPACE_DIR, LocalSandbox
from activities.sandbox.local.trees import FLATTEN_DEPTH, remove_tree

log = logging.getLogger(__name__)

REMOVE_TIMEOUT_S = 60.0  # kill: unmount, then remove the tree
LOCK_TIMEOUT_S = 8.0  # waiting for another thread or worker creating/removing the same sandbox
IO_THREADS = 8  # quick host work: file access, listing, preparing commands
BULK_THREADS = 4  # slow host work: probes, mkfs/mount, measuring, removing trees

_remove_tree = remove_tree  # the name the removal tests use


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
        self.running: dict[str, Commands] = {}
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
        commands = self.running.pop(sandbox_id, None)
        if commands is not None:
            commands.kill()
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
