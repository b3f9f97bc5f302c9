"""Creating an E2B VM under an idempotency key, against the API's idempotency errors.

The SDK sends ``idempotency_key`` as the ``Idempotency-Key`` header of ``POST /v2/sandboxes``
(``SandboxApi._create_sandbox``) and raises an error answer through ``handle_api_exception``: a
``SandboxException("<status>: <message>", status_code=<status>)``. The body's ``error_code``
(``idempotency_in_progress``, ``idempotency_request_mismatch``, ``idempotency_outcome_unknown``) is
*dropped* by the SDK, so the kind is told from the status and the message text; what exactly the
real API says cannot be checked from here (docs/sandboxes.md), so an unrecognised 409 on create is
treated as "in progress" (wait, look up, retry) — never as a reason to make a second VM blindly.

* in progress (409): another caller's create with the same key is being served. Look the VM up by
  metadata; if it is not there yet, wait (bounded backoff) and retry with the same key.
* request mismatch (4xx): the key was first used with another body (``AGENT_E2B_TIMEOUT_S``, the
  internet setting or the metadata changed between attempts). Look the VM up; if there is none,
  create under a key derived from the new body (deterministic: the next retry shares it).
* outcome unknown: the API does not know whether the first attempt made a VM. Look it up; if there is
  none, create under a fresh key. If both exist after all, ``_find_one`` keeps the oldest.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import e2b

from activities.sandbox.base import SandboxTransient

IN_PROGRESS_ATTEMPTS = 6  # creates tried while another one with the key is in progress
IN_PROGRESS_FIRST_WAIT_S = 0.25  # then doubled: about 8 s in all before giving up (Temporal retries later)


class IdempotencyConflict(SandboxTransient):
    """The API refused a create because of its idempotency key; ``kind`` says why."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind = kind


def idempotency_key(sandbox_id: str, nonce: str = "") -> str:
    """The ``Idempotency-Key`` for creating ``sandbox_id`` (E2B wants ``[a-z0-9-]{1,255}``)."""
    digest = hashlib.sha256(f"{sandbox_id}\0{nonce}".encode()).hexdigest()[:48]
    return f"da-{digest}"


def idempotency_kind(exc: BaseException) -> str | None:
    """``in_progress`` / ``mismatch`` / ``unknown`` for an idempotency refusal of a create, else None."""
    if not isinstance(exc, e2b.SandboxException) or isinstance(exc, e2b.TimeoutException):
        return None
    status = exc.status_code
    text = str(exc).lower().replace("_", " ").replace("-", " ")
    if "mismatch" in text or ("idempotency" in text and "different" in text):
        return "mismatch"
    if "outcome unknown" in text or ("idempotency" in text and "unknown" in text):
        return "unknown"
    if "in progress" in text or status == 409:
        return "in_progress"
    if status is not None and 400 <= status < 500 and "idempotency" in text:
        return "mismatch"  # some other refusal of the key itself: never reuse it
    return None


def body_nonce(template: str, timeout: int, internet: bool, metadata: Mapping[str, str]) -> str:
    """A nonce from the create's body: the same body always gets the same key."""
    body = {"template": template, "timeout": timeout, "internet": internet, "metadata": dict(metadata)}
    return "body-" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]


async def create_with_key(
    create: Callable[[str], Awaitable[Any]],
    find: Callable[[], Awaitable[Any | None]],
    *,
    sandbox_id: str,
    nonce: str,
    body: str,
) -> tuple[Any | None, Any | None]:
    """``(new VM, None)`` or ``(None, existing listing)``; ``create(key)`` raises :class:`IdempotencyConflict`."""
    key = idempotency_key(sandbox_id, nonce)
    wait = IN_PROGRESS_FIRST_WAIT_S
    for _attempt in range(IN_PROGRESS_ATTEMPTS):
        try:
            return await create(key), None
        except IdempotencyConflict as conflict:
            found = await find()  # whatever the refusal, the run's VM may exist by now: use it
            if found is not None:
                return None, found
            if conflict.kind == "in_progress":
                await asyncio.sleep(wait)
                wait *= 2
                found = await find()  # the other create is likely done: its VM is listed
                if found is not None:
                    return None, found
            elif conflict.kind == "mismatch" and key != idempotency_key(sandbox_id, body):
                key = idempotency_key(sandbox_id, body)
            else:  # outcome unknown (or a mismatch under the body's own key): that key is spent
                key = idempotency_key(sandbox_id, uuid.uuid4().hex)
    raise SandboxTransient(
        f"E2B create sandbox: the create of {sandbox_id!r} is still in progress elsewhere; retrying later"
    )
