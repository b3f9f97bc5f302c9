"""Host-side access to a sandbox's workspace that never blocks, never follows a planted name, and has a deadline.

Everything in a workspace belongs to the sandboxed code, which may put a FIFO, a
symlink, a socket or a deep tree wherever the worker will look next. The worker's
own file access therefore:

* opens every path component relative to the previous one's directory fd with
  ``O_NOFOLLOW | O_DIRECTORY | O_NONBLOCK`` (a symlink or FIFO swapped in for a
  directory is refused, never followed or waited on);
* opens files with ``O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC`` after an ``lstat``, and
  ``fstat``\\ s the fd: anything but a regular file is refused (opening a FIFO
  without ``O_NONBLOCK`` blocks until a writer appears, i.e. forever);
* creates or replaces a file by writing a fresh ``O_EXCL`` temporary name in the
  target's directory and renaming it over the target, so nothing planted at the
  target's name is ever opened;
* runs on a bounded executor of its own (:class:`HostExecutor`), never on asyncio's
  default one (which the run store shares), with a deadline on every operation.

Tree walks (:func:`remove_tree`, :func:`remove_tree_at`, :func:`measure_tree`,
:func:`walk_tree`) use the same fd-relative opens, never cross into another
filesystem, and are bounded (depth kept short by renaming; entry, depth and time caps
for measuring and walking).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from activities.sandbox.base import SandboxError

T = TypeVar("T")

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class HostExecutor:
    """A bounded thread pool for blocking host work, and a deadline on each piece of it.

    asyncio's default executor is small (``min(32, cpus + 4)`` threads) and shared
    with everything else the worker does (the SQLite run store among it): six
    workspace FIFOs once froze all of it. A timed-out call raises
    :class:`SandboxError`; its thread runs on to its own end (every operation here is
    non-blocking and bounded, so that end comes) and never holds a thread of anyone else.
    """

    def __init__(self, name: str, threads: int) -> None:
        self.threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def run(self, what: str, timeout_s: float, fn: Callable[[], T]) -> T:
        future = asyncio.get_running_loop().run_in_executor(self._pool, fn)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise SandboxError(f"{what} timed out after {timeout_s:g} s; try again") from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def describe(mode: int) -> str:
    """What a non-regular file is, for the model ("a FIFO (named pipe)")."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_dir(path: str | Path) -> int:
    """An fd on the directory ``path`` itself (its last component is not followed if it is a symlink)."""
    return os.open(path, DIR_FLAGS)


def _open_component(dir_fd: int, part: str, shown: str) -> int:
    try:
        return os.open(part, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            info = _lstat_at(dir_fd, part)
            what = describe(info.st_mode) if info else "gone"
            raise SandboxError(f"{shown!r}: {part!r} is {what}, not a directory; refused") from None
        if exc.errno == errno.ENOENT:
            raise
        raise SandboxError(f"cannot open {shown!r}: {exc.strerror}") from None


def walk(
    root_fd: int,
    parts: Sequence[str],
    shown: str,
    *,
    create: bool = False,
    owner: tuple[int, int] | None = None,
) -> int:
    """An fd on the directory ``root/parts...``, every component opened without following or blocking.

    With ``create``, missing directories are made (``0755``, then given to ``owner``).
    :class:`FileNotFoundError` when a component is missing and ``create`` is off.
    """
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                nxt = _open_component(fd, part, shown)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise SandboxError(f"cannot create the directories for {shown!r}: {exc.strerror}") from None
                else:
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
                try:
                    nxt = _open_component(fd, part, shown)
                except FileNotFoundError:
                    raise SandboxError(f"{shown!r}: {part!r} vanished while it was being created") from None
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_at(dir_fd: int, name: str, content: bytes, shown: str, *, owner: tuple[int, int] | None = None) -> None:
    """Create or replace the regular file ``name`` in ``dir_fd`` with ``content`` (temp file + rename).

    A directory, FIFO, socket, device or symlink at ``name`` is refused; one swapped in
    after that check is replaced by the rename, never opened. An existing file's
    permission bits (not setuid/setgid) are kept.
    """
    existing = _lstat_at(dir_fd, name)
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        if stat.S_ISDIR(existing.st_mode):
            raise SandboxError(f"{shown!r} is a directory")
        raise SandboxError(
            f"{shown!r} is {describe(existing.st_mode)}, not a regular file; write_file refuses to replace it "
            "(remove it first)"
        )
    tmp = temp_name(name)
    create_file_at(
        dir_fd, tmp, content, owner=owner, mode=None if existing is None else stat.S_IMODE(existing.st_mode) & 0o777
    )
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def temp_name(name: str) -> str:
    """A fresh hidden name beside ``name``, to write under and then rename over it."""
    return f".{name[:200]}.{secrets.token_hex(6)}.tmp"


def create_file_at(
    dir_fd: int, name: str, content: bytes, *, owner: tuple[int, int] | None = None, mode: int | None = None
) -> None:
    """Write ``content`` to the new file ``name`` in ``dir_fd`` (never following a symlink), removed again on failure.

    ``mode`` given: created private, then set to exactly ``mode``; else created 0644 under the umask.
    """
    fd = os.open(name, CREATE_FLAGS, 0o644 if mode is None else 0o600, dir_fd=dir_fd)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        if mode is not None:
            os.fchmod(fd, mode)
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)


