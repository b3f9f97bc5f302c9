"""Taking and restoring workspace checkpoints, for any backend that implements :class:`Checkpointable`.

``take`` scans the workspace, reads only the files whose stamp changed since the checkpoint the
sandbox's marker names (so a step that changed one 10 KB file in a 50 MB workspace reads 10 KB),
stores new contents as blobs, and stores the manifest; its digest is the checkpoint id.
``restore`` makes the workspace hold exactly a checkpoint's entries, rewriting only what differs.
Both refuse a workspace over ``max_bytes`` with :class:`CheckpointTooLarge`, a tool error the model
reads: the run goes on, without that checkpoint. ``take`` also refuses, with
:class:`CheckpointBudgetExceeded`, a checkpoint that would add more than ``remaining`` bytes to the
store (the run's ``AGENT_CHECKPOINT_RUN_MAX_MB`` left): checked on the files it would read before
reading them, then on what it really added (only blobs the store did not hold yet count).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from activities.sandbox.checkpointable import (
    MAX_ENTRIES,
    Checkpointable,
    CheckpointError,
    CheckpointMarker,
    CheckpointTooLarge,
    Manifest,
    ManifestEntry,
)
from activities.store.base import RunStore

EMPTY = ""  # the id of "no checkpoint yet": an empty workspace


class CheckpointBudgetExceeded(CheckpointError):
    """This checkpoint would take the run's checkpoints past ``AGENT_CHECKPOINT_RUN_MAX_MB``."""


class CheckpointMissing(CheckpointError):
    """A checkpoint (or one of its files) is not in the run store."""


@dataclass(frozen=True)
class Taken:
    checkpoint_id: str
    files: int
    total_bytes: int
    read_bytes: int  # of files whose stamp changed (what this checkpoint had to read)
    duration_ms: int
    new_bytes: int = 0  # what it added to the store: contents and manifest it did not hold yet
    blobs: tuple[str, ...] = ()  # every blob it uses: its manifest and its files' contents


async def take(sandbox: Checkpointable, store: RunStore, *, max_bytes: int, remaining: int | None = None) -> Taken:
    """Checkpoint the workspace; the marker then names the new checkpoint.

    ``remaining``: the most this checkpoint may add to the store (None: no bound), else
    :class:`CheckpointBudgetExceeded` and nothing is recorded.
    """
    started = time.monotonic()
    marker = await sandbox.checkpoint_marker() or CheckpointMarker()
    scan = await sandbox.scan_workspace(max_entries=MAX_ENTRIES)
    total = sum(e.size for e in scan if e.kind == "file")
    if total > max_bytes:
        raise CheckpointTooLarge(_too_large(total, max_bytes))
    hashes: dict[str, str] = {}
    unread: list[str] = []
    for entry in scan:
        if entry.kind != "file":
            continue
        known = marker.hashes.get(entry.path)
        if known and entry.stamp and marker.stamps.get(entry.path) == entry.stamp:
            hashes[entry.path] = known
        else:
            unread.append(entry.path)
    if remaining is not None:
        to_read = set(unread)
        changed = sum(e.size for e in scan if e.kind == "file" and e.path in to_read)
        if changed > remaining:
            raise CheckpointBudgetExceeded(f"its changed files hold {changed} bytes, {remaining} are left")
    contents = await sandbox.read_workspace_files(unread, max_bytes=max_bytes) if unread else {}
    read_bytes = new_bytes = 0
    for path, data in contents.items():
        hashes[path], new = await store.add_blob(data)
        read_bytes += len(data)
        new_bytes += len(data) if new else 0
    entries: list[ManifestEntry] = []
    for entry in scan:
        if entry.kind == "file":
            if entry.path not in hashes:
                continue  # gone (or no longer a regular file) between the scan and the read
            size = len(contents[entry.path]) if entry.path in contents else entry.size
            entries.append(
                ManifestEntry(path=entry.path, kind="file", mode=entry.mode, size=size, hash=hashes[entry.path])
            )
        else:
            entries.append(ManifestEntry(path=entry.path, kind=entry.kind, mode=entry.mode, target=entry.target))
    manifest = Manifest(entries=entries)
    if manifest.total_bytes() > max_bytes:
        raise CheckpointTooLarge(_too_large(manifest.total_bytes(), max_bytes))
    encoded = manifest.encode()
    if remaining is not None and new_bytes + len(encoded) > remaining:
        # What it stored already is named by nothing: garbage collection deletes it after its grace period.
        raise CheckpointBudgetExceeded(f"it adds {new_bytes + len(encoded)} bytes, {remaining} are left")
    checkpoint_id, new = await store.add_blob(encoded)
    new_bytes += len(encoded) if new else 0
    stamps = {e.path: e.stamp for e in scan if e.kind == "file" and e.path in hashes and e.stamp}
    await sandbox.set_checkpoint_marker(CheckpointMarker(checkpoint_id=checkpoint_id, stamps=stamps, hashes=hashes))
    return Taken(
        checkpoint_id=checkpoint_id,
        files=sum(1 for e in entries if e.kind == "file"),
        total_bytes=manifest.total_bytes(),
        read_bytes=read_bytes,
        duration_ms=int((time.monotonic() - started) * 1000),
        new_bytes=new_bytes,
        blobs=(checkpoint_id, *sorted(set(hashes.values()))),
    )


