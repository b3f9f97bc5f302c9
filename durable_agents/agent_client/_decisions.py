"""Sending one decision to the run that waits for it: the ``decide`` update, signed when a key is set.

The update (not a signal) so the caller learns at once whether the decision took effect: a refusal
comes back with the run's reason. With an approval key (``AGENT_APPROVAL_KEY``) the decision is
signed (``workflows.identity.decision_signature``), the signature covering what it carries besides
the verdict (:func:`workflows.identity.signed_extras`: an edit's arguments exactly as sent, an
answer's text, a remembered scope).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from pydantic import SecretStr, ValidationError
from temporalio.client import Client, RPCTimeoutOrCancelledError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.agent_client._errors import DecisionRefused, InvalidRequest, NoAnswer, RunNotFound
from durable_agents.agent_client._reading import describe_run, no_answer_reason, raise_if_cancelled
from durable_agents.agent_client._words import cli_command
from workflows.agent import AgentWorkflow
from workflows.identity import decision_signature, signed_extras
from workflows.types import DecideRequest, DecideResult, DecisionKind

DECIDE_TIMEOUT = timedelta(seconds=30)
# DecideRequest fields → the arguments that set them (the CLI's flags: its users read these lines)
_DECISION_FIELDS = {
    "approval_id": "the approval id",
    "reviewer": "--reviewer",
    "comment": "--comment or --reason",
    "signature": "the signature",
    "text": "the answer",
    "arguments": "--edit",
    "remember": "--remember",
}


def decide_request(
    approval_id: str,
    decision: DecisionKind,
    reviewer: str,
    note: str,
    signature: str,
    *,
    text: str = "",
    arguments: dict[str, Any] | None = None,
    remember: str = "",
) -> DecideRequest:
    """The ``decide`` update's payload; a value the run would refuse (too long, ...) is ``InvalidRequest``."""
    try:
        return DecideRequest.model_validate(
            {
                "approval_id": approval_id,
                "decision": decision,
                "reviewer": reviewer,
                "comment": note,
                "signature": signature,
                "text": text,
                "arguments": arguments,
                "remember": remember,
            }
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = str(first["loc"][0]) if first["loc"] else "decision"
        raise InvalidRequest(f"{_DECISION_FIELDS.get(field, field)}: {first['msg']}") from None


def signature_of(
    approval_key: SecretStr | None,
    approval_id: str,
    decision: DecisionKind,
    reviewer: str,
    expires_at: str,
    *,
    arguments: dict[str, Any] | None,
    text: str,
    remember: str,
) -> str:
    """The decision's HMAC signature under ``approval_key`` ("" without a key: an unsigned decision)."""
    key = approval_key.get_secret_value() if approval_key is not None else ""
    if not key:
        return ""
    covers = signed_extras(arguments, text=text, remember=remember)
    return decision_signature(key.encode(), approval_id, decision, reviewer, expires_at, covers)


async def send_decision(client: Client, workflow_id: str, request: DecideRequest) -> str:
    """Send ``request`` by the ``decide`` update; the run's one-line message when it took effect.

    ``DecisionRefused`` with the run's reason, ``NoAnswer`` when no worker answered in time (the
    decision may still take effect), ``RunNotFound`` when no such run is running.
    """
    handle = client.get_workflow_handle(workflow_id)
    try:
        # cast: the SDK's overloads type an update decorated with a validator as returning a coroutine
        result = cast(
            DecideResult,
            await handle.execute_update(AgentWorkflow.decide_update, request, rpc_timeout=DECIDE_TIMEOUT),
        )
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        reason = cause.message if isinstance(cause, ApplicationError) else str(cause)
        raise DecisionRefused(f"refused: {reason}") from None
    except RPCTimeoutOrCancelledError:
        raise_if_cancelled()
        _, desc = await describe_run(client, workflow_id)
        reason = await no_answer_reason(client, desc, waited=DECIDE_TIMEOUT)
        raise NoAnswer(
            f"run {workflow_id}: no answer to the decision ({reason}); it may still take effect: "
            f"see {cli_command(f'pending {workflow_id}')}"
        ) from None
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFound(f"no running run with id {workflow_id!r}") from None
        raise
    if not result.accepted:
        raise DecisionRefused(f"refused: {result.message}")
    return result.message
