"""What every activity of one worker shares: settings, run store, tools, providers, prices, policy, sandboxes.

Built once by the composition root (``DurableAgentsPlugin``). ``Runtime.from_settings``
validates everything a run will later depend on, so that a misconfiguration
stops the worker with one line instead of failing runs minutes later: the
default model's provider, every provider's construction, the price table and
the operator's policy file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from activities import catalog
from activities.approvals import load_policy
from activities.models.base import FatalProviderError
from activities.models.pricing import PriceTable
from activities.models.registry import ProviderPool, ProviderRegistry
from activities.sandbox.base import SandboxBackend
from activities.sandbox.factory import backend_for
from activities.settings import ConfigurationError, Settings
from activities.store import RunStore, open_store
from activities.tools.registry import ToolRegistry


@dataclass
class Runtime:
    settings: Settings
    tools: ToolRegistry
    providers: ProviderPool
    prices: PriceTable = field(default_factory=PriceTable)
    policy: dict[str, Any] = field(default_factory=dict)  # the operator's policy, snapshotted into each run
    search_attributes_ready: bool = False  # set by the plugin once it checked the namespace
    _sandbox_backend: SandboxBackend | None = field(default=None, repr=False)
    _store: RunStore | None = field(default=None, repr=False)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        tools: ToolRegistry | None = None,
        providers: ProviderRegistry | None = None,
    ) -> Runtime:
        """A runtime for ``settings``; registries default to the built-ins plus the operator's modules.

        Raises :class:`ConfigurationError` (one line, naming the variable) for anything a run would trip on.
        """
        tools = tools if tools is not None else catalog.tool_registry(settings)
        providers = providers if providers is not None else catalog.provider_registry(settings)
        try:
            providers.check_model(settings.model)
        except FatalProviderError as exc:
            raise ConfigurationError(f"AGENT_MODEL: {exc.message}") from None
        pool = ProviderPool(providers, settings)
        pool.build_all()
        return cls(
            settings=settings,
            tools=tools,
            providers=pool,
            prices=PriceTable.load(settings.prices_file),
            policy=load_policy(settings.policy_file),
        )

    @property
    def store(self) -> RunStore:
        """The run store, opened on first use (again after :meth:`aclose`)."""
        if self._store is None:
            self._store = open_store(self.settings.store_url)
        return self._store

    def sandbox_backend(self) -> SandboxBackend:
        """The configured backend; raises ``SandboxUnavailable`` if it cannot isolate."""
        if self._sandbox_backend is None:
            self._sandbox_backend = backend_for(self.settings)
        return self._sandbox_backend

    async def aclose(self) -> None:
        """Close provider connections and the store; a later use opens them again."""
        await self.providers.aclose()
        store, self._store = self._store, None
        if store is not None:
            await store.close()
