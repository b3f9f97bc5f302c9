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
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import SecretStr, ValidationError

from activities.crypto.keyring import KeyRing
from activities.store_urls import StoreUrlError, is_postgres, sqlite_path
from workflows.types import MAX_DEPTH

DEFAULT_STATE_DIR = Path(".agent")
DEFAULT_UID_BASE = 2_000_000_000
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SANDBOX_BACKENDS = ("local", "e2b")
TRACE_EXPORTERS = ("console", "otlp", "none")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
DEFAULT_CODEC_ORIGINS = ("http://localhost:8233", "http://127.0.0.1:8233")  # the dev server's UI
_CONNINFO_PASSWORD = re.compile(r"\bpassword\s*=\s*(?:'([^']*)'|(\S+))")


class ConfigurationError(ValueError):
    """A variable or a file it names is invalid; the message names it and fits on one line."""


@dataclass(frozen=True)
class TemporalSettings:
    address: str = "localhost:7233"
    namespace: str = "default"
    profile: str = ""  # TEMPORAL_PROFILE: a profile of temporal.toml (TLS, API keys)
    task_queue: str = "agents"
    ui_url: str = "http://localhost:8233"
    http_port: int | None = None  # TEMPORAL_HTTP_PORT: the frontend's HTTP API port (Temporal's default: port + 10)


@dataclass(frozen=True)
class ProviderEndpoint:
    """Where a model API lives and the key that opens it."""

    base_url: str
    api_key: SecretStr | None = None


@dataclass(frozen=True)
class LocalLimits:
    """Per-command resource limits of the local (bubblewrap) sandbox; ``AGENT_SANDBOX_*`` overrides them."""

    timeout_s: float = 60.0  # wall time; a run's own timeout_s is capped at this
    memory_mb: int = 1024  # RLIMIT_AS, per process
    cpu_s: int = 60  # RLIMIT_CPU, per process
    output_bytes: int = 64 * 1024  # kept per stream (stdout, stderr)
    fsize_mb: int = 64  # RLIMIT_FSIZE: largest file a command may write
    nofile: int = 256  # RLIMIT_NOFILE
    tmpfs_mb: int = 64  # size of the in-memory /tmp and /dev/shm
    nproc: int = 256  # RLIMIT_NPROC: processes + threads of the sandbox at once
    drain_bytes: int = 64 * 1024 * 1024  # output read (and dropped) per stream before the command is killed
    disk_mb: int = 1024  # AGENT_SANDBOX_DISK_MB: the workspace's quota


@dataclass(frozen=True)
class LocalSandboxSettings:
    limits: LocalLimits = field(default_factory=LocalLimits)
    uid_base: int = DEFAULT_UID_BASE  # first host uid a root worker hands to sandboxes


@dataclass(frozen=True)
class E2BConfig:
    """Where and how E2B VMs are created (``AGENT_E2B_*``)."""

    template: str = "base"
    timeout_s: int = 3600  # VM lifetime after its last use (E2B caps it: 1 h Hobby, 24 h Pro)
    # AGENT_E2B_MAX_TIMEOUT_S: the plan's cap; timeout_s is clamped to it (default: Hobby's 1 h, the safe side)
    max_timeout_s: int = 3600
    internet: bool = False
    request_timeout_s: float = 30.0  # per control-plane / file request
    limits: LocalLimits = field(default_factory=LocalLimits)  # per-command wall time and output caps


@dataclass(frozen=True)
class SandboxSettings:
    backend: str = "local"  # AGENT_SANDBOX: local | e2b (e2b when E2B_API_KEY is set)
    local: LocalSandboxSettings = field(default_factory=LocalSandboxSettings)
    e2b: E2BConfig = field(default_factory=E2BConfig)
    e2b_api_key: SecretStr | None = None
    reap_interval_s: float = 600.0  # 0: the worker never reaps sandboxes


RUN_MAX_FACTOR = 4  # AGENT_CHECKPOINT_RUN_MAX_MB's default, in AGENT_CHECKPOINT_MAX_MB


@dataclass(frozen=True)
class CheckpointSettings:
    """Workspace checkpoints (``AGENT_CHECKPOINT_*``)."""

    max_mb: int = 256  # a workspace over this is not checkpointed (a tool error says so)
    retention_days: float = 7.0  # closed runs keep their checkpoints this long (to be forked)
    # What one run's checkpoints may add to the run store in all (new bytes, after dedupe), and how many
    # distinct checkpoints it may record; past either, its checkpoints stop (the model is told) and it goes on.
    run_max_mb: int = 0  # 0: RUN_MAX_FACTOR x max_mb
    run_max_count: int = 1000

    @property
    def max_bytes(self) -> int:
        return self.max_mb * 1024 * 1024

    @property
    def run_max_bytes(self) -> int:
        return (self.run_max_mb or RUN_MAX_FACTOR * self.max_mb) * 1024 * 1024


