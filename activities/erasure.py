"""Deleting runs' data from the run store: what ``forget`` and run retention share.

:func:`erase` deletes, for a set of conversations (``<workflow id>/<first run>[~branch]`` and
``<workflow id>/session``) and a set of workflow ids:

* every transcript entry of those conversations;
* what their runs' checkpoints were counted as (``checkpoint_usage``, under each conversation's
  :func:`~activities.checkpoints.ids.run_key`) and which blobs those runs were recorded to use
  (``blob_refs``);
* the ledger entries (tool results and notes) of the workflow ids;
* every blob those conversations reference (as garbage collection marks them: checkpoint manifests
  and their files, MCP snapshots and images, any digest a message names) or their runs were recorded
  to use, **unless another conversation still references it, another run is recorded to use it, or a
  checkpoint taken within ``grace_s`` names it** (blobs are content-addressed, so two tenants who
  wrote the same bytes share one row: it stays for the one that still uses it, and goes with the last).

Then :meth:`~activities.store.base.RunStore.scrub` makes the deleted rows unrecoverable from the
store's files where the database allows it. A dry run counts the same things and deletes nothing.

Reading every other conversation to find what it references costs what a garbage collection costs:
it is the reference that never misses a blob (the ``blob_refs`` table only covers checkpoints).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from activities.checkpoints import gc
from activities.checkpoints.ids import run_key
from activities.store.base import RunStore

BLOB_GRACE_S = 3600.0  # as garbage collection's: a checkpoint being taken right now is not named by any entry yet


@dataclass
class Erased:
    """What was deleted (or, in a dry run, would be), per kind."""

    conversations: int = 0
    messages: int = 0
    checkpoints: int = 0
    blobs: int = 0
    ledger_entries: int = 0
    shared_blobs_kept: int = 0  # blobs of the erased conversations that others still use
    scrubbed: bool = True  # the store's files hold no copy of what was deleted (see RunStore.scrub)
    problems: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "conversations": self.conversations,
            "messages": self.messages,
            "checkpoints": self.checkpoints,
            "blobs": self.blobs,
            "ledger_entries": self.ledger_entries,
            "shared_blobs_kept": self.shared_blobs_kept,
        }


async def erase(
    store: RunStore,
    conversations: list[str],
    workflow_ids: list[str],
    *,
    dry_run: bool = False,
    grace_s: float = BLOB_GRACE_S,
    now: float | None = None,
    scrub: bool = True,
) -> Erased:
    """Delete the data of ``conversations`` and the ledger of ``workflow_ids`` (see the module).

    ``scrub=False`` leaves the store's :meth:`~activities.store.base.RunStore.scrub` to the caller
    (``forget`` scrubs once, fully, after it has deleted memory and streamed text as well)."""
    doomed = sorted(set(conversations))
    doomed_set = set(doomed)
    runs = sorted({run_key(c) for c in doomed})
    run_set = set(runs)
    report = Erased()
    referenced, problems = await gc.referenced_by(store, doomed)
    report.problems.extend(problems)
    candidates = set(referenced)
    for run in runs:
        candidates.update(await store.blob_refs_of(run))
    stored = set(await store.blob_digests(float("inf")))
    candidates &= stored
    kept: set[str] = set()
    if candidates:  # else there is nothing to keep: no need to read every other conversation
        others = [c for c, _ in await store.conversations() if c not in doomed_set]
        kept, _ = await gc.referenced_by(store, others)
        cutoff = (time.time() if now is None else now) - grace_s
        # A young checkpoint of another run keeps its files; the erased runs' own checkpoints do not.
        kept |= await gc.young_manifest_files(store, cutoff, besides=candidates)
        for digest, users in (await store.blob_ref_runs(sorted(candidates))).items():
            if users - run_set:
                kept.add(digest)
    blobs = sorted(candidates - kept)
    report.shared_blobs_kept = len(candidates) - len(blobs)
    sizes = [await store.count_messages(c) for c in doomed]
    report.conversations = sum(1 for size in sizes if size)
    if dry_run:
        report.messages = sum(sizes)
        report.checkpoints = sum([(await store.checkpoint_usage(run)).count for run in runs])
        report.ledger_entries = sum([len(await store.ledger(w)) for w in sorted(set(workflow_ids))])
        report.blobs = len(blobs)
        return report
    # The transcripts go last: they are how the conversations are found, so an erase interrupted
    # part way (a killed reaper or forget) is finished by the next one instead of orphaning blobs.
    for start in range(0, len(blobs), gc.DELETE_BATCH):
        report.blobs += await store.delete_blobs(blobs[start : start + gc.DELETE_BATCH])
    for workflow_id in sorted(set(workflow_ids)):
        report.ledger_entries += await store.delete_ledger(workflow_id)
    for run in runs:
        report.checkpoints += await store.delete_checkpoint_usage(run)
        await store.delete_blob_refs(run)
    for conversation_id in doomed:
        report.messages += await store.delete_conversation(conversation_id)
    if scrub:  # also when nothing was deleted now: an earlier scrub may not have completed
        report.scrubbed = await store.scrub()
    return report
