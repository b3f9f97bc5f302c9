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

Whole trees (removing, measuring and walking one) are :mod:`activities.sandbox.local.trees`.
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


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
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
            info = lstat_at(dir_fd, part)
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
    existing = lstat_at(dir_fd, name)
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
    info = lstat_at(dir_fd, name)
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