@dataclass(frozen=True)
class ObservabilitySettings:
    log_level: str = "INFO"
    metrics_port: int | None = None  # AGENT_METRICS_PORT: Prometheus on 0.0.0.0:N/metrics
    trace_exporters: tuple[str, ...] = ()  # OTEL_TRACES_EXPORTER (default otlp when an endpoint is set)
    otlp_protocol: str = "http/protobuf"
    service_name: str = ""  # OTEL_SERVICE_NAME; empty: the process's own default
    sampler_configured: bool = False  # OTEL_TRACES_SAMPLER is set: use the SDK's sampler, not ours


@dataclass(frozen=True)
class ExtensionSettings:
    tool_modules: tuple[str, ...] = ()  # AGENT_TOOL_MODULES
    provider_modules: tuple[str, ...] = ()  # AGENT_PROVIDER_MODULES


@dataclass(frozen=True)
class WorkerSettings:
    """How ``worker.py`` runs its worker: ``AGENT_MAX_*``, ``AGENT_HEALTH_PORT``, ``AGENT_REQUIRE_SHARED_STORE``."""

    # From bench/scale waiting (10,000 runs parked on approvals, one worker): a cached run costs ~170-190 KB
    # of RSS, so the SDK's 1000 put the worker at 307 MB; 500 holds it at 235 MB, and 500 approvals at once
    # started their tools no later (p95 10.4 s against 10.7 s: with 10,000 runs either cache misses 90-95 %).
    # Slots stay the SDK's 100 per kind (WorkerTuner.create_fixed): no bench here came near them.
    max_cached_workflows: int = 500  # AGENT_MAX_CACHED_WORKFLOWS (0: no cache, every task replays its history)
    max_concurrent_activities: int = 100  # AGENT_MAX_CONCURRENT_ACTIVITIES
    max_concurrent_workflow_tasks: int = 100  # AGENT_MAX_CONCURRENT_WORKFLOW_TASKS (at least 2 with a cache)
    health_port: int | None = None  # AGENT_HEALTH_PORT: /healthz and /readyz on 0.0.0.0:N
    require_shared_store: bool = False  # AGENT_REQUIRE_SHARED_STORE: refuse a SQLite run store

    def options(self) -> dict[str, Any]:
        """Keyword arguments of ``temporalio.worker.Worker`` for these settings."""
        return {
            "max_cached_workflows": self.max_cached_workflows,
            "max_concurrent_activities": self.max_concurrent_activities,
            "max_concurrent_workflow_tasks": self.max_concurrent_workflow_tasks,
        }


