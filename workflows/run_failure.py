"""A run that ended ``failed`` or ``limit_exceeded`` as a failed workflow (``AGENT_FAIL_WORKFLOW_ON_ERROR=1``).

By default every run's workflow completes and returns its ``AgentResult``, whatever the
agent's status: the Temporal UI shows a failed agent run as a green COMPLETED workflow
(its ``AgentState`` search attribute says ``failed``). With the flag on, the run fails its
workflow instead, with an ``ApplicationError`` of type ``AgentRunFailed`` whose first detail
is the ``AgentResult``; readers of the result (the CLI, a parent run) decode it from there.
"""

from __future__ import annotations

from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from workflows.inputs import safe
from workflows.types import AgentResult

AGENT_RUN_FAILED = "AgentRunFailed"
FAILING_STATUSES = ("failed", "limit_exceeded")
MESSAGE_LINE_MAX = 300  # of the output's first line in the failure's message


def run_failed_error(result: AgentResult) -> ApplicationError:
    """The failure a run with the flag on ends with: its status and output's first line, the result as details."""
    first_line = (result.output.splitlines() or [""])[0]
    return ApplicationError(
        f"agent run {result.status}: {safe(first_line, MESSAGE_LINE_MAX)}",
        result,
        type=AGENT_RUN_FAILED,
        non_retryable=True,
    )


def result_of_failure(err: BaseException) -> AgentResult | None:
    """The ``AgentResult`` of a workflow that failed with ``AgentRunFailed``; None for any other failure.

    ``err`` is what waiting for the result raised (``WorkflowFailureError``, ``ChildWorkflowError``:
    their ``cause``) or the ``ApplicationError`` itself.
    """
    cause = err if isinstance(err, ApplicationError) else getattr(err, "cause", None)
    if not isinstance(cause, ApplicationError) or cause.type != AGENT_RUN_FAILED or not cause.details:
        return None
    detail = cause.details[0]
    if isinstance(detail, AgentResult):
        return detail
    try:
        return AgentResult.model_validate(detail)
    except ValidationError:
        return None
