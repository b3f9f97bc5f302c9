"""Wire the sandbox reaper to Temporal: a sandbox is reaped when its run's workflow chain is closed.

Used by ``starter.py sandboxes reap`` and by the worker's periodic reaper task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.sandbox.base import SandboxBackend
from activities.sandbox.reaper import ReapReport, reap

log = structlog.get_logger("reaper")


def run_closed_checker(client: Client) -> Callable[[str], Awaitable[bool]]:
    """``is_run_closed(conversation_id)`` for the reaper.

    A conversation id is ``<workflow id>/<first run id>``; the chain is closed when
    its latest run is not running, when the workflow id was reused by a newer chain,
    or when Temporal no longer knows it.
    """

    async def is_run_closed(conversation_id: str) -> bool:
        workflow_id, _, first_run_id = conversation_id.rpartition("/")
        try:
            desc = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return True
            raise
        latest_first_run = desc.raw_description.workflow_execution_info.first_run_id
        if first_run_id and latest_first_run and latest_first_run != first_run_id:
            return True
        return desc.status != WorkflowExecutionStatus.RUNNING

    return is_run_closed


async def reap_once(client: Client, backend: SandboxBackend, *, min_age_s: float = 60.0) -> ReapReport:
    return await reap(backend, run_closed_checker(client), min_age_s=min_age_s)


async def reap_forever(client: Client, backend: Callable[[], SandboxBackend], every_s: float) -> None:
    """The worker's background reaper: one pass every ``every_s`` seconds; errors are logged, never raised."""
    while True:
        await asyncio.sleep(every_s)
        try:
            report = await reap_once(client, backend())
        except Exception as exc:  # the reaper is a safety net; it must never take the worker down
            log.warning("reap_failed", error=str(exc))
            continue
        if report.killed or report.errors:
            log.info("reaped", summary=report.summary())
