"""``AGENT_TENANT_MAX_OPEN_RUNS``: how many top-level runs and sessions one tenant may have open at once.

A run takes its place in the run store's ``tenant_runs`` at its start (in ``run_config``, so the count and
the decision are one atomic step in trusted code, whoever started the run and however) and gives it back
in its cleanup (``tenant_run_release``). A run that never cleaned up (terminated, crashed past its
retries, failed on its input) keeps its row until someone checks: a start that finds the tenant full asks
Temporal whether the counted runs are still open and frees the places of those that are not, and the
worker's reaper does the same for every tenant on each pass.

Only runs without a parent workflow count: a sub-agent is part of its tree (``AGENT_MAX_TREE_RUNS``).
Runs without a tenant are not counted. A session counts once for all its messages (one workflow id,
across continue-as-new); an idle session that ended gives its place back and takes one again when a
message wakes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import structlog
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.store.base import RunStore
from activities.store_errors import store_guarded
from workflows.inputs import quote
from workflows.types import TENANT_QUOTA_EXCEEDED, TenantRunRelease

if TYPE_CHECKING:  # the reaper (and so every CLI command) imports this module: not the whole worker runtime
    from activities.runtime import Runtime

log = structlog.get_logger("activities.tenant_quota")

_CHECK_CONCURRENCY = 16  # describe calls in flight while checking which counted runs are still open
_NAMED_MAX = 5  # counted runs a refusal names

IsOpen = Callable[[str], Awaitable[bool]]


def open_checker(client: Client) -> IsOpen:
    """``is_open(workflow_id)``: whether the workflow's latest run is running (unknown to Temporal: closed)."""

    async def is_open(workflow_id: str) -> bool:
        try:
            desc = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return desc.status == WorkflowExecutionStatus.RUNNING

    return is_open


async def release_closed(store: RunStore, is_open: IsOpen, tenant: str | None = None) -> int:
    """Give back the places of counted runs (of one tenant, or all) that are no longer open; how many.

    A run Temporal cannot be asked about right now keeps its place.
    """
    rows = await store.tenant_runs(tenant)
    gate = asyncio.Semaphore(_CHECK_CONCURRENCY)

    async def closed(workflow_id: str) -> bool:
        async with gate:
            try:
                return not await is_open(workflow_id)
            except RPCError as err:
                log.warning("tenant_run_check_failed", workflow_id=workflow_id[:200], error=str(err)[:200])
                return False

    verdicts = await asyncio.gather(*(closed(workflow_id) for _, workflow_id in rows))
    released = 0
    for (owner, workflow_id), is_closed in zip(rows, verdicts, strict=True):
        if is_closed and await store.tenant_run_release(owner, workflow_id):
            released += 1
    return released


def _worker_client() -> Client | None:
    try:
        return activity.client()
    except RuntimeError:  # not given one (an activity environment without a client)
        return None


async def reserve(runtime: Runtime, tenant: str, workflow_id: str) -> bool:
    """Count ``workflow_id`` among ``tenant``'s open runs; whether it holds a place (False: no limit applies).

    ``ApplicationError`` of type ``TenantQuotaExceeded`` (non-retryable) when the tenant has
    ``AGENT_TENANT_MAX_OPEN_RUNS`` open runs already, after freeing the places of those that closed.
    """
    cap = runtime.settings.tenant_max_open_runs
    if cap <= 0 or not tenant:
        return False
    store = runtime.store
    granted, counted = await store.tenant_run_reserve(tenant, workflow_id, cap)
    if not granted:
        client = _worker_client()
        if client is not None and await release_closed(store, open_checker(client), tenant):
            granted, counted = await store.tenant_run_reserve(tenant, workflow_id, cap)
    if granted:
        return True
    named = ", ".join(quote(c) for c in counted[:_NAMED_MAX]) + (" ..." if len(counted) > _NAMED_MAX else "")
    log.warning("tenant_quota_refused", tenant=tenant, open_runs=len(counted), limit=cap)
    runs = f"{len(counted)} open run{'' if len(counted) == 1 else 's'}"
    raise ApplicationError(
        f"tenant {quote(tenant)} has {runs}, the most AGENT_TENANT_MAX_OPEN_RUNS={cap} allows ({named}): "
        "wait for one to end or cancel one",
        type=TENANT_QUOTA_EXCEEDED,
        non_retryable=True,
    )


class TenantQuotaActivities:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @activity.defn(name="tenant_run_release")
    @store_guarded
    async def tenant_run_release(self, req: TenantRunRelease) -> bool:
        """The calling run no longer counts among its tenant's open runs (its own workflow id, not the input's)."""
        return await self._rt.store.tenant_run_release(req.tenant, activity.info().workflow_id or "")


__all__ = ["TenantQuotaActivities", "open_checker", "release_closed", "reserve"]
