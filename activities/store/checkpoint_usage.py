"""What one run's workspace checkpoints have added to the run store (``AGENT_CHECKPOINT_RUN_MAX_*``).

One row per distinct checkpoint a run recorded, under the run's key (its conversation id without
rewind branches: a rewind spends the same budget), with the bytes that checkpoint added to the
store: the file contents and the manifest that were not stored yet (after dedupe). Recording is
insert-if-absent, so a retried attempt or a checkpoint taken twice counts once. The row ``STOPPED``
marks a run whose checkpoints stopped (its budget would have been passed): no later checkpoint is
taken for it.
"""

from __future__ import annotations

from dataclasses import dataclass

STOPPED = "stopped"  # the key of the "checkpoints stopped" row (checkpoint ids are "sha256:...")


@dataclass(frozen=True)
class CheckpointUsage:
    bytes: int = 0  # added to the store by the run's checkpoints, in all
    count: int = 0  # distinct checkpoints recorded
    stopped: bool = False
