"""structlog configuration: JSON lines, or console-pretty on a terminal.

Standard-library loggers (Temporal's ``workflow.logger`` / ``activity.logger``
included) are routed through the same processors so every line has one shape.
The Temporal loggers' context (the ``temporal_workflow`` / ``temporal_activity``
record extras) becomes top-level fields: ``workflow_id``, ``run_id``,
``workflow_type``, ``activity``, ``attempt``, ... Activities bind their own
context (``activity_context``): workflow id, run id, activity, attempt, plus
step / tool / turn. Configured secret values, and those the process learned since
(a tenant's credentials a tool read: ``activities.redaction.learn``), are replaced by
``[REDACTED]`` in every line, whatever its level.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import structlog
from temporalio import activity, workflow

from activities.redaction import learned, redact, redact_cut_tail

# Temporal's logger details → our field names. The workflow logger's ``attempt`` is the workflow's
# (not an activity's) attempt, so it is left out to keep ``attempt`` unambiguous.
_WORKFLOW_FIELDS = {
    "workflow_id": "workflow_id",
    "run_id": "run_id",
    "workflow_type": "workflow_type",
    "task_queue": "task_queue",
    "namespace": "namespace",
    "update_id": "update_id",
    "update_name": "update_name",
}
_ACTIVITY_FIELDS = {
    "workflow_id": "workflow_id",
    "workflow_run_id": "run_id",
    "workflow_type": "workflow_type",
    "activity_type": "activity",
    "activity_id": "activity_id",
    "attempt": "attempt",
    "task_queue": "task_queue",
    "namespace": "namespace",
}


def temporal_fields(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Lift the Temporal loggers' ``temporal_workflow`` / ``temporal_activity`` extras into the event."""
    record = event.get("_record")
    if record is None:
        return event
    for attr, names in (("temporal_activity", _ACTIVITY_FIELDS), ("temporal_workflow", _WORKFLOW_FIELDS)):
        details = getattr(record, attr, None)
        if isinstance(details, dict):
            for key, value in details.items():
                if key in names:
                    event.setdefault(names[key], value)
    return event


class Redactor:
    """Replace configured (and learned) secret values in every string of the event (nested ones too).

    A string that ends in the beginning of a long secret (text cut short before it was
    logged) has that fragment redacted too.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def _clean(self, value: Any) -> Any:
        if isinstance(value, str):
            return redact_cut_tail(redact(value, self.secrets), self.secrets)
        if isinstance(value, dict):
            return {k: self._clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._clean(v) for v in value]
        return value

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if not self.secrets and not learned():
            return event
        for key, value in list(event.items()):
            if not key.startswith("_"):
                event[key] = self._clean(value)
        return event


def configure(level: str | None = None, *, json: bool | None = None, secrets: Iterable[str] = ()) -> None:
    level_name = (level or "INFO").upper()
    as_json = json if json is not None else not sys.stderr.isatty()
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        temporal_fields,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        # filter_by_level first: a DEBUG line below the level costs one check, not the whole chain.
        processors=[structlog.stdlib.filter_by_level, *shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                Redactor(secrets),
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_name)
    # The ids are fields of every line now; Temporal need not also append them to the message text.
    workflow.logger.workflow_info_on_message = False
    activity.logger.activity_info_on_message = False
    # httpx logs every request URL at INFO; keep that at WARNING so no query strings leak by default.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
