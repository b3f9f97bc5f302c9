"""The reading half of ``AgentClient``: a run this client may see, its description, status and result.

Tenant scoping: a client with ``tenant`` set sees a run only when the run is that tenant's, by its
input (``AgentInput.tenant`` in the started event, which no worker is needed to read) and by its
``AgentTenant`` search attribute when set (both must agree). Any other run, and a run that does not
exist, is the same ``RunNotFound``, so an id of another tenant's run does not leak.
"""

from __future__ import annotations

import copy
from typing import Any, Self

from pydantic import SecretStr
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError

from durable_agents.agent_client._errors import (
    AgentClientError,
    InvalidRequest,
    NoAnswer,
    RunNotFound,
    RunNotOpen,
)
from durable_agents.agent_client._events import DeltaSource
from durable_agents.agent_client._owners import Warn, no_warning
from durable_agents.agent_client._reading import (
    QUICK_QUERY_TIMEOUT,
    RPC_TIMEOUT,
    ask_status,
    closed_result,
    describe_run,
    ended_state,
    raise_if_cancelled,
    recorded_state,
    started_input,
    temporal_state,
)
from durable_agents.agent_client._types import (
    RunDescription,
)
from workflows.progress import COST_USD, MODEL, PENDING_APPROVALS, TENANT
from workflows.run_failure import result_of_failure
from workflows.types import AgentInput, AgentResult, StatusView

# A closed run without a result (Temporal's word) as an agent state a ``StatusView`` can hold.
_ENDED_AS = {"canceled": "cancelled", "cancelled": "cancelled"}


