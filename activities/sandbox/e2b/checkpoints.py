"""Workspace checkpoints on the E2B backend (:class:`activities.sandbox.checkpointable.Checkpointable`).

"Archive out, archive in": the VM is remote, so nothing is read or written file by file.

* ``scan_workspace``: one ``find -printf`` in the VM writes a NUL-separated listing to a staging
  file under ``/tmp``, downloaded as bytes (command output reaches us decoded as text, which would
  mangle names) with a size bound, then parsed defensively: the VM is hostile.
* ``read_workspace_files``: the requested paths go up as a NUL-separated list, ``tar`` in the VM
  archives exactly them (``--no-recursion``, links not followed), the archive comes down (its size
  checked before and while downloading) and is read in memory: only regular-file members whose
  names were asked for are taken; nothing is ever extracted to the worker's disk.
* ``apply_workspace``: a tar built in memory (directories, files with their modes, inside symlinks
  last) and the lists of what to keep go up; one script removes everything else, sets the kept
  files' modes and extracts the archive.
* The marker is a JSON file in the VM outside the workspace (:data:`MARKER_PATH`).
* Names are bytes throughout (the listing, the NUL lists, the archives): one that is not valid
  UTF-8 is its ``surrogateescape`` decoding in memory, like the local backend's (see
  :mod:`activities.sandbox.checkpointable`), so it is checkpointed and restored like any other.

Every script runs as the VM's default user (the one the model's commands run as, so restored files
stay the model's) with an empty environment, and starts with ``set -e`` (the fake E2B runs such
scripts with a real ``bash``). A missing VM raises :class:`SandboxMissing`; SDK failures are
translated by the backend (``SandboxTransient`` etc.); a script that fails raises
:class:`CheckpointError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import shlex
import tarfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import e2b
from pydantic import ValidationError

from activities.sandbox.base import WORKSPACE, SandboxError, SandboxTransient
from activities.sandbox.checkpointable import (
    MAX_MARKER_BYTES,
    MAX_PATH_CHARS,
    CheckpointError,
    CheckpointMarker,
    CheckpointTooLarge,
    ManifestEntry,
    ScanEntry,
    link_stays_inside,
    safe_relative,
)
from activities.settings import E2BConfig

T = TypeVar("T")

# In the VM but outside the workspace. Unlike the local backend's, this marker is as forgeable as the
# workspace itself (anything the model runs can rewrite it) — but only in the run's own sandbox. So its
# checkpoint id is only ever trusted to *skip* a restore (the run's own workspace claiming to be what the
# workflow expects), and its stamps/hashes only to skip re-reading files; nothing is ever read on its say
# but blobs of the run store, by the ids the workflow itself recorded.
MARKER_PATH = "/home/user/.durable-agents/checkpoint.json"
STAGING_PREFIX = "/tmp/.da-ckpt-"
SCRIPT_TIMEOUT_S = 600  # one scan, archive or extraction of a whole workspace
SCRIPT_OUTPUT_BYTES = 64 * 1024  # what a checkpoint script may print (kept for its error message)
SCRIPT_DRAIN_BYTES = 1024 * 1024  # printing more than this gets the script killed
SCAN_RECORD_BYTES = 160 + 2 * MAX_PATH_CHARS  # one find record at most (fields, link text, name)
MAX_SCAN_BYTES = 64 * 1024 * 1024  # a listing over this is refused whatever max_entries says
TAR_SLACK_BYTES = 20 * 1024  # end-of-archive blocks and the blocking factor
# find's fields per entry: type, permission bits (octal), size, mtime, ctime, inode, link text, path
FIND_FORMAT = r"%y\0%m\0%s\0%T@\0%C@\0%i\0%l\0%P\0"
FIELDS = 8
_NUMBER = re.compile(rb"[0-9]{1,20}")
_TIME = re.compile(rb"-?[0-9]{1,20}(\.[0-9]{1,12})?")
_OCTAL = re.compile(rb"[0-7]{1,6}")
_KINDS = {b"f": "file", b"d": "dir", b"l": "symlink"}  # p, s, c, b, D (and unknowns) are skipped


class _Backend(Protocol):
    config: E2BConfig

    async def sdk_call(self, what: str, awaitable: Awaitable[T]) -> T: ...


class _NotThere(CheckpointError):
    """A file the checkpoint code expected in the VM is missing (or is not a regular file)."""


class _Bounded:
    """Keeps the first ``SCRIPT_OUTPUT_BYTES`` of a stream; sets ``flooded`` past ``SCRIPT_DRAIN_BYTES``."""

    def __init__(self, flooded: asyncio.Event) -> None:
        self.flooded = flooded
        self.data = bytearray()
        self.total = 0

    def feed(self, chunk: str) -> None:
        raw = chunk.encode("utf-8", errors="replace")
        self.total += len(raw)
        self.data += raw[: max(0, SCRIPT_OUTPUT_BYTES - len(self.data))]
        if self.total > SCRIPT_DRAIN_BYTES:
            self.flooded.set()

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", errors="replace")


def _too_large(what: str, size: int, max_bytes: int) -> CheckpointTooLarge:
    return CheckpointTooLarge(
        f"{what} is {size / 1e6:.1f} MB, over the checkpoint limit of {max_bytes / 1e6:.1f} MB "
        "(AGENT_CHECKPOINT_MAX_MB); this step was not checkpointed: delete files you do not need"
    )


def parse_scan(data: bytes, *, max_entries: int) -> list[ScanEntry]:
    """Entries of a ``find -printf FIND_FORMAT`` listing; hostile input: refused when malformed.

    Names are decoded with ``surrogateescape`` (any bytes). Records with a name that is not a clean
    relative path, FIFOs, sockets, devices and symlinks whose text resolves outside the workspace are
    skipped (never stored, never restored).
    """
    if not data:
        return []
    if not data.endswith(b"\0"):
        raise CheckpointError("the sandbox's workspace listing is malformed (truncated record)")
    parts = data[:-1].split(b"\0")
    if len(parts) % FIELDS:
        raise CheckpointError("the sandbox's workspace listing is malformed (wrong number of fields)")
    entries: list[ScanEntry] = []
    for at in range(0, len(parts), FIELDS):
        kind_b, mode_b, size_b, mtime_b, ctime_b, ino_b, link_b, name_b = parts[at : at + FIELDS]
        if not (
            len(kind_b) == 1
            and _OCTAL.fullmatch(mode_b)
            and _NUMBER.fullmatch(size_b)
            and _TIME.fullmatch(mtime_b)
            and _TIME.fullmatch(ctime_b)
            and _NUMBER.fullmatch(ino_b)
        ):
            raise CheckpointError(f"the sandbox's workspace listing is malformed (record {at // FIELDS})")
        kind = _KINDS.get(kind_b)
        mode = int(mode_b, 8)
        if kind is None or mode > 0o7777:
            continue
        path = name_b.decode("utf-8", "surrogateescape")
        target = link_b.decode("utf-8", "surrogateescape")
        if not safe_relative(path):
            continue
        if kind == "symlink":
            if not link_stays_inside(path, target):
                continue
        else:
            target = ""
        if len(entries) >= max_entries:
            raise CheckpointTooLarge(
                f"the workspace holds more than {max_entries} entries; this step was not checkpointed"
            )
        size = int(size_b) if kind == "file" else 0
        stamp = b":".join((size_b, mtime_b, ctime_b, ino_b)).decode()
        entries.append(ScanEntry(path=path, kind=kind, mode=mode, size=size, target=target, stamp=stamp))
    return entries


def extract_files(archive: bytes, wanted: set[str], *, max_bytes: int) -> dict[str, bytes]:
    """The regular-file members of ``archive`` named in ``wanted``, read in memory.

    The archive comes from the VM: links, devices, directories, absolute or ``..`` names and
    anything not asked for are ignored; contents over ``max_bytes`` in total are refused.
    """
    found: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:", encoding="utf-8", errors="surrogateescape") as tar:
            for member in tar:
                if not member.isreg() or member.name not in wanted or not safe_relative(member.name):
                    continue
                total += member.size
                if total > max_bytes:
                    raise _too_large("the files to checkpoint", total, max_bytes)
                stream = tar.extractfile(member)
                if stream is None:
                    continue
                data = stream.read(member.size + 1)
                if len(data) != member.size:
                    raise CheckpointError(f"the sandbox's archive is malformed (member {member.name!r} is short)")
                found[member.name] = data
    except (tarfile.TarError, EOFError, ValueError, OSError) as exc:
        raise CheckpointError(f"the sandbox's archive of the workspace is malformed: {exc}") from None
    return found


def build_archive(entries: list[ManifestEntry], contents: dict[str, bytes], keep: set[str]) -> bytes:
    """A tar of ``entries`` (kept files left out): directories first, then files, then symlinks."""
    buffer = io.BytesIO()
    now = int(time.time())
    order = {"dir": 0, "file": 1, "symlink": 2}
    # PAX: a name that is not UTF-8 goes as its raw bytes (hdrcharset=BINARY), which GNU tar extracts as such
    with tarfile.open(
        fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for entry in sorted(entries, key=lambda e: (order[e.kind], e.path)):
            if not safe_relative(entry.path):
                raise CheckpointError(f"not a workspace path: {entry.path[:200]!r}")
            info = tarfile.TarInfo(entry.path)
            info.mode, info.mtime = entry.mode, now
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                if not link_stays_inside(entry.path, entry.target):
                    continue  # never restore a link that points out
                info.type, info.linkname = tarfile.SYMTYPE, entry.target
                tar.addfile(info)
            elif entry.path not in keep:
                data = contents.get(entry.hash)
                if data is None:
                    raise CheckpointError(f"no content for {entry.path!r} ({entry.hash})")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _nul_list(items: list[str] | set[str]) -> bytes:
    return b"".join(_raw(item) + b"\0" for item in sorted(items))


def _raw(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


class E2BCheckpoints:
    """The :class:`Checkpointable` half of :class:`activities.sandbox.e2b.backend.E2BSandbox` (mixed into it)."""

    _vm: Any
    _backend: _Backend

    async def _wait(self, handle: Any, flooded: asyncio.Event) -> tuple[int, bool, bool]:
        raise NotImplementedError  # E2BSandbox's

    # --- plumbing ---------------------------------------------------------------------

    async def _script(self, what: str, script: str) -> str:
        """Run a ``set -e`` script in the VM; its (bounded) stdout, :class:`CheckpointError` if it fails."""
        flooded = asyncio.Event()
        out, err = _Bounded(flooded), _Bounded(flooded)
        handle = await self._backend.sdk_call(
            what,
            self._vm.commands.run(
                script,
                background=True,
                envs={},  # never the worker's environment
                on_stdout=out.feed,
                on_stderr=err.feed,
                timeout=SCRIPT_TIMEOUT_S,
                retain_output=False,
            ),
        )
        exit_code, flooding, timed_out = await self._wait(handle, flooded)
        if flooding or timed_out or exit_code != 0:
            why = "printed too much" if flooding else "timed out" if timed_out else f"exit {exit_code}"
            raise CheckpointError(f"{what} failed in the sandbox ({why}): {err.text()[-2000:].strip()}")
        return out.text()

    async def _cleanup(self, stage: str) -> None:
        with contextlib.suppress(SandboxError, SandboxTransient):
            await self._script("checkpoint cleanup", f"set -e\nrm -rf -- {shlex.quote(stage)}\n")

    async def _upload(self, path: str, data: bytes) -> None:
        await self._backend.sdk_call(f"upload {path}", self._vm.files.write(path, data))

    async def _download(self, path: str, cap: int, too_large: Callable[[int], Exception]) -> bytes:
        """The bytes of the VM's regular file ``path``; ``too_large(size)`` is raised past ``cap``
        (checked against the file's size first, then while the bytes arrive: the VM may lie or grow it).
        :class:`_NotThere` when there is no such file."""

        async def fetch() -> bytes:
            try:
                info = await self._vm.files.get_info(path)
                if info.type != e2b.FileType.FILE:
                    raise _NotThere(f"{path} in the sandbox is not a regular file")
                if info.size > cap:
                    raise too_large(int(info.size))
                reader = await self._vm.files.read(path, format="stream")
            except e2b.FileNotFoundException:
                raise _NotThere(f"no {path} in the sandbox") from None
            data = bytearray()
            try:
                async for chunk in reader:
                    data += chunk
                    if len(data) > cap:
                        raise too_large(len(data))
            finally:
                await reader.aclose()
            return bytes(data)

        return await self._backend.sdk_call(f"download {path}", fetch())

    # --- Checkpointable ---------------------------------------------------------------

    async def scan_workspace(self, *, max_entries: int) -> list[ScanEntry]:
        stage = f"{STAGING_PREFIX}{uuid.uuid4().hex}"
        listing = f"{stage}/scan"
        script = (
            "set -e\n"
            f"mkdir -p -m 700 {shlex.quote(stage)}\n"
            # -xdev: never into another filesystem mounted below the workspace; errors (an unreadable
            # directory) leave that part out rather than failing the checkpoint
            f"find {WORKSPACE} -xdev -mindepth 1 -printf '{FIND_FORMAT}' > {shlex.quote(listing)} 2>/dev/null || true\n"
        )
        cap = min(MAX_SCAN_BYTES, max(1, max_entries) * SCAN_RECORD_BYTES)
        try:
            await self._script("workspace scan", script)
            data = await self._download(
                listing,
                cap,
                lambda size: CheckpointTooLarge(
                    f"the workspace listing is {size} bytes (over {cap}): too many entries to checkpoint"
                ),
            )
        finally:
            await self._cleanup(stage)
        return parse_scan(data, max_entries=max_entries)

    async def read_workspace_files(self, paths: list[str], *, max_bytes: int) -> dict[str, bytes]:
        wanted = sorted({p for p in paths if safe_relative(p)})
        if not wanted:
            return {}
        stage = f"{STAGING_PREFIX}{uuid.uuid4().hex}"
        names, archive = f"{stage}/list", f"{stage}/out.tar"
        # per member: a header, a long-name (or pax) header and its blocks, the content's padding
        cap = max_bytes + TAR_SLACK_BYTES + sum(2048 + len(_raw(p)) for p in wanted)
        script = (
            "set -e\n"
            f"cd {WORKSPACE}\n"
            # --verbatim-files-from: a listed name starting with '-' is a name, never an option;
            # --ignore-failed-read: a file gone or unreadable is left out; exit 1 = one changed while read
            "tar --null --verbatim-files-from --no-recursion --ignore-failed-read "
            f"-cf {shlex.quote(archive)} -T {shlex.quote(names)} 2>/dev/null || test $? -eq 1\n"
        )
        try:
            await self._upload(names, _nul_list(wanted))
            await self._script("workspace archive", script)
            data = await self._download(
                archive, cap, lambda size: _too_large("the files to checkpoint", size, max_bytes)
            )
        finally:
            await self._cleanup(stage)
        return extract_files(data, set(wanted), max_bytes=max_bytes)

    async def apply_workspace(
        self, entries: list[ManifestEntry], contents: dict[str, bytes], *, keep: set[str]
    ) -> None:
        files = {e.path for e in entries if e.kind == "file"}
        keep = keep & files
        dirs = {e.path for e in entries if e.kind == "dir"}
        for path in keep:  # a kept file's parents stay whatever the manifest says
            parts = path.split("/")[:-1]
            dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        modes = b"".join(
            f"{e.mode:o}".encode() + b"\0" + _raw(e.path) + b"\0"
            for e in sorted(entries, key=lambda e: e.path)
            if e.path in keep
        )
        stage = f"{STAGING_PREFIX}{uuid.uuid4().hex}"
        q = {name: shlex.quote(f"{stage}/{name}") for name in ("in.tar", "keep", "dirs", "modes", "keep.s", "dirs.s")}
        script = (
            "set -e\n"
            "export LC_ALL=C\n"
            f"cd {WORKSPACE}\n"
            # what cannot be entered or emptied is opened first (tar sets the directories' modes again)
            "find . -xdev -mindepth 1 -type d ! -perm -u=rwx -exec chmod u+rwx {} \\;\n"
            f"sort -z -u {q['keep']} > {q['keep.s']}\n"
            f"sort -z -u {q['dirs']} > {q['dirs.s']}\n"
            # everything but a kept file and a directory that stays a directory goes
            f"find . -xdev -mindepth 1 ! -type d -printf '%P\\0' | sort -z | comm -z -23 - {q['keep.s']} "
            "| xargs -0 -r rm -f --\n"
            f"find . -xdev -mindepth 1 -type d -printf '%P\\0' | sort -z | comm -z -23 - {q['dirs.s']} "
            "| xargs -0 -r rm -rf --\n"
            f"xargs -0 -r -n 2 chmod -- < {q['modes']}\n"
            f"tar -x -p --no-same-owner -f {q['in.tar']} -C {WORKSPACE}\n"
        )
        try:
            await self._upload(f"{stage}/in.tar", build_archive(entries, contents, keep))
            await self._upload(f"{stage}/keep", _nul_list(keep))
            await self._upload(f"{stage}/dirs", _nul_list(dirs))
            await self._upload(f"{stage}/modes", modes)
            await self._script("workspace restore", script)
        finally:
            await self._cleanup(stage)

    async def checkpoint_marker(self) -> CheckpointMarker | None:
        try:
            data = await self._download(MARKER_PATH, MAX_MARKER_BYTES, lambda size: _NotThere("marker too large"))
        except _NotThere:
            return None  # none, not a regular file, or too large: as good as none
        try:
            return CheckpointMarker.model_validate_json(data)
        except (ValidationError, ValueError):
            return None

    async def set_checkpoint_marker(self, marker: CheckpointMarker) -> None:
        data = json.dumps(marker.model_dump(), separators=(",", ":")).encode()
        await self._upload(MARKER_PATH, data)
