"""What a workspace checkpoint is, and what a sandbox backend implements so that its workspace can be checkpointed.

A checkpoint is a manifest of path → (kind, mode, size, content hash), content-addressed. A backend
implements :class:`Checkpointable` and raises :class:`CheckpointError` / :class:`CheckpointTooLarge`;
:mod:`activities.checkpoints.engine`, above the sandbox layer, takes and restores checkpoints through it.

A checkpoint's id is the run store digest of its canonical manifest, so two identical workspaces
have the same id and a step that changed nothing makes no new checkpoint. File contents are blobs
of their own, stored once by hash: a step that changed one file stores one blob and one manifest.

What backends scan is a :class:`ScanEntry`: the manifest's fields plus a ``stamp`` (size, mtime,
ctime, inode as the backend sees them) that says whether a file may have changed since the last
checkpoint. Stamps are local to one sandbox and never part of a checkpoint's id; they live in the
sandbox's :class:`CheckpointMarker` next to the id of the checkpoint the workspace holds.

Only regular files, directories and symlinks whose target stays inside the workspace are stored;
devices, sockets, FIFOs and links that point out are left out (and never restored).

Names are bytes on disk and need not be UTF-8 (``b"caf\\xe9.txt"``). In memory a path is the
``surrogateescape`` decoding of its bytes (what ``os`` gives for such a name); on the wire (the
encoded manifest, the marker's JSON) a path that is not valid UTF-8 is written as
``/b64/<urlsafe base64 of its bytes>``: a leading ``/`` never starts a workspace-relative path, so
the two forms cannot be confused, and a manifest of UTF-8 names encodes exactly as before (old
manifests read as they are, and keep their ids).
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import PurePosixPath
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field, field_serializer, field_validator

from activities.sandbox.base import SandboxError

EntryKind = Literal["file", "dir", "symlink"]
MAX_ENTRIES = 100_000  # of one workspace: a tree of more is refused, not stored in part
MAX_PATH_CHARS = 4096
MAX_MARKER_BYTES = 32 * 1024 * 1024  # a marker file read back from a sandbox (hostile in a remote VM)
RAW_PREFIX = "/b64/"  # a name that is not valid UTF-8, on the wire (see the module)


def name_bytes(name: str) -> bytes | None:
    """The bytes of an in-memory name (``surrogateescape``), None for a str no name decodes to."""
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate outside U+DC80..U+DCFF
        return None


def to_wire(name: str) -> str:
    """``name`` as JSON can carry it: itself when it is valid UTF-8, else ``RAW_PREFIX`` + base64 of its bytes."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        raw = name_bytes(name)
        if raw is None:
            raise ValueError(f"not a file name: {name[:200]!r}") from None
        return RAW_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii")


