"""Whole workspace trees, from the host side: removing, measuring and walking one, bounded.

Built on :mod:`activities.sandbox.local.hostfs`: the same fd-relative ``O_NOFOLLOW`` opens, so a
name the sandboxed code planted is never followed. A walk never crosses into another filesystem
and is bounded: removal keeps its chain of open directories short by moving deep ones up
(:data:`FLATTEN_DEPTH`); measuring and walking stop at an entry, depth and time cap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from activities.sandbox.base import SandboxError
from activities.sandbox.local.hostfs import DIR_FLAGS, lstat_at, open_dir

# --- removal ------------------------------------------------------------------------

FLATTEN_DEPTH = 32  # deeper directories are moved up before removal, so no chain of fds grows without bound


def remove_tree(path: Path, *, budget_s: float | None = None) -> None:
    """Delete ``path`` and everything below it, however deep or wide, whatever its permissions.

    Iterative (``shutil.rmtree`` recurses, and a workspace 1,100 directories deep made
    it raise ``RecursionError``) and fd-relative: each directory is opened from its
    parent's fd with ``O_NOFOLLOW``, and entries are unlinked with ``unlinkat``, so a
    directory swapped for a symlink by a still-running command is never followed out
    of the tree. Directories nested deeper than ``FLATTEN_DEPTH`` are renamed to the
    top of the tree first, so at most that many fds are open. A directory made
    unreadable (``chmod 000``) is made usable again. Another filesystem mounted inside
    is never entered (:class:`OSError` ``EBUSY``): unmount it first. With ``budget_s``,
    a removal still going after that long (something keeps writing into the tree)
    stops with :class:`TimeoutError`; what was removed stays removed.
    """
    try:
        root_fd = open_dir(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return  # gone, or not a directory: nothing of ours to walk
        raise
    deadline = None if budget_s is None else time.monotonic() + budget_s
    _empty_tree(root_fd, deadline, str(path))
    os.rmdir(path)


def remove_tree_at(dir_fd: int, name: str, *, deadline: float | None = None) -> None:
    """Remove the entry ``name`` of the directory ``dir_fd``, whatever it is; a directory with all below it.

    Like :func:`remove_tree`, but reached fd-relative from ``dir_fd``, so a symlink planted
    anywhere on the way to it is never followed (a symlink at ``name`` is itself unlinked).
    A filesystem mounted on ``name`` is never entered (:class:`OSError` ``EBUSY``).
    """
    try:
        child = _open_for_removal(dir_fd, name)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        _unlink_at(dir_fd, name)
        return
    if os.fstat(child).st_dev != os.fstat(dir_fd).st_dev:
        os.close(child)
        raise OSError(errno.EBUSY, "a filesystem is mounted there", name)
    _empty_tree(child, deadline, name)
    os.rmdir(name, dir_fd=dir_fd)


def _empty_tree(root_fd: int, deadline: float | None, shown: str) -> None:
    """Remove everything below the directory ``root_fd`` (closed when done); the directory itself stays."""
    device = os.fstat(root_fd).st_dev
    moved = 0
    stack = [_Frame(root_fd, "", 0)]
    try:
        while stack:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(errno.ETIMEDOUT, "removal still going at its deadline", shown)
            frame = stack[-1]
            if not frame.pending:  # (re)scan: unlink what is not a directory, list the directories
                frame.pending = _clear_files(frame.fd)
                if not frame.pending:
                    stack.pop()
                    os.close(frame.fd)
                    if stack:
                        _rmdir_at(stack[-1].fd, frame.name)
                    continue
            sub = frame.pending.pop()
            if frame.depth + 1 >= FLATTEN_DEPTH:
                moved = _move_to_top(frame.fd, sub, root_fd, moved)
                continue
            try:
                child = _open_for_removal(frame.fd, sub)
            except FileNotFoundError:
                continue
            except NotADirectoryError:  # replaced by a file or link meanwhile
                _unlink_at(frame.fd, sub)
                continue
            if os.fstat(child).st_dev != device:
                os.close(child)
                raise OSError(errno.EBUSY, "a filesystem is mounted inside the tree", sub)
            stack.append(_Frame(child, sub, frame.depth + 1))
    finally:
        for frame in stack:
            with contextlib.suppress(OSError):
                os.close(frame.fd)


@dataclass
class _Frame:
    fd: int
    name: str  # in the parent directory
    depth: int
    pending: list[str] = field(default_factory=list)  # subdirectories still to remove


def _clear_files(fd: int) -> list[str]:
    """Unlink every entry of the directory ``fd`` that is not a directory; the names of those that are."""
    with os.scandir(fd) as scan:
        entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in scan]
    subdirectories = []
    for name, is_dir in entries:
        if is_dir:
            subdirectories.append(name)
        else:
            _unlink_at(fd, name)
    return subdirectories


def _open_for_removal(parent_fd: int, name: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        _make_usable_at(parent_fd, name)
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotADirectoryError(errno.ENOTDIR, "a symlink", name) from None
        raise


def _make_usable_at(parent_fd: int, name: str) -> None:
    """``chmod 700`` the directory ``name``, never through a symlink (via an ``O_PATH`` fd checked to be one)."""
    try:
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    try:
        if stat.S_ISDIR(os.fstat(handle).st_mode):
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
    finally:
        os.close(handle)


def _unlink_at(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except IsADirectoryError:  # became a directory meanwhile: the next scan descends into it
        return
    except PermissionError:
        os.fchmod(dir_fd, 0o700)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)


def _rmdir_at(dir_fd: int, name: str) -> None:
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        # something appeared meanwhile: the parent's next scan finds it and descends again


def _move_to_top(fd: int, name: str, root_fd: int, moved: int) -> int:
    while True:
        moved += 1
        try:
            os.rename(name, f".removing-{moved}", src_dir_fd=fd, dst_dir_fd=root_fd)
            return moved
        except FileNotFoundError:
            return moved
        except PermissionError:
            os.fchmod(fd, 0o700)
            os.rename(name, f".removing-{moved}", src_dir_fd=fd, dst_dir_fd=root_fd)
            return moved
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or moved > 1_000_000:
                raise


# --- measuring (the quota when no size-capped filesystem can be mounted) --------------


@dataclass(frozen=True)
class Usage:
    """What :func:`measure_tree` found: bytes allocated, entries seen, and why it stopped early ("" if it did not)."""

    used_bytes: int
    entries: int
    incomplete: str = ""


def measure_tree(path: Path, *, max_entries: int, max_depth: int, budget_s: float) -> Usage:
    """Disk space allocated below ``path`` (``st_blocks``, hard links counted once), bounded in entries, depth and time.

    fd-relative and ``O_NOFOLLOW`` like :func:`remove_tree`; never leaves the
    filesystem of ``path``. A walk that hits a cap returns what it counted so far and
    says which cap in ``incomplete``.
    """
    count = _Count(max_entries)
    deadline = time.monotonic() + budget_s
    root_fd = open_dir(path)
    stack: list[tuple[int, list[str]]] = [(root_fd, [])]  # (fd, subdirectories still to visit)
    try:
        info = os.fstat(root_fd)
        count.device = info.st_dev
        count.used = info.st_blocks * 512
        stack[-1] = (root_fd, count.scan(root_fd))
        while stack and not count.incomplete:
            if time.monotonic() > deadline:
                count.incomplete = f"counting it took longer than {budget_s:g} s"
                break
            fd, pending = stack[-1]
            if not pending:
                stack.pop()
                os.close(fd)
                continue
            name = pending.pop()
            if len(stack) >= max_depth:
                count.incomplete = f"it is nested deeper than {max_depth} directories"
                break
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except PermissionError:
                count.incomplete = UNREADABLE
                break
            except OSError:  # removed, or replaced by something that is not a directory, meanwhile
                continue
            stack.append((child, []))  # on the stack before scanning, so that it is closed whatever happens
            stack[-1] = (child, count.scan(child))
    finally:
        for fd, _ in stack:
            with contextlib.suppress(OSError):
                os.close(fd)
    return Usage(used_bytes=count.used, entries=count.entries, incomplete=count.incomplete)


UNREADABLE = "a directory in it is unreadable (chmod it back, e.g. chmod -R u+rwX)"


class _Count:
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.device = 0
        self.used = 0
        self.entries = 0
        self.incomplete = ""
        self._linked: set[int] = set()

    def scan(self, fd: int) -> list[str]:
        """Count one directory's entries; its subdirectories (on the same filesystem) to visit."""
        subdirectories: list[str] = []
        try:
            with os.scandir(fd) as scan:
                for entry in scan:
                    self.entries += 1
                    if self.entries > self.max_entries:
                        self.incomplete = f"it holds more than {self.max_entries} files and directories"
                        break
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        if st.st_dev == self.device:
                            subdirectories.append(entry.name)
                    elif st.st_nlink > 1:
                        if st.st_ino in self._linked:
                            continue
                        self._linked.add(st.st_ino)
                    self.used += st.st_blocks * 512
        except PermissionError:
            self.incomplete = UNREADABLE
        return subdirectories


