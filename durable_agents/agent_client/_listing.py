"""Listing runs through the visibility API: ``list`` and the runs ``pending`` asks.

``pending`` without a run id finds the waiting runs by the ``AgentPendingApprovals`` search
attribute, so it sees every one of them however many runs are running: one visibility listing (a
page holds ``VISIBILITY_PAGE`` runs), then one status query for each of the first ``limit`` hits,
``QUERY_CONCURRENCY`` at a time and each with a short deadline, so a run no worker answers for
costs seconds, not the call. On a namespace without the attribute it asks every running run instead.

A page token is text any process (another API replica) can serve the next page from: ``list``'s is
the visibility listing's own (base64url), ``pending``'s the number of waiting runs already shown.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass

from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.crypto.codec import PayloadsEncrypted
from durable_agents.agent_client._errors import AgentClientError, InvalidRequest
from durable_agents.agent_client._owners import Warn
from durable_agents.agent_client._reading import (
    QUICK_QUERY_TIMEOUT,
    RPC_TIMEOUT,
    VISIBILITY_PAGE,
    describe_run,
    ended_state,
    list_runs,
    no_answer_reason,
    query_literal,
    raise_if_cancelled,
    recorded_state,
    started_input,
    temporal_state,
)
from workflows.agent import AgentWorkflow
from workflows.progress import PENDING_APPROVALS, STATE, TENANT
from workflows.types import StatusView

RUNNING_AGENTS = "WorkflowType = 'AgentWorkflow' AND ExecutionStatus = 'Running'"
QUERY_CONCURRENCY = 16  # status queries in flight at once while `pending` reads many runs
OPEN_STATES = ("running", "waiting_approval", "waiting_human")  # recorded by runs that still run
MAX_PAGE_TOKEN_CHARS = 4096  # a visibility token is a few hundred bytes; a longer one is not ours


def tenant_clause(tenant: str | None) -> str:
    """The clause of a client's tenant scope: none unscoped; runs without the attribute for tenant ""."""
    if tenant is None:
        return ""
    return f" AND {TENANT.name} = {query_literal(tenant)}" if tenant else f" AND {TENANT.name} IS NULL"


def list_query(state: str | None, tenant: str | None) -> str:
    """The visibility query of ``list``: agent runs (not the closed runs a continue-as-new left), filtered.

    Filter values are quoted with :func:`query_literal`: a tenant is user input. A ``running``,
    ``waiting_approval`` or ``waiting_human`` run is one that still runs (a run that was terminated
    keeps the state it last recorded). ``tenant`` "" is the runs of no tenant only when it is a
    client's scope; ``list --tenant`` never passes "".
    """
    clauses = ["WorkflowType = 'AgentWorkflow'", "ExecutionStatus != 'ContinuedAsNew'"]
    if state:
        clauses.append(f"{STATE.name} = {query_literal(state)}")
        if state in OPEN_STATES:
            clauses.append("ExecutionStatus = 'Running'")
    if tenant:
        clauses.append(f"{TENANT.name} = {query_literal(tenant)}")
    return " AND ".join(clauses)


def waiting_query(tenant: str | None) -> str:
    return f"{RUNNING_AGENTS} AND {PENDING_APPROVALS.name} > 0{tenant_clause(tenant)}"


def encode_token(token: bytes | None) -> str:
    return base64.urlsafe_b64encode(token).decode() if token else ""


def decode_token(text: str) -> bytes | None:
    if not text:
        return None
    try:
        if len(text) > MAX_PAGE_TOKEN_CHARS:
            raise ValueError
        return base64.urlsafe_b64decode(text.encode())
    except (ValueError, binascii.Error):
        raise InvalidRequest(f"not a page token: {text[:40]!r}") from None


@dataclass(frozen=True)
class Listed:
    runs: list[WorkflowExecution]
    next_page_token: bytes | None
    total: int | None  # None: the server did not say


async def list_page(client: Client, query: str, limit: int, page_token: bytes | None = None) -> Listed:
    """Up to ``limit`` runs matching ``query`` from ``page_token`` on (in the server's order: open runs,
    then the latest closed), where the next page starts, and how many match in all.

    Pages of at most ``VISIBILITY_PAGE`` are read until ``limit`` runs are in hand. When the last page
    read was the listing's last and the first, the total is known without another call; else one
    ``CountWorkflowExecutions`` says it. An ``RPCError`` of the listing (e.g. ``INVALID_ARGUMENT``: a
    search attribute the namespace does not know) is raised.
    """
    found: dict[str, WorkflowExecution] = {}
    token = page_token
    first = page_token is None
    while True:
        pages = client.list_workflows(
            query, page_size=min(limit - len(found), VISIBILITY_PAGE), next_page_token=token, rpc_timeout=RPC_TIMEOUT
        )
        await pages.fetch_next_page()
        for wf in pages.current_page or ():
            found.setdefault(wf.id, wf)
        token = pages.next_page_token or None
        if token is None or len(found) >= limit:
            break
    if token is None and first:
        return Listed(list(found.values()), None, len(found))
    try:
        total: int | None = (await client.count_workflows(query, rpc_timeout=RPC_TIMEOUT)).count
    except (RPCError, RPCTimeoutOrCancelledError):
        raise_if_cancelled()
        total = None
    return Listed(list(found.values()), token, total)


