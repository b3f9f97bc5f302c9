"""The local sandbox backend: bubblewrap namespaces, seccomp and rlimits around one workspace directory per sandbox.

Every command runs in its own ``bwrap`` with fresh user/pid/net/ipc/uts/cgroup/mount
namespaces (network: loopback only, and nothing listens on it), no capabilities,
no nested user namespaces, a seccomp filter (:mod:`activities.sandbox.seccomp`),
a read-only ``/usr``, an empty environment, private ``/tmp`` and only
``/workspace`` writable and persistent. The command's pid namespace dies with it:
nothing it started survives ``run()``.

A root worker runs each sandbox's commands as an unprivileged host uid of its own
(``AGENT_SANDBOX_UID_BASE`` + a hash of the sandbox id, recorded in ``meta.json``),
which owns the workspace; any other worker runs them as its own uid. Inside, the
command always sees uid/gid 1000. When ``bwrap`` is missing or cannot create the
namespaces, :class:`SandboxUnavailable` is raised: this backend never runs anything
unsandboxed.

This module keeps the sandboxes (workspace directories, ``meta.json``, file
access); the rest lives in:

* :mod:`activities.sandbox.local_limits`: :class:`LocalLimits` and the uid settings;
* :mod:`activities.sandbox.bwrap`: the ``bwrap`` command line, the child's rlimits
  and uid switch (why a root worker does not run commands as root), the probe;
* :mod:`activities.sandbox.processes`: running a command to its end (output caps,
  timeout, emptying its pid namespace).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import threading
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

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
    validate_sandbox_id,
    workspace_relative,
)
from activities.sandbox.bwrap import INSTALL_HINT, build_spawn, clear_probe_cache, require_bwrap
from activities.sandbox.local_limits import DEFAULT_UID_BASE, LocalLimits, host_uid_for
from activities.sandbox.processes import execute, killpg

META_FILE = "meta.json"


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
        bwrap = await asyncio.to_thread(require_bwrap, self._backend.uid_base)
        self._check_alive()
        chdir = WORKSPACE
        if cwd:
            target = _inside(self.workspace, _relative(cwd, allow_root=True), cwd)
            if not target.is_dir():
                raise SandboxError(f"cwd {cwd!r} is not a directory in the workspace")
            chdir = str(PurePosixPath(WORKSPACE) / target.relative_to(self.workspace.resolve()))
        limits = self._backend.limits
        spawn = await asyncio.to_thread(build_spawn, bwrap, limits, self.workspace.resolve(), self.owner, chdir, argv)
        return await execute(
            spawn,
            stdin=stdin,
            timeout_s=min(timeout_s, limits.timeout_s),
            limits=limits,
            running=self._backend.running,
            sandbox_id=self.sandbox_id,
        )

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


FLATTEN_DEPTH = 32  # deeper directories are moved up before removal, so no path grows without bound


def _remove_tree(path: Path) -> None:
    """Delete ``path`` and everything below it, however deep, whatever its permissions.

    Iterative (``shutil.rmtree`` recurses, and a workspace 1,100 directories deep made it
    raise ``RecursionError``): a stack of directories, each rescanned until empty.
    Directories nested deeper than ``FLATTEN_DEPTH`` are renamed to the top of the tree
    first, so paths stay short. A directory a command chmod'ed to 000 is made usable again.
    Symlinks are removed, never followed.
    """
    if not path.is_dir() or path.is_symlink():
        return
    root = str(path)
    moved = 0
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        current, depth = stack[-1]
        try:
            with os.scandir(current) as scan:
                entries = list(scan)
        except FileNotFoundError:
            stack.pop()
            continue
        except PermissionError:
            _make_usable(current)
            with os.scandir(current) as scan:
                entries = list(scan)
        subdirectories = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.path)
            else:
                _unlink(entry.path)
        if not subdirectories:
            os.rmdir(current)
            stack.pop()
            continue
        for sub in subdirectories:
            if depth + 1 >= FLATTEN_DEPTH:
                moved += 1
                flat = os.path.join(root, f".removing-{moved}")
                _make_usable(current)
                os.rename(sub, flat)
                stack.append((flat, 1))
            else:
                stack.append((sub, depth + 1))


def _make_usable(directory: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.chmod(directory, 0o700)


def _unlink(target: str) -> None:
    try:
        os.unlink(target)
    except FileNotFoundError:
        return
    except PermissionError:
        _make_usable(os.path.dirname(target))
        os.unlink(target)


class LocalSandboxBackend:
    """Sandboxes under ``root/<sandbox_id>/`` (``workspace/`` plus ``meta.json``), each command bubblewrapped."""

    name = "local"

    def __init__(self, root: Path, limits: LocalLimits | None = None, *, uid_base: int = DEFAULT_UID_BASE) -> None:
        self.root = Path(root).absolute()
        self.limits = limits or LocalLimits()
        self.running: dict[str, set[asyncio.subprocess.Process]] = {}
        self.uid_base = uid_base

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
        await asyncio.to_thread(require_bwrap, self.uid_base)
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
        validate_sandbox_id(sandbox_id)
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
        validate_sandbox_id(sandbox_id)
        for proc in list(self.running.pop(sandbox_id, ())):
            killpg(proc)
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
    "DEFAULT_UID_BASE",
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
