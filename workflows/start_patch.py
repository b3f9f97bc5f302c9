"""The patches a run decides in its first activation, which a new run records as one marker.

Each ``workflow.patched`` call that returns true in a new run records a marker and, with it, the
SDK's upsert of the ``TemporalChangeVersion`` search attribute: two history events. The patches a
run decides at its start (``STRICT_POLICY_PATCH``, ``SEARCH_ATTRIBUTES_PATCH``) did so in every
run. A run started now records ``RUN_START_PATCH`` alone, which stands for each of them and for
the start-time changes made since; a run recorded before it replays as its history says: with
``RUN_START_V2`` (every start-time patch, a session opened by the ``session_open`` activity), or
with each patch's own marker (both, one of them, or none).
"""

from __future__ import annotations

from temporalio import workflow

# A new run: every start-time patch, and a new run of a session opens its conversation in ``run_config``.
RUN_START_PATCH = "run-start-v3"
RUN_START_V2 = "run-start-v2"


def start_patched(patch_id: str) -> bool:
    """Whether this run takes the start-time patch ``patch_id`` (decided once per run, like ``patched``).

    Call it in the run's first activation first (as ``AgentWorkflow.run`` does), so that a new run's
    one marker is in its first workflow task.
    """
    return workflow.patched(RUN_START_PATCH) or workflow.patched(RUN_START_V2) or workflow.patched(patch_id)


def session_opened_by_run_config() -> bool:
    """Whether a new run of a session has ``run_config`` make or find its conversation (one local activity),
    rather than the ``session_open`` activity after it (recorded runs: six history events more)."""
    return workflow.patched(RUN_START_PATCH)
