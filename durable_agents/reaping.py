"""Wire the sandbox reaper to Temporal: a sandbox is reaped when its run's workflow chain is closed.

Used by ``starter.py sandboxes reap`` and by the worker's periodic reaper task, which also applies
``AGENT_RUN_RETENTION_DAYS`` (:func:`expire_runs`) and collects unreferenced store blobs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.checkpoints import gc
from activities.checkpoints.gc import workflow_of
from activities.erasure import Erased, erase
from activities.memory import MemoryStore
from activities.sandbox.base import SandboxBackend
from activities.sandbox.reaper import ReapReport, reap
from activities.store.base import RunStore
from activities.streaming import DeltaChannel
from activities.streaming.base import RETAIN_S
from activities.tenant_quota import open_checker, release_closed
from workflows.identity import SESSION_RUN

log = structlog.get_logger("reaper")


def run_closed_checker(client: Client) -> Callable[[str], Awaitable[bool]]:
    """``is_run_closed(conversation_id)`` for the reaper.

    A conversation id is ``<workflow id>/<first run id>``; the chain is closed when
    its latest run is not running, when the workflow id was reused by a newer chain,
    or when Temporal no longer knows it.
    """

    async def is_run_closed(conversation_id: str) -> bool:
        try:  # a branch of a rewound run ("<id>/<first run>~<branch>") belongs to the same chain
            workflow_id, first_run_id = workflow_of(conversation_id)
        except ValueError:
            workflow_id, first_run_id = conversation_id, ""
        try:
            desc = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return True
            raise
        latest_first_run = desc.raw_description.workflow_execution_info.first_run_id
        # A session's sandbox belongs to whichever run of it is current (``<workflow id>/session``).
        if first_run_id and first_run_id != SESSION_RUN and latest_first_run and latest_first_run != first_run_id:
            return True
        return desc.status != WorkflowExecutionStatus.RUNNING

    return is_run_closed


async def reap_once(client: Client, backend: SandboxBackend, *, min_age_s: float = 60.0) -> ReapReport:
    return await reap(backend, run_closed_checker(client), min_age_s=min_age_s)


def conversation_keeper(
    client: Client, retention_s: float, clock: Callable[[], float] = time.time
) -> Callable[[str, float], Awaitable[bool]]:
    """``keep(conversation_id, last_write)`` for checkpoint garbage collection.

    Kept: conversations of running chains, and of chains closed less than ``retention_s`` ago (so
    they can still be forked). A conversation Temporal no longer knows (its history passed the
    namespace's retention), or whose workflow id now belongs to a newer chain, is kept until
    ``retention_s`` after its last write.
    """
    described: dict[str, tuple[str, bool, float | None]] = {}  # workflow id -> (first run, running, closed at)

    async def keep(conversation_id: str, last_write: float) -> bool:
        now = clock()
        try:
            workflow_id, first_run_id = workflow_of(conversation_id)
        except ValueError:
            return now - last_write < retention_s
        if workflow_id not in described:
            try:
                desc = await client.get_workflow_handle(workflow_id).describe()
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise  # unsure: collect nothing rather than delete what a live run needs
                described[workflow_id] = ("", False, None)
            else:
                closed = desc.close_time.timestamp() if desc.close_time else None
                first = desc.raw_description.workflow_execution_info.first_run_id
                described[workflow_id] = (first, desc.status == WorkflowExecutionStatus.RUNNING, closed)
        first, running, closed_at = described[workflow_id]
        if first != first_run_id and not (first_run_id == SESSION_RUN and first):
            return now - last_write < retention_s
        if running:
            return True
        return now - (closed_at if closed_at is not None else last_write) < retention_s

    return keep


async def collect_garbage(
    client: Client, store: RunStore, retention_days: float, *, grace_s: float = 3600.0
) -> gc.GcReport:
    """Delete the store blobs no open run or kept checkpoint references (see ``activities.checkpoints.gc``)."""
    keep = conversation_keeper(client, retention_days * 86400)
    return await gc.collect(store, keep_conversation=keep, grace_s=grace_s)


async def expire_runs(
    client: Client, store: RunStore, run_retention_days: float, *, clock: Callable[[], float] = time.time
) -> Erased:
    """``AGENT_RUN_RETENTION_DAYS``: delete the transcripts, checkpoints and blobs of runs closed longer ago.

    The same rules as ``forget`` (:func:`activities.erasure.erase`): a blob another run still uses stays.
    Which conversations are old is :func:`conversation_keeper`'s answer with that retention (a conversation
    Temporal no longer knows counts from its last write). Ledger entries stay: they are keyed by workflow
    id, which a newer run may reuse.
    """
    keep = conversation_keeper(client, run_retention_days * 86400, clock)
    expired = [c for c, last_write in await store.conversations() if not await keep(c, last_write)]
    if not expired:
        return Erased()
    return await erase(store, expired, [], now=clock())


async def expire_memory(memory: MemoryStore, now: float | None = None) -> int:
    """Delete the memory entries past ``AGENT_MEMORY_TTL_DAYS``; how many (0 after an error, which is logged)."""
    try:
        expired = await memory.expire(time.time() if now is None else now)
    except Exception as exc:
        log.warning("memory_expiry_failed", error=str(exc)[:300])
        return 0
    if expired:
        log.info("memory_expired", deleted=expired)
    return expired


async def expire_deltas(channel: DeltaChannel, older_than: float) -> int:
    """Delete streamed text written before ``older_than`` (its turns are long in the transcript), and stale
    listeners; how many deltas (0 after an error, which is logged)."""
    try:
        expired = await channel.expire(older_than)
    except Exception as exc:
        log.warning("stream_expiry_failed", error=str(exc)[:300])
        return 0
    if expired:
        log.info("stream_deltas_expired", deleted=expired)
    return expired


async def reap_forever(
    client: Client,
    backend: Callable[[], SandboxBackend],
    every_s: float,
    *,
    store: Callable[[], RunStore] | None = None,
    retention_days: float = 7.0,
    run_retention_days: float | None = None,
    clock: Callable[[], float] = time.time,
    memory: Callable[[], MemoryStore] | None = None,
    deltas: Callable[[], DeltaChannel] | None = None,
) -> None:
    """The worker's background reaper: one pass every ``every_s`` seconds; errors are logged, never raised.

    A pass kills the sandboxes of closed runs, then (with ``store``) deletes the data of runs closed
    longer than ``run_retention_days`` ago (when set) and the run store blobs no open run or kept
    checkpoint references, and gives back the tenant places (``AGENT_TENANT_MAX_OPEN_RUNS``) of runs
    that closed without giving theirs back; then (with ``memory``) the memory entries past their TTL, and (with
    ``deltas``) streamed text older than ``activities.streaming.base.RETAIN_S``.
    """
    while True:
        await asyncio.sleep(every_s)
        if memory is not None:
            await expire_memory(memory())
        if deltas is not None:
            await expire_deltas(deltas(), clock() - RETAIN_S)
        try:
            report = await reap_once(client, backend())
        except Exception as exc:  # the reaper is a safety net; it must never take the worker down
            log.warning("reap_failed", error=str(exc))
        else:
            if report.killed or report.errors:
                log.info("reaped", summary=report.summary())
        if store is None:
            continue
        if run_retention_days is not None:
            try:
                expired = await expire_runs(client, store(), run_retention_days, clock=clock)
            except Exception as exc:
                log.warning("run_retention_failed", error=str(exc)[:300])
            else:
                if expired.conversations or expired.blobs:
                    log.info("run_retention", **expired.counts())
        try:
            collected = await collect_garbage(client, store(), retention_days)
        except Exception as exc:
            log.warning("checkpoint_gc_failed", error=str(exc)[:300])
        else:
            if collected.deleted or collected.problems:
                log.info(
                    "checkpoint_gc", deleted=collected.deleted, kept=collected.kept, problems=len(collected.problems)
                )
        try:
            released = await release_closed(store(), open_checker(client))
        except Exception as exc:
            log.warning("tenant_runs_check_failed", error=str(exc)[:300])
        else:
            if released:
                log.info("tenant_runs_released", released=released)