class TooLarge(SandboxError):
    """The file is over the caller's size cap."""

    def __init__(self, shown: str, size: int) -> None:
        super().__init__(f"{shown!r} is {size} bytes")
        self.size = size


def read_at(dir_fd: int, name: str, shown: str, *, max_bytes: int) -> bytes:
    """The bytes of the regular file ``name`` in ``dir_fd``; :class:`TooLarge` past ``max_bytes``.

    :class:`FileNotFoundError` when it does not exist; anything but a regular file is refused.
    """
    info = _lstat_at(dir_fd, name)
    if info is None:
        raise FileNotFoundError(errno.ENOENT, "no such file", shown)
    if not stat.S_ISREG(info.st_mode):
        raise SandboxError(f"{shown!r} is {describe(info.st_mode)}, not a regular file; refused")
    if info.st_size > max_bytes:
        raise TooLarge(shown, info.st_size)
    fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
            raise SandboxError(f"{shown!r} was replaced while it was being read; refused")
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1024 * 1024, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > max_bytes:  # grew while we read it
        raise TooLarge(shown, total)
    return b"".join(chunks)


def read_small(path: Path, max_bytes: int = 1024 * 1024) -> bytes | None:
    """A small regular file of the worker's own (``meta.json``): ``None`` if missing, not regular or too big."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return None
        return os.read(fd, max_bytes + 1)[:max_bytes]
    except OSError:
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(fd: int, what: str, timeout_s: float) -> Iterator[None]:
    """``flock`` on ``fd`` (a sandbox's directory), polled without blocking, for at most ``timeout_s``.

    flock locks belong to the open file description, so this serialises threads of
    one worker as well as worker processes sharing a state directory.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise SandboxError(f"{what} is busy (being created or removed elsewhere); try again") from None
            time.sleep(0.01)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


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
            info = _lstat_at(fd, name)
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


def chmod_at(dir_fd: int, name: str, mode: int, *, kind: int) -> bool:
    """``chmod`` the entry ``name`` of ``dir_fd`` if it is of ``kind`` (``stat.S_IFREG``, ``S_IFDIR``).

    Through an ``O_PATH | O_NOFOLLOW`` fd checked with ``fstat``, so never through a
    symlink and without opening (a FIFO cannot block it). ``False`` when it is gone or
    not of that kind.
    """
    try:
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    try:
        info = os.fstat(handle)
        if stat.S_IFMT(info.st_mode) != kind:
            return False
        if stat.S_IMODE(info.st_mode) != mode:  # (a chmod changes the ctime even when the mode stays)
            os.chmod(f"/proc/self/fd/{handle}", mode)
        return True
    finally:
        os.close(handle)


__all__ = [
    "FLATTEN_DEPTH",
    "Found",
    "HostExecutor",
    "TooLarge",
    "Usage",
    "WalkLimit",
    "chmod_at",
    "describe",
    "locked",
    "measure_tree",
    "open_dir",
    "read_at",
    "read_small",
    "remove_tree",
    "remove_tree_at",
    "walk",
    "walk_tree",
    "write_at",
]