class RunReader:
    """What every call stands on: the Temporal client, the scope, and reading one run (see :class:`AgentClient`)."""

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = "agent-tasks",
        tenant: str | None = None,
        approval_key: SecretStr | None = None,
        store_url: str = "",
        warn: Warn | None = None,
        deltas: DeltaSource | None = None,
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.tenant = tenant
        self.approval_key = approval_key
        self.store_url = store_url
        self.warn: Warn = warn or no_warning
        self.deltas = deltas  # where ``events`` reads streamed text (None: progress events only)

    def for_tenant(self, tenant: str) -> Self:
        """The same client scoped to ``tenant`` (the API makes one per request's token).

        >>> acme = agents.for_tenant("acme")
        >>> await acme.status("a-run-of-another-tenant")  # raises RunNotFound
        """
        scoped = copy.copy(self)
        scoped.tenant = tenant
        return scoped

    def stamped(self, inp: AgentInput) -> AgentInput:
        """``inp`` with this client's tenant (``InvalidRequest`` when it names another)."""
        if self.tenant is None or inp.tenant == self.tenant:
            return inp
        if inp.tenant:
            raise InvalidRequest(f"the input names tenant {inp.tenant!r}, not this client's ({self.tenant!r})")
        return inp.model_copy(update={"tenant": self.tenant})

    # --- reading a run ----------------------------------------------------------------

    async def run(self, workflow_id: str) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
        """The run's handle and description, once it is known to be an agent run this client may see.

        ``RunNotFound`` (no such run, or another tenant's), ``NotAnAgentRun`` (another workflow type).
        """
        handle, desc = await describe_run(self.client, workflow_id)
        if self.tenant is not None and not await self._is_mine(desc):
            raise RunNotFound(f"no run with id {workflow_id!r}")
        return handle, desc

    async def _is_mine(self, desc: WorkflowExecutionDescription) -> bool:
        tenants: set[str] = set()
        if (attribute := desc.typed_search_attributes.get(TENANT)) is not None:
            tenants.add(attribute)
        try:
            inp = await started_input(self.client, desc.id, desc.run_id)
        except (RPCError, RPCTimeoutOrCancelledError, AgentClientError, ValueError):
            raise_if_cancelled()
            inp = None
        if inp is not None:
            tenants.add(inp.tenant)
        return tenants == {self.tenant}

    async def describe(self, workflow_id: str) -> RunDescription:
        """Everything ``status`` knows of the run, also without a worker (what ``starter.py status`` shows).

        >>> d = await agents.describe("readme-1")
        >>> d.view.state if d.view else (d.no_answer or d.state)
        """
        handle, desc = await self.run(workflow_id)
        out = RunDescription(
            workflow_id=workflow_id, run_id=desc.run_id or "", execution_status=temporal_state(desc.status)
        )
        if desc.status == WorkflowExecutionStatus.RUNNING:
            try:
                out.view = await ask_status(self.client, handle, desc)
                out.state = out.view.state
            except NoAnswer as err:
                attributes = desc.typed_search_attributes
                out.no_answer = str(err)
                out.state = recorded_state(attributes) or "running"
                out.pending_approval_count = attributes.get(PENDING_APPROVALS)
                out.model = attributes.get(MODEL) or ""
                out.cost_usd = attributes.get(COST_USD)
                out.task_queue = desc.task_queue
                out.started_at = desc.start_time.isoformat(timespec="seconds")
            return out
        if desc.status == WorkflowExecutionStatus.COMPLETED:
            out.result = await self.client.get_workflow_handle(
                workflow_id, run_id=desc.run_id, result_type=AgentResult
            ).result(follow_runs=False, rpc_timeout=RPC_TIMEOUT)
        elif desc.status == WorkflowExecutionStatus.FAILED:
            # Started with AGENT_FAIL_WORKFLOW_ON_ERROR=1 and ended failed or limit_exceeded: its result is
            # in the failure.
            out.result = await closed_result(self.client, workflow_id, desc.run_id)
        if out.result is not None:
            out.state = out.result.status
        else:
            out.state = out.execution_status
            out.error = await self._why_it_ended(desc)
        return out

    async def _why_it_ended(self, desc: WorkflowExecutionDescription) -> str:
        """The failure of a run that ended without a result (failed, timed out, terminated); empty if none."""
        handle = self.client.get_workflow_handle(desc.id, run_id=desc.run_id)
        try:
            await handle.result(follow_runs=False, rpc_timeout=RPC_TIMEOUT)
        except WorkflowFailureError as err:
            return str(err.cause or err)
        except (RPCError, RPCTimeoutOrCancelledError, TemporalError):
            raise_if_cancelled()
            return ""
        return ""

    async def status(self, workflow_id: str) -> StatusView:
        """The run's status: its status query while it runs, else from its result.

        ``NoAnswer`` when it runs and no worker answers within seconds (the message says why). A
        closed run without a result (terminated, timed out, failed its workflow) is state ``failed``
        (``cancelled`` when Temporal cancelled it) with the failure as ``output``.

        >>> view = await agents.status("readme-1")
        >>> view.state, view.step, [a.approval_id for a in view.pending_approvals]
        """
        described = await self.describe(workflow_id)
        if described.view is not None:
            return described.view
        if described.no_answer:
            raise NoAnswer(f"run {workflow_id} is running but {described.no_answer}")
        result = described.result
        if result is not None:
            return StatusView(
                state=result.status,
                step=result.steps,
                usage=result.usage,
                output=result.output,
                decisions=result.decisions,
                decisions_total=len(result.decisions),
                checkpoint=result.checkpoint,
            )
        state = _ENDED_AS.get(described.state, "failed")
        return StatusView.model_validate({"state": state, "step": 0, "output": described.error or described.state})

    async def result(self, workflow_id: str) -> AgentResult:
        """Wait for the run (following continue-as-new) and answer its result.

        A run that failed its workflow with a result (``AGENT_FAIL_WORKFLOW_ON_ERROR=1``) answers that
        result; one that ended without any is ``RunNotOpen`` naming how it ended.

        >>> result = await agents.result("readme-1")
        >>> result.status, result.output
        """
        await self.run(workflow_id)
        handle: WorkflowHandle[Any, AgentResult] = self.client.get_workflow_handle(workflow_id, result_type=AgentResult)
        try:
            return await handle.result(follow_runs=True)
        except WorkflowFailureError as err:
            found = result_of_failure(err)
            if found is not None:
                return found
            raise RunNotOpen(f"run {workflow_id} ended without a result: {err.cause or err}", state="failed") from None

    async def running_view(
        self, workflow_id: str, *, query_timeout: Any = QUICK_QUERY_TIMEOUT
    ) -> tuple[str, StatusView | None]:
        """The run's state name and, while it runs, its status query answer (``NoAnswer`` when none comes).

        A closed run's state is the agent's (``cancelled``, ``failed`` ...), not Temporal's ``completed``.
        """
        handle, desc = await self.run(workflow_id)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            state = await ended_state(self.client, desc.id, desc.run_id, desc.status, desc.typed_search_attributes)
            return state, None
        try:
            view = await ask_status(self.client, handle, desc, query_timeout=query_timeout)
        except NoAnswer as err:
            pending = desc.typed_search_attributes.get(PENDING_APPROVALS)
            recorded = f"; it last recorded {pending} pending approval(s)" if pending is not None else ""
            raise NoAnswer(f"run {handle.id} is running but {err}{recorded}") from None
        return view.state, view
