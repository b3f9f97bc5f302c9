"""Trusted approval helpers: the operator's policy file and decision signatures.

``AGENT_POLICY_FILE`` (JSON, see ``workflows.policy.Policy``) is read and
validated at worker start and snapshotted into every run that starts. With
``AGENT_APPROVAL_KEY`` set, every decision must carry an HMAC made with the same
key (``starter.py`` signs when the variable is set in its environment); the key
never enters a workflow.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.settings import Settings, bad_file
from activities.tools.registry import ToolRegistry
from workflows.identity import decision_signature
from workflows.policy import Policy
from workflows.types import EditCheck, EditChecked, RecordedToolCall, SignatureCheck


def load_policy(path: str) -> dict[str, Any]:
    """The operator policy as a validated plain dict (defaults when no file is configured).

    ``ConfigurationError`` naming the file when it cannot be read or is not a valid policy.
    """
    if not path:
        return Policy().model_dump()
    try:
        raw = json.loads(Path(path).read_text())
        return Policy.model_validate(raw).model_dump()
    except (OSError, ValueError) as exc:  # ValidationError is a ValueError
        raise bad_file("AGENT_POLICY_FILE", path, exc) from None


class ApprovalActivities:
    def __init__(self, settings: Settings, tools: ToolRegistry | None = None) -> None:
        self._settings = settings
        self._tools = tools

    @activity.defn(name="check_edited_call")
    async def check_edited_call(self, check: EditCheck) -> EditChecked:
        """A reviewer's arguments validated as the model's would be (argument model, then the tool's precheck)."""
        if self._tools is None or check.tool not in self._tools.names():
            return EditChecked(error=f"calls of {check.tool} cannot be edited on this worker")
        raw = RecordedToolCall(id="edit", name=check.tool, arguments_json=json.dumps(check.arguments))
        call = self._tools.validate_call(raw, [check.tool], self._settings)
        if call.error:
            return EditChecked(error=call.error.removeprefix("Error: "))
        return EditChecked(arguments=call.arguments)

    @activity.defn(name="verify_decision")
    async def verify_decision(self, check: SignatureCheck) -> bool:
        key = self._settings.approval_key
        if key is None:
            return False
        expected = decision_signature(
            key.get_secret_value().encode(),
            check.approval_id,
            check.decision,
            check.reviewer,
            check.expires_at,
            check.covers,
        )
        return hmac.compare_digest(expected, check.signature)
