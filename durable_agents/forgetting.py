"""Forget a tenant, or one user of a tenant: find their runs in Temporal, delete their data, then the runs.

Used by ``starter.py forget`` (:mod:`durable_agents.cli.forget`). The steps:

1. **Find** the runs: every execution whose ``AgentTenant`` search attribute is the tenant
   (sub-agents, forks, sessions and continued runs carry it too), kept only when its own start
   input (from its history) names that tenant, and, with ``user``, that user. The user is not a
   search attribute: it is read from the start input, which is also what makes a search attribute
   set by hand on someone else's run not enough to get that run deleted.
2. **Open runs** are left alone and listed, unless ``include_open``: then each is cancelled (as
   ``starter.py cancel`` does: the run's compensations run), waited for until it closed (at most
   ``open_wait_s``), and forgotten with the closed ones; a run still open then is reported, not deleted.
3. **The store**: the runs' conversations (``<workflow id>/<first run>``, its rewind branches, and
   ``<workflow id>/session`` for a session of that tenant and user), their checkpoints and blobs
   (a blob another run still uses stays), and the ledger entries of their workflow ids (unless the
   workflow id also names a run that is not being forgotten): :func:`activities.erasure.erase`. Then
   with ``memory``, the tenant's (or user's) long-term memory entries, which are kept per namespace
   rather than per run.
4. **Temporal**: ``DeleteWorkflowExecution`` for every closed run found. The server deletes
   asynchronously, once its transfer queue's ack level has passed the run's close: a run may
   still be described and listed for up to ``history.transferProcessorUpdateAckInterval``
   after (30 s by default).

A dry run does steps 1 and 3 as counts and deletes nothing. Running it again is safe: what is gone
is not found again (a run the server is still deleting may be listed and its deletion asked for again;
its data in the store is gone already).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import structlog
from temporalio.api.common.v1 import WorkflowExecution as ExecutionRef
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.checkpoints.gc import workflow_of
from activities.erasure import erase
from activities.memory import MemoryStore, open_memory
from activities.settings import Settings
from activities.store.base import TENANT_META, USER_META, RunStore
from activities.store.factory import open_store
from activities.streaming import DeltaChannel, open_channel
from workflows.identity import SESSION_RUN
from workflows.types import AgentInput

AUDIT_LOGGER = "durable_agents.audit"
log = structlog.get_logger(AUDIT_LOGGER)
OPEN_WAIT_S = 120.0  # how long --include-open waits for the cancelled runs to close
_POLL_S = 0.5
_PAGE = 1000


def query_literal(value: str) -> str:
    """``value`` as a visibility query string literal: a quote or backslash in a tenant name stays text."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class Run:
    workflow_id: str
    run_id: str
    first_run_id: str
    open: bool
    session: bool


@dataclass
class ForgetReport:
    """What a forget deleted (or, for a dry run, would delete).

    ``counts`` per kind: ``runs`` (Temporal executions), ``conversations``, ``messages``, ``checkpoints``,
    ``blobs``, ``ledger_entries``, ``memory_entries``, and ``shared_blobs_kept`` (blobs other runs still use).
    ``open_runs`` are the workflow ids left alone; ``kept_ledgers`` the workflow ids whose ledger entries
    stay because other runs share them; ``scrubbed`` is False when SQLite's WAL could not be truncated.
    """

    tenant: str
    user: str | None
    dry_run: bool
    counts: dict[str, int] = field(default_factory=dict)
    open_runs: list[str] = field(default_factory=list)  # left alone (or, with include_open, still open)
    kept_ledgers: list[str] = field(default_factory=list)  # workflow ids another run shares
    problems: list[str] = field(default_factory=list)
    scrubbed: bool = True


