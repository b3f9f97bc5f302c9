"""Run a side-effecting tool at most once per idempotency key, surviving crashes.

Protocol (docs/concepts.md, "Idempotency ledger"): claim the key in the ledger (intent)
before the side effect, record the outcome after. On a retry:

- outcome recorded → return it, do nothing;
- intent without outcome (the previous holder died or failed mid-call) → the
  tool's recovery mode decides: ``idempotent_by_key`` re-sends with the same key,
  ``reconcile`` checks whether it happened, ``unknown`` reports an unknown outcome
  so the workflow pauses for a human. Never a blind retry.

Store outages (``StoreUnavailable``: PostgreSQL down, SQLite locked) at each point of
``execute_once``. Any store call may have been applied even though it raised (a commit whose
answer was lost), so every point is judged for both cases. The activity attempt that meets one
fails with the retryable ``StoreUnavailable`` (``activities.store_errors``); Temporal retries it.

1. ``claim`` fails: nothing ran. Either no intent was recorded (the retry claims ``fresh``) or it
   was and the answer was lost (the retry finds this attempt's live lease, ``busy``: it waits for
   the lease, then ``recovered`` with no execution started, and the recovery mode decides, as for
   any intent without outcome). Never two runs: the side effect only starts after ``started``.
2. ``reconcile`` / ``finish(unknown)`` of a recovered claim fail: the side effect was not started
   by this attempt; the retry claims again and gets the same verdict (or ``done``/``unknown``).
3. ``started`` fails: the side effect was not started (it starts only after ``started`` returns
   True). If the count was applied and the answer lost, the ledger over-counts an execution that
   never began, which only makes recovery more careful. ``started`` is False when another holder
   took the key meanwhile: then this attempt does not run it at all.
4. During the side effect, lease renewals fail: tolerated (``_renewer``), logged once per streak;
   heartbeats to Temporal go on, so no other attempt is started, and no other holder can claim
   the key while the store is down anyway. The lease may run out meanwhile; the next renewal that
   reaches the store extends it again (``renew`` matches the owner, not the lease), unless another
   holder has claimed the key, which is reported as today. The side effect is never abandoned.
5. ``finish(done)`` fails after the side effect: retried in the attempt (``persistently``, with
   heartbeats) until it lands or the attempt times out. If it never lands, the next attempt meets
   intent without outcome and an execution started: the recovery mode decides (``idempotent_by_key``
   re-sends with the same key, ``reconcile`` asks, ``unknown`` asks a human). Never a blind rerun.
6. Storing the result in the transcript fails (``_run_tool``, after this returns): the retry
   claims ``done`` and returns the recorded outcome without running anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating, persistently
from activities.redaction import redact
from activities.runtime import Runtime
from activities.store.base import StoreUnavailable
from activities.store.ledger import ClaimRequest
from activities.tools.spec import ToolContext, ToolSpec
from workflows.identity import canonical_json
from workflows.types import ToolInvocation

DEFAULT_LEASE_S = 60.0
log = structlog.get_logger("activities.tools.recovery")


@dataclass(frozen=True)
class Execution:
    text: str
    is_error: bool
    unknown: bool = False


Runner = Callable[[ToolSpec, Runtime, ToolInvocation], Awaitable[tuple[str, bool]]]


def _lease_s() -> float:
    info = activity.info()
    timeout = info.heartbeat_timeout or info.start_to_close_timeout
    return timeout.total_seconds() if timeout else DEFAULT_LEASE_S


def _renewer(runtime: Runtime, key: str, owner: str, lease_s: float) -> Callable[[], Awaitable[None]]:
    """Renew the ledger lease on every heartbeat, so a live holder is never taken over.

    A renewal that fails because the store is unavailable is tolerated: logged once per run of
    missed beats (the store logs the outage itself), and the next beat renews again. The side
    effect goes on. Losing the lease to another holder is reported as before.
    """
    missed = 0

    async def renew() -> None:
        nonlocal missed
        try:
            held = await runtime.store.renew(key, owner, lease_s)
        except StoreUnavailable as exc:
            missed += 1
            if missed == 1:
                log.info("lease_renewal_missed", key=key, error=str(exc)[:300])
            return
        if missed:
            log.info("lease_renewed", key=key, missed_beats=missed)
            missed = 0
        if not held:
            activity.logger.warning("lost the ledger lease on %s to another holder", key)

    return renew


async def execute_once(spec: ToolSpec, runtime: Runtime, inv: ToolInvocation, run: Runner) -> Execution:
    info = activity.info()
    store = runtime.store
    owner = f"{info.workflow_id}/{info.activity_id}#{info.attempt}/{uuid.uuid4().hex[:8]}"
    lease_s = _lease_s()
    claim = await store.claim(
        ClaimRequest(
            key=inv.idempotency_key,
            tool=spec.name,
            args_hash=hashlib.sha256(canonical_json(inv.arguments).encode()).hexdigest(),
            workflow_id=inv.workflow_id,
            owner=owner,
            attempt=info.attempt,
            lease_s=lease_s,
            force=inv.resolution == "retry",
            start_if_fresh=True,
        )
    )
    entry = claim.entry
    if claim.status == "done":
        activity.logger.info("%s already done for key %s; returning the recorded outcome", spec.name, entry.key)
        return Execution(entry.result, entry.is_error)
    if claim.status == "busy":
        wait = max(1.0, entry.lease_until - time.time())
        raise ApplicationError(
            f"{spec.name} call {entry.key} is in flight elsewhere (lease held by {entry.owner})",
            type="CallInFlight",
            next_retry_delay=timedelta(seconds=wait),
        )
    if claim.status == "recovered":
        activity.logger.warning(
            "%s key %s has intent without outcome (attempt %d); recovery mode %s",
            spec.name,
            entry.key,
            entry.attempt,
            spec.recovery,
        )
        if spec.recovery == "reconcile":
            assert spec.reconcile is not None
            found = await spec.reconcile(spec.args_model.model_validate(inv.arguments), _context(runtime, inv))
            if found is not None:  # the ledger and the transcript get it: redacted like a tool's own result
                found = redact(found, runtime.settings.secret_values())
                await store.finish(entry.key, owner, "done", found, False, note="reconciled")
                return Execution(found, False)
        elif spec.recovery == "unknown":
            note = f"attempt {entry.attempt} recorded intent and no outcome; {entry.executions} execution(s) started"
            await store.finish(entry.key, owner, "unknown", "", False, note=note)
            return Execution(f"outcome unknown: {note}", True, unknown=True)

    if claim.status != "fresh" and not await store.started(inv.idempotency_key, owner):
        # Another holder claimed the key since our claim (our lease ran out): it decides, not us.
        raise ApplicationError(
            f"{spec.name} call {inv.idempotency_key} was claimed by another holder before it started",
            type="CallInFlight",
            next_retry_delay=timedelta(seconds=1),
        )
    every_s = float(spec.heartbeat_s or max(1.0, lease_s / 3))
    try:
        async with heartbeating(every_s, _renewer(runtime, inv.idempotency_key, owner, lease_s)):
            text, is_error = await run(spec, runtime, inv)
    except BaseException:
        # Whether the side effect happened is unknown; give up the lease so the next attempt
        # goes straight to recovery instead of waiting for the lease to run out.
        with contextlib.suppress(Exception):
            await store.renew(inv.idempotency_key, owner, 0)
        raise
    # The side effect happened: its outcome must reach the ledger, or a retry would treat it as unknown.
    await persistently(
        f"outcome of {spec.name} {inv.idempotency_key}",
        lambda: store.finish(inv.idempotency_key, owner, "done", text, is_error),
    )
    return Execution(text, is_error)


def _context(runtime: Runtime, inv: ToolInvocation) -> ToolContext:
    return ToolContext(invocation=inv, settings=runtime.settings, memory=runtime.memory_of(inv.tenant, inv.user))
