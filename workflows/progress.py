"""What a run tells the outside while it works: progress events and search attributes.

Events go to a durable Workflow Stream (``temporalio.contrib.workflow_streams``,
topic ``progress``) that ``starter.py watch`` subscribes to and that is carried
across continue-as-new. Search attributes make runs filterable in the UI and
``temporal workflow list --query "AgentState='waiting_approval'"``; they are only
written when the worker found them registered, and only when a value changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributeUpdate
from temporalio.contrib.workflow_streams import WorkflowStream, WorkflowStreamState

from workflows.start_patch import start_patched

EventKind = Literal[
    "started",
    "turn_started",
    "model_answered",
    "tool_decided",
    "tool_started",
    "tool_finished",
    "approval_requested",
    "approval_decided",
    "decision_refused",
    # humans beyond yes/no
    "question_asked",  # the model asked a human (data: approval_id, options)
    "question_answered",  # a human answered it (data: approval_id, reviewer), or it expired
    "approval_counted",  # one approval of a quorum (data: approval_id, approved, required)
    "continued_as_new",
    "rewound",
    "finished",
    "memory_recalled",  # memory.recall put entries into the context (data: recalled), or failed
    "output_invalid",  # the final answer did not match output_schema: sent back to the model (data: errors)
    # sessions
    "message_received",  # a message was taken (data: seq, message_id, sender)
    "message_refused",  # a message was refused (data: reason)
    "interrupted",  # the model turn in flight was cancelled for a new message
    "replied",  # the work on the messages up to data.seq ended; the session is idle
    "idle",  # the session's sandbox was stopped while idle, or it closes
]
TOPIC = "progress"
STREAM_RETAIN = 500  # events kept (and carried across continue-as-new) for late subscribers
# A session continues as new every few dozen messages; 500 carried events (~180 KB, in the continue-as-new
# event and again in the next run's start) would be half of each of its runs' history.
SESSION_STREAM_RETAIN = 100
EVENT_TEXT_MAX = 500  # characters of an event's text; with STREAM_RETAIN this bounds the carried stream
EVENT_VALUE_MAX = 200  # characters of a string in an event's data, items of a list in it
# The stream's signal for publishers outside the workflow (temporalio.contrib.workflow_streams).
# Nothing outside a run publishes to its progress stream, so the run refuses them: anyone who
# can signal could otherwise grow the stream, and with it the continue-as-new input, at will.
PUBLISH_SIGNAL = "__temporal_workflow_stream_publish"

STATE = SearchAttributeKey.for_keyword("AgentState")
PENDING_APPROVALS = SearchAttributeKey.for_int("AgentPendingApprovals")
TENANT = SearchAttributeKey.for_keyword("AgentTenant")
MODEL = SearchAttributeKey.for_keyword("AgentModel")
COST_USD = SearchAttributeKey.for_float("AgentCostUsd")
FORK_OF = SearchAttributeKey.for_keyword("AgentForkOf")  # set once, on forks: the source run's workflow id
SEARCH_ATTRIBUTES = {
    FORK_OF.name: "Keyword",
    STATE.name: "Keyword",
    PENDING_APPROVALS.name: "Int",
    TENANT.name: "Keyword",
    MODEL.name: "Keyword",
    COST_USD.name: "Double",
}
SEARCH_ATTRIBUTES_PATCH = "search-attributes-v1"


class ProgressEvent(BaseModel):
    kind: EventKind
    step: int
    text: str
    at: str = ""  # workflow time, ISO 8601
    tool: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class Reporter:
    """Publishes events and keeps search attributes current. Construct from the workflow's ``__init__``."""

    def __init__(self, prior: WorkflowStreamState | None, refuse_publish: Callable[..., None] | None = None) -> None:
        # WorkflowStream checks that it is built from an ``__init__``; this one is called from the workflow's.
        self.stream = WorkflowStream(prior_state=prior)
        if refuse_publish is not None:
            workflow.set_signal_handler(PUBLISH_SIGNAL, refuse_publish)
        self._topic = self.stream.topic(TOPIC, type=ProgressEvent)
        self._published: tuple[Any, ...] | None = None
        self._offset = prior.base_offset + len(prior.log) if prior is not None else 0

    def publish(self, kind: EventKind, step: int, text: str, tool: str = "", **data: Any) -> None:
        event = ProgressEvent(
            kind=kind,
            step=step,
            text=_cut(text, EVENT_TEXT_MAX),
            at=workflow.now().isoformat(),
            tool=_cut(tool, EVENT_VALUE_MAX),
            data={key: _bounded(value) for key, value in data.items()},
        )
        self._topic.publish(event)
        self._offset += 1

    async def hand_over(self, retain: int = STREAM_RETAIN) -> WorkflowStreamState:
        """The stream's state for the next run, once every running handler has finished.

        Pollers are released first (a long poll would otherwise keep ``all_handlers_finished``
        false), then running handlers finish and may still publish, and only then is the state
        taken: an event published by a handler during the hand-over is carried, never lost.
        """
        self.stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._offset > retain:
            self.stream.truncate(self._offset - retain)
        return self.stream.get_state()

    def sync_search_attributes(
        self, enabled: bool, *, state: str, pending: int, tenant: str, model: str, cost_usd: float
    ) -> None:
        """Upsert only changed values; runs recorded before this existed replay without upserts."""
        if not enabled or not start_patched(SEARCH_ATTRIBUTES_PATCH):
            return
        values = (state, pending, tenant, model, round(cost_usd, 6))
        if values == self._published:
            return
        self._published = values
        updates: list[SearchAttributeUpdate[Any]] = [
            STATE.value_set(state),
            PENDING_APPROVALS.value_set(pending),
            MODEL.value_set(model),
            COST_USD.value_set(round(cost_usd, 6)),
        ]
        if tenant:
            updates.append(TENANT.value_set(tenant))
        workflow.upsert_search_attributes(updates)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bounded(value: Any) -> Any:
    """An event's data value with its strings and lists cut to size (events are kept and carried)."""
    if isinstance(value, str):
        return _cut(value, EVENT_VALUE_MAX)
    if isinstance(value, list | tuple):
        return [_bounded(v) for v in value[:EVENT_VALUE_MAX]]
    if isinstance(value, dict):
        return {_cut(str(k), EVENT_VALUE_MAX): _bounded(v) for k, v in list(value.items())[:EVENT_VALUE_MAX]}
    return value