async def find_runs(client: Client, tenant: str, user: str | None) -> list[Run]:
    """The executions of ``tenant`` (and ``user``): visibility says the tenant, each one's start input confirms."""
    found: list[Run] = []
    seen: set[tuple[str, str]] = set()
    async for wf in client.list_workflows(f"AgentTenant = {query_literal(tenant)}", page_size=_PAGE):
        if (wf.id, wf.run_id) in seen:
            continue
        seen.add((wf.id, wf.run_id))
        owner = await _owner(client, wf)
        if owner is None:
            continue
        inp, first_run = owner
        if inp.tenant != tenant or (user is not None and inp.user != user):
            continue
        session = inp.session is not None or (inp.carry is not None and inp.carry.session is not None)
        found.append(Run(wf.id, wf.run_id, first_run, wf.status == WorkflowExecutionStatus.RUNNING, session))
    return found


async def _owner(client: Client, wf: WorkflowExecution) -> tuple[AgentInput, str] | None:
    """The run's start input and its chain's first run id (None: not an agent run, or its history is gone)."""
    if wf.workflow_type != "AgentWorkflow":
        return None
    handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
    try:
        async for event in handle.fetch_history_events(page_size=1):
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                return None
            started = event.workflow_execution_started_event_attributes
            try:
                [inp] = await client.data_converter.decode(list(started.input.payloads), [AgentInput])
            except Exception:  # anything the converter raises for an input that is not an agent run's
                return None
            if not isinstance(inp, AgentInput):
                return None
            return inp, started.first_execution_run_id or wf.run_id
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return None


async def _conversations_of(store: RunStore, runs: list[Run], tenant: str, user: str | None) -> list[str]:
    chains = {(r.workflow_id, r.first_run_id) for r in runs}
    sessions = {r.workflow_id for r in runs if r.session}
    found: list[str] = []
    for conversation_id, _ in await store.conversations():
        try:
            workflow_id, run = workflow_of(conversation_id)
        except ValueError:
            continue
        mine = (workflow_id, run) in chains or (
            run == SESSION_RUN and workflow_id in sessions and await _session_is(store, conversation_id, tenant, user)
        )
        if mine:
            found.append(conversation_id)
    return found


async def _session_is(store: RunStore, conversation_id: str, tenant: str, user: str | None) -> bool:
    """Whether the session conversation records this tenant (and user): a session id may be reused."""
    first = await store.get_message(conversation_id, 0)
    if first is None:
        return False
    meta = first.meta
    return meta.get(TENANT_META, "") == tenant and (user is None or meta.get(USER_META, "") == user)


async def _shared_workflow_ids(client: Client, runs: list[Run]) -> set[str]:
    """Workflow ids that also name a run not being forgotten (its ledger entries are kept: they are keyed by
    workflow id only)."""
    mine = {(r.workflow_id, r.run_id) for r in runs}
    shared: set[str] = set()
    for workflow_id in sorted({r.workflow_id for r in runs}):
        async for wf in client.list_workflows(f"WorkflowId = {query_literal(workflow_id)}", page_size=_PAGE):
            if (wf.id, wf.run_id) not in mine:
                shared.add(workflow_id)
                break
    return shared


async def cancel_and_wait(client: Client, runs: list[Run], wait_s: float) -> list[Run]:
    """Cancel the open ``runs`` (their compensations run) and wait for them to close; those still open after."""
    for run in runs:
        try:
            await client.get_workflow_handle(run.workflow_id, run_id=run.run_id).cancel()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
    deadline = time.monotonic() + wait_s
    pending = list(runs)
    while pending:
        still: list[Run] = []
        for run in pending:
            try:
                desc = await client.get_workflow_handle(run.workflow_id, run_id=run.run_id).describe()
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
                continue
            if desc.status == WorkflowExecutionStatus.RUNNING:
                still.append(run)
        pending = still
        if not pending or time.monotonic() >= deadline:
            break
        await asyncio.sleep(_POLL_S)
    return pending


async def delete_executions(client: Client, runs: list[Run]) -> int:
    """``DeleteWorkflowExecution`` for each closed run; how many the server accepted."""
    deleted = 0
    for run in runs:
        request = DeleteWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=ExecutionRef(workflow_id=run.workflow_id, run_id=run.run_id),
        )
        try:
            await client.workflow_service.delete_workflow_execution(request)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                continue  # deleted already (a second forget while the server finishes the first)
            raise
        deleted += 1
    return deleted