@dataclass(frozen=True)
class EncryptionSettings:
    """Payload and run-store encryption (``AGENT_PAYLOAD_KEYS*``) and the codec server (``AGENT_CODEC_*``)."""

    keyring: KeyRing | None = None  # None: payloads and the run store stay plaintext
    codec_token: SecretStr | None = None  # AGENT_CODEC_TOKEN: the codec server wants `Authorization: Bearer <it>`
    codec_origins: tuple[str, ...] = DEFAULT_CODEC_ORIGINS  # AGENT_CODEC_CORS_ORIGINS: browser origins allowed
    ui_codec_endpoint: str = ""  # AGENT_UI_CODEC_ENDPOINT: `make server` points the dev server's UI at it
    codec_max_payloads: int = 10_000  # AGENT_CODEC_MAX_PAYLOADS: payloads per codec request (more: 413)
    codec_deadline_s: float = 10.0  # AGENT_CODEC_DEADLINE_S: a codec request not done by then is 503/504

    @property
    def enabled(self) -> bool:
        return self.keyring is not None


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
    mcp_config: str = ""  # AGENT_MCP_CONFIG: the operator's MCP servers ({"mcpServers": ...}, JSON)
    approval_key: SecretStr | None = None
    allow_fork_input: bool = True  # AGENT_ALLOW_FORK_INPUT=0: a run input's ``fork`` is refused (fork_prepare)
    # AGENT_FAIL_WORKFLOW_ON_ERROR=1: a run that ends failed or limit_exceeded fails its workflow (the
    # AgentResult in the failure's details) instead of completing with it; taken at each run's start.
    fail_workflow_on_error: bool = False
    reviewer: str = "cli"  # who the starter's decisions are from by default ($USER)
    # The rest of the environment, for operator extensions (``variable``); never printed.
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False, compare=False)
    # Secrets that configuration files brought in (``${VAR}`` values of MCP servers); see ``with_secrets``.
    extra_secrets: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the environment (or ``env``); :class:`ConfigurationError` names the first bad variable."""
        env = dict(os.environ if env is None else env)
        reader = _Reader(env)
        openai_key = reader.secret("OPENAI_API_KEY")
        anthropic_key = reader.secret("ANTHROPIC_API_KEY")
        e2b_key = reader.secret("E2B_API_KEY")
        state_dir = Path(reader.text("AGENT_STATE_DIR") or str(DEFAULT_STATE_DIR))
        limits = _local_limits(reader)
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
                local=LocalSandboxSettings(limits=limits, uid_base=_uid_base(reader)),
                e2b=_e2b(reader, limits),
                e2b_api_key=e2b_key,
                reap_interval_s=reader.number("AGENT_REAP_INTERVAL_S", 600.0, minimum=0.0),
            ),
            checkpoints=CheckpointSettings(
                max_mb=reader.integer("AGENT_CHECKPOINT_MAX_MB", 256, low=1, high=1024 * 1024),
                retention_days=reader.number("AGENT_CHECKPOINT_RETENTION_DAYS", 7.0, minimum=0.0),
                run_max_mb=reader.integer("AGENT_CHECKPOINT_RUN_MAX_MB", 0, low=1, high=1024 * 1024 * 1024),
                run_max_count=reader.integer("AGENT_CHECKPOINT_RUN_MAX_COUNT", 1000, low=1, high=10_000_000),
            ),
            observability=_observability(reader),
            extensions=ExtensionSettings(
                tool_modules=reader.names("AGENT_TOOL_MODULES"),
                provider_modules=reader.names("AGENT_PROVIDER_MODULES"),
            ),
            worker=_worker(reader),
            encryption=_encryption(reader),
            http_allow=tuple(h.lower() for h in reader.names("AGENT_HTTP_ALLOW")),
            store_url=_store_url(reader, state_dir),
            state_dir=state_dir,
            prices_file=reader.text("AGENT_PRICES"),
            allow_unpriced=reader.flag("AGENT_ALLOW_UNPRICED"),
            policy_file=reader.text("AGENT_POLICY_FILE"),
            subagents_file=reader.text("AGENT_SUBAGENTS_FILE"),
            max_output_tokens=reader.integer("AGENT_MAX_OUTPUT_TOKENS", 4096, low=1, high=1_000_000),
            max_subagent_calls_per_turn=reader.integer("AGENT_MAX_SUBAGENT_CALLS_PER_TURN", 10, low=0, high=1000),
            max_tree_runs=reader.integer("AGENT_MAX_TREE_RUNS", 50, low=1, high=1_000_000),
            max_depth=reader.integer("AGENT_MAX_DEPTH", 3, low=0, high=MAX_DEPTH),
            mcp_config=reader.text("AGENT_MCP_CONFIG"),
            approval_key=reader.secret("AGENT_APPROVAL_KEY"),
            allow_fork_input=reader.flag("AGENT_ALLOW_FORK_INPUT", True),
            fail_workflow_on_error=reader.flag("AGENT_FAIL_WORKFLOW_ON_ERROR"),
            reviewer=reader.text("USER") or "cli",
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


class _Reader:
    """Typed reads of one environment snapshot; every problem names its variable."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def text(self, name: str) -> str:
        return self.env.get(name, "").strip()

    def secret(self, name: str) -> SecretStr | None:
        value = self.text(name)
        return SecretStr(value) if value else None

    def names(self, name: str) -> tuple[str, ...]:
        return tuple(part.strip() for part in self.text(name).split(",") if part.strip())

    def number(self, name: str, default: float, *, minimum: float = 0.0, positive: bool = False) -> float:
        raw = self.text(name)
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ConfigurationError(f"{name}={raw!r} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigurationError(f"{name}={raw!r} is not a finite number")
        if positive and value <= 0:
            raise ConfigurationError(f"{name}={raw!r} must be positive")
        if value < minimum:
            raise ConfigurationError(f"{name}={raw!r} must be at least {minimum:g}")
        return value

    def flag(self, name: str, default: bool = False) -> bool:
        raw = self.text(name).lower()
        if not raw:
            return default
        if raw not in (*_TRUE, *_FALSE):
            raise ConfigurationError(f"{name}={self.text(name)!r}: expected 1 or 0")
        return raw in _TRUE

    def integer(self, name: str, default: int, *, low: int, high: int) -> int:
        raw = self.text(name)
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigurationError(f"{name}={raw!r} is not an integer") from None
        if not low <= value <= high:
            raise ConfigurationError(f"{name}={raw!r} must be between {low} and {high}")
        return value


def _local_limits(reader: _Reader) -> LocalLimits:
    default = LocalLimits()

    def positive(name: str, fallback: float) -> float:
        return reader.number(name, fallback, positive=True)

    return LocalLimits(
        timeout_s=positive("AGENT_SANDBOX_TIMEOUT_S", default.timeout_s),
        memory_mb=int(positive("AGENT_SANDBOX_MEMORY_MB", default.memory_mb)),
        cpu_s=int(positive("AGENT_SANDBOX_CPU_S", default.cpu_s)),
        output_bytes=int(positive("AGENT_SANDBOX_OUTPUT_BYTES", default.output_bytes)),
        fsize_mb=int(positive("AGENT_SANDBOX_FSIZE_MB", default.fsize_mb)),
        nofile=int(positive("AGENT_SANDBOX_NOFILE", default.nofile)),
        tmpfs_mb=int(positive("AGENT_SANDBOX_TMPFS_MB", default.tmpfs_mb)),
        nproc=int(positive("AGENT_SANDBOX_NPROC", default.nproc)),
        disk_mb=int(positive("AGENT_SANDBOX_DISK_MB", default.disk_mb)),
    )


def _uid_base(reader: _Reader) -> int:
    return reader.integer("AGENT_SANDBOX_UID_BASE", DEFAULT_UID_BASE, low=1000, high=4_000_000_000)


def _e2b(reader: _Reader, limits: LocalLimits) -> E2BConfig:
    return E2BConfig(
        template=reader.text("AGENT_E2B_TEMPLATE") or E2BConfig.template,
        timeout_s=reader.integer("AGENT_E2B_TIMEOUT_S", E2BConfig.timeout_s, low=1, high=30 * 24 * 3600),
        max_timeout_s=reader.integer("AGENT_E2B_MAX_TIMEOUT_S", E2BConfig.max_timeout_s, low=60, high=30 * 24 * 3600),
        internet=reader.text("AGENT_E2B_INTERNET").lower() in _TRUE,
        limits=limits,
    )


def _worker(reader: _Reader) -> WorkerSettings:
    default = WorkerSettings()
    port: int | None = None
    if reader.text("AGENT_HEALTH_PORT"):
        port = reader.integer("AGENT_HEALTH_PORT", 0, low=1, high=65535)
    flag = reader.text("AGENT_REQUIRE_SHARED_STORE").lower()
    if flag and flag not in (*_TRUE, *_FALSE):
        raise ConfigurationError(
            f"AGENT_REQUIRE_SHARED_STORE={reader.text('AGENT_REQUIRE_SHARED_STORE')!r}: expected 1 or 0"
        )
    return WorkerSettings(
        max_cached_workflows=reader.integer(
            "AGENT_MAX_CACHED_WORKFLOWS", default.max_cached_workflows, low=0, high=1_000_000
        ),
        max_concurrent_activities=reader.integer(
            "AGENT_MAX_CONCURRENT_ACTIVITIES", default.max_concurrent_activities, low=1, high=100_000
        ),
        # The SDK needs two workflow slots when workflows are cached (sticky and normal queue).
        max_concurrent_workflow_tasks=reader.integer(
            "AGENT_MAX_CONCURRENT_WORKFLOW_TASKS", default.max_concurrent_workflow_tasks, low=2, high=100_000
        ),
        health_port=port,
        require_shared_store=flag in _TRUE,
    )


def _encryption(reader: _Reader) -> EncryptionSettings:
    inline, path = reader.env.get("AGENT_PAYLOAD_KEYS", ""), reader.text("AGENT_PAYLOAD_KEYS_FILE")
    if inline.strip() and path:
        raise ConfigurationError("set AGENT_PAYLOAD_KEYS or AGENT_PAYLOAD_KEYS_FILE, not both")
    keyring: KeyRing | None = None
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"AGENT_PAYLOAD_KEYS_FILE={path}: cannot read it ({type(exc).__name__})") from None
        keyring = _keyring(f"AGENT_PAYLOAD_KEYS_FILE={path}", text)
    elif "AGENT_PAYLOAD_KEYS" in reader.env:
        keyring = _keyring("AGENT_PAYLOAD_KEYS", inline)
    endpoint = reader.text("AGENT_UI_CODEC_ENDPOINT").rstrip("/")
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigurationError(f"AGENT_UI_CODEC_ENDPOINT={endpoint!r}: expected an http:// or https:// URL")
    origins = tuple(o.rstrip("/") for o in reader.names("AGENT_CODEC_CORS_ORIGINS")) or DEFAULT_CODEC_ORIGINS
    return EncryptionSettings(
        keyring=keyring,
        codec_token=reader.secret("AGENT_CODEC_TOKEN"),
        codec_origins=origins,
        ui_codec_endpoint=endpoint,
        codec_max_payloads=reader.integer("AGENT_CODEC_MAX_PAYLOADS", 10_000, low=1, high=10_000_000),
        codec_deadline_s=reader.number("AGENT_CODEC_DEADLINE_S", 10.0, positive=True),
    )


