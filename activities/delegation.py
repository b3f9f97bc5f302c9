"""The ``tree_run_reserve`` activity: a sub-agent's run is counted among its tree's before it starts.

A tree of runs (a root and every sub-agent under it, at any depth) may hold at most
``AGENT_MAX_TREE_RUNS`` runs, its root included. The parent's workflow asks before each
child start; the count is kept in the run store under the tree's root, like its budget, so
it holds across workers and however many children start at once. Past the cap the parent's
call gets a tool error and no child starts.
"""

from __future__ import annotations

from temporalio import activity

from activities.runtime import Runtime
from activities.store_errors import store_guarded
from workflows.types import TreeRunRequest, TreeRunVerdict


class DelegationActivities:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @activity.defn(name="tree_run_reserve")
    @store_guarded
    async def tree_run_reserve(self, req: TreeRunRequest) -> TreeRunVerdict:
        cap = self._rt.settings.max_tree_runs
        granted = await self._rt.store.tree_run_reserve(req.root, req.child_id, cap - 1)  # the root is one
        return TreeRunVerdict(granted=granted, cap=cap)
