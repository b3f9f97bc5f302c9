"""What every activity shares in one worker process: settings, run store, providers, sandboxes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from activities.config import Settings
from activities.models.registry import ProviderPool
from activities.sandbox.base import SandboxBackend
from activities.store import RunStore, open_store


@dataclass
class Runtime:
    settings: Settings
    store: RunStore
    providers: ProviderPool
    search_attributes_ready: bool = False  # set by the worker once it checked the namespace
    _sandbox_backend: SandboxBackend | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> Runtime:
        return cls(settings=settings, store=open_store(settings.store_url), providers=ProviderPool(settings))

    def sandbox_backend(self) -> SandboxBackend:
        """The configured backend; raises ``SandboxUnavailable`` if it cannot isolate."""
        if self._sandbox_backend is None:
            from activities.sandbox.factory import backend_for

            self._sandbox_backend = backend_for(self.settings)
        return self._sandbox_backend

    async def aclose(self) -> None:
        await self.providers.aclose()
        await self.store.close()


def all_activities(runtime: Runtime) -> list[Callable[..., Any]]:
    """Every activity a worker registers: model, run config, transcript, sandbox, one per tool."""
    from activities.approvals import ApprovalActivities
    from activities.models.activity import ModelActivities
    from activities.sandbox.activity import SandboxActivities
    from activities.tools.activity import CompensationActivities, TranscriptActivities, tool_activities

    model = ModelActivities(runtime)
    sandbox = SandboxActivities(runtime)
    transcript = TranscriptActivities(runtime)
    return [
        model.run_config,
        ApprovalActivities(runtime.settings).verify_decision,
        model.model,
        transcript.transcript_append,
        CompensationActivities(runtime).compensate,
        sandbox.sandbox_create,
        sandbox.sandbox_kill,
        *tool_activities(runtime),
    ]
