"""``AgentClient``: every operation a front end performs on runs, over a Temporal ``Client``.

The CLI (``durable_agents/cli/``) is argparse and rendering over it; the HTTP API makes one per
request, scoped to its token's tenant (:meth:`AgentClient.for_tenant`). It keeps no state of its
own: everything it answers comes from the Temporal server and the runs' queries.

Tenant scoping: a client with ``tenant`` set sees a run only when the run is that tenant's, by its
input (``AgentInput.tenant`` in the started event, which no worker is needed to read) and by its
``AgentTenant`` search attribute when set (both must agree). Any other run, and a run that does not
exist, is the same ``RunNotFound``, so an id of another tenant's run does not leak.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

import durable_agents.agent_client._listing as _listing
from durable_agents.agent_client._errors import InvalidRequest, MessageRefused, RunNotFound, RunNotOpen
from durable_agents.agent_client._events import POLL_COOLDOWN, run_events
from durable_agents.agent_client._forking import Forking
from durable_agents.agent_client._reading import (
    RPC_TIMEOUT,
    bounded,
    ended_state,
    started_input,
    temporal_state,
)
from durable_agents.agent_client._starting import start_agent_run, static_details, static_summary
from durable_agents.agent_client._types import (
    EventCursor,
    RunEvent,
    RunPage,
    RunRef,
    RunSummary,
    SessionSend,
)
from durable_agents.fairness import tenant_priority
from workflows.agent import AgentWorkflow
from workflows.progress import MODEL, TENANT
from workflows.session_types import SendResult, SessionMessage
from workflows.types import AgentInput


class AgentClient(Forking):
    """A typed client over a Temporal ``Client``.

    ``tenant`` (optional) scopes every call: runs of another tenant are ``RunNotFound`` and
    ``list``/``pending`` show only the tenant's runs, and ``start``/``send`` stamp it on the input.
    ``approval_key`` signs decisions for workers that require signed decisions. ``warn`` receives
    the one-line warnings of calls that read many runs (a run no worker answered for; default: dropped).

    >>> agents = AgentClient(await Client.connect("localhost:7233"), task_queue="agent-tasks")
    >>> ref = await agents.start(AgentInput(task="say hello"))
    >>> (await agents.result(ref.workflow_id)).output
    """

    # --- starting ---------------------------------------------------------------------

    async def start(
        self,
        inp: AgentInput,
        *,
        workflow_id: str | None = None,
        reuse_id: bool = False,
        summary: str | None = None,
        details: str | None = None,
        what: str = "run",
    ) -> RunRef:
        """Start a run of ``inp`` (an id ``agent-<hex>`` unless ``workflow_id``); answers its ids.

        A scoped client stamps its tenant on the input and refuses (``InvalidRequest``) one naming
        another. ``RunExists`` when the id is taken (a closed run's too, unless ``reuse_id``).

        >>> ref = await agents.start(AgentInput(task="summarise README.md"), workflow_id="readme-1")
        >>> ref.workflow_id, ref.run_id
        """
        inp = self.stamped(inp)
        wid = workflow_id or f"agent-{uuid.uuid4().hex[:12]}"
        handle = await start_agent_run(
            self.client,
            inp,
            wid,
            self.task_queue,
            summary=static_summary(inp) if summary is None else summary,
            details=static_details(inp) if details is None else details,
            what=what,
            reuse_id=reuse_id,
        )
        return RunRef(workflow_id=wid, run_id=handle.result_run_id or "")

    async def send(
        self,
        session_id: str,
        text: str,
        *,
        message_id: str = "",
        sender: str = "",
        start: AgentInput | None = None,
    ) -> SendResult:
        """Send a session a message; with ``start`` the session is started with it when missing.

        With ``start`` (an input with ``session`` set) a missing or ended session is started (woken: an
        ended session goes on with its conversation and workspace) by one update-with-start; without it
        the session must be running (``RunNotFound``, ``RunNotOpen``). ``message_id`` makes a retry the
        same message (default: a new id). ``MessageRefused`` when the session refuses it.

        >>> sent = await agents.send("support-42", "Where is my order?", start=AgentInput(session=SessionSpec()))
        >>> sent.seq, sent.duplicate
        """
        sent = await self.send_session(session_id, text, message_id=message_id, sender=sender, start=start)
        return sent.result

    async def send_session(
        self,
        session_id: str,
        text: str,
        *,
        message_id: str = "",
        sender: str = "",
        start: AgentInput | None = None,
    ) -> SessionSend:
        """:meth:`send`, saying also whether the message started or woke the session."""
        try:
            message = SessionMessage(message_id=message_id or uuid.uuid4().hex, text=text, sender=sender)
        except ValidationError as exc:
            raise InvalidRequest(f"the message: {exc.errors(include_url=False)[0]['msg']}") from None
        if start is not None and start.session is None:
            raise InvalidRequest('start must be a session\'s input ("session": {} set)')
        try:
            _, desc = await self.run(session_id)
        except RunNotFound:
            if start is None or (self.tenant is not None and await _exists(self.client, session_id)):
                raise
            desc = None
        ended = desc is not None and desc.status != WorkflowExecutionStatus.RUNNING
        if desc is not None and ended and not await _is_session(self.client, desc):
            raise MessageRefused(
                f"refused: not_a_session: run {session_id} (ended) is not a session (a session starts with "
                '"session": {} in its input)',
                reason="not_a_session",
                by_session=True,
            )
        if ended and start is None:
            raise RunNotOpen(f"session {session_id} has ended; send with start= to wake it")
        task_queue = desc.task_queue if desc is not None else self.task_queue
        result = await self.deliver(session_id, message, start=start, task_queue=task_queue)
        woke = ""
        if desc is not None and ended:
            woke = await ended_state(self.client, desc.id, desc.run_id, desc.status, desc.typed_search_attributes)
        return SessionSend(
            workflow_id=session_id, result=result, task_queue=task_queue, started=desc is None, woke=woke
        )

    async def deliver(
        self,
        session_id: str,
        message: SessionMessage,
        *,
        start: AgentInput | None = None,
        task_queue: str | None = None,
        summary: str | None = None,
    ) -> SendResult:
        """The ``send`` update itself (with start when ``start``), no check first: :meth:`send` checks."""
        try:
            if start is None:
                handle = self.client.get_workflow_handle(session_id)
                answer: SendResult = await handle.execute_update("send", message, result_type=SendResult)
                return answer
            inp = self.stamped(start)
            operation = WithStartWorkflowOperation(
                AgentWorkflow.run,
                inp,
                id=session_id,
                task_queue=task_queue or self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                static_summary=summary,
                priority=tenant_priority(inp.tenant),
            )
            answer = await self.client.execute_update_with_start_workflow(
                "send", message, start_workflow_operation=operation, result_type=SendResult
            )
            return answer
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError):
                by_session = cause.type == "MessageRefused"
                what = (
                    f"refused: {cause.message}"
                    if by_session
                    else f"session {session_id} did not take the message: {cause}"
                )
                raise MessageRefused(what, reason=cause.message, by_session=by_session) from None
            raise MessageRefused(
                f"session {session_id} did not take the message: {cause or err}", reason=str(cause or err)
            ) from None

    # --- events, transcript, fork -----------------------------------------------------------

    async def events(
        self, workflow_id: str, *, after: EventCursor | None = None, poll_cooldown: timedelta = POLL_COOLDOWN
    ) -> AsyncIterator[RunEvent]:
        """The run's events after ``after`` until it (its last continued run) closes: progress
        events read by query (adding nothing to the run's history) merged with streamed text.

        Each event's ``cursor`` resumes after it: pass it back as ``after`` (an SSE ``id`` is
        ``str(cursor)``, ``EventCursor.parse`` reads ``Last-Event-ID``). Streamed text comes from the
        client's ``deltas`` source when it has one (``kind == "delta"``).

        >>> async for event in agents.events("readme-1"):
        ...     print(event.cursor, event.kind, event.progress.text if event.progress else event.text)
        >>> async for event in agents.events("readme-1", after=EventCursor.parse("12.0")):
        ...     ...  # from the 13th progress event on
        """
        await self.run(workflow_id)
        cursor = after or EventCursor()
        async for event in run_events(
            self.client, workflow_id, cursor, deltas=self.deltas, poll_cooldown=poll_cooldown
        ):
            yield event

    # --- stopping and listing ------------------------------------------------------------------

    async def cancel(self, workflow_id: str, *, reason: str = "") -> None:
        """Ask the run to cancel (its sandbox is cleaned up); ``RunNotOpen`` when it has already ended.

        >>> await agents.cancel("readme-1", reason="wrong task")
        """
        handle, desc = await self.run(workflow_id)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            state = await ended_state(self.client, desc.id, desc.run_id, desc.status, desc.typed_search_attributes)
            raise RunNotOpen(f"run {workflow_id} has already ended: {state}", state=state)
        await handle.cancel(reason=reason)

    async def list(
        self, *, state: str | None = None, limit: int = 50, page_token: str = ""
    ) -> tuple[list[RunSummary], str]:
        """Recent runs (open ones, then the latest closed), this client's tenant's only when it is scoped;
        the second value is the next page's token ("" at the end). Filtering by ``state`` or tenant needs
        the ``Agent*`` search attributes (``InvalidRequest`` on a namespace without them).

        >>> runs, token = await agents.list(state="waiting_approval", limit=20)
        >>> [(r.workflow_id, r.state) for r in runs]
        """
        page = await self.list_page(state=state, limit=limit, page_token=page_token)
        return page.runs, page.next_page_token

    async def list_page(self, *, state: str | None = None, limit: int = 50, page_token: str = "") -> RunPage:
        """:meth:`list` with how many runs match in all (``total``; None when the server did not say)."""
        query = _listing.list_query(state, None) + _listing.tenant_clause(self.tenant)
        try:
            listed = await _listing.list_page(self.client, query, limit, _listing.decode_token(page_token))
        except RPCError as err:
            if err.status != RPCStatusCode.INVALID_ARGUMENT or not (state or self.tenant is not None):
                raise
            raise InvalidRequest(
                f"this namespace cannot filter by --state/--tenant ({err.message}); register the Agent* search "
                "attributes (see docs/operations.md)"
            ) from None
        executions = listed.runs
        concurrency = _listing.QUERY_CONCURRENCY
        states = await bounded((_listing.agent_state(self.client, wf) for wf in executions), concurrency)
        sessions = await bounded((_listing.session_of(self.client, wf) for wf in executions), concurrency)
        runs = [
            RunSummary(
                workflow_id=wf.id,
                run_id=wf.run_id or "",
                state=session.state or agent_state,
                execution_status=temporal_state(wf.status),
                tenant=wf.typed_search_attributes.get(TENANT) or "",
                model=wf.typed_search_attributes.get(MODEL) or "",
                started_at=wf.start_time.isoformat(timespec="seconds"),
                closed_at=wf.close_time.isoformat(timespec="seconds") if wf.close_time else "",
                session=session.session,
                messages=session.messages,
            )
            for wf, agent_state, session in zip(executions, states, sessions, strict=True)
        ]
        return RunPage(runs=runs, next_page_token=_listing.encode_token(listed.next_page_token), total=listed.total)


async def _exists(client: Client, workflow_id: str) -> bool:
    try:
        await client.get_workflow_handle(workflow_id).describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def _is_session(client: Client, desc: WorkflowExecutionDescription) -> bool:
    inp = await started_input(client, desc.id, desc.run_id)
    return inp is not None and inp.session is not None