def _keyring(variable: str, text: str) -> KeyRing:
    """The ring in ``text`` (an empty value is an error: a set variable must hold keys)."""
    try:
        return KeyRing.parse(text.strip())
    except ValueError as exc:
        raise ConfigurationError(f"{variable}: {exc}") from None


def is_shared_store(url: str) -> bool:
    """Whether a run store URL names the shared (PostgreSQL) store (a URL or a conninfo) rather than a SQLite file."""
    return is_postgres(url)


def _store_url(reader: _Reader, state_dir: Path) -> str:
    """``AGENT_STORE_URL``; text that would make a SQLite file named after connection settings is refused."""
    url = reader.text("AGENT_STORE_URL") or str(state_dir / "store.sqlite3")
    if not is_postgres(url):
        try:
            sqlite_path(url)
        except StoreUrlError as exc:
            raise ConfigurationError(f"AGENT_STORE_URL {exc}") from None
    return url


def _observability(reader: _Reader) -> ObservabilitySettings:
    level = (reader.text("AGENT_LOG_LEVEL") or "INFO").upper()
    if level not in LOG_LEVELS:
        raise ConfigurationError(
            f"AGENT_LOG_LEVEL={reader.text('AGENT_LOG_LEVEL')!r}: expected one of {', '.join(LOG_LEVELS)}"
        )
    port: int | None = None
    if reader.text("AGENT_METRICS_PORT"):
        port = reader.integer("AGENT_METRICS_PORT", 0, low=1, high=65535)
    endpoint = reader.text("OTEL_EXPORTER_OTLP_ENDPOINT") or reader.text("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    exporters = tuple(n.lower() for n in reader.names("OTEL_TRACES_EXPORTER")) or (("otlp",) if endpoint else ())
    unknown = [name for name in exporters if name not in TRACE_EXPORTERS]
    if unknown:
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER={reader.text('OTEL_TRACES_EXPORTER')!r}: expected {', '.join(TRACE_EXPORTERS)}"
        )
    return ObservabilitySettings(
        log_level=level,
        metrics_port=port,
        trace_exporters=tuple(name for name in exporters if name != "none"),
        otlp_protocol=reader.text("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or reader.text("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf",
        service_name=reader.text("OTEL_SERVICE_NAME"),
        sampler_configured=bool(reader.text("OTEL_TRACES_SAMPLER")),
    )


def url_passwords(url: str) -> list[str]:
    """The password of a store URL: in its userinfo, a ``?password=`` query parameter or ``password=`` conninfo."""
    if "://" not in url:
        return [m.group(1) or m.group(2) for m in _CONNINFO_PASSWORD.finditer(url) if m.group(1) or m.group(2)]
    try:
        parts = urlsplit(url)
        found = [parts.password or ""]
        found += [value for key, value in parse_qsl(parts.query) if key.lower() == "password"]
    except ValueError:
        return []
    return [value for value in found if value]


def default_model(openai_key: SecretStr | None, anthropic_key: SecretStr | None) -> str:
    """``AGENT_MODEL`` when unset: a real provider when its key exists, else the offline script."""
    if openai_key is not None:
        return "openai:gpt-4o-mini"
    if anthropic_key is not None:
        return "anthropic:claude-sonnet-4-5"
    return "scripted:demo"


def bad_file(variable: str, path: str, exc: Exception) -> ConfigurationError:
    """One line naming the variable, its file and the first problem (an unreadable file, bad JSON, a bad field)."""
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        return ConfigurationError(f"{variable}={path}: {where}: {first['msg']}")
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ConfigurationError(f"{variable}={path}: {detail}")
