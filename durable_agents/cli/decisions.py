"""Sending one decision to the run that waits for it, and saying what the run answered.

Every decision of the CLI (``approve``, ``reject``, ``resolve``, ``answer``, and the
prompts of ``run --follow`` and ``chat``) goes through :func:`send_decision`, that is
``AgentClient.decide``: the ``decide`` update, so the caller learns at once whether it
took effect (a refusal comes back with the run's reason). With ``AGENT_APPROVAL_KEY`` set
(``settings.approval_key``) the decision is signed
(``workflows.identity.decision_signature``), the signature covering what it carries
besides the verdict (:func:`workflows.identity.signed_extras`: an edit's arguments
exactly as sent, an answer's text, a remembered scope).
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import SecretStr
from temporalio.client import Client

from durable_agents.agent_client._client import AgentClient
from durable_agents.agent_client._decisions import decide_request as _decide_request
from durable_agents.agent_client._errors import AgentClientError
from durable_agents.agent_client._types import PendingItem
from durable_agents.cli.common import (
    cli_command,
    cli_error,
    interrupt_state,
    not_utf8,
    on_interrupt,
    restore_interrupt,
)
from workflows.call_view import call_head
from workflows.types import DecideRequest, DecisionKind, PendingApproval

Decision = DecisionKind
QUESTION_HEAD_CHARS = 80  # of a question's text in the one line an answer prints
_PROGRESS = re.compile(r"\((\d+)/(\d+)\); waiting for more reviewers")


@dataclass(frozen=True)
class Extras:
    """What a decision carries besides its verdict: an edit, a remembered scope, an answer's text."""

    edit: dict[str, Any] | None = None  # top-level keys set over the call's arguments (``approve --edit``)
    remember: Literal["", "call", "tool"] = ""
    text: str = ""  # the answer to a question

    def arguments(self, approval: PendingApproval | None) -> dict[str, Any] | None:
        """The call's whole arguments with the edit's keys set: what is sent, signed and run.

        Merged over what the approval's reviewers so far approved (an earlier edit of a quorum),
        else over the call as the model made it.
        """
        if self.edit is None:
            return None
        if approval is None:
            return dict(self.edit)
        base = approval.edited_args if approval.edited_args is not None else approval.args
        return {**base, **self.edit}


def edit_object(text: str) -> dict[str, Any]:
    """``--edit``'s value: a JSON object (of argument names to their new values); else a usage error."""
    if where := not_utf8(text):
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text ({where})")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object of the arguments to change, e.g. '{{\"json\": {{...}}}}', got {_json_type(value)}"
        )
    if not value:
        raise argparse.ArgumentTypeError("the JSON object is empty: name at least one argument to change")
    return value


def _json_type(value: Any) -> str:
    kinds = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def decide_request(
    approval_id: str,
    decision: Decision,
    reviewer: str,
    note: str,
    signature: str,
    *,
    text: str = "",
    arguments: dict[str, Any] | None = None,
    remember: str = "",
) -> DecideRequest:
    """The ``decide`` update's payload; a value the run would refuse (too long, ...) is a one-line usage error."""
    try:
        return _decide_request(
            approval_id, decision, reviewer, note, signature, text=text, arguments=arguments, remember=remember
        )
    except AgentClientError as err:
        raise cli_error(err) from None


async def send_decision(
    client: Client,
    workflow_id: str,
    approval_id: str,
    decision: Decision,
    reviewer: str,
    note: str,
    approval: PendingApproval | None,
    *,
    approval_key: SecretStr | None,
    extras: Extras | None = None,
) -> str:
    """Send one decision by ``AgentClient.decide``; what to print when it took effect (one line or a
    few: a quorum's progress, what was remembered or why not), else ``CliError``.

    With an ``approval_key`` the decision is signed (for workers that require signed decisions).
    """
    extras = extras or Extras()
    agents = AgentClient(client, approval_key=approval_key)
    item = PendingItem.model_validate({**approval.model_dump(), "workflow_id": workflow_id}) if approval else None
    before = interrupt_state()  # run --follow's reattach note, restored once the decision is answered
    on_interrupt(
        f"the {decision} decision may or may not have reached run {workflow_id}: see "
        + cli_command(f"pending {workflow_id}")
    )
    try:
        message = await agents.decide(
            workflow_id,
            approval_id,
            decision,
            reviewer=reviewer,
            comment=note,
            arguments=extras.arguments(approval),
            text=extras.text,
            remember=extras.remember,
            approval=item,
        )
    except AgentClientError as err:
        raise cli_error(err) from None
    finally:
        restore_interrupt(before)
    return outcome_text(decision, approval_id, reviewer, note, approval, message, extras)


def outcome_text(
    decision: Decision,
    approval_id: str,
    reviewer: str,
    note: str,
    approval: PendingApproval | None,
    message: str,
    extras: Extras,
) -> str:
    """What a decision the run accepted did, from what was sent and the run's own message."""
    if decision == "answer":
        asked = ""
        if approval is not None and approval.question:
            question = " ".join(approval.question.split())
            cut = question if len(question) <= QUESTION_HEAD_CHARS else question[: QUESTION_HEAD_CHARS - 1] + "…"
            asked = f" ({cut})"
        return f"answered {approval_id}{asked} as {reviewer}: {extras.text}"
    arguments = extras.arguments(approval)
    shown = arguments if arguments is not None else (approval.args if approval else None)
    what = f" ({call_head(approval.tool, shown or {})})" if approval else ""
    verb = {"approve": "approved", "reject": "rejected"}.get(decision, f"resolved ({decision})")
    why = f": {note}" if note else ""
    line = f"{verb} {approval_id}{what} as {reviewer}{why}"
    if arguments is not None and approval is not None and extras.edit is not None:
        base = approval.edited_args if approval.edited_args is not None else approval.args
        changed = sorted(k for k in extras.edit if base.get(k) != extras.edit[k])
        line += f" with edited arguments ({', '.join(changed) or 'unchanged'})"
    lines = [line]
    progress = _PROGRESS.search(message)
    if progress is not None:
        done, needed = int(progress.group(1)), int(progress.group(2))
        lines.append(f"  {done}/{needed} approvals: the call waits for {needed - done} more reviewer(s) before it runs")
        if extras.remember:
            lines.append(f"  --remember {extras.remember} was not kept: the approval that completes the quorum sets it")
    at = message.find("; remember")
    if at >= 0:
        remembered = message[at + 2 :]
        if remembered.startswith("remember tool refused"):
            remembered += " (the approval itself stands)"
        lines.append(f"  {remembered}")
    return "\n".join(lines)