# --- walking (checkpoints: every entry of a tree, bounded) ------------------------------


class WalkLimit(SandboxError):
    """:func:`walk_tree` stopped: more entries, deeper, or slower than its caps (``cap`` says which)."""

    def __init__(self, cap: str, message: str) -> None:
        super().__init__(message)
        self.cap = cap  # "entries", "depth", "time" or "unreadable"


@dataclass(frozen=True)
class Found:
    """One entry :func:`walk_tree` found: its path below the root, its ``lstat``, and where it is.

    ``dir_fd`` (the directory holding it) is valid only until the walk goes on.
    """

    parts: tuple[str, ...]
    info: os.stat_result
    dir_fd: int
    name: str


def walk_tree(
    root_fd: int,
    *,
    max_entries: int,
    max_depth: int,
    deadline: float,
    descend: Callable[[Found], bool] | None = None,
    skip_root: frozenset[str] = frozenset(),
) -> Iterator[Found]:
    """Every entry below the directory ``root_fd``, parents before children, nothing followed.

    fd-relative and ``O_NOFOLLOW | O_NONBLOCK`` like :func:`measure_tree`; a directory on
    another filesystem is yielded but never entered, and ``descend`` may keep the walk out
    of others. Names in ``skip_root`` (e.g. ext4's ``lost+found``) are left out of the
    root's listing. Over ``max_entries`` entries, ``max_depth`` levels, past ``deadline``
    (``time.monotonic()``) or at a directory it may not read: :class:`WalkLimit`. The
    consumer may remove or replace the entry it was given; the walk then notices, never
    follows.
    """
    device = os.fstat(root_fd).st_dev
    seen = 0
    stack: list[tuple[int, tuple[str, ...], list[str]]] = []  # (fd, parts, names still to visit)

    def listing(fd: int, parts: tuple[str, ...]) -> list[str]:
        nonlocal seen
        names: list[str] = []
        try:
            with os.scandir(fd) as scan:
                for entry in scan:
                    if not parts and entry.name in skip_root:
                        continue
                    seen += 1
                    if seen > max_entries:
                        raise WalkLimit("entries", f"it holds more than {max_entries} files and directories")
                    names.append(entry.name)
        except PermissionError:
            raise WalkLimit("unreadable", UNREADABLE) from None
        names.reverse()  # popped from the end: visited in the listing's order
        return names

    try:
        stack.append((os.dup(root_fd), (), []))
        stack[-1] = (stack[-1][0], (), listing(stack[-1][0], ()))
        while stack:
            if time.monotonic() > deadline:
                raise WalkLimit("time", "walking it took too long")
            fd, parts, pending = stack[-1]
            if not pending:
                stack.pop()
                os.close(fd)
                continue
            name = pending.pop()
            info = lstat_at(fd, name)
            if info is None:
                continue  # removed meanwhile
            found = Found((*parts, name), info, fd, name)
            yield found
            if not stat.S_ISDIR(info.st_mode) or info.st_dev != device:
                continue
            if descend is not None and not descend(found):
                continue
            if len(found.parts) >= max_depth:
                raise WalkLimit("depth", f"it is nested deeper than {max_depth} directories")
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except PermissionError:
                raise WalkLimit("unreadable", UNREADABLE) from None
            except OSError:  # removed, or replaced by something that is not a directory, meanwhile
                continue
            stack.append((child, found.parts, []))  # on the stack before listing, so that it is closed
            if os.fstat(child).st_dev != device:
                continue
            stack[-1] = (child, found.parts, listing(child, found.parts))
    finally:
        for fd, _, _ in stack:
            with contextlib.suppress(OSError):
                os.close(fd)
