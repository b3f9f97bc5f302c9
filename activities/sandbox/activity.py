"""``sandbox_create`` / ``sandbox_kill``: the run's sandbox lifecycle, driven by the workflow."""

from __future__ import annotations

from collections.abc import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.sandbox.base import SandboxBackend, SandboxUnavailable
from workflows.types import SandboxRef, SandboxRequest


class SandboxActivities:
    """The two activities, over the worker's backend (``backend()`` returns it, or raises ``SandboxUnavailable``).

    Handed the backend, not the Runtime: the sandbox layer sits below the model and tool layers.
    """

    def __init__(self, backend: Callable[[], SandboxBackend]) -> None:
        self._backend = backend

    @activity.defn(name="sandbox_create")
    async def sandbox_create(self, req: SandboxRequest) -> SandboxRef:
        """Create the run's sandbox (idempotent on ``sandbox_id``)."""
        try:
            backend = self._backend()
            sandbox = await backend.create(
                req.sandbox_id, metadata={"conversation_id": req.conversation_id, "tenant": req.tenant}
            )
        except SandboxUnavailable as exc:
            # Fail closed and tell the run why; retrying cannot install bubblewrap.
            raise ApplicationError(str(exc), type="SandboxUnavailable", non_retryable=True) from None
        return SandboxRef(sandbox_id=sandbox.sandbox_id, backend=backend.name)

    @activity.defn(name="sandbox_kill")
    async def sandbox_kill(self, req: SandboxRequest) -> None:
        """Kill the run's sandbox (idempotent). Transient backend errors propagate and are retried."""
        try:
            killed = await self._backend().kill(req.sandbox_id)
        except SandboxUnavailable as exc:
            activity.logger.warning("cannot kill sandbox %s: %s", req.sandbox_id, exc)
            return
        if not killed:
            activity.logger.info("sandbox %s already gone", req.sandbox_id)
