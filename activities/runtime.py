"""What every activity of one worker shares: settings, run store, tools, providers, prices, policy, sandboxes.

Built once by the composition root (``DurableAgentsPlugin``). ``Runtime.from_settings``
validates everything a run will later depend on, so that a misconfiguration
stops the worker with one line instead of failing runs minutes later: the
default model's provider, every provider's construction, the price table and
the operator's policy file.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from activities import catalog
from activities.approvals import load_policy
from activities.mcp.config import McpConfig, load_mcp_config
from activities.mcp.pool import McpPool
from activities.memory import MemoryStore, open_memory
from activities.memory.run_memory import RunMemory
from activities.models.base import FatalProviderError
from activities.models.pricing import PriceTable
from activities.models.registry import ProviderPool, ProviderRegistry
from activities.sandbox.base import SandboxBackend, SandboxUnavailable
from activities.sandbox.factory import backend_for
from activities.sandbox.local.backend import LocalSandboxBackend
from activities.sandbox.local.bwrap import bound_host_paths, require_bwrap
from activities.settings import ConfigurationError, Settings
from activities.store import RunStore, open_store
from activities.store.factory import display_url
from activities.store.transcript_cache import TranscriptCache, conversations_for
from activities.streaming import DeltaChannel, open_channel
from activities.subagents import load_subagents
from activities.tenant_secrets import secrets_dir_problem
from activities.tools.registry import RESERVED_NAMES, ToolRegistry
from workflows.types import SubagentDef

STARTUP_CHECK_WORKFLOW = "__durable_agents_startup_check__"  # a read that touches the store, never a run


@dataclass
class Runtime:
    settings: Settings
    tools: ToolRegistry
    providers: ProviderPool
    prices: PriceTable = field(default_factory=PriceTable)
    policy: dict[str, Any] = field(default_factory=dict)  # the operator's policy, snapshotted into each run
    subagents: dict[str, SubagentDef] = field(default_factory=dict)  # AGENT_SUBAGENTS_FILE, snapshotted too
    search_attributes_ready: bool = False  # set by the plugin once it checked the namespace
    mcp: McpPool = field(default_factory=lambda: McpPool(McpConfig()))  # AGENT_MCP_CONFIG's servers
    _sandbox_backend: SandboxBackend | None = field(default=None, repr=False)
    _store: RunStore | None = field(default=None, repr=False)
    _transcripts: TranscriptCache | None = field(default=None, repr=False)
    _memory: MemoryStore | None = field(default=None, repr=False)
    _deltas: DeltaChannel | None = field(default=None, repr=False)

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
        mcp_config = load_mcp_config(settings)
        settings = settings.with_secrets(mcp_config.secrets)  # redacted wherever the settings' secrets are
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
            subagents=load_subagents(settings.subagents_file, tools.names(), RESERVED_NAMES),
            mcp=McpPool(mcp_config, tuple(settings.secret_values()), settings),
        )

    @property
    def store(self) -> RunStore:
        """The run store, opened on first use (again after :meth:`aclose`)."""
        if self._store is None:
            self._store = open_store(self.settings.store_url, self.settings.encryption.keyring)
        return self._store

    @property
    def memory(self) -> MemoryStore:
        """Long-term memory, beside the run store (same file or database), opened on first use."""
        if self._memory is None:
            self._memory = open_memory(self.settings)
        return self._memory

    @property
    def deltas(self) -> DeltaChannel:
        """Where model turns stream their text (``activities.streaming``), beside the run store; opened on first use."""
        if self._deltas is None:
            self._deltas = open_channel(self.settings)
        return self._deltas

    def memory_of(self, tenant: str, user: str) -> RunMemory:
        """The (tenant, user) namespace of :attr:`memory`, as a run's tools get it (the store opens on first use)."""
        return RunMemory(lambda: self.memory, tenant, user)

    @property
    def transcripts(self) -> TranscriptCache:
        """Transcript prefixes this worker read or wrote, shared by the model and tool activities."""
        if self._transcripts is None:
            bound = conversations_for(self.settings.worker.max_cached_workflows)
            self._transcripts = TranscriptCache(self.store, max_conversations=bound)
        return self._transcripts

    def sandbox_backend(self) -> SandboxBackend:
        """The configured backend; raises ``SandboxUnavailable`` if it cannot isolate."""
        if self._sandbox_backend is None:
            self._sandbox_backend = backend_for(self.settings)
        return self._sandbox_backend

    async def check(self, *, timeout_s: float = 15.0) -> None:
        """Prove, before any run depends on them, that the run store opens, the sandbox can isolate and no
        sandbox can see the tenants' secrets (``AGENT_TENANT_SECRETS_DIR``).

        :class:`ConfigurationError` naming ``AGENT_STORE_URL`` or ``AGENT_SANDBOX`` otherwise, so a worker
        exits at start instead of failing every run later (and blaming the model).
        """
        url = display_url(self.settings.store_url)
        try:
            await asyncio.wait_for(self.store.ledger(STARTUP_CHECK_WORKFLOW), timeout_s)
        except TimeoutError:
            raise ConfigurationError(
                f"AGENT_STORE_URL={url}: the run store did not answer within {timeout_s:g} s"
            ) from None
        except Exception as exc:
            detail = (str(exc).splitlines() or [""])[0] or type(exc).__name__
            raise ConfigurationError(f"AGENT_STORE_URL={url}: the run store cannot be opened: {detail}") from None
        try:
            backend = self.sandbox_backend()
            if backend.name == "local":
                await asyncio.to_thread(require_bwrap, self.settings.sandbox.local.uid_base)
        except SandboxUnavailable as exc:
            raise ConfigurationError(f"AGENT_SANDBOX={self.settings.sandbox.backend}: {exc}") from None
        # Tenants' secrets must lie where no local sandbox can read them: not under a host path it binds, nor
        # under the workspaces (an E2B sandbox sees nothing of the host).
        visible = [*bound_host_paths(), str(backend.root)] if isinstance(backend, LocalSandboxBackend) else []
        problem = secrets_dir_problem(self.settings, visible)
        if problem:
            raise ConfigurationError(problem)

    async def aclose(self) -> None:
        """Stop MCP servers, close provider connections and the store; a later use opens them again."""
        pool, self.mcp = self.mcp, McpPool(self.mcp.config, tuple(self.settings.secret_values()), self.settings)
        await pool.aclose()
        await self.providers.aclose()
        store, self._store = self._store, None
        self._transcripts = None
        if store is not None:
            await store.close()
        memory, self._memory = self._memory, None
        if memory is not None:
            await memory.close()
        deltas, self._deltas = self._deltas, None
        if deltas is not None:
            await deltas.close()
