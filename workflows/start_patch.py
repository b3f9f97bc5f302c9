"""The patches a run decides in its first activation, which a new run records as one marker.

Each ``workflow.patched`` call that returns true in a new run records a marker and, with it, the
SDK's upsert of the ``TemporalChangeVersion`` search attribute: two history events. The patches a
run decides at its start (``STRICT_POLICY_PATCH``, ``SEARCH_ATTRIBUTES_PATCH``) did so in every
run. A run started now records ``RUN_START_PATCH`` alone, which stands for each of them; a run
recorded before it has no such marker and replays each patch as its history says (both markers,
one of them, or none).
"""

from __future__ import annotations

from temporalio import workflow

RUN_START_PATCH = "run-start-v2"


def start_patched(patch_id: str) -> bool:
    """Whether this run takes the start-time patch ``patch_id`` (decided once per run, like ``patched``).

    Call it in the run's first activation first (as ``AgentWorkflow.run`` does), so that a new run's
    one marker is in its first workflow task.
    """
    return workflow.patched(RUN_START_PATCH) or workflow.patched(patch_id)
