"""Typed reads of one environment snapshot, part by part: a problem is a ConfigurationError naming its variable.

Called by :meth:`activities.settings.Settings.from_env` only, on the snapshot it took.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from pydantic import SecretStr, ValidationError

from activities.crypto.keyring import KeyRing
from activities.settings.parts import (
    DEFAULT_CODEC_ORIGINS,
    DEFAULT_UID_BASE,
    ApiSettings,
    E2BConfig,
    EncryptionSettings,
    LocalLimits,
    ObservabilitySettings,
    WorkerSettings,
)
from activities.store_urls import StoreUrlError, is_postgres, sqlite_path

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TRACE_EXPORTERS = ("console", "otlp", "none")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_CONNINFO_PASSWORD = re.compile(r"\bpassword\s*=\s*(?:'([^']*)'|(\S+))")


class ConfigurationError(ValueError):
    """A variable or a file it names is invalid; the message names it and fits on one line."""


class Reader:
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


def local_limits(reader: Reader) -> LocalLimits:
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


def uid_base(reader: Reader) -> int:
    return reader.integer("AGENT_SANDBOX_UID_BASE", DEFAULT_UID_BASE, low=1000, high=4_000_000_000)


def e2b_config(reader: Reader, limits: LocalLimits) -> E2BConfig:
    return E2BConfig(
        template=reader.text("AGENT_E2B_TEMPLATE") or E2BConfig.template,
        timeout_s=reader.integer("AGENT_E2B_TIMEOUT_S", E2BConfig.timeout_s, low=1, high=30 * 24 * 3600),
        max_timeout_s=reader.integer("AGENT_E2B_MAX_TIMEOUT_S", E2BConfig.max_timeout_s, low=60, high=30 * 24 * 3600),
        internet=reader.text("AGENT_E2B_INTERNET").lower() in _TRUE,
        limits=limits,
    )


def worker_settings(reader: Reader) -> WorkerSettings:
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
        heap_trim_interval_s=reader.number("AGENT_HEAP_TRIM_INTERVAL_S", default.heap_trim_interval_s),
    )


def encryption_settings(reader: Reader) -> EncryptionSettings:
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


def api_settings(reader: Reader) -> ApiSettings:
    default = ApiSettings()
    return ApiSettings(
        port=reader.integer("AGENT_API_PORT", default.port, low=0, high=65535),
        tokens_file=reader.text("AGENT_API_TOKENS_FILE"),
        max_body_bytes=reader.integer("AGENT_API_MAX_BODY_BYTES", default.max_body_bytes, low=1024, high=1 << 30),
        rate_per_minute=reader.integer("AGENT_API_RATE_PER_MINUTE", default.rate_per_minute, low=1, high=1_000_000),
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


def store_url_of(reader: Reader, state_dir: Path) -> str:
    """``AGENT_STORE_URL``; text that would make a SQLite file named after connection settings is refused."""
    url = reader.text("AGENT_STORE_URL") or str(state_dir / "store.sqlite3")
    if not is_postgres(url):
        try:
            sqlite_path(url)
        except StoreUrlError as exc:
            raise ConfigurationError(f"AGENT_STORE_URL {exc}") from None
    return url


def observability_settings(reader: Reader) -> ObservabilitySettings:
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