async def load_manifest(store: RunStore, checkpoint_id: str) -> Manifest:
    if checkpoint_id == EMPTY:
        return Manifest()
    data = await store.get_blob(checkpoint_id)
    if data is None:
        raise CheckpointMissing(f"checkpoint {checkpoint_id} is not in the run store")
    return Manifest.decode(data)


async def restore(sandbox: Checkpointable, store: RunStore, checkpoint_id: str, *, max_bytes: int) -> int:
    """Make the workspace hold checkpoint ``checkpoint_id`` (``EMPTY``: nothing); the bytes written."""
    manifest = await load_manifest(store, checkpoint_id)
    if manifest.total_bytes() > max_bytes:
        raise CheckpointTooLarge(_too_large(manifest.total_bytes(), max_bytes))
    marker = await sandbox.checkpoint_marker() or CheckpointMarker()
    scan = {e.path: e for e in await sandbox.scan_workspace(max_entries=MAX_ENTRIES)}
    keep: set[str] = set()
    for entry in manifest.entries:
        found = scan.get(entry.path)
        if (
            entry.kind == "file"
            and found is not None
            and found.kind == "file"
            and found.stamp
            and marker.stamps.get(entry.path) == found.stamp
            and marker.hashes.get(entry.path) == entry.hash
        ):
            keep.add(entry.path)
    contents: dict[str, bytes] = {}
    for entry in manifest.entries:
        if entry.kind == "file" and entry.path not in keep and entry.hash not in contents:
            data = await store.get_blob(entry.hash)
            if data is None:
                raise CheckpointMissing(f"file {entry.path!r} of checkpoint {checkpoint_id} is not in the run store")
            contents[entry.hash] = data
    await sandbox.apply_workspace(manifest.entries, contents, keep=keep)
    after = await sandbox.scan_workspace(max_entries=MAX_ENTRIES)
    hashes = {e.path: e.hash for e in manifest.entries if e.kind == "file"}
    stamps = {e.path: e.stamp for e in after if e.kind == "file" and e.path in hashes and e.stamp}
    await sandbox.set_checkpoint_marker(CheckpointMarker(checkpoint_id=checkpoint_id, stamps=stamps, hashes=hashes))
    return sum(len(data) for data in contents.values())


async def current(sandbox: Checkpointable) -> str:
    """The id of the checkpoint the workspace holds (``EMPTY`` for a sandbox that never had one)."""
    marker = await sandbox.checkpoint_marker()
    return marker.checkpoint_id if marker is not None else EMPTY


def _too_large(size: int, max_bytes: int) -> str:
    return (
        f"the workspace holds {size / 1e6:.1f} MB, over the checkpoint limit of {max_bytes / 1e6:.0f} MB "
        "(AGENT_CHECKPOINT_MAX_MB); this step was not checkpointed: delete files you do not need"
    )
