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

import os
import sys
from collections.abc import Sequence
from typing import Any

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
from temporalio import activity
from temporalio.contrib.opentelemetry import OpenTelemetryPlugin, ReplaySafeTracerProvider, create_tracer_provider
from temporalio.plugin import SimplePlugin
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

log = structlog.get_logger("telemetry")

TRACER_NAME = "durable_agents"
METRICS_PORT_ENV = "AGENT_METRICS_PORT"
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


def _exporters(names: list[str]) -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "console":
            # One JSON object per line on stderr, next to the JSON logs; stdout stays the CLI's output.
            exporters.append(
                ConsoleSpanExporter(out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n")
            )
        elif name == "otlp":
            protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
            )
            if protocol != "http/protobuf":
                log.warning("otlp_protocol_unsupported", protocol=protocol, using="http/protobuf")
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name != "none":
            log.warning("unknown_traces_exporter", exporter=name, known=["console", "otlp", "none"])
    return exporters


def configure_tracing(service_name: str, *, exporter: SpanExporter | None = None) -> ReplaySafeTracerProvider | None:
    """Install a global tracer provider as the environment asks; None when tracing is off.

    ``exporter`` (tests) is used instead of the environment's, with a synchronous processor.
    The global provider can be set once per process; later calls return the first provider.
    """
    global _provider
    if _provider is not None:
        return _provider
    if exporter is not None:
        exporters = [exporter]
    else:
        default = (
            "otlp"
            if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            else "none"
        )
        names = [n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", default).split(",") if n.strip()]
        exporters = _exporters(names)
        if not exporters:
            return None
    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service_name})
    sampler = None if os.environ.get("OTEL_TRACES_SAMPLER") else QuietSampler()
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


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


# --- metrics -----------------------------------------------------------------------------------


def metrics_port() -> int | None:
    raw = os.environ.get(METRICS_PORT_ENV, "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"{METRICS_PORT_ENV} must be a port number, got {raw!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"{METRICS_PORT_ENV} must be a port number, got {raw!r}")
    return port


def temporal_runtime() -> Runtime | None:
    """A Temporal runtime exporting metrics for Prometheus when ``AGENT_METRICS_PORT`` is set, else None."""
    port = metrics_port()
    if port is None:
        return None
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"0.0.0.0:{port}")))


def record_model_usage(provider: str, model: str, input_tokens: int, output_tokens: int, cost_usd: float) -> None:
    """Count one model call's tokens and cost (``agent_model_tokens``, ``agent_model_cost_microusd``)."""
    try:
        meter = activity.metric_meter().with_additional_attributes({"provider": provider, "model": model})
        tokens = meter.create_counter("agent_model_tokens", "Model tokens used, by token type", "tokens")
        tokens.add(input_tokens, {"token_type": "input"})
        tokens.add(output_tokens, {"token_type": "output"})
        meter.create_counter("agent_model_cost_microusd", "Model cost in millionths of a US dollar", "microusd").add(
            round(cost_usd * 1_000_000)
        )
    except Exception as exc:  # metrics never fail an activity (a retry would call the model again)
        log.debug("metrics_unavailable", error=str(exc))


def record_tool_call(tool: str, verdict: str, outcome: str) -> None:
    """Count one tool activity by the policy verdict that let it run and its outcome (``agent_tool_calls``)."""
    try:
        activity.metric_meter().create_counter("agent_tool_calls", "Tool activity executions", "calls").add(
            1, {"tool": tool, "verdict": verdict or "unrecorded", "outcome": outcome}
        )
    except Exception as exc:  # metrics never fail an activity
        log.debug("metrics_unavailable", error=str(exc))


def gen_ai_chat_attributes(provider: str, model: str, conversation_id: str) -> dict[str, Any]:
    """Request-side attributes of a ``chat <model>`` span (OpenTelemetry GenAI semantic conventions)."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,  # the attribute's older name, still read by many backends
        "gen_ai.request.model": model,
        "gen_ai.conversation.id": conversation_id,
    }
