"""What a workspace checkpoint is: a manifest of path → (kind, mode, size, content hash), content-addressed.

A checkpoint's id is the run store digest of its canonical manifest, so two identical workspaces
have the same id and a step that changed nothing makes no new checkpoint. File contents are blobs
of their own, stored once by hash: a step that changed one file stores one blob and one manifest.

What backends scan is a :class:`ScanEntry`: the manifest's fields plus a ``stamp`` (size, mtime,
ctime, inode as the backend sees them) that says whether a file may have changed since the last
checkpoint. Stamps are local to one sandbox and never part of a checkpoint's id; they live in the
sandbox's :class:`CheckpointMarker` next to the id of the checkpoint the workspace holds.

Only regular files, directories and symlinks whose target stays inside the workspace are stored;
devices, sockets, FIFOs and links that point out are left out (and never restored).
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, Field, field_validator

EntryKind = Literal["file", "dir", "symlink"]
MAX_ENTRIES = 100_000  # of one workspace: a tree of more is refused, not stored in part
MAX_PATH_CHARS = 4096
MAX_MARKER_BYTES = 32 * 1024 * 1024  # a marker file read back from a sandbox (hostile in a remote VM)


class ManifestEntry(BaseModel):
    path: str  # relative to the workspace, POSIX, no "." or ".." parts
    kind: EntryKind
    mode: int = Field(ge=0, le=0o7777)  # permission bits only
    size: int = Field(default=0, ge=0)
    hash: str = ""  # files: the content's store digest ("sha256:...")
    target: str = ""  # symlinks: the link text (relative, resolving inside the workspace)

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        if not safe_relative(path):
            raise ValueError(f"not a workspace-relative path: {path[:200]!r}")
        return path


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


def safe_relative(path: str) -> bool:
    """``path`` names something inside the workspace (relative, normalised, no ``..``, no NUL)."""
    if not path or len(path) > MAX_PATH_CHARS or "\x00" in path or path.startswith("/"):
        return False
    parts = PurePosixPath(path).parts
    return bool(parts) and all(part not in (".", "..") for part in parts) and "/".join(parts) == path


def link_stays_inside(path: str, target: str) -> bool:
    """A symlink at ``path`` with text ``target`` resolves (lexically) inside the workspace."""
    if not target or target.startswith("/") or "\x00" in target or len(target) > MAX_PATH_CHARS:
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
