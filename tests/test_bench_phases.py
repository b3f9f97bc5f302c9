"""The overhead bench splits a step into phases by the server's event times: which span is which."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History, HistoryEvent
from temporalio.client import WorkflowHistory

from bench.scale.common import phase_ms


def _event(event_id: int, kind: EventType.ValueType, at_ms: int, **attributes: object) -> HistoryEvent:
    event = HistoryEvent(event_id=event_id, event_type=kind, **attributes)  # type: ignore[arg-type]
    event.event_time.FromMilliseconds(at_ms)
    return event


def test_each_phase_is_the_median_span_between_its_two_events() -> None:
    ev = EventType
    events = [
        _event(1, ev.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 0),
        _event(2, ev.EVENT_TYPE_WORKFLOW_TASK_STARTED, 2),
        _event(3, ev.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 12),
        _event(4, ev.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, 12),
        _event(5, ev.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, 12),
        _event(6, ev.EVENT_TYPE_ACTIVITY_TASK_STARTED, 13),
        _event(7, ev.EVENT_TYPE_ACTIVITY_TASK_STARTED, 15),
        _event(8, ev.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, 20),
        _event(9, ev.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, 25),
    ]
    events[3].activity_task_scheduled_event_attributes.activity_type.name = "call_model"
    events[4].activity_task_scheduled_event_attributes.activity_type.name = "run_tool"
    events[5].activity_task_started_event_attributes.scheduled_event_id = 4
    events[6].activity_task_started_event_attributes.scheduled_event_id = 5
    events[7].activity_task_completed_event_attributes.scheduled_event_id = 4
    events[8].activity_task_completed_event_attributes.scheduled_event_id = 5
    history = WorkflowHistory(workflow_id="w", events=list(History(events=events).events))

    phases = phase_ms([history])

    assert phases == {
        "model_wait": 1.0,
        "model_work": 7.0,
        "tool_wait": 3.0,
        "tool_work": 10.0,
        "wft_wait": 2.0,
        "wft_work": 10.0,
    }