async def forget(
    client: Client,
    store: RunStore,
    tenant: str,
    user: str | None = None,
    *,
    dry_run: bool = False,
    include_open: bool = False,
    open_wait_s: float = OPEN_WAIT_S,
    memory: MemoryStore | None = None,
    deltas: DeltaChannel | None = None,
) -> ForgetReport:
    """Delete everything of ``tenant`` (or of its ``user``); see the module. Writes one audit log line."""
    report = ForgetReport(tenant=tenant, user=user, dry_run=dry_run)
    runs = await find_runs(client, tenant, user)
    open_runs = [r for r in runs if r.open]
    if open_runs and include_open and not dry_run:
        still_open = await cancel_and_wait(client, open_runs, open_wait_s)
        runs = await find_runs(client, tenant, user)  # their final state (a cancelled run may have closed)
        left = {(r.workflow_id, r.run_id) for r in still_open}
        open_runs = [r for r in runs if r.open or (r.workflow_id, r.run_id) in left]
    report.open_runs = sorted({r.workflow_id for r in open_runs})
    open_ids = {(r.workflow_id, r.run_id) for r in open_runs}
    closed = [r for r in runs if (r.workflow_id, r.run_id) not in open_ids]
    # A workflow id with a run that stays (open, or someone else's) keeps its conversations' chains apart
    # (they are per first run) but shares its ledger: that is kept.
    shared = await _shared_workflow_ids(client, closed)
    report.kept_ledgers = sorted(shared)
    conversations = await _conversations_of(store, closed, tenant, user)
    erased = await erase(
        store, conversations, sorted({r.workflow_id for r in closed} - shared), dry_run=dry_run, scrub=False
    )
    report.problems = erased.problems
    report.counts["runs"] = len(closed) if dry_run else 0
    report.counts.update(erased.counts())
    if memory is not None:  # kept per (tenant, user), not per run: open runs do not keep it
        report.counts["memory_entries"] = (
            await memory.count(tenant, user) if dry_run else await memory.forget(tenant, user)
        )
    if deltas is not None:  # streamed text is the workflow id's, all of it: shared ids included
        ids = sorted({r.workflow_id for r in closed})
        report.counts["stream_deltas"] = sum([await (deltas.count if dry_run else deltas.delete)(w) for w in ids])
    if not dry_run:
        # Once, after every kind is deleted, and also when nothing was now: an earlier scrub may not
        # have completed. Full: PostgreSQL rewrites the tables, so no deleted bytes stay in their files.
        report.scrubbed = await store.scrub(full=True)
        report.counts["runs"] = await delete_executions(client, closed)
    log.info(
        "forget",
        tenant=tenant,
        user=user if user is not None else "",
        dry_run=dry_run,
        include_open=include_open,
        open_runs=len(report.open_runs),
        **report.counts,
    )
    return report


async def forget_tenant(
    client: Client,
    settings: Settings,
    tenant: str,
    user: str | None = None,
    *,
    dry_run: bool = False,
    include_open: bool = False,
) -> ForgetReport:
    """:func:`forget` with the run store and long-term memory of ``settings`` (what ``durable-agents forget`` runs).

    ``client`` must reach the namespace of the tenant's runs, with the ``Agent*`` search attributes
    registered (an ``RPCError`` with ``INVALID_ARGUMENT`` otherwise). Example::

        report = await forget_tenant(client, Settings.from_env(), "acme", dry_run=True)
        print(report.counts)  # {"runs": 4, "conversations": 4, ..., "memory_entries": 2}
    """
    store = open_store(settings.store_url, settings.encryption.keyring)
    memory = open_memory(settings)
    deltas = open_channel(settings)
    try:
        return await forget(
            client, store, tenant, user, dry_run=dry_run, include_open=include_open, memory=memory, deltas=deltas
        )
    finally:
        await deltas.close()
        await memory.close()
        await store.close()
