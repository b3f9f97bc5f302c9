"""``ScheduledMessageWorkflow``: what a session schedule starts at each firing.

A Temporal Schedule can only start a workflow, and a message reaches a session (starting or waking it
when missing) only through a client's update-with-start. So each firing is one short workflow whose one
activity, ``scheduled_message_send`` (``activities/scheduled_messages.py``), does that ``send``. The
message id is this execution's (its workflow id carries the firing's time), so a retried activity is
the same message, never a second one. The workflow ends when the session has taken the message (not
when it has replied): the schedule's overlap policy skips a firing only while the previous one is still
delivering; messages that arrive while the session works queue in the session as any ``send`` does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.inputs import NO_PAYLOAD, decode, one_payload
    from workflows.schedule_types import (
        SCHEDULED_MESSAGE_WORKFLOW,
        SCHEDULED_SEND_ACTIVITY,
        SCHEDULED_SEND_REFUSED,
        ScheduledMessage,
        ScheduledSend,
    )
    from workflows.session_types import SendResult

if TYPE_CHECKING:
    ScheduledInput = ScheduledMessage | RawValue
else:
    ScheduledInput = RawValue

SEND_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
    non_retryable_error_types=[SCHEDULED_SEND_REFUSED],
)


@workflow.defn(name=SCHEDULED_MESSAGE_WORKFLOW)
class ScheduledMessageWorkflow:
    @workflow.run
    @one_payload
    async def run(self, raw: ScheduledInput = NO_PAYLOAD, *extra: Any) -> SendResult:
        """Deliver the message once; an input that is not a ``ScheduledMessage`` (anyone may start this
        workflow) fails the run on its first task with ``InvalidInput``, never a task retried forever."""
        req = decode(raw, ScheduledMessage, extra)
        if isinstance(req, str):
            raise ApplicationError(f"invalid scheduled message: {req}", type="InvalidInput", non_retryable=True)
        info = workflow.info()
        send = ScheduledSend(
            **dict(req),
            message_id=f"{info.workflow_id}/{info.run_id}"[-200:],
            sender=f"schedule:{req.schedule}" if req.schedule else "schedule",
        )
        result: SendResult = await workflow.execute_activity(
            SCHEDULED_SEND_ACTIVITY,
            send,
            result_type=SendResult,
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=SEND_RETRY,
            summary=f"send to session {req.session_id[:100]}",
        )
        return result
