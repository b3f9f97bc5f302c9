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
from collections.abc import Sequence

import structlog
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes
from temporalio.contrib.opentelemetry import OpenTelemetryPlugin, ReplaySafeTracerProvider, create_tracer_provider
from temporalio.plugin import SimplePlugin
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from activities.settings import ObservabilitySettings

log = structlog.get_logger("telemetry")

# Read-only chatter that would otherwise make a root trace per call: status queries and progress-stream polls.
_QUIET_SPANS = ("QueryWorkflow:", "HandleQuery:")
_QUIET_MARKERS = ("__temporal_workflow_stream_poll", "__temporal_workflow_stream_offset")

_provider: ReplaySafeTracerProvider | None = None


class QuietSampler(Sampler):
    """Parent-based always-on, except for spans of queries and progress-stream polls (never recorded)."""

    def __init__(self) -> None:
        self._delegate = ParentBased(ALWAYS_ON)

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if name.startswith(_QUIET_SPANS) or any(marker in name for marker in _QUIET_MARKERS):
            return SamplingResult(Decision.DROP)
        return self._delegate.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return "QuietSampler{ParentBased{AlwaysOn}; drops queries and stream polls}"


def _exporters(names: Sequence[str], otlp_protocol: str) -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "console":
            # One JSON object per line on stderr, next to the JSON logs; stdout stays the CLI's output.
            exporters.append(
                ConsoleSpanExporter(out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n")
            )
        elif name == "otlp":
            if otlp_protocol != "http/protobuf":
                log.warning("otlp_protocol_unsupported", protocol=otlp_protocol, using="http/protobuf")
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name != "none":
            log.warning("unknown_traces_exporter", exporter=name, known=["console", "otlp", "none"])
    return exporters


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
    if exporter is not None:
        exporters = [exporter]
    else:
        exporters = _exporters(config.trace_exporters, config.otlp_protocol)
        if not exporters:
            return None
    resource = Resource.create({SERVICE_NAME: config.service_name or service_name})
    sampler = None if config.sampler_configured else QuietSampler()
    provider = create_tracer_provider(sampler=sampler, resource=resource)
    for each in exporters:
        provider.add_span_processor(SimpleSpanProcessor(each) if exporter is not None else BatchSpanProcessor(each))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        log.warning("tracer_provider_already_set", hint="another component installed a global tracer provider")
        provider.shutdown()
        return None
    _provider = provider
    log.debug("tracing_configured", service=service_name, exporters=[type(e).__name__ for e in exporters])
    return provider


def tracing_enabled() -> bool:
    return isinstance(trace.get_tracer_provider(), ReplaySafeTracerProvider)


def temporal_plugins() -> list[SimplePlugin]:
    """Temporal's OpenTelemetry plugin when tracing is on (the worker inherits it from the client)."""
    return [OpenTelemetryPlugin(add_temporal_spans=True)] if tracing_enabled() else []


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
