"""Which run owns an approval, and that run's own entry: what ``AgentClient.pending`` and ``decide`` show and sign.

A run's status lists its own approvals (its book: entries whose ``workflow_id`` is
empty) and, as a hint, what its sub-agents reported (entries naming a sub-agent's
run). A signal names no sender, so a reported entry may be forged: one made a
parent list a harmless ``read_file README.md`` whose signed approval released
another run's ``POST /pay``. Nothing here trusts a reported entry. Each run of a
tree is asked for its own book; the tree is what each run lists, from its own
state, as the sub-agents it started that still run (``StatusView.subagents``),
and only ids under the asking run's own id (``<run>/<name>/s<step>c<i>``) are
followed. A reported entry that its owner does not list is never shown or signed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from temporalio.client import Client, RPCTimeoutOrCancelledError, WorkflowQueryFailedError
from temporalio.service import RPCError

from durable_agents.agent_client._reading import QUICK_QUERY_TIMEOUT, bounded, raise_if_cancelled
from workflows.agent import AgentWorkflow
from workflows.types import PendingApproval, StatusView

TREE_RUNS = 256  # runs of one tree asked at most (AGENT_MAX_TREE_RUNS keeps real trees far smaller)
TREE_CONCURRENCY = 16  # status queries in flight at once
Warn = Callable[[str], None]  # where a line about a run that did not answer goes (the CLI: stderr)


def no_warning(line: str) -> None:
    """The default ``Warn``: such lines are dropped (a front end that shows them passes its own)."""


@dataclass(frozen=True)
class Owned:
    """An approval as the run that waits for it lists it in its own book."""

    workflow_id: str  # the owner
    approval: PendingApproval  # its own entry (``workflow_id`` empty)
    via: str = ""  # the run it was found under, when that is not the owner


async def tree(
    client: Client, workflow_id: str, view: StatusView, warn: Warn = no_warning
) -> list[tuple[str, StatusView]]:
    """The run and the live sub-agents under it that answer, breadth first (at most ``TREE_RUNS``)."""
    found = [(workflow_id, view)]
    seen = {workflow_id}
    frontier = found
    while frontier and len(found) < TREE_RUNS:
        ids = [c for wid, v in frontier for c in v.subagents if c.startswith(f"{wid}/") and c not in seen]
        ids = list(dict.fromkeys(ids))[: TREE_RUNS - len(found)]
        seen.update(ids)
        views = await bounded((_sub_agent_view(client, c, warn) for c in ids), TREE_CONCURRENCY)
        frontier = [(c, v) for c, v in zip(ids, views, strict=True) if v is not None]
        found += frontier
    return found


async def _sub_agent_view(client: Client, workflow_id: str, warn: Warn) -> StatusView | None:
    try:
        async with asyncio.timeout(QUICK_QUERY_TIMEOUT.total_seconds() + 1):
            raw = await client.get_workflow_handle(workflow_id).query(
                AgentWorkflow.status, rpc_timeout=QUICK_QUERY_TIMEOUT
            )
        return StatusView.model_validate(raw)
    except (WorkflowQueryFailedError, RPCError, RPCTimeoutOrCancelledError, TimeoutError) as err:
        raise_if_cancelled()
        reason = str(err) or type(err).__name__
        warn(f"warning: sub-agent run {workflow_id} did not answer ({reason}): approvals not shown")
        return None


def owned(runs: Iterable[tuple[str, StatusView]], root: str = "") -> dict[tuple[str, str], Owned]:
    """Every run's own pending approvals, by (owner, approval id); ``via`` names ``root`` for the others'."""
    found: dict[tuple[str, str], Owned] = {}
    for workflow_id, view in runs:
        for approval in view.pending_approvals:
            if not approval.workflow_id:
                via = root if root and root != workflow_id else ""
                found.setdefault((workflow_id, approval.approval_id), Owned(workflow_id, approval, via))
    return found


def unconfirmed(runs: Iterable[tuple[str, StatusView]], confirmed: dict[tuple[str, str], Owned]) -> list[str]:
    """A warning for each reported entry whose owner does not list it (forged, or already out of date)."""
    return [
        f"warning: run {workflow_id} lists approval {a.approval_id} as run {a.workflow_id}'s, which does not "
        "list it: not shown (a forged or out-of-date report)"
        for workflow_id, view in runs
        for a in view.pending_approvals
        if a.workflow_id and (a.workflow_id, a.approval_id) not in confirmed
    ]


async def owned_in_tree(client: Client, workflow_id: str, view: StatusView, warn: Warn = no_warning) -> list[Owned]:
    """The approvals that runs of ``workflow_id``'s tree wait for, each as its owner lists it."""
    runs = await tree(client, workflow_id, view, warn)
    return list(owned(runs, workflow_id).values())