async def every_run(client: Client, query: str) -> list[WorkflowExecution]:
    found: dict[str, WorkflowExecution] = {}
    async for wf in client.list_workflows(query):  # no limit: the iterator reads every page
        found.setdefault(wf.id, wf)
    return list(found.values())


async def agent_state(client: Client, wf: WorkflowExecution) -> str:
    """The agent's state of a listed run: its ``AgentState`` attribute, else (closed runs) its result."""
    if wf.status == WorkflowExecutionStatus.RUNNING:
        return recorded_state(wf.typed_search_attributes) or "running"
    try:
        return await ended_state(client, wf.id, wf.run_id, wf.status, wf.typed_search_attributes)
    except PayloadsEncrypted:  # one run this client has no keys for does not stop the listing: Temporal's word
        return temporal_state(wf.status)


@dataclass(frozen=True)
class SessionRow:
    """What ``list`` shows of a run as a session."""

    session: bool = False
    state: str = ""  # a running session's state from its status query ("idle"); "" when not asked or no answer
    messages: int | None = None  # messages taken so far (a running session's answer, else what its input carried)


async def session_of(client: Client, wf: WorkflowExecution) -> SessionRow:
    """Whether a listed run is a session; a running one's state and message count from its status query."""
    try:
        inp = await started_input(client, wf.id, wf.run_id)
    except PayloadsEncrypted:  # a run this client has no keys for is listed all the same, unmarked
        return SessionRow()
    except (RPCError, RPCTimeoutOrCancelledError) as err:
        raise_if_cancelled()
        if isinstance(err, RPCError) and err.status == RPCStatusCode.UNAVAILABLE:
            raise
        return SessionRow()
    if inp is None or inp.session is None:
        return SessionRow()
    carried = inp.carry.session.messages if inp.carry is not None and inp.carry.session is not None else None
    if wf.status != WorkflowExecutionStatus.RUNNING:
        return SessionRow(True, "", carried)
    try:
        view = StatusView.model_validate(
            await client.get_workflow_handle(wf.id, run_id=wf.run_id).query(
                AgentWorkflow.status, rpc_timeout=QUICK_QUERY_TIMEOUT
            )
        )
    except (RPCError, RPCTimeoutOrCancelledError, WorkflowQueryFailedError, ValueError, PayloadsEncrypted):
        raise_if_cancelled()
        return SessionRow(True, "", carried)
    return SessionRow(True, view.state, view.messages)


@dataclass(frozen=True)
class Waiting:
    runs: list[WorkflowExecution]
    total: int  # waiting runs in all, those before ``offset`` included
    by_attribute: bool  # False: the namespace has no AgentPendingApprovals: every running run is listed


async def waiting_runs(client: Client, limit: int, tenant: str | None, offset: int = 0) -> Waiting:
    """The ``limit`` runs after the first ``offset`` that may wait for a decision, how many there are in
    all, and whether the attribute said so.

    By the ``AgentPendingApprovals`` search attribute the workflow keeps current: one listing call
    (per ``VISIBILITY_PAGE`` waiting runs). On a namespace that does not know the attribute (the
    server rejects the query), every running ``AgentWorkflow``, all pages (their status queries then
    tell which ones wait).
    """
    try:
        runs, total = await list_runs(client, waiting_query(tenant), offset + limit, page_size=VISIBILITY_PAGE)
    except RPCError as err:
        if err.status != RPCStatusCode.INVALID_ARGUMENT:
            raise
    else:
        return Waiting(runs[offset:], len(runs) if total is None else total, True)
    everyone = await every_run(client, RUNNING_AGENTS)
    return Waiting(everyone, len(everyone), False)


async def listed_view(client: Client, wf: WorkflowExecution, warn: Warn) -> StatusView | None:
    """A listed run's status query answer: one query RPC, under ``QUICK_QUERY_TIMEOUT``.

    No answer is a warning naming the run and why (from what the server knows without a worker),
    and None: one stuck run costs seconds, not the call.
    """
    handle = client.get_workflow_handle(wf.id)
    try:
        async with asyncio.timeout(QUICK_QUERY_TIMEOUT.total_seconds() + 1):  # in case the RPC overstays
            view = await handle.query(AgentWorkflow.status, rpc_timeout=QUICK_QUERY_TIMEOUT)
        return StatusView.model_validate(view)
    except WorkflowQueryFailedError as err:
        reason = f"its worker could not answer: {err}"
    except (RPCError, RPCTimeoutOrCancelledError, TimeoutError):
        raise_if_cancelled()
        reason = await _why_no_answer(client, wf.id)
    pending = wf.typed_search_attributes.get(PENDING_APPROVALS)
    recorded = f"; it last recorded {pending} pending approval(s)" if pending is not None else ""
    warn(f"warning: run {wf.id} is running but {reason}{recorded}")
    return None


async def _why_no_answer(client: Client, workflow_id: str) -> str:
    try:
        _, desc = await describe_run(client, workflow_id)
        return await no_answer_reason(client, desc, waited=QUICK_QUERY_TIMEOUT)
    except (AgentClientError, RPCError, RPCTimeoutOrCancelledError):
        raise_if_cancelled()
        return f"no worker answered within {QUICK_QUERY_TIMEOUT.seconds} s"
