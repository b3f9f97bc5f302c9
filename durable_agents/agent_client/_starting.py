"""Starting an ``AgentWorkflow`` run: a taken id or a refusal is one error line.

An id whose run is running is refused (``RunExists``); one whose run is closed too
(``RunExists(closed=True)``), unless ``reuse_id``: then another run starts under it. Search
attributes the namespace does not have are dropped (the run starts without them).
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, RPCTimeoutOrCancelledError, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.agent_client._errors import InvalidRequest, RunExists
from durable_agents.agent_client._reading import RPC_TIMEOUT, raise_if_cancelled, temporal_state
from durable_agents.agent_client._words import cli_command
from durable_agents.fairness import tenant_priority
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput

SUMMARY_CHARS = 120
DETAILS_TASK_CHARS = 2000


def static_summary(inp: AgentInput) -> str:
    """The run list's one line: the task, on one line, trimmed."""
    task = " ".join(inp.task.split())
    return task if len(task) <= SUMMARY_CHARS else task[: SUMMARY_CHARS - 1] + "…"


def static_details(inp: AgentInput) -> str:
    """Markdown shown on the run's page: the task, the model and the limits it runs under."""
    task = inp.task if len(inp.task) <= DETAILS_TASK_CHARS else inp.task[:DETAILS_TASK_CHARS] + "…"
    limits = inp.limits
    lines = [
        "**task**",
        "",
        *(f"> {line}" if line else ">" for line in task.splitlines()),
        "",
        f"**model** {inp.model or 'the worker default (AGENT_MODEL)'}",
        "",
        f"**limits** {limits.max_steps} steps · {limits.max_tokens} tokens · ${limits.max_cost_usd:g}"
        f" · {limits.timeout_s} s",
        "",
        f"**tools** {', '.join(inp.tools) if inp.tools is not None else 'all registered'}",
    ]
    if inp.tenant:
        lines += ["", f"**tenant** {inp.tenant}"]
    if inp.user:
        lines += ["", f"**user** {inp.user}"]
    if inp.approvers:
        lines += ["", f"**approvers** {', '.join(inp.approvers)}"]
    if inp.policy:
        lines += ["", f"**run policy** {len(inp.policy.get('rules', []))} rule(s)"]
    return "\n".join(lines)


async def start_agent_run(
    client: Client,
    inp: AgentInput,
    workflow_id: str,
    task_queue: str,
    *,
    summary: str,
    details: str,
    search_attributes: TypedSearchAttributes = TypedSearchAttributes.empty,
    what: str = "run",
    reuse_id: bool = False,
) -> WorkflowHandle[Any, Any]:
    """Start ``AgentWorkflow``; ``RunExists`` for a taken id, ``InvalidRequest`` when Temporal refuses the input."""
    policy = WorkflowIDReusePolicy.ALLOW_DUPLICATE if reuse_id else WorkflowIDReusePolicy.REJECT_DUPLICATE
    while True:
        try:
            return await client.start_workflow(
                AgentWorkflow.run,
                inp,
                id=workflow_id,
                task_queue=task_queue,
                static_summary=summary,
                static_details=details,
                search_attributes=search_attributes,
                id_reuse_policy=policy,
                priority=tenant_priority(inp.tenant),
            )
        except WorkflowAlreadyStartedError:
            raise await _taken(client, workflow_id, what) from None
        except RPCError as err:
            if err.status == RPCStatusCode.ALREADY_EXISTS:
                raise RunExists(f"a run with id {workflow_id} is already running") from None
            if err.status == RPCStatusCode.INVALID_ARGUMENT:
                if search_attributes and "search attribute" in err.message.lower():
                    search_attributes = TypedSearchAttributes.empty
                    continue
                raise InvalidRequest(f"Temporal refused to start the {what}: {err.message}") from None
            raise


async def _taken(client: Client, workflow_id: str, what: str) -> RunExists:
    """Why ``workflow_id`` cannot be started: its run is running, or closed and not to be reused."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe(rpc_timeout=RPC_TIMEOUT)
        status = desc.status
    except (RPCError, RPCTimeoutOrCancelledError):
        raise_if_cancelled()
        status = None
    if status in (None, WorkflowExecutionStatus.RUNNING):
        return RunExists(
            f"a run with id {workflow_id} is already running (watch it: {cli_command(f'watch {workflow_id}')})"
        )
    return RunExists(
        f"id {workflow_id} was already used by a run that is {temporal_state(status)}; pass --reuse-id to start "
        f"another {what} under it, or choose another --id",
        closed=True,
    )
