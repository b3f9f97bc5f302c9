"""Reading a run from the server without waiting in silence: describe it, ask its status, list runs.

A status query gets a short deadline (``QUICK_QUERY_TIMEOUT``), and when no worker answers,
:func:`no_answer_reason` says why (no worker polls the run's task queue, or its workflow task keeps
failing) from what the server knows without a worker.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Awaitable, Iterable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.agent_client._errors import NoAnswer, NotAnAgentRun, RunNotFound
from durable_agents.agent_client._words import worker_command
from workflows.agent import AgentWorkflow
from workflows.progress import STATE
from workflows.run_failure import result_of_failure
from workflows.types import AgentInput, AgentResult, StatusView

QUERY_TIMEOUT = timedelta(seconds=10)  # a status query while following a run (a worker is known to be there)
QUICK_QUERY_TIMEOUT = timedelta(seconds=2)  # status / pending: answer within seconds, worker or not
PROBE_TIMEOUT = timedelta(seconds=3)  # a closed run's progress: a worker replays its history first
RPC_TIMEOUT = timedelta(seconds=5)  # server-only reads (describe a task queue, a closed run's result)
VISIBILITY_PAGE = 1000  # runs per ListWorkflowExecutions page (the SDK's default page size)
T = TypeVar("T")


def query_literal(value: str) -> str:
    """``value`` as a quoted string literal of a visibility query: a quote or backslash in it stays text.

    Inside a single-quoted string the server's query parser reads a backslash
    followed by a quote as a quote, and two backslashes as one, so user input (a
    tenant name) cannot end the literal and add clauses of its own.
    """
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


async def list_runs(
    client: Client, query: str, limit: int, *, page_size: int = VISIBILITY_PAGE
) -> tuple[list[WorkflowExecution], int | None]:
    """Up to ``limit`` runs matching ``query`` (in the server's order: open runs, then the latest closed),
    and how many match in all (None: unknown).

    Pages of ``page_size`` are read until ``limit`` runs are in hand. When the last
    page read was the listing's last, the total is known without another call;
    else one ``CountWorkflowExecutions`` says it. An ``RPCError`` of the listing
    (e.g. ``INVALID_ARGUMENT``: a search attribute the namespace does not know) is raised.
    """
    pages = client.list_workflows(query, page_size=page_size, rpc_timeout=RPC_TIMEOUT)
    found: dict[str, WorkflowExecution] = {}
    while True:
        await pages.fetch_next_page()
        for wf in pages.current_page or ():
            found.setdefault(wf.id, wf)
        if not pages.next_page_token:
            return list(found.values())[:limit], len(found)
        if len(found) >= limit:
            break
    try:
        total: int | None = max((await client.count_workflows(query, rpc_timeout=RPC_TIMEOUT)).count, len(found))
    except (RPCError, RPCTimeoutOrCancelledError):
        raise_if_cancelled()
        total = None
    return list(found.values())[:limit], total


async def describe_run(
    client: Client, workflow_id: str
) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
    """The run's handle and description; ``RunNotFound`` when it does not exist, ``NotAnAgentRun`` when
    it is not an agent run.

    Every command reads an agent run through ``AgentWorkflow``'s queries, updates and payload types;
    another workflow type (a user's own workflow, or anything else on the namespace) is said to be one.
    """
    handle = client.get_workflow_handle(workflow_id)
    try:
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFound(f"no run with id {workflow_id!r}") from None
        raise
    check_agent_run(desc)
    return handle, desc


def check_agent_run(desc: WorkflowExecutionDescription) -> None:
    """``NotAnAgentRun`` unless the described workflow is an ``AgentWorkflow`` run."""
    if desc.workflow_type != AgentWorkflow.__name__:
        raise NotAnAgentRun(f"{desc.id} is a {desc.workflow_type} workflow, not an {AgentWorkflow.__name__} run")


async def poller_count(client: Client, task_queue: str) -> int | None:
    """How many workers polled the workflow task queue lately; None when the server does not say."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    try:
        response = await client.workflow_service.describe_task_queue(request, timeout=RPC_TIMEOUT)
    except (RPCError, RPCTimeoutOrCancelledError):
        raise_if_cancelled()
        return None
    return len(response.pollers)


def start_worker_hint(task_queue: str) -> str:
    return f"start one with: AGENT_TASK_QUEUE={shlex.quote(task_queue)} {worker_command()}"


def no_worker_line(task_queue: str) -> str:
    return f"no worker polls task queue {task_queue}"


async def no_answer_reason(client: Client, desc: WorkflowExecutionDescription, *, waited: timedelta) -> str:
    """Why no worker answered the run within ``waited``, in words, from what the server knows without one."""
    pending = desc.raw_description.pending_workflow_task
    if desc.raw_description.HasField("pending_workflow_task") and pending.attempt > 1:
        return (
            f"its workflow task has failed {pending.attempt - 1} time(s) and is retried: the run is stuck "
            "(see the worker's log)"
        )
    pollers = await poller_count(client, desc.task_queue)
    if pollers == 0:
        return _no_pollers(desc.task_queue)
    if pollers is None:
        return f"no worker answered within {waited.seconds} s (the server does not say who polls {desc.task_queue})"
    return (
        f"no worker answered within {waited.seconds} s (task queue {desc.task_queue} has {pollers} recent "
        "poller(s): busy, stopped, or replaying a long history)"
    )


def _no_pollers(task_queue: str) -> str:
    return (
        f"no worker answered: {no_worker_line(task_queue)}; the run waits for one and loses nothing "
        f"({start_worker_hint(task_queue)})"
    )


async def ask_status(
    client: Client,
    handle: WorkflowHandle[Any, Any],
    desc: WorkflowExecutionDescription,
    *,
    query_timeout: timedelta = QUICK_QUERY_TIMEOUT,
) -> StatusView:
    """A running run's status query; ``NoAnswer`` at once when no worker polls its queue, else after the timeout.

    While the server refuses the query because the run's workflow task is on a retry
    (:func:`workflow_not_ready`), the query is asked again until the timeout: a burst of
    signals makes the server retry a task it force-closed, which a worker answers moments later.
    """
    query = asyncio.ensure_future(_status_until_ready(handle, query_timeout))
    pollers = asyncio.ensure_future(poller_count(client, desc.task_queue))
    try:
        await asyncio.wait({query, pollers}, return_when=asyncio.FIRST_COMPLETED)
        if not query.done() and await pollers == 0:
            raise NoAnswer(_no_pollers(desc.task_queue))
        view = await query
    except WorkflowQueryFailedError as err:
        raise NoAnswer(f"its worker could not answer: {err}") from None
    except (RPCError, RPCTimeoutOrCancelledError):
        raise_if_cancelled()
        raise NoAnswer(await no_answer_reason(client, desc, waited=query_timeout)) from None
    finally:
        query.cancel()
        pollers.cancel()
    return StatusView.model_validate(view)


NOT_READY_RETRY_S = 0.2  # between status queries the server refused with WorkflowNotReady


def workflow_not_ready(err: RPCError) -> bool:
    """The server refused a query or update because the run's workflow task is on a retry (attempt > 1).

    That is so after a worker failed the task (a bug or a non-determinism: it stays so), and
    also, for a moment, after the server itself force-closed a task because more than 100
    signals arrived while a worker held it; the next attempt handles them all.
    """
    return err.status == RPCStatusCode.FAILED_PRECONDITION and any(
        detail.type_url.endswith("WorkflowNotReadyFailure") for detail in err.grpc_status.details
    )


async def _status_until_ready(handle: WorkflowHandle[Any, Any], within: timedelta) -> Any:
    deadline = asyncio.get_running_loop().time() + within.total_seconds()
    while True:
        left = deadline - asyncio.get_running_loop().time()
        try:
            return await handle.query(AgentWorkflow.status, rpc_timeout=timedelta(seconds=max(left, 0.1)))
        except RPCError as err:
            if not workflow_not_ready(err) or left <= NOT_READY_RETRY_S:
                raise
        await asyncio.sleep(NOT_READY_RETRY_S)


def recorded_state(search_attributes: TypedSearchAttributes) -> str | None:
    """The agent state the run last recorded in its ``AgentState`` search attribute (None: not recorded)."""
    value = search_attributes.get(STATE)
    return value or None


def temporal_state(status: WorkflowExecutionStatus | None) -> str:
    return status.name.lower() if status else "unknown"


async def ended_state(
    client: Client,
    workflow_id: str,
    run_id: str | None,
    status: WorkflowExecutionStatus | None,
    search_attributes: TypedSearchAttributes | None = None,
) -> str:
    """A closed run's outcome as the agent reports it: ``completed``, ``failed``, ``cancelled``, ``limit_exceeded``.

    Temporal says ``completed`` for all four (the workflow returns an ``AgentResult``
    either way); the ``AgentState`` search attribute says which, and without it the
    result does. A run started with ``AGENT_FAIL_WORKFLOW_ON_ERROR=1`` that ended failed or
    limit_exceeded failed its workflow: its result is in the failure. Runs that did not
    return otherwise (failed, terminated, timed out) keep Temporal's word.
    """
    if status == WorkflowExecutionStatus.FAILED:
        result = await closed_result(client, workflow_id, run_id)
        return result.status if result is not None else temporal_state(status)
    if status != WorkflowExecutionStatus.COMPLETED:
        return temporal_state(status)
    if search_attributes is not None and (state := recorded_state(search_attributes)) in (
        "completed",
        "failed",
        "cancelled",
        "limit_exceeded",
    ):
        return state
    handle = client.get_workflow_handle(workflow_id, run_id=run_id, result_type=AgentResult)
    try:
        result = await handle.result(follow_runs=False, rpc_timeout=RPC_TIMEOUT)
    except (RPCError, RPCTimeoutOrCancelledError, TemporalError, ValueError, TypeError):
        raise_if_cancelled()
        return "completed"
    return result.status if isinstance(result, AgentResult) else "completed"


async def closed_result(client: Client, workflow_id: str, run_id: str | None) -> AgentResult | None:
    """A closed run's ``AgentResult``: returned, or in the failure of a run that failed its workflow
    (``AGENT_FAIL_WORKFLOW_ON_ERROR=1``, ``AgentRunFailed``); None when it has none (or it cannot be read)."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id, result_type=AgentResult)
    try:
        result = await handle.result(follow_runs=False, rpc_timeout=RPC_TIMEOUT)
    except WorkflowFailureError as err:
        return result_of_failure(err)
    except (RPCError, RPCTimeoutOrCancelledError, TemporalError, ValueError, TypeError):
        raise_if_cancelled()
        return None
    return result if isinstance(result, AgentResult) else None


async def bounded(pending: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """Await each (not yet started) awaitable, at most ``limit`` at a time; results in their order."""
    gate = asyncio.Semaphore(limit)

    async def one(awaitable: Awaitable[T]) -> T:
        async with gate:
            return await awaitable

    return list(await asyncio.gather(*(one(awaitable) for awaitable in pending)))


def raise_if_cancelled() -> None:
    """Re-raise a cancellation an RPC error stood for (call it first in every handler of RPC errors).

    The SDK turns the cancellation of a call in flight into ``RPCTimeoutOrCancelledError``; a handler
    that takes it for a slow server would swallow Ctrl-C (asyncio cancels every task on exit and then
    waits for them), so a loop polling the server would keep the command alive for good.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def started_input(client: Client, workflow_id: str, run_id: str | None) -> AgentInput | None:
    """The execution's input (its started event: no worker needed); None when it is not an ``AgentInput``."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async for event in handle.fetch_history_events(page_size=1, rpc_timeout=RPC_TIMEOUT):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        if len(payloads) != 1:
            return None
        try:
            [inp] = await client.data_converter.decode([payloads[0]], [AgentInput])
        except (ValueError, TypeError, KeyError, RuntimeError):  # a malformed input (the run refused it)
            return None
        return inp if isinstance(inp, AgentInput) else None
    return None
