"""Workspace checkpoints on the local backend: scanning, reading and rewriting a hostile workspace from the host.

The :class:`~activities.sandbox.checkpointable.Checkpointable` methods of
:class:`~activities.sandbox.local.sandbox.LocalSandbox` are thin wrappers around the functions
here, which take the workspace's directory fd (opened by the caller, checked to be the
mounted image in ``loop`` mode) and follow the discipline of :mod:`activities.sandbox.local.hostfs`:

* every path is reached component by component from the workspace fd with
  ``O_NOFOLLOW | O_NONBLOCK`` (a planted symlink is never followed, a FIFO never
  opened for reading), walks never enter another filesystem, and every walk is bounded
  in entries, depth and time (:func:`trees.walk_tree`);
* files are read only after an ``lstat`` and an ``fstat`` of the opened fd say they are
  regular (and the same inode): anything else is left out;
* files and symlinks are (re)created under a fresh ``O_EXCL`` name and renamed over
  their target, given to the sandbox's owner (a root worker's commands run as an
  unprivileged uid, which must be able to modify what a restore wrote), and removal is
  ``unlinkat``-based (:func:`trees.remove_tree_at`): a directory symlink planted where a
  restored directory goes is unlinked, never descended into.

What a checkpoint holds: regular files (mode: permission bits without setuid/setgid),
directories (permission bits and the sticky bit) and symlinks whose text stays inside the
workspace (:func:`~activities.sandbox.checkpointable.link_stays_inside`). Names are kept
whatever their bytes (one that is not valid UTF-8 is its ``surrogateescape`` decoding in
memory and base64 on the wire, see :mod:`~activities.sandbox.checkpointable`). FIFOs, sockets,
devices, outward symlinks and names that are not a
:func:`~activities.sandbox.checkpointable.safe_relative` path are left out, with a count
logged. Hard links are stored as separate files (a restore writes them as such). In a
``loop`` workspace the root's ``lost+found`` belongs to ext4: it is never scanned, stored
or removed.

The marker (which checkpoint the workspace holds, and the change stamps of its files) is
``checkpoint.json`` in the sandbox's host directory next to ``meta.json``: outside the
workspace, so the sandboxed code can neither read nor forge it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import stat
import time
from pathlib import Path

from activities.sandbox.base import SandboxError
from activities.sandbox.checkpointable import (
    MAX_ENTRIES,
    MAX_MARKER_BYTES,
    CheckpointError,
    CheckpointMarker,
    CheckpointTooLarge,
    ManifestEntry,
    ScanEntry,
    link_stays_inside,
    safe_relative,
)
from activities.sandbox.local import quota
from activities.sandbox.local.hostfs import (
    CREATE_FLAGS,
    TooLarge,
    chmod_at,
    create_file_at,
    read_at,
    read_small,
    temp_name,
    walk,
)
from activities.sandbox.local.trees import Found, WalkLimit, remove_tree_at, walk_tree

log = logging.getLogger(__name__)

MARKER_FILE = "checkpoint.json"
MAX_DEPTH = quota.MAX_DEPTH  # directories nested deeper: the workspace is not checkpointed
SCAN_BUDGET_S = 30.0
READ_BUDGET_S = 120.0
APPLY_BUDGET_S = 120.0
MARGIN_S = 5.0  # the executor's deadline is the budget plus this: the walk stops first, with its own message
FILE_MODE_BITS = 0o777  # setuid/setgid are never stored or restored
DIR_MODE_BITS = 0o1777
LOOP_ROOT_SKIP = frozenset({"lost+found"})

Owner = tuple[int, int] | None


def _path_of(parts: tuple[str, ...]) -> str | None:
    """The manifest path of ``parts`` (any bytes: ``surrogateescape``), or None when it is not a safe relative path."""
    path = "/".join(parts)
    return path if safe_relative(path) else None


def _walk_error(exc: WalkLimit, what: str) -> CheckpointError:
    if exc.cap in ("entries", "depth"):
        return CheckpointTooLarge(f"the workspace cannot be {what}: {exc}; delete files you do not need")
    return CheckpointError(f"the workspace cannot be {what}: {exc}")


# --- scanning ---------------------------------------------------------------------------


def scan(
    root_fd: int,
    *,
    max_entries: int,
    skip_root: frozenset[str] = frozenset(),
    budget_s: float = SCAN_BUDGET_S,
) -> list[ScanEntry]:
    """Every regular file, directory and inside-pointing symlink below ``root_fd``, nothing followed or opened.

    :class:`CheckpointTooLarge` over ``max_entries`` entries (everything listed counts, kept or
    not) or ``MAX_DEPTH`` levels; :class:`CheckpointError` past ``budget_s``.
    """
    found: list[ScanEntry] = []
    skipped = {"name": 0, "special": 0, "outward link": 0}

    def descend(item: Found) -> bool:
        return _path_of(item.parts) is not None

    try:
        for item in walk_tree(
            root_fd,
            max_entries=max_entries,
            max_depth=MAX_DEPTH,
            deadline=time.monotonic() + budget_s,
            descend=descend,
            skip_root=skip_root,
        ):
            path = _path_of(item.parts)
            if path is None:
                skipped["name"] += 1
                continue
            info = item.info
            if stat.S_ISREG(info.st_mode):
                stamp = f"{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}:{info.st_ino}"
                mode = stat.S_IMODE(info.st_mode) & FILE_MODE_BITS
                found.append(ScanEntry(path=path, kind="file", mode=mode, size=info.st_size, stamp=stamp))
            elif stat.S_ISDIR(info.st_mode):
                found.append(ScanEntry(path=path, kind="dir", mode=stat.S_IMODE(info.st_mode) & DIR_MODE_BITS))
            elif stat.S_ISLNK(info.st_mode):
                target = _readlink(item)
                if target is None or not link_stays_inside(path, target):
                    skipped["outward link"] += 1
                    continue
                found.append(ScanEntry(path=path, kind="symlink", mode=0o777, target=target))
            else:
                skipped["special"] += 1
    except WalkLimit as exc:
        raise _walk_error(exc, "checkpointed") from None
    if any(skipped.values()):
        log.info(
            "workspace scan: left out %d names that are not safe relative paths, %d FIFOs/sockets/devices, "
            "%d symlinks pointing outside the workspace",
            skipped["name"],
            skipped["special"],
            skipped["outward link"],
        )
    return found


def _readlink(item: Found) -> str | None:
    try:
        target = os.readlink(item.name, dir_fd=item.dir_fd)
    except OSError:  # gone, or replaced by something that is not a link, meanwhile
        return None
    return target


# --- reading ----------------------------------------------------------------------------


class _Parents:
    """An fd on the directory last asked for (paths sorted: siblings come together), reached without following."""

    def __init__(self, root_fd: int, *, create: bool = False, owner: Owner = None) -> None:
        self.root_fd = root_fd
        self.create = create
        self.owner = owner
        self.parts: tuple[str, ...] | None = None
        self.fd: int | None = None

    def get(self, parts: tuple[str, ...], shown: str) -> int:
        if parts != self.parts or self.fd is None:
            self.close()
            self.fd = walk(self.root_fd, parts, shown, create=self.create, owner=self.owner)
            self.parts = parts
        return self.fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.parts = None, None


def read_files(root_fd: int, paths: list[str], *, max_bytes: int, budget_s: float = READ_BUDGET_S) -> dict[str, bytes]:
    """The contents of the regular files ``paths`` below ``root_fd``; one that is not (any more) is left out.

    :class:`CheckpointTooLarge` once they hold more than ``max_bytes`` in all.
    """
    deadline = time.monotonic() + budget_s
    contents: dict[str, bytes] = {}
    total = 0
    parents = _Parents(root_fd)
    try:
        for path in sorted(set(paths)):
            if time.monotonic() > deadline:
                raise CheckpointError(f"reading the workspace's files took longer than {budget_s:g} s")
            if not safe_relative(path):
                continue
            parts = tuple(path.split("/"))
            try:
                directory = parents.get(parts[:-1], path)
                data = read_at(directory, parts[-1], path, max_bytes=max_bytes - total)
            except TooLarge:
                raise CheckpointTooLarge(
                    f"the workspace's files are over the checkpoint limit of {max_bytes / 1e6:.0f} MB "
                    f"(AGENT_CHECKPOINT_MAX_MB; {path[:200]!r} did not fit); this step was not checkpointed: "
                    "delete files you do not need"
                ) from None
            except PermissionError:
                raise CheckpointError(
                    f"{path[:200]!r} cannot be read for the checkpoint (permission denied): chmod u+r it"
                ) from None
            except (SandboxError, FileNotFoundError, NotADirectoryError):  # gone, or no longer a regular file
                parents.close()
                continue
            except OSError as exc:
                raise CheckpointError(f"{path[:200]!r} cannot be read for the checkpoint: {exc.strerror}") from None
            contents[path] = data
            total += len(data)
    finally:
        parents.close()
    return contents


# --- applying ---------------------------------------------------------------------------


def apply(
    root_fd: int,
    entries: list[ManifestEntry],
    contents: dict[str, bytes],
    keep: set[str],
    *,
    owner: Owner,
    skip_root: frozenset[str] = frozenset(),
    budget_s: float = APPLY_BUDGET_S,
) -> None:
    """Make the tree below ``root_fd`` hold exactly ``entries`` (the root itself and ``skip_root`` stay).

    Files in ``keep`` are left in place (their mode set); other files are written from
    ``contents`` by hash. Outward symlinks and unsafe paths in ``entries`` are ignored.
    """
    deadline = time.monotonic() + budget_s
    wanted: dict[str, ManifestEntry] = {}
    for entry in entries:
        if not safe_relative(entry.path) or entry.path.split("/")[0] in skip_root:
            continue
        if entry.kind == "symlink" and not link_stays_inside(entry.path, entry.target):
            continue
        if entry.kind == "file" and entry.path not in keep and entry.hash not in contents:
            raise CheckpointError(f"the content of {entry.path[:200]!r} is missing; the workspace was not restored")
        wanted[entry.path] = entry
    try:
        linked = _remove_unwanted(root_fd, wanted, keep, skip_root, deadline)
        _create(root_fd, wanted, contents, keep, linked, owner, deadline)
    except WalkLimit as exc:
        raise _walk_error(exc, "restored") from None
    except TimeoutError:
        raise CheckpointError(f"restoring the workspace took longer than {budget_s:g} s") from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CheckpointError(
                f"the workspace is full ({quota.QUOTA_VARIABLE}); the checkpoint could not be restored"
            ) from None
        raise CheckpointError(f"the workspace could not be restored: {exc.strerror or exc}") from None


def _remove_unwanted(
    root_fd: int, wanted: dict[str, ManifestEntry], keep: set[str], skip_root: frozenset[str], deadline: float
) -> set[str]:
    """Remove whatever is not in ``wanted`` or of another kind; the paths of symlinks already right."""
    linked: set[str] = set()

    def descend(item: Found) -> bool:
        path = _path_of(item.parts)
        entry = wanted.get(path) if path is not None else None
        return entry is not None and entry.kind == "dir"

    for item in walk_tree(
        root_fd,
        max_entries=2 * MAX_ENTRIES,  # only wanted directories are entered; the rest goes whole
        max_depth=MAX_DEPTH + 1,
        deadline=deadline,
        descend=descend,
        skip_root=skip_root,
    ):
        path = _path_of(item.parts)
        entry = wanted.get(path) if path is not None else None
        mode = item.info.st_mode
        if entry is None:
            remove_tree_at(item.dir_fd, item.name, deadline=deadline)
        elif entry.kind == "dir":
            if not stat.S_ISDIR(mode):
                remove_tree_at(item.dir_fd, item.name, deadline=deadline)
        elif entry.kind == "file":
            if stat.S_ISREG(mode):
                continue  # kept, or replaced by the rename of a fresh file
            remove_tree_at(item.dir_fd, item.name, deadline=deadline)
        elif stat.S_ISLNK(mode) and _readlink(item) == entry.target:
            linked.add(entry.path)
        else:
            remove_tree_at(item.dir_fd, item.name, deadline=deadline)
    return linked


def _create(
    root_fd: int,
    wanted: dict[str, ManifestEntry],
    contents: dict[str, bytes],
    keep: set[str],
    linked: set[str],
    owner: Owner,
    deadline: float,
) -> None:
    ordered = sorted(wanted.values(), key=lambda e: e.path.split("/"))  # parents before their children
    parents = _Parents(root_fd, create=True, owner=owner)
    try:
        for entry in ordered:
            if time.monotonic() > deadline:
                raise TimeoutError(errno.ETIMEDOUT, "restore deadline")
            parts = tuple(entry.path.split("/"))
            directory = parents.get(parts[:-1], entry.path)
            name = parts[-1]
            if entry.kind == "dir":
                _make_dir(directory, name, owner, deadline)
            elif entry.kind == "file":
                if entry.path in keep and chmod_at(directory, name, entry.mode & FILE_MODE_BITS, kind=stat.S_IFREG):
                    continue
                if entry.hash not in contents:
                    raise CheckpointError(f"{entry.path[:200]!r} changed while the workspace was being restored")
                _install(directory, name, deadline, owner, content=contents[entry.hash], mode=entry.mode)
            elif entry.path not in linked:
                _install(directory, name, deadline, owner, target=entry.target)
        parents.close()
        parents.create = False
        for entry in reversed(ordered):  # children first: a directory made read-only last
            if entry.kind == "dir":
                parts = tuple(entry.path.split("/"))
                directory = parents.get(parts[:-1], entry.path)
                chmod_at(directory, parts[-1], entry.mode & DIR_MODE_BITS, kind=stat.S_IFDIR)
    finally:
        parents.close()


def _make_dir(directory: int, name: str, owner: Owner, deadline: float) -> None:
    for _ in range(3):
        try:
            os.mkdir(name, 0o700, dir_fd=directory)
        except FileExistsError:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                chmod_at(directory, name, stat.S_IMODE(info.st_mode) | 0o700, kind=stat.S_IFDIR)  # for its children
                return
            remove_tree_at(directory, name, deadline=deadline)  # appeared since the removal pass
            continue
        if owner is not None:
            os.chown(name, *owner, dir_fd=directory, follow_symlinks=False)
        return
    raise CheckpointError(f"{name[:200]!r} kept being replaced while the workspace was being restored")


def _install(
    directory: int,
    name: str,
    deadline: float,
    owner: Owner,
    *,
    content: bytes | None = None,
    mode: int = 0o644,
    target: str = "",
) -> None:
    """Write a file (``content``) or a symlink (``target``) under a fresh name, then rename it over ``name``."""
    tmp = temp_name(name)
    if content is None:
        os.symlink(target, tmp, dir_fd=directory)
        if owner is not None:
            os.chown(tmp, *owner, dir_fd=directory, follow_symlinks=False)
    else:
        create_file_at(directory, tmp, content, owner=owner, mode=mode & FILE_MODE_BITS)
    try:
        try:
            os.rename(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
        except OSError as exc:
            if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            remove_tree_at(directory, name, deadline=deadline)  # a directory appeared there meanwhile
            os.rename(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=directory)
        raise


# --- the marker -------------------------------------------------------------------------


def read_marker(directory: Path) -> CheckpointMarker | None:
    """The marker in the sandbox's host directory; None when it is missing, too big or not a marker."""
    raw = read_small(directory / MARKER_FILE, MAX_MARKER_BYTES)
    if raw is None:
        return None
    try:
        return CheckpointMarker.model_validate_json(raw)
    except ValueError:
        log.warning("%s: the checkpoint marker is corrupt; ignored", directory / MARKER_FILE)
        return None


def write_marker(directory: Path, marker: CheckpointMarker) -> None:
    """Replace the marker atomically (fresh file, fsync, rename); one too big keeps only the checkpoint id."""
    data = marker.model_dump_json().encode()
    if len(data) > MAX_MARKER_BYTES:  # its stamps are only a shortcut: the next checkpoint reads every file
        data = json.dumps({"checkpoint_id": marker.checkpoint_id}).encode()
    tmp = directory / f".{MARKER_FILE}.{secrets.token_hex(6)}"
    fd = os.open(tmp, CREATE_FLAGS, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, directory / MARKER_FILE)


__all__ = [
    "APPLY_BUDGET_S",
    "LOOP_ROOT_SKIP",
    "MARGIN_S",
    "MARKER_FILE",
    "READ_BUDGET_S",
    "SCAN_BUDGET_S",
    "apply",
    "read_files",
    "read_marker",
    "scan",
    "write_marker",
]
