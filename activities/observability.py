"""What activities record: GenAI spans through the global tracer, ``agent_*`` metrics, bound log context.

The process-level setup (exporters, the Temporal OpenTelemetry plugin, Prometheus,
log rendering) belongs to the entry points (``durable_agents.telemetry`` and
``durable_agents.logs``); these helpers only use what was installed, and are
no-ops when nothing was.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from opentelemetry import trace
from temporalio import activity

TRACER_NAME = "durable_agents"
log = structlog.get_logger("observability")


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


@contextmanager
def activity_context(**fields: Any) -> Iterator[None]:
    """Bind the running activity's ids (and ``fields``: step, tool, turn...) to every log line inside."""
    info = activity.info()
    with structlog.contextvars.bound_contextvars(
        workflow_id=info.workflow_id,
        run_id=info.workflow_run_id,
        activity=info.activity_type,
        attempt=info.attempt,
        **fields,
    ):
        yield


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
