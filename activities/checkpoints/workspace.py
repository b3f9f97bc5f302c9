"""A sandbox tool call's workspace: restored to the run's last checkpoint before, checkpointed after.

The workflow sends, with every sandbox tool call, the checkpoint its workspace must hold. When the
sandbox holds another one (its VM expired and was recreated, the step landed on a worker on another
host, the run was reset or forked), that checkpoint is restored first. After the tool, the
workspace is checkpointed and the new id goes back to the workflow with the result.

A run's checkpoints are bounded in the run store (``AGENT_CHECKPOINT_RUN_MAX_MB``: the bytes they
add after dedupe; ``AGENT_CHECKPOINT_RUN_MAX_COUNT``: how many distinct ones it records, counted
under :func:`~activities.checkpoints.ids.run_key`). The first checkpoint that would pass either is
not taken, the run's checkpoints stop for good, the model is told in that tool's result, and the
run goes on. A step with no checkpoint of its own (stopped, too large, or failed) returns an
``unsaved`` id (:mod:`activities.checkpoints.ids`) so that nothing restores or forks the wrong files.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import structlog

from activities.checkpoints import engine, ids
from activities.runtime import Runtime
from activities.sandbox.checkpointable import CheckpointError, CheckpointMarker, CheckpointTooLarge
from activities.store.checkpoint_usage import STOPPED
from workflows.types import ToolInvocation

log = structlog.get_logger("activities.checkpoints")
_RUN_LOCKS: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

RESTORED_NOTE = (
    "[sandbox] note: this run's sandbox was recreated (it had expired or was lost, or this step runs on "
    "another host); the files in /workspace were restored from the run's last checkpoint, running "
    "processes and /tmp were not."
)
UNSAVED_RESTORED_NOTE = (
    "[sandbox] note: the files in /workspace were restored from the run's last checkpoint, taken before its "
    "checkpoints stopped (or before a step that could not be checkpointed): what changed since is lost."
)


def stopped_note(why: str) -> str:
    return (
        f"\n[checkpoint] checkpoints stopped for this run: {why}; the run goes on, but from this step on its files "
        "are not checkpointed, so a fork or rewind can only go back to an earlier step, and a lost sandbox "
        "comes back with the files of the last checkpoint."
    )


class Workspace:
    def __init__(self, runtime: Runtime, inv: ToolInvocation) -> None:
        self._rt = runtime
        self._inv = inv
        self.checkpoint = ""  # taken after the tool: a checkpoint id, an ``unsaved`` one, or "" (none)
        self.stopped = False  # this call stopped the run's checkpoints (its note must reach the model)

    @property
    def _max_bytes(self) -> int:
        return self._rt.settings.checkpoints.max_bytes

    async def prepare(self, sandbox: Any, *, recreated: bool) -> str:
        """Restore the expected checkpoint when the workspace holds another; the note for the model."""
        expected = self._inv.checkpoint
        held = await engine.current(sandbox)
        if held == expected:
            return ""
        target = ids.real_base(expected)  # a step with no checkpoint of its own: the last one before it
        try:
            written = await engine.restore(sandbox, self._rt.store, target, max_bytes=self._max_bytes)
        except CheckpointError as exc:
            # Never wedge the run: it goes on with the workspace as it is, and says so.
            log.warning("workspace_restore_failed", expected=expected, held=held, error=str(exc))
            return f"[sandbox] note: the workspace could not be restored to the run's last checkpoint ({exc})."
        log.info("workspace_restored", checkpoint=expected or "(empty)", previous=held or "(none)", bytes=written)
        if target != expected:
            return UNSAVED_RESTORED_NOTE
        return RESTORED_NOTE if recreated else ""

    async def checkpoint_after(self, sandbox: Any) -> str:
        """Checkpoint the workspace; text to add to the tool's result ("" unless it could not be taken)."""
        run = ids.run_key(self._inv.conversation_id)
        # Parallel calls of one run on this worker check and spend its budget one at a time (across
        # workers they may each pass the check: the budget can then be passed by one checkpoint per call).
        lock = _RUN_LOCKS.setdefault(run, asyncio.Lock())
        async with lock:
            return await self._checkpoint_after(sandbox, run)

    async def _checkpoint_after(self, sandbox: Any, run: str) -> str:
        limits = self._rt.settings.checkpoints
        store = self._rt.store
        try:
            usage = await store.checkpoint_usage(run)
            if usage.stopped:
                return await self._unsaved(sandbox, "")
            if usage.count >= limits.run_max_count:
                why = f"it has recorded {usage.count} checkpoints (AGENT_CHECKPOINT_RUN_MAX_COUNT)"
                return await self._stop(sandbox, run, why)
            remaining = max(0, limits.run_max_bytes - usage.bytes)
            taken = await engine.take(sandbox, store, max_bytes=self._max_bytes, remaining=remaining)
            # Which run (of which tenant) uses these blobs: forget and retention keep what another run uses.
            await store.blob_ref(run, self._inv.tenant, self._inv.user, list(taken.blobs))
            await store.checkpoint_record(run, taken.checkpoint_id, taken.new_bytes)
        except engine.CheckpointBudgetExceeded as exc:
            why = (
                f"this step's files would take its checkpoints past {limits.run_max_bytes / 2**20:.0f} MiB in the "
                f"run store (AGENT_CHECKPOINT_RUN_MAX_MB; {exc})"
            )
            return await self._stop(sandbox, run, why)
        except CheckpointTooLarge as exc:
            log.warning("workspace_checkpoint_refused", error=str(exc))
            return await self._unsaved(sandbox, f"\n[checkpoint] {exc}")
        except Exception as exc:  # the tool ran: its result stands, and a retry must not run it again
            log.warning("workspace_checkpoint_failed", error_type=type(exc).__name__, error=str(exc)[:300])
            note = f"\n[checkpoint] this step's files could not be checkpointed ({type(exc).__name__})"
            return await self._unsaved(sandbox, note)
        self.checkpoint = taken.checkpoint_id
        log.info(
            "workspace_checkpointed",
            checkpoint=taken.checkpoint_id,
            files=taken.files,
            total_bytes=taken.total_bytes,
            read_bytes=taken.read_bytes,
            new_bytes=taken.new_bytes,
            run_bytes=usage.bytes + taken.new_bytes,
            duration_ms=taken.duration_ms,
        )
        return ""

    async def _stop(self, sandbox: Any, run: str, why: str) -> str:
        """Stop the run's checkpoints for good (recorded in the store); the one line the model reads."""
        log.warning("workspace_checkpoints_stopped", run=run, reason=why)
        self.stopped = True
        try:
            await self._rt.store.checkpoint_record(run, STOPPED, 0)
        except Exception as exc:  # the next call asks again
            log.warning("workspace_checkpoint_stop_failed", error_type=type(exc).__name__)
        return await self._unsaved(sandbox, stopped_note(why))

    async def _unsaved(self, sandbox: Any, note: str) -> str:
        """This step has no checkpoint of its own: the sandbox and the workflow get an ``unsaved`` id."""
        unsaved = ids.unsaved_id(self._inv.checkpoint, self._inv.idempotency_key)
        try:
            marker = await sandbox.checkpoint_marker() or CheckpointMarker()
            # Its stamps and hashes still say which files hold which stored contents: the next take reads less.
            await sandbox.set_checkpoint_marker(marker.model_copy(update={"checkpoint_id": unsaved}))
        except Exception as exc:  # the marker keeps naming the last checkpoint: as before this step
            log.warning("workspace_marker_failed", error_type=type(exc).__name__, error=str(exc)[:300])
            return note
        self.checkpoint = unsaved
        return note
