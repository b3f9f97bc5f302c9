"""The frozen, typed parts of :class:`~activities.settings.Settings` (``settings.temporal``, ``.sandbox``, ...).

Data only: :mod:`activities.settings.reader` fills them from the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from activities.crypto.keyring import KeyRing

DEFAULT_STATE_DIR = Path(".agent")
DEFAULT_UID_BASE = 2_000_000_000
DEFAULT_CODEC_ORIGINS = ("http://localhost:8233", "http://127.0.0.1:8233")  # the dev server's UI


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
    # AGENT_RUN_RETENTION_DAYS: runs closed longer ago lose their transcripts, checkpoints and blobs (None: kept).
    run_retention_days: float | None = None
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
class MemorySettings:
    """Long-term memory's bounds per namespace (tenant, user) (``AGENT_MEMORY_*``)."""

    max_entries: int = 10_000  # AGENT_MEMORY_MAX_ENTRIES: a save past it is refused (the model reads why)
    max_mb: int = 64  # AGENT_MEMORY_MAX_MB: the entries' text in all
    ttl_days: float | None = None  # AGENT_MEMORY_TTL_DAYS: entries expire this long after their save; None: never

    @property
    def max_bytes(self) -> int:
        return self.max_mb * 1024 * 1024

    @property
    def ttl_s(self) -> float | None:
        return None if self.ttl_days is None else self.ttl_days * 86400.0


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
    """How ``worker.py`` runs its worker: ``AGENT_MAX_*``, ``AGENT_HEALTH_PORT``, ``AGENT_REQUIRE_SHARED_STORE``,
    ``AGENT_HEAP_TRIM_INTERVAL_S``."""

    # From bench/scale waiting (10,000 runs parked on approvals, one worker): a cached run costs ~170-190 KB
    # of RSS, so the SDK's 1000 put the worker at 307 MB; 500 holds it at 235 MB, and 500 approvals at once
    # started their tools no later (p95 10.4 s against 10.7 s: with 10,000 runs either cache misses 90-95 %).
    # Slots stay the SDK's 100 per kind (WorkerTuner.create_fixed): no bench here came near them.
    max_cached_workflows: int = 500  # AGENT_MAX_CACHED_WORKFLOWS (0: no cache, every task replays its history)
    max_concurrent_activities: int = 100  # AGENT_MAX_CONCURRENT_ACTIVITIES
    max_concurrent_workflow_tasks: int = 100  # AGENT_MAX_CONCURRENT_WORKFLOW_TASKS (at least 2 with a cache)
    health_port: int | None = None  # AGENT_HEALTH_PORT: /healthz and /readyz on 0.0.0.0:N
    require_shared_store: bool = False  # AGENT_REQUIRE_SHARED_STORE: refuse a SQLite run store
    # AGENT_HEAP_TRIM_INTERVAL_S: how often worker.py looks for freed heap to give back (durable_agents.heap); 0: never
    heap_trim_interval_s: float = 10.0

    def options(self) -> dict[str, Any]:
        """Keyword arguments of ``temporalio.worker.Worker`` for these settings."""
        return {
            "max_cached_workflows": self.max_cached_workflows,
            "max_concurrent_activities": self.max_concurrent_activities,
            "max_concurrent_workflow_tasks": self.max_concurrent_workflow_tasks,
            # A session's ``interrupt`` cancels the model call in flight; the call learns of it from a
            # heartbeat's answer, which the SDK would otherwise hold back for up to 80 % of its timeout (16 s).
            "max_heartbeat_throttle_interval": timedelta(seconds=1),
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
class ApiSettings:
    """The HTTP API (``starter.py serve``, ``AGENT_API_*``)."""

    port: int = 8080  # AGENT_API_PORT (``--port`` wins)
    tokens_file: str = ""  # AGENT_API_TOKENS_FILE: the tenant tokens (hashes only); unset: only --insecure-local
    max_body_bytes: int = 1024 * 1024  # AGENT_API_MAX_BODY_BYTES: a larger request body is 413
    rate_per_minute: int = 600  # AGENT_API_RATE_PER_MINUTE: requests one token may make a minute (more: 429)
