"""The OpenTelemetry SDK side of tracing: the sampler, the exporters and the replay-safe provider.

Imported by ``durable_agents.telemetry.configure_tracing`` only when tracing is on, so that a worker
without tracing does not load the SDK and Temporal's OpenTelemetry module (~3 MB of its memory).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import structlog
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
from temporalio.contrib.opentelemetry import ReplaySafeTracerProvider, create_tracer_provider

from activities.settings import ObservabilitySettings

log = structlog.get_logger("telemetry")

# Read-only chatter that would otherwise make a root trace per call: status queries and progress-stream polls.
_QUIET_SPANS = ("QueryWorkflow:", "HandleQuery:")
_QUIET_MARKERS = ("__temporal_workflow_stream_poll", "__temporal_workflow_stream_offset")


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


def build_provider(
    service_name: str, config: ObservabilitySettings, exporter: SpanExporter | None
) -> tuple[ReplaySafeTracerProvider, list[str]] | None:
    """The provider ``config`` asks for and its exporters' names (``exporter`` instead of the configured
    ones, with a synchronous processor); None when no exporter is configured."""
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
    return provider, [type(e).__name__ for e in exporters]
