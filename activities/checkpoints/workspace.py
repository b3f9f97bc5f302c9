"""A sandbox tool call's workspace: restored to the run's last checkpoint before, checkpointed after.

The workflow sends, with every sandbox tool call, the checkpoint its workspace must hold. When the
sandbox holds another one (its VM expired and was recreated, the step landed on a worker on another
host, the run was reset or forked), that checkpoint is restored first. After the tool, the
workspace is checkpointed and the new id goes back to the workflow with the result.
"""

from __future__ import annotations

from typing import Any

import structlog

from activities.checkpoints import engine
from activities.runtime import Runtime
from workflows.types import ToolInvocation

log = structlog.get_logger("activities.checkpoints")

RESTORED_NOTE = (
    "[sandbox] note: this run's sandbox was recreated (it had expired or was lost, or this step runs on "
    "another host); the files in /workspace were restored from the run's last checkpoint, running "
    "processes and /tmp were not."
)


class Workspace:
    def __init__(self, runtime: Runtime, inv: ToolInvocation) -> None:
        self._rt = runtime
        self._inv = inv
        self.checkpoint = ""  # taken after the tool ("" when none was)

    @property
    def _max_bytes(self) -> int:
        return self._rt.settings.checkpoints.max_bytes

    async def prepare(self, sandbox: Any, *, recreated: bool) -> str:
        """Restore the expected checkpoint when the workspace holds another; the note for the model."""
        expected = self._inv.checkpoint
        held = await engine.current(sandbox)
        if held == expected:
            return ""
        try:
            written = await engine.restore(sandbox, self._rt.store, expected, max_bytes=self._max_bytes)
        except engine.CheckpointError as exc:
            # Never wedge the run: it goes on with the workspace as it is, and says so.
            log.warning("workspace_restore_failed", expected=expected, held=held, error=str(exc))
            return f"[sandbox] note: the workspace could not be restored to the run's last checkpoint ({exc})."
        log.info("workspace_restored", checkpoint=expected or "(empty)", previous=held or "(none)", bytes=written)
        return RESTORED_NOTE if recreated else ""

    async def checkpoint_after(self, sandbox: Any) -> str:
        """Checkpoint the workspace; text to add to the tool's result ("" unless it could not be taken)."""
        try:
            taken = await engine.take(sandbox, self._rt.store, max_bytes=self._max_bytes)
        except engine.CheckpointTooLarge as exc:
            log.warning("workspace_checkpoint_refused", error=str(exc))
            return f"\n[checkpoint] {exc}"
        except Exception as exc:  # the tool ran: its result stands, and a retry must not run it again
            log.warning("workspace_checkpoint_failed", error_type=type(exc).__name__, error=str(exc)[:300])
            return f"\n[checkpoint] this step's files could not be checkpointed ({type(exc).__name__})"
        self.checkpoint = taken.checkpoint_id
        log.info(
            "workspace_checkpointed",
            checkpoint=taken.checkpoint_id,
            files=taken.files,
            total_bytes=taken.total_bytes,
            read_bytes=taken.read_bytes,
            duration_ms=taken.duration_ms,
        )
        return ""
