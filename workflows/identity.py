"""Deterministic identities derived from a call: canonical JSON, idempotency keys, approval ids.

Pure functions of their inputs, so every retry, replay and continue-as-new of a
run derives exactly the same values.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no insignificant whitespace (the hashing form)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(*parts: Any) -> str:
    return hashlib.sha256(canonical_json(list(parts)).encode()).hexdigest()


def idempotency_key(workflow_id: str, step: int, call_index: int, tool: str, arguments: dict[str, Any]) -> str:
    """``hash(workflow_id, step, call index, tool, canonical args)`` (docs/concepts.md, "One step, end to end")."""
    return "ik_" + _digest("idem", workflow_id, step, call_index, tool, arguments)[:40]


def approval_id(workflow_id: str, step: int, call_id: str, tool: str, arguments: dict[str, Any]) -> str:
    """An id that can only ever authorize this exact call."""
    return "ap_" + _digest("approval", workflow_id, step, call_id, tool, arguments)[:16]


SESSION_RUN = "session"  # in place of a first run id: a session's conversation outlives its runs


def session_conversation_id(workflow_id: str) -> str:
    """``<workflow id>/session``: every run of a session, woken again after it ended or not, shares it."""
    return f"{workflow_id}/{SESSION_RUN}"


def sandbox_id_for(conversation_id: str) -> str:
    return "sbx-" + _digest("sandbox", conversation_id)[:20]


def decision_signature(
    key: bytes,
    approval_id: str,
    decision: str,
    reviewer: str,
    expires_at: str,
    covers: dict[str, Any] | None = None,
) -> str:
    """HMAC-SHA256 over the decision, as ``starter.py`` signs and the worker verifies it.

    Binding ``expires_at`` means a signature cannot be replayed onto a later
    approval of the same call. ``covers`` binds what else the decision carries (an
    edit's ``arguments``, an answer's ``text``, a ``remember`` scope; see
    :func:`signed_extras`): a signature made for the call as the model made it does
    not verify for an edited one.
    """
    fields: dict[str, Any] = {
        "approval_id": approval_id,
        "decision": decision,
        "reviewer": reviewer,
        "expires_at": expires_at,
    }
    if covers:
        fields["covers"] = covers
    return hmac.new(key, canonical_json(fields).encode(), hashlib.sha256).hexdigest()


def signed_extras(arguments: dict[str, Any] | None = None, text: str = "", remember: str = "") -> dict[str, Any]:
    """What a decision's signature covers besides the decision itself (empty for a plain one)."""
    extras: dict[str, Any] = {}
    if arguments is not None:
        extras["arguments"] = arguments
    if text:
        extras["text"] = text
    if remember:
        extras["remember"] = remember
    return extras
