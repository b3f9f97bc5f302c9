"""``Settings``: the one reader of the environment, for the worker, the starter and the plugin.

``Settings.from_env()`` reads every variable of the public contract once and
returns frozen, typed parts; nothing else in the project calls ``os.environ``.
Secrets are held as ``pydantic.SecretStr`` so that a settings object printed or
logged by accident shows ``**********`` instead of a key. A bad value raises
:class:`ConfigurationError` with the variable named, which the entry points turn
into a one-line error and exit code 2.

Parts::

    settings.temporal        address, namespace, profile, task queue, UI URL
    settings.openai          base URL and key of the OpenAI-compatible server
    settings.anthropic       base URL and key of the Anthropic server
    settings.sandbox         backend name, .local (bubblewrap limits, uid base), .e2b, reaper interval
    settings.observability   log level, metrics port, trace exporters
    settings.extensions      operator tool and provider modules
    settings.worker          worker tuning (cache, slots), health port, shared-store requirement
    settings.encryption      the payload and run-store key ring, the codec server's token and origins
    settings.memory          long-term memory's bounds per namespace and its TTL

The parts are :mod:`activities.settings.parts`; reading a variable (and the error naming it) is
:mod:`activities.settings.reader`. Every name is importable from ``activities.settings``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pydantic import SecretStr

from activities.settings.parts import (
    DEFAULT_CODEC_ORIGINS,
    DEFAULT_STATE_DIR,
    DEFAULT_UID_BASE,
    RUN_MAX_FACTOR,
    ApiSettings,
    CheckpointSettings,
    E2BConfig,
    EncryptionSettings,
    ExtensionSettings,
    LocalLimits,
    LocalSandboxSettings,
    MemorySettings,
    ObservabilitySettings,
    ProviderEndpoint,
    SandboxSettings,
    TemporalSettings,
    WorkerSettings,
)
from activities.settings.reader import (
    LOG_LEVELS,
    TRACE_EXPORTERS,
    ConfigurationError,
    Reader,
    api_settings,
    bad_file,
    default_model,
    e2b_config,
    encryption_settings,
    is_shared_store,
    local_limits,
    observability_settings,
    store_url_of,
    uid_base,
    url_passwords,
    worker_settings,
)
from activities.settings_reference import VARIABLES
from workflows.types import MAX_DEPTH

SANDBOX_BACKENDS = ("local", "e2b")
_RUNTIME_VARIABLES = frozenset(v.name for v in VARIABLES)  # never handed to a tool as a "worker secret"

__all__ = [
    "DEFAULT_CODEC_ORIGINS",
    "DEFAULT_STATE_DIR",
    "DEFAULT_UID_BASE",
    "LOG_LEVELS",
    "RUN_MAX_FACTOR",
    "SANDBOX_BACKENDS",
    "TRACE_EXPORTERS",
    "ApiSettings",
    "CheckpointSettings",
    "ConfigurationError",
    "E2BConfig",
    "EncryptionSettings",
    "ExtensionSettings",
    "LocalLimits",
    "LocalSandboxSettings",
    "MemorySettings",
    "ObservabilitySettings",
    "ProviderEndpoint",
    "SandboxSettings",
    "Settings",
    "TemporalSettings",
    "WorkerSettings",
    "bad_file",
    "default_model",
    "is_shared_store",
    "url_passwords",
]


@dataclass(frozen=True)
class Settings:
    temporal: TemporalSettings = field(default_factory=TemporalSettings)
    model: str = "scripted:demo"  # AGENT_MODEL: the default model of runs that name none
    openai: ProviderEndpoint = field(default_factory=lambda: ProviderEndpoint("https://api.openai.com/v1"))
    anthropic: ProviderEndpoint = field(default_factory=lambda: ProviderEndpoint("https://api.anthropic.com"))
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    checkpoints: CheckpointSettings = field(default_factory=CheckpointSettings)
    observability: ObservabilitySettings = field(default_factory=ObservabilitySettings)
    extensions: ExtensionSettings = field(default_factory=ExtensionSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    encryption: EncryptionSettings = field(default_factory=EncryptionSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    api: ApiSettings = field(default_factory=ApiSettings)  # AGENT_API_*: starter.py serve
    http_allow: tuple[str, ...] = ()
    store_url: str = str(DEFAULT_STATE_DIR / "store.sqlite3")
    state_dir: Path = DEFAULT_STATE_DIR
    prices_file: str = ""
    allow_unpriced: bool = False  # AGENT_ALLOW_UNPRICED: a run may set max_cost_usd with a model that has no price
    policy_file: str = ""
    subagents_file: str = ""  # AGENT_SUBAGENTS_FILE: the operator's sub-agent definitions (JSON)
    # The most one model turn may return (sent to the provider; a tree's budget reserves it per turn).
    max_output_tokens: int = 4096  # AGENT_MAX_OUTPUT_TOKENS
    max_subagent_calls_per_turn: int = 10  # AGENT_MAX_SUBAGENT_CALLS_PER_TURN: the extra calls get a tool error
    max_tree_runs: int = 50  # AGENT_MAX_TREE_RUNS: runs of one tree (its root included), reserved in the run store
    max_depth: int = 3  # AGENT_MAX_DEPTH: the ceiling of every run's and sub-agent's limits.max_depth
    # AGENT_TENANT_MAX_OPEN_RUNS: open top-level runs and sessions one tenant may have (0: any number)
    tenant_max_open_runs: int = 0
    mcp_config: str = ""  # AGENT_MCP_CONFIG: the operator's MCP servers ({"mcpServers": ...}, JSON)
    approval_key: SecretStr | None = None
    allow_fork_input: bool = True  # AGENT_ALLOW_FORK_INPUT=0: a run input's ``fork`` is refused (fork_prepare)
    # AGENT_FAIL_WORKFLOW_ON_ERROR=1: a run that ends failed or limit_exceeded fails its workflow (the
    # AgentResult in the failure's details) instead of completing with it; taken at each run's start.
    fail_workflow_on_error: bool = False
    reviewer: str = "cli"  # who the starter's decisions are from by default ($USER)
    # AGENT_TENANT_SECRETS_DIR: ``<dir>/<tenant>/<NAME>`` is the tenant's secret NAME (``ctx.secret``, ``${secret:}``)
    tenant_secrets_dir: str = ""
    # AGENT_TENANT_SECRETS_FALLBACK=1: a secret the run's tenant lacks is the worker's own (its environment variable)
    tenant_secrets_fallback: bool = False
    # The rest of the environment, for operator extensions (``variable``); never printed.
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False, compare=False)
    # Secrets that configuration files brought in (``${VAR}`` values of MCP servers); see ``with_secrets``.
    extra_secrets: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the environment (or ``env``); :class:`ConfigurationError` names the first bad variable."""
        env = dict(os.environ if env is None else env)
        reader = Reader(env)
        openai_key = reader.secret("OPENAI_API_KEY")
        anthropic_key = reader.secret("ANTHROPIC_API_KEY")
        e2b_key = reader.secret("E2B_API_KEY")
        state_dir = Path(reader.text("AGENT_STATE_DIR") or str(DEFAULT_STATE_DIR))
        limits = local_limits(reader)
        sandbox = reader.text("AGENT_SANDBOX").lower() or ("e2b" if e2b_key else "local")
        if sandbox not in SANDBOX_BACKENDS:
            raise ConfigurationError(
                f"AGENT_SANDBOX={reader.text('AGENT_SANDBOX')!r}: expected one of {', '.join(SANDBOX_BACKENDS)}"
            )
        return cls(
            temporal=TemporalSettings(
                address=reader.text("TEMPORAL_ADDRESS") or "localhost:7233",
                namespace=reader.text("TEMPORAL_NAMESPACE") or "default",
                profile=reader.text("TEMPORAL_PROFILE"),
                task_queue=reader.text("AGENT_TASK_QUEUE") or "agents",
                ui_url=(reader.text("TEMPORAL_UI_URL") or "http://localhost:8233").rstrip("/"),
                http_port=reader.integer("TEMPORAL_HTTP_PORT", 0, low=1, high=65535) or None,
            ),
            model=reader.text("AGENT_MODEL") or default_model(openai_key, anthropic_key),
            openai=ProviderEndpoint(
                (reader.text("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/"), openai_key
            ),
            anthropic=ProviderEndpoint(
                (reader.text("ANTHROPIC_BASE_URL") or "https://api.anthropic.com").rstrip("/"), anthropic_key
            ),
            sandbox=SandboxSettings(
                backend=sandbox,
                local=LocalSandboxSettings(limits=limits, uid_base=uid_base(reader)),
                e2b=e2b_config(reader, limits),
                e2b_api_key=e2b_key,
                reap_interval_s=reader.number("AGENT_REAP_INTERVAL_S", 600.0, minimum=0.0),
            ),
            checkpoints=CheckpointSettings(
                max_mb=reader.integer("AGENT_CHECKPOINT_MAX_MB", 256, low=1, high=1024 * 1024),
                retention_days=reader.number("AGENT_CHECKPOINT_RETENTION_DAYS", 7.0, minimum=0.0),
                run_retention_days=(
                    reader.number("AGENT_RUN_RETENTION_DAYS", 0.0, positive=True)
                    if reader.text("AGENT_RUN_RETENTION_DAYS")
                    else None
                ),
                run_max_mb=reader.integer("AGENT_CHECKPOINT_RUN_MAX_MB", 0, low=1, high=1024 * 1024 * 1024),
                run_max_count=reader.integer("AGENT_CHECKPOINT_RUN_MAX_COUNT", 1000, low=1, high=10_000_000),
            ),
            observability=observability_settings(reader),
            extensions=ExtensionSettings(
                tool_modules=reader.names("AGENT_TOOL_MODULES"),
                provider_modules=reader.names("AGENT_PROVIDER_MODULES"),
            ),
            worker=worker_settings(reader),
            encryption=encryption_settings(reader),
            memory=MemorySettings(
                max_entries=reader.integer("AGENT_MEMORY_MAX_ENTRIES", 10_000, low=1, high=100_000_000),
                max_mb=reader.integer("AGENT_MEMORY_MAX_MB", 64, low=1, high=1024 * 1024),
                ttl_days=reader.number("AGENT_MEMORY_TTL_DAYS", 0.0, positive=True) or None,
            ),
            api=api_settings(reader),
            http_allow=tuple(h.lower() for h in reader.names("AGENT_HTTP_ALLOW")),
            store_url=store_url_of(reader, state_dir),
            state_dir=state_dir,
            prices_file=reader.text("AGENT_PRICES"),
            allow_unpriced=reader.flag("AGENT_ALLOW_UNPRICED"),
            policy_file=reader.text("AGENT_POLICY_FILE"),
            subagents_file=reader.text("AGENT_SUBAGENTS_FILE"),
            max_output_tokens=reader.integer("AGENT_MAX_OUTPUT_TOKENS", 4096, low=1, high=1_000_000),
            max_subagent_calls_per_turn=reader.integer("AGENT_MAX_SUBAGENT_CALLS_PER_TURN", 10, low=0, high=1000),
            max_tree_runs=reader.integer("AGENT_MAX_TREE_RUNS", 50, low=1, high=1_000_000),
            max_depth=reader.integer("AGENT_MAX_DEPTH", 3, low=0, high=MAX_DEPTH),
            tenant_max_open_runs=reader.integer("AGENT_TENANT_MAX_OPEN_RUNS", 0, low=0, high=1_000_000),
            mcp_config=reader.text("AGENT_MCP_CONFIG"),
            approval_key=reader.secret("AGENT_APPROVAL_KEY"),
            allow_fork_input=reader.flag("AGENT_ALLOW_FORK_INPUT", True),
            fail_workflow_on_error=reader.flag("AGENT_FAIL_WORKFLOW_ON_ERROR"),
            reviewer=reader.text("USER") or "cli",
            tenant_secrets_dir=reader.text("AGENT_TENANT_SECRETS_DIR"),
            tenant_secrets_fallback=reader.flag("AGENT_TENANT_SECRETS_FALLBACK"),
            environ=MappingProxyType(env),
        )

    @property
    def task_queue(self) -> str:
        return self.temporal.task_queue

    def shared_store_problem(self) -> str:
        """Why this run store breaks ``AGENT_REQUIRE_SHARED_STORE=1`` (one line), or ``""`` when it does not."""
        if not self.worker.require_shared_store or is_shared_store(self.store_url):
            return ""
        return (
            f"AGENT_REQUIRE_SHARED_STORE=1 but AGENT_STORE_URL={self.store_url} is a SQLite run store, which only "
            "workers on one machine can share: set AGENT_STORE_URL=postgresql://..."
        )

    def variable(self, name: str, default: str = "") -> str:
        """An environment variable for an operator's own extension (a provider's key, a tool's endpoint).

        Read from the snapshot taken by :meth:`from_env`, so extensions never touch ``os.environ``.
        """
        return self.environ.get(name, default)

    def worker_secret(self, name: str) -> str | None:
        """The worker's own secret ``name`` (its environment variable), or None when unset or when ``name`` is one
        of the runtime's own settings (``AGENT_*``, ``TEMPORAL_*``, a provider's key): a tool never gets those.

        Only read for a tool when ``tenant_secrets_fallback`` is on (see ``activities.tenant_secrets``).
        """
        if name.startswith(("AGENT_", "TEMPORAL_", "OTEL_")) or name in _RUNTIME_VARIABLES:
            return None
        value = self.environ.get(name, "")
        return value or None

    def secret_values(self) -> list[str]:
        """Every configured secret (API keys, the approval key, payload keys, the codec token, the store URL's
        password), for redaction."""
        keys = [
            s.get_secret_value()
            for s in (self.openai.api_key, self.anthropic.api_key, self.sandbox.e2b_api_key, self.approval_key)
            if s is not None and s.get_secret_value()
        ]
        if self.encryption.codec_token is not None:
            keys.append(self.encryption.codec_token.get_secret_value())
        if self.encryption.keyring is not None:
            keys += self.encryption.keyring.secret_values()
        return [*keys, *url_passwords(self.store_url), *self.extra_secrets]

    def with_secrets(self, secrets: Iterable[str]) -> Settings:
        """These settings, also redacting ``secrets`` (values a configuration file pulled from the environment)."""
        merged = tuple(dict.fromkeys([*self.extra_secrets, *(s for s in secrets if s)]))
        return dataclasses.replace(self, extra_secrets=merged)