def from_wire(value: Any) -> Any:
    """The in-memory form of a wire name (anything else is returned as it is, for validation to judge)."""
    if not isinstance(value, str) or not value.startswith(RAW_PREFIX):
        return value
    try:
        raw = base64.b64decode(value[len(RAW_PREFIX) :].encode("ascii"), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise ValueError(f"not a base64 file name: {value[:200]!r}") from None
    return raw.decode("utf-8", "surrogateescape")


class ManifestEntry(BaseModel):
    path: str  # relative to the workspace, POSIX, no "." or ".." parts
    kind: EntryKind
    mode: int = Field(ge=0, le=0o7777)  # permission bits only
    size: int = Field(default=0, ge=0)
    hash: str = ""  # files: the content's store digest ("sha256:...")
    target: str = ""  # symlinks: the link text (relative, resolving inside the workspace)

    @field_validator("path", "target", mode="before")
    @classmethod
    def _from_wire(cls, value: Any) -> Any:
        return from_wire(value)

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        if not safe_relative(path):
            raise ValueError(f"not a workspace-relative path: {path[:200]!r}")
        return path

    @field_serializer("path", "target")
    def _to_wire(self, value: str) -> str:
        return to_wire(value)


class Manifest(BaseModel):
    entries: list[ManifestEntry] = Field(default_factory=list, max_length=MAX_ENTRIES)

    def encode(self) -> bytes:
        """Canonical bytes (entries sorted by path): equal workspaces give equal bytes, hence equal ids."""
        ordered = sorted(self.entries, key=lambda e: e.path)
        rows = [e.model_dump() for e in ordered]
        return json.dumps({"version": 1, "entries": rows}, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        raw = json.loads(data)
        return cls(entries=raw.get("entries", []))

    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == "file")

    def hashes(self) -> set[str]:
        return {e.hash for e in self.entries if e.kind == "file" and e.hash}


class ScanEntry(BaseModel):
    """One entry as a backend found it: the manifest's fields (no hash yet) and its change stamp."""

    path: str
    kind: EntryKind
    mode: int
    size: int = 0
    target: str = ""
    stamp: str = ""  # e.g. "size:mtime_ns:ctime_ns:ino"; "" means "always read it"


class CheckpointMarker(BaseModel):
    """Kept with a sandbox (outside its workspace when the backend can): which checkpoint the workspace holds."""

    checkpoint_id: str = ""
    stamps: dict[str, str] = Field(default_factory=dict)  # path -> stamp at that checkpoint
    hashes: dict[str, str] = Field(default_factory=dict)  # path -> content digest at that checkpoint

    @field_validator("stamps", "hashes", mode="before")
    @classmethod
    def _keys_from_wire(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {from_wire(key): item for key, item in value.items()}

    @field_serializer("stamps", "hashes")
    def _keys_to_wire(self, value: dict[str, str]) -> dict[str, str]:
        return {to_wire(key): item for key, item in value.items()}


class CheckpointError(SandboxError):
    """A checkpoint could not be taken or restored (shown to the model as a tool error)."""


class CheckpointTooLarge(CheckpointError):
    """The workspace is over ``AGENT_CHECKPOINT_MAX_MB`` (or ``MAX_ENTRIES`` entries)."""


class Checkpointable(Protocol):
    """What a sandbox backend provides for checkpoints (see ``activities.sandbox.local.backend`` and ``.e2b``)."""

    async def scan_workspace(self, *, max_entries: int) -> list[ScanEntry]:
        """Every file, directory and inside-pointing symlink of the workspace, without following links.

        Devices, sockets, FIFOs and symlinks pointing outside the workspace are left out.
        :class:`CheckpointTooLarge` when there are more than ``max_entries``.
        """
        ...

    async def read_workspace_files(self, paths: list[str], *, max_bytes: int) -> dict[str, bytes]:
        """The contents of these regular files (never following a link); :class:`CheckpointTooLarge` over
        ``max_bytes`` in total. A path that is no longer a regular file is left out of the result."""
        ...

    async def apply_workspace(
        self, entries: list[ManifestEntry], contents: dict[str, bytes], *, keep: set[str]
    ) -> None:
        """Make the workspace hold exactly ``entries`` (file contents from ``contents`` by hash).

        Files in ``keep`` already hold their entry's content and are left as they are (their mode is
        set); everything not in ``entries`` is removed.
        """
        ...

    async def checkpoint_marker(self) -> CheckpointMarker | None:
        """The marker written by the last ``set_checkpoint_marker`` of this sandbox, or None."""
        ...

    async def set_checkpoint_marker(self, marker: CheckpointMarker) -> None: ...


def safe_relative(path: str) -> bool:
    """``path`` names something inside the workspace (relative, normalised, no ``..``, no NUL)."""
    if not path or len(path) > MAX_PATH_CHARS or "\x00" in path or path.startswith("/") or name_bytes(path) is None:
        return False
    parts = PurePosixPath(path).parts
    return bool(parts) and all(part not in (".", "..") for part in parts) and "/".join(parts) == path


def link_stays_inside(path: str, target: str) -> bool:
    """A symlink at ``path`` with text ``target`` resolves (lexically) inside the workspace."""
    if not target or target.startswith("/") or "\x00" in target or len(target) > MAX_PATH_CHARS:
        return False
    if name_bytes(target) is None:
        return False
    depth = len(PurePosixPath(path).parts) - 1  # directories above the link
    for part in PurePosixPath(target).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part != ".":
            depth += 1
    return True
