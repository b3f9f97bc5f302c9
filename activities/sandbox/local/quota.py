"""The workspace quota (``AGENT_SANDBOX_DISK_MB``): a size-capped filesystem when the worker can mount one.

Two mechanisms, chosen per backend by :func:`detect` and recorded per sandbox in its
``meta.json`` (``"quota"``):

``loop`` (a root worker with ``mkfs.ext4``, ``mount`` and loop devices)
    Each sandbox's workspace is an ext4 filesystem in a sparse image file of exactly
    ``disk_mb`` MiB (``<sandbox>/workspace.ext4``, root-only, outside the sandbox's
    view), loop-mounted ``nosuid,nodev`` on ``<sandbox>/workspace``. The kernel
    enforces the quota: a write past it fails with ``ENOSPC`` at once, the image can
    never take more than ``disk_mb`` of the host's disk, the number of files is
    bounded by the image's inodes, and removal is an unmount and one unlink (no tree
    walk). Inside the sandbox, ``/proc/self/mountinfo`` then shows the workspace as
    ``/`` of ``/dev/loopN``, not as a host path. The filesystem's own metadata
    (journal, inode tables) takes about 5 % of the image, so a little less than
    ``disk_mb`` is free for files.

    Why not tmpfs: a tmpfs lives in RAM (and swap), so every sandbox's full quota
    (1 GiB by default) would be memory a handful of hostile runs could take from the
    worker's host, and a tmpfs workspace would vanish on a reboot while a loop image
    persists like the plain directory did.

``measured`` (everything else: a non-root worker, no loop devices, mount refused)
    The workspace stays a plain directory. Its usage (``st_blocks``, hard links once)
    is counted by a bounded walk (at most ``MAX_ENTRIES`` entries, ``MAX_DEPTH``
    levels, ``MEASURE_BUDGET_S``) before a command starts (its ``RLIMIT_FSIZE`` is
    lowered to what is left of the quota, at least 1 MiB, so one file cannot overshoot),
    while it runs (every ``MONITOR_MIN_S``, or 10 times the last walk's duration if
    longer; a command that takes the workspace past the quota is killed), after it
    ends (the command fails with a message naming the quota) and before every
    ``write_file`` (refused if it would pass the quota). A command writing many
    files can still overshoot by what it writes between two checks; a workspace too
    big to count (more entries, deeper, slower than the caps) counts as over.
    Deleting files makes the sandbox usable again.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from activities.sandbox.base import SandboxError
from activities.sandbox.local.hostfs import CREATE_FLAGS
from activities.sandbox.local.trees import Usage

log = logging.getLogger(__name__)

LOOP = "loop"
MEASURED = "measured"
MECHANISMS = (LOOP, MEASURED)
IMAGE = "workspace.ext4"
MIB = 1024 * 1024
TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
TOOL_TIMEOUT_S = 20.0

# measured mode: the walk's caps, and how often a running command's workspace is counted
MAX_ENTRIES = 100_000
MAX_DEPTH = 64
MEASURE_BUDGET_S = 5.0
MONITOR_MIN_S = 0.05  # and at least 10 x the last walk's duration, so that big workspaces are walked rarely
FULL_BYTES = MIB  # loop mode: less free than this and the command's result says the workspace is full

QUOTA_VARIABLE = "AGENT_SANDBOX_DISK_MB"

_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_umount2 = _libc.umount2
_umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


@dataclass(frozen=True)
class LoopTools:
    mkfs: str
    mount: str


def detect() -> tuple[str, str, LoopTools | None]:
    """``(mechanism, why, tools)``: ``loop`` when this worker can loop-mount ext4 images, else ``measured``."""
    if os.geteuid() != 0:
        return MEASURED, "the worker is not root, so it cannot mount a size-capped filesystem", None
    mkfs = shutil.which("mkfs.ext4", path=TOOL_PATH)
    mount = shutil.which("mount", path=TOOL_PATH)
    if mkfs is None or mount is None:
        return MEASURED, "mkfs.ext4 or mount is missing (apt-get install e2fsprogs mount)", None
    if not os.path.exists("/dev/loop-control"):
        return MEASURED, "the host has no loop devices (/dev/loop-control is missing)", None
    return LOOP, "a loop-mounted ext4 image per sandbox", LoopTools(mkfs, mount)


def _tool(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(
            argv,
            env={"PATH": TOOL_PATH, "LC_ALL": "C"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TOOL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"{what} failed: {exc}") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).decode(errors="replace").strip()[:300]
        raise SandboxError(f"{what} failed (exit {done.returncode}): {detail}")


def make_image(image: Path, size_mb: int, tools: LoopTools) -> None:
    """A sparse file of ``size_mb`` MiB with an empty ext4 filesystem in it (root-only, ``0600``)."""
    fd = os.open(image, CREATE_FLAGS, 0o600)
    try:
        os.ftruncate(fd, size_mb * MIB)
    finally:
        os.close(fd)
    try:
        _tool(
            [tools.mkfs, "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image)],
            "mkfs.ext4 of the workspace image",
        )
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(image)
        raise


def mount_image(image: Path, mountpoint: Path, tools: LoopTools) -> None:
    _tool(
        [tools.mount, "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", str(image), str(mountpoint)],
        "mounting the workspace image",
    )


def is_mounted(path: Path) -> bool:
    """Whether another filesystem is mounted on ``path`` (its device differs from its parent's)."""
    try:
        here = os.lstat(path)
        parent = os.lstat(path.parent)
    except OSError:
        return False
    return here.st_dev != parent.st_dev


def unmount(path: Path) -> None:
    """Detach whatever is mounted on ``path`` (lazily: processes still dying in it cannot make it fail).

    The loop device is released (``autoclear``) once the last user of the filesystem is gone.
    """
    for _ in range(8):  # in case it was mounted more than once
        if not is_mounted(path):
            return
        if _umount2(os.fsencode(path), _MNT_DETACH) != 0:
            code = ctypes.get_errno()
            if code == errno.EINVAL:  # not a mount point (any more)
                return
            raise SandboxError(f"cannot unmount the workspace {path}: {os.strerror(code)}")
    if is_mounted(path):
        raise SandboxError(f"cannot unmount the workspace {path}: still mounted")


def _unescape(field: str) -> str:
    """A mountinfo path field (spaces, tabs, newlines and backslashes are written as octal escapes)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def unmount_under(root: Path) -> list[str]:
    """Detach every workspace mounted below ``root``; the mount points it detached.

    For test sessions and operators cleaning up a state directory they are about to
    delete: sandboxes that were never killed keep their loop-mounted workspace (by
    design, so that they survive a worker restart), and a plain ``rm -r`` cannot
    remove a mount point.
    """
    prefix = str(Path(root).absolute()).rstrip("/") + "/"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            points = [_unescape(line.split()[4]) for line in fh if len(line.split()) > 4]
    except OSError:
        return []
    detached = []
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        with contextlib.suppress(SandboxError):
            unmount(Path(point))
            detached.append(point)
    return detached


def full_note(workspace: Path, disk_mb: int) -> str:
    """Loop mode: a line for the command's result when the workspace is (nearly) full, else ""."""
    try:
        info = os.statvfs(workspace)
    except OSError:
        return ""
    free = info.f_bavail * info.f_frsize
    if info.f_favail == 0:
        return (
            f"\n[sandbox] the workspace has no inodes left (its quota is {disk_mb} MiB, {QUOTA_VARIABLE}): "
            "creating files fails with 'No space left on device'; delete files to continue"
        )
    if free < FULL_BYTES:
        return (
            f"\n[sandbox] the workspace is full ({free // 1024} KiB left of its {disk_mb} MiB quota, "
            f"{QUOTA_VARIABLE}): writes fail with 'No space left on device'; delete files to continue"
        )
    return ""


def left_mb(usage: Usage, disk_mb: int) -> int:
    """Measured mode: whole MiB left of the quota (at least 1, so that a command can still write a little)."""
    if usage.incomplete:
        return 1
    return max(1, (disk_mb * MIB - usage.used_bytes) // MIB)


def over_quota(usage: Usage, disk_mb: int) -> str:
    """Measured mode: why ``usage`` is over the quota, or ""."""
    if usage.incomplete:
        return f"the workspace quota ({disk_mb} MiB, {QUOTA_VARIABLE}) cannot be checked: {usage.incomplete}"
    if usage.used_bytes > disk_mb * MIB:
        return (
            f"the workspace holds {usage.used_bytes / MIB:.1f} MiB, over its quota of {disk_mb} MiB ({QUOTA_VARIABLE})"
        )
    return ""


__all__ = [
    "IMAGE",
    "LOOP",
    "MEASURED",
    "MECHANISMS",
    "LoopTools",
    "detect",
    "full_note",
    "is_mounted",
    "left_mb",
    "make_image",
    "mount_image",
    "over_quota",
    "unmount",
    "unmount_under",
]
