"""Traces and metrics: OpenTelemetry tracing configured from the standard env, Prometheus metrics.

Tracing is off unless asked for. ``configure_tracing`` reads the standard
OpenTelemetry variables:

- ``OTEL_TRACES_EXPORTER``: ``console`` (one JSON span per line on stderr),
  ``otlp`` or ``none`` (comma-separated for several). Default: ``otlp`` when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, else ``none``.
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``..._TRACES_ENDPOINT`` / ``..._HEADERS``:
  the OTLP/HTTP (protobuf) collector, e.g. ``http://localhost:4318``.
- ``OTEL_SERVICE_NAME`` (overrides the process's default name),
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``.

When tracing is on, the provider is a replay-safe one
(``temporalio.contrib.opentelemetry.create_tracer_provider``) and
``temporal_plugins()`` returns Temporal's ``OpenTelemetryPlugin`` for the client,
which the worker inherits: the starter's ``StartWorkflow`` span, the
``RunWorkflow`` span and every activity span then form one trace, and the
activities add GenAI spans (``chat <model>``, ``execute_tool <name>``) through
the global tracer. When tracing is off the global tracer is OpenTelemetry's no-op
and nothing is recorded or exported.

Metrics: with ``AGENT_METRICS_PORT=N`` the Temporal SDK runtime serves its
metrics (and the ``agent_*`` counters recorded by the activities through
``activity.metric_meter()``) for Prometheus on ``0.0.0.0:N/metrics``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import structlog
from opentelemetry import trace
from temporalio.plugin import SimplePlugin
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from activities.settings import ObservabilitySettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from temporalio.contrib.opentelemetry import ReplaySafeTracerProvider

log = structlog.get_logger("telemetry")

_provider: ReplaySafeTracerProvider | None = None


def configure_tracing(
    service_name: str,
    observability: ObservabilitySettings | None = None,
    *,
    exporter: SpanExporter | None = None,
) -> ReplaySafeTracerProvider | None:
    """Install a global tracer provider as the environment asks; None when tracing is off.

    ``exporter`` (tests) is used instead of the environment's, with a synchronous processor.
    The global provider can be set once per process; later calls return the first provider.
    """
    global _provider
    if _provider is not None:
        return _provider
    config = observability if observability is not None else ObservabilitySettings()
    if exporter is None and not config.trace_exporters:
        return None  # the SDK is not even imported
    from durable_agents._tracing import build_provider

    built = build_provider(service_name, config, exporter)
    if built is None:
        return None
    provider, exporters = built
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        log.warning("tracer_provider_already_set", hint="another component installed a global tracer provider")
        provider.shutdown()
        return None
    _provider = provider
    log.debug("tracing_configured", service=service_name, exporters=exporters)
    return provider


def tracing_enabled() -> bool:
    """Whether the global tracer provider is Temporal's replay-safe one (this module's, or the application's)."""
    contrib = sys.modules.get("temporalio.contrib.opentelemetry")  # no such provider without the module
    return contrib is not None and isinstance(trace.get_tracer_provider(), contrib.ReplaySafeTracerProvider)


def temporal_plugins() -> list[SimplePlugin]:
    """Temporal's OpenTelemetry plugin when tracing is on (the worker inherits it from the client)."""
    if not tracing_enabled():
        return []
    from temporalio.contrib.opentelemetry import OpenTelemetryPlugin

    return [OpenTelemetryPlugin(add_temporal_spans=True)]


def shutdown_tracing() -> None:
    """Export what is buffered. Call before ``os._exit`` (``exit_process``), which skips atexit hooks."""
    global _provider
    provider, _provider = _provider, None
    if provider is not None:
        provider.force_flush(timeout_millis=5000)
        provider.shutdown()


# --- metrics -----------------------------------------------------------------------------------


def temporal_runtime(observability: ObservabilitySettings) -> Runtime | None:
    """A Temporal runtime exporting metrics for Prometheus when ``AGENT_METRICS_PORT`` is set, else None."""
    port = observability.metrics_port
    if port is None:
        return None
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"0.0.0.0:{port}")))
