"""``scheduled_message_send``: a session schedule's message, handed to its session by update-with-start.

The activity does what ``starter.py send`` does, with the worker's own client (``activity.client()``):
a running session takes the message; a missing or ended one is started (woken) under its id with the
schedule's input. Before that it checks the id: a run that is not a session, or a session of another
tenant than the schedule's, is refused for good (``ScheduledMessageRefused``, not retried), so that a
schedule never talks to a conversation its tenant does not own (a woken session's ``session_open``
checks the stored conversation's tenant again). The message id comes from the scheduled execution, so
retries of this activity are one message in the session.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from workflows.inputs import quote
from workflows.schedule_types import SCHEDULED_SEND_ACTIVITY, SCHEDULED_SEND_REFUSED, ScheduledSend
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, AgentResult

AGENT_WORKFLOW = "AgentWorkflow"
MESSAGE_REFUSED = "MessageRefused"  # workflows/session.py's refusal type
RETRIED_REFUSALS = ("closed",)  # a closing session ends soon: the next attempt wakes it


def refuse(why: str) -> ApplicationError:
    return ApplicationError(why, type=SCHEDULED_SEND_REFUSED, non_retryable=True)


async def started_input(client: Client, workflow_id: str, run_id: str | None) -> AgentInput | None:
    """The execution's input, from its first history event (no worker needed); None when not an ``AgentInput``."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async for event in handle.fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        if len(payloads) != 1:
            return None
        try:
            [inp] = await client.data_converter.decode([payloads[0]], [AgentInput])
        except (ValueError, TypeError, KeyError, RuntimeError):
            return None
        return inp if isinstance(inp, AgentInput) else None
    return None


class ScheduledMessageActivities:
    @activity.defn(name=SCHEDULED_SEND_ACTIVITY)
    async def scheduled_message_send(self, req: ScheduledSend) -> SendResult:
        client = activity.client()
        session = quote(req.session_id, 100)
        try:
            desc = await client.get_workflow_handle(req.session_id).describe()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            desc = None
        if desc is not None:
            if desc.workflow_type != AGENT_WORKFLOW:
                raise refuse(f"{session} is a {desc.workflow_type} run, not a session")
            found = await started_input(client, req.session_id, desc.run_id)
            if found is None or found.session is None:
                raise refuse(f"run {session} is not a session")
            if found.tenant != req.tenant:
                raise refuse(f"session {session} belongs to another tenant than the schedule's")
        start = (req.start or AgentInput(session=SessionSpec())).model_copy(update={"tenant": req.tenant})
        if start.session is None:
            start.session = SessionSpec()
        operation: WithStartWorkflowOperation[Any, AgentResult] = WithStartWorkflowOperation(
            AGENT_WORKFLOW,
            start,
            id=req.session_id,
            task_queue=req.task_queue or activity.info().task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
        message = SessionMessage(message_id=req.message_id, text=req.text, sender=req.sender)
        try:
            result: SendResult = await client.execute_update_with_start_workflow(
                "send", message, start_workflow_operation=operation, result_type=SendResult
            )
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == MESSAGE_REFUSED:
                reason = _reason(cause)
                if reason in RETRIED_REFUSALS:
                    raise ApplicationError(f"session {session} refused the message: {cause.message}") from None
                raise refuse(f"session {session} refused the message: {cause.message}") from None
            raise
        activity.logger.info("scheduled message %s taken as message %d", req.message_id, result.seq)
        return result


def _reason(cause: ApplicationError) -> str:
    """The refusal's reason: its message starts with it (``"closed: the session is closing"``)."""
    return cause.message.partition(":")[0].strip()
