"""Garbage collection of run store blobs: mark what kept conversations reference, sweep the rest.

Mark: for every conversation the store knows, ``keep_conversation(conversation_id, last_write)``
decides whether it is kept. Every entry of a kept conversation is read (a page at a time, gaps and
all) and marks
  * ``meta["checkpoint"]``, a checkpoint id, and every file ``hash`` of that manifest (each manifest
    is loaded once, however many entries and conversations name it; an ``unsaved`` id marks the
    checkpoint it follows, see ``activities.checkpoints.ids``);
  * ``meta["mcp_snapshot"]``, the MCP tool list the model saw;
  * every ``sha256:<64 hex>`` anywhere in the entry's message (content, tool calls) or meta: MCP
    images, whole large results, whatever else a message mentions. Marking a string that only looks
    like a digest is harmless: it keeps at most one blob that happens to have that digest.

Sweep: every blob first stored before ``now - grace_s`` that is not marked is deleted. The grace
period protects what is being written right now and not referenced by any entry yet: the file
blobs and the manifest of a checkpoint that is being taken, an MCP image whose tool result is not
stored yet.

Failures are fail-safe: anything the store or ``keep_conversation`` raises aborts the collection
before it deletes anything, except a manifest that cannot be used, which is reported in
``GcReport.problems`` and marks no files:
  * missing (no blob under the checkpoint id): there is nothing to restore it from, so the files it
    named are of no use through it, and those another checkpoint names are marked through that one;
  * not a manifest (the blob is there but does not decode): the same; the blob itself is marked,
    since an entry names it, so what is left can be inspected;
  * corrupt (``BlobCorrupt``: the stored row is not the bytes of its digest): the same, and the row
    is kept as well. Only ``BlobCorrupt`` counts: any other ``StoreError`` may be an unreachable
    store, and collecting on a partial mark would delete files of healthy checkpoints.
Unmarking the files of an unusable manifest is safe for that checkpoint (it is lost either way). It
can matter to a live sandbox that still holds that checkpoint: its marker's hashes let the next
checkpoint name unchanged files without storing them again (see below).

A checkpoint taken within the grace period may not be named by any entry yet while it names files
first stored long ago (unchanged since an earlier checkpoint of that sandbox). Every young blob
that is a manifest therefore marks its files too. What remains (below) needs a checkpoint older
than the grace period that no entry names, which no writer leaves behind for that long.

Known limit: a blob's age is the time it was *first* stored, and ``engine.take`` names unchanged
files by the digests in the sandbox's marker without storing them again. A checkpoint that is
older than the grace period and named by no entry (taken, then its tool result never stored, and
the sandbox kept) can therefore name files a collection deletes; restoring it then fails with
``CheckpointMissing`` and the run goes on with the workspace it has (it is told so).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Set
from dataclasses import dataclass, field

from activities.checkpoints.ids import real_base
from activities.sandbox.checkpointable import Manifest
from activities.store.base import BlobCorrupt, RunStore, StoredMessage, is_blob_digest

log = logging.getLogger(__name__)

PAGE = 500  # entries read at once
DELETE_BATCH = 1000  # digests per delete_blobs call
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_BRANCH = "~"
MANIFEST_PREFIX = b'{"entries":'  # how every encoded manifest starts (sorted keys, no spaces)


@dataclass(frozen=True)
class GcReport:
    conversations: int  # the store knew of
    kept: int  # of them
    marked: int  # distinct digests the kept ones reference (whether or not such a blob exists)
    deleted: int  # blobs
    seconds: float
    problems: tuple[str, ...] = field(default=())  # unusable manifests (missing, not a manifest, corrupt)


def workflow_of(conversation_id: str) -> tuple[str, str]:
    """``(workflow_id, first_execution_run_id)`` of ``<workflow_id>/<run_id>[~<branch>...]``.

    Workflow ids may contain ``/`` (so the split is on the last one) and ``~``; run ids and branch
    suffixes contain neither. ``ValueError`` when either part would be empty.
    """
    workflow_id, slash, tail = conversation_id.rpartition("/")
    run_id = tail.partition(_BRANCH)[0]
    if not slash or not workflow_id or not run_id:
        raise ValueError(f"not a conversation id: {conversation_id[:200]!r}")
    return workflow_id, run_id


async def collect(
    store: RunStore,
    *,
    keep_conversation: Callable[[str, float], Awaitable[bool]],
    grace_s: float = 3600,
    now: float | None = None,
) -> GcReport:
    """Delete every blob older than ``grace_s`` that no kept conversation references (see the module)."""
    if not grace_s >= 0:
        raise ValueError(f"grace_s must be >= 0, not {grace_s}")
    started = time.monotonic()
    cutoff = (time.time() if now is None else now) - grace_s
    marked: set[str] = set()
    manifests: set[str] = set()  # loaded already (or found unusable)
    problems: list[str] = []
    known = await store.conversations()
    kept = 0
    for conversation_id, last_write in known:
        if not await keep_conversation(conversation_id, last_write):
            continue
        kept += 1
        await _mark_conversation(store, conversation_id, marked, manifests, problems)
    # A checkpoint taken within the grace period may not be named by any entry yet, and it may name
    # files first stored long ago (unchanged since an earlier checkpoint): keep those through it.
    old_enough = await store.blob_digests(cutoff)
    young = set(await store.blob_digests(float("inf"))) - set(old_enough)
    for digest in sorted(young - manifests):
        await _mark_young_manifest(store, digest, marked)
    doomed = [d for d in old_enough if d not in marked]
    deleted = 0
    for start in range(0, len(doomed), DELETE_BATCH):
        deleted += await store.delete_blobs(doomed[start : start + DELETE_BATCH])
    for problem in problems:
        log.warning("checkpoint gc: %s", problem)
    report = GcReport(
        conversations=len(known),
        kept=kept,
        marked=len(marked),
        deleted=deleted,
        seconds=time.monotonic() - started,
        problems=tuple(problems),
    )
    log.info(
        "checkpoint gc: %d of %d conversations kept, %d digests marked, %d blobs deleted in %.1f s",
        report.kept,
        report.conversations,
        report.marked,
        report.deleted,
        report.seconds,
    )
    return report


def _mark_entry(entry: StoredMessage, marked: set[str]) -> str:
    """Mark what ``entry`` references; the checkpoint id it carries ("" when none)."""
    # The meta's digests include meta["checkpoint"] and meta["mcp_snapshot"].
    marked.update(_DIGEST.findall(entry.message.model_dump_json()))
    marked.update(_DIGEST.findall(json.dumps(entry.meta, default=str)))
    checkpoint = entry.meta.get("checkpoint")
    if isinstance(checkpoint, str):
        checkpoint = real_base(checkpoint)  # a step with no checkpoint of its own keeps the one before it
    if not isinstance(checkpoint, str) or not is_blob_digest(checkpoint):
        return ""  # none ("" is the empty workspace), or not a digest at all
    return checkpoint


async def _mark_manifest(store: RunStore, checkpoint: str, marked: set[str]) -> str:
    """Mark the files of manifest ``checkpoint``; what is wrong with it, or "" (see the module on why)."""
    try:
        data = await store.get_blob(checkpoint)
    except BlobCorrupt as exc:
        return f"checkpoint {checkpoint} is corrupt, its files are not kept through it: {exc}"
    if data is None:
        return f"checkpoint {checkpoint} is missing, its files are not kept through it"
    try:
        manifest = Manifest.decode(data)
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:  # pydantic's ValidationError too
        return f"checkpoint {checkpoint} is not a manifest, no files are kept through it: {str(exc)[:200]}"
    marked.update(manifest.hashes())
    return ""


async def _mark_young_manifest(store: RunStore, digest: str, marked: set[str]) -> None:
    """Mark the files of ``digest`` if it is a manifest (most young blobs are files: skipped cheaply)."""
    try:
        data = await store.get_blob(digest)
    except BlobCorrupt:
        return
    if not data or not data.startswith(MANIFEST_PREFIX):
        return
    try:
        marked.update(Manifest.decode(data).hashes())
    except (ValueError, TypeError, AttributeError, RecursionError):
        return


async def _mark_conversation(
    store: RunStore, conversation_id: str, marked: set[str], manifests: set[str], problems: list[str]
) -> None:
    """Mark what every entry of ``conversation_id`` references (a checkpoint's files too, each manifest once)."""
    after = -1
    while page := await store.entries_after(conversation_id, after, PAGE):
        for entry in page:
            checkpoint = _mark_entry(entry, marked)
            if checkpoint and checkpoint not in manifests:
                manifests.add(checkpoint)
                problem = await _mark_manifest(store, checkpoint, marked)
                if problem:
                    problems.append(f"{problem} (named by {conversation_id} entry {entry.seq})")
        after = page[-1].seq


async def referenced_by(store: RunStore, conversation_ids: list[str]) -> tuple[set[str], list[str]]:
    """Every digest the entries of ``conversation_ids`` reference, as collection marks them (the files of the
    checkpoints they name included), and the problems of unusable manifests (see the module)."""
    marked: set[str] = set()
    manifests: set[str] = set()
    problems: list[str] = []
    for conversation_id in conversation_ids:
        await _mark_conversation(store, conversation_id, marked, manifests, problems)
    return marked, problems


async def young_manifest_files(store: RunStore, cutoff: float, *, besides: Set[str] = frozenset()) -> set[str]:
    """The files of every manifest first stored at or after ``cutoff`` (checkpoints no entry may name yet),
    other than those in ``besides``."""
    marked: set[str] = set()
    old_enough = set(await store.blob_digests(cutoff))
    for digest in sorted(set(await store.blob_digests(float("inf"))) - old_enough - besides):
        await _mark_young_manifest(store, digest, marked)
    return marked
