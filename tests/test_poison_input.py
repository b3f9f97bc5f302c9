"""Whatever a run is started with, a bad input fails the run on its first workflow task.

Every input below is what someone can send through the Temporal API or CLI:
wrong shapes and types, numbers out of range (they once overflowed a timer and
failed every workflow task, forever), undecodable encodings (a lone surrogate,
invalid UTF-8, a non-JSON payload), the wrong number of payloads, oversized
fields and a forged continue-as-new ``carry``. Each must end as a failed run with
``invalid run input: ...`` by its first workflow task, with no ``WorkflowTaskFailed`` in its
history, and a message that does not copy what was sent.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RawValue
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import WorkerFactory
from tests.waiting import DEADLINE_S


def raw(data: bytes, encoding: bytes = b"json/plain") -> RawValue:
    """A payload sent as is: what a non-Python client or the Temporal CLI can send."""
    return RawValue(Payload(metadata={"encoding": encoding}, data=data))


def carry(**changes: Any) -> dict[str, Any]:
    """A well-formed continue-as-new carry, with ``changes``."""
    fields: dict[str, Any] = {
        "conversation_id": "c/1",
        "step": 0,
        "transcript_len": 2,
        "usage": {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0},
        "started_at": 1_700_000_000.0,
        "model": "openai:test-model",
        "tools": [],
    }
    return fields | changes


def nested(depth: int) -> bytes:
    return b'{"task": "t", "policy": {"rules": ' + b"[" * depth + b"]" * depth + b"}}"


BIG_KEY = "k" * 10_000
# (case id, positional args of the start, a fragment the failure message must contain)
CASES: list[tuple[str, list[Any], str]] = [
    # shapes: the Temporal CLI sends whatever JSON it is given
    ("array", [raw(b"[1,2,3]")], "expected a JSON object, got an array"),
    ("string", [raw(b'"str"')], "expected a JSON object, got a string"),
    ("number", [raw(b"42")], "expected a JSON object, got a number"),
    ("null", [raw(b"null")], "expected a JSON object, got null"),
    ("boolean", [raw(b"true")], "expected a JSON object, got a boolean"),
    ("empty object", [{}], "task: Field required"),
    ("no payload", [], "no payload was sent"),
    ("two payloads", [{"task": "a"}, {"task": "b"}], "expected one payload, got 2"),
    ("binary payload", [raw(b"\x00\x01", b"binary/plain")], "got a payload with encoding 'binary/plain'"),
    # encodings
    ("lone surrogate", [raw(b'{"task": "fix \\ud800 this"}')], "task: not valid Unicode: a lone surrogate"),
    ("surrogate in a key", [raw(b'{"task": "t", "policy": {"\\udfff": 1}}')], "not valid Unicode"),
    ("invalid UTF-8", [raw(b'{"task": "\xff\xfe"}')], "not valid UTF-8"),
    ("not JSON", [raw(b'{"task": ')], "not valid JSON"),
    ("nested too deeply", [raw(nested(100_000))], "invalid run input"),
    # types
    ("task is a number", [{"task": 123}], "task: Input should be a valid string"),
    ("task is a list", [{"task": ["a"]}], "task: Input should be a valid string"),
    ("limits is a string", [{"task": "t", "limits": "fast"}], "limits: Input should be an object"),
    ("tools is a string", [{"task": "t", "tools": "all"}], "tools: Input should be a valid array"),
    ("policy is a list", [{"task": "t", "policy": [1]}], "policy: Input should be an object"),
    # empty task
    ("empty task", [{"task": ""}], "task: String should have at least 1 character"),
    ("whitespace task", [{"task": " \n\t "}], "task: Value error, must not be empty or whitespace only"),
    # ranges
    ("timeout 1e15", [raw(b'{"task": "t", "limits": {"timeout_s": 1e15}}')], "limits.timeout_s: Input should be less"),
    (
        "timeout 2**66",
        [raw(b'{"task": "t", "limits": {"timeout_s": 99999999999999999999}}')],
        "limits.timeout_s: Input should be less",
    ),
    ("negative steps", [{"task": "t", "limits": {"max_steps": -1}}], "limits.max_steps: Input should be greater"),
    ("huge steps", [{"task": "t", "limits": {"max_steps": 10**9}}], "limits.max_steps: Input should be less"),
    ("huge tokens", [{"task": "t", "limits": {"max_tokens": 10**12}}], "limits.max_tokens: Input should be less"),
    ("NaN cost", [raw(b'{"task": "t", "limits": {"max_cost_usd": NaN}}')], "limits.max_cost_usd: Input should be"),
    ("infinite cost", [raw(b'{"task": "t", "limits": {"max_cost_usd": Infinity}}')], "limits.max_cost_usd"),
    ("huge cost", [{"task": "t", "limits": {"max_cost_usd": 1e7}}], "limits.max_cost_usd: Input should be less"),
    (
        "huge approval timeout",
        [{"task": "t", "policy": {"approval_timeout_s": 10**20}}],
        "policy: approval_timeout_s must be at most",
    ),
    ("bad policy rule", [{"task": "t", "policy": {"rules": [{"decision": "maybe"}]}}], "policy: rules.0.decision"),
    # sizes
    ("task of 1 MB", [{"task": "x" * 1_000_001}], "task: String should have at most 1000000 characters"),
    ("long tenant", [{"task": "t", "tenant": "x" * 201}], "tenant: String should have at most 200 characters"),
    ("many approvers", [{"task": "t", "approvers": ["a"] * 101}], "approvers: List should have at most 100 items"),
    ("long unknown field", [{"task": "t", BIG_KEY: 1}], "unknown key"),
    # a forged continue-as-new carry
    ("carry from the far future", [{"task": "t", "carry": carry(started_at=1e300)}], "started_at must be between"),
    (
        "carry with a broken stream",
        [{"task": "t", "carry": carry(stream={"log": [{"topic": "progress", "data": "!!"}]})}],
        "carry.stream: Value error, log item 0 is not an encoded payload",
    ),
    ("carry is a string", [{"task": "t", "carry": "x"}], "carry: Input should be an object"),
]


def test_there_are_at_least_25_distinct_bad_inputs() -> None:
    assert len({case for case, _, _ in CASES}) == len(CASES) >= 25


async def fails_at_once(client: Client, task_queue: str, args: list[Any]) -> tuple[str, float, list[int]]:
    handle = await client.start_workflow(
        "AgentWorkflow", args=args, id=f"poison-{uuid.uuid4().hex[:10]}", task_queue=task_queue
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), timeout=DEADLINE_S)  # a hang guard
    history = await handle.fetch_history()
    started, ended = history.events[0].event_time.ToDatetime(), history.events[-1].event_time.ToDatetime()
    return str(failure.value.cause), (ended - started).total_seconds(), [e.event_type for e in history.events]


async def test_every_bad_input_fails_the_run_on_its_first_workflow_task(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    async with run_worker(dev_env.client, runtime) as task_queue:
        outcomes = await asyncio.gather(*(fails_at_once(dev_env.client, task_queue, args) for _, args, _ in CASES))
    problems = []
    for (case, _, fragment), (message, _, events) in zip(CASES, outcomes, strict=True):
        if "invalid run input" not in message or fragment not in message:
            problems.append(f"{case}: message {message[:300]!r} lacks {fragment!r}")
        if EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED in events:
            problems.append(f"{case}: a workflow task failed")
        if events.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED) != 1:
            problems.append(f"{case}: not failed by its first workflow task")
        if events[-1] != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            problems.append(f"{case}: ended with event {events[-1]}")
        if len(message) > 2100 or "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk" in message:
            problems.append(f"{case}: the message copies the input ({len(message)} characters)")
    assert not problems, "\n".join(problems)
    slowest = max(seconds for _, seconds, _ in outcomes)
    print(f"{len(CASES)} bad inputs each failed by the first workflow task; slowest {slowest * 1000:.0f} ms")


async def test_a_valid_input_sent_as_raw_json_still_runs(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    """The raw decoding is not stricter than the typed one: JSON from any client starts a run."""
    async with run_worker(dev_env.client, runtime) as task_queue:
        handle = await dev_env.client.start_workflow(
            "AgentWorkflow",
            raw(json.dumps({"task": "say hi", "limits": {"max_steps": 3, "timeout_s": 600}}).encode()),
            id=f"poison-ok-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        result = await handle.result()
    assert result["status"] == "completed"


def test_decoding_messages_are_bounded_and_never_copy_the_input() -> None:
    from workflows.inputs import MESSAGE_MAX, decode
    from workflows.types import AgentInput, ApproveSignal

    many_keys = json.dumps({"task": "t", **{f"{'k' * 5000}{i}": 1 for i in range(50)}}).encode()
    message = decode(raw(many_keys), AgentInput)
    assert isinstance(message, str) and len(message) <= MESSAGE_MAX and "k" * 100 not in message
    assert "and 40 more problem(s)" in message
    huge = decode(raw(json.dumps({"approval_id": "a", "reviewer": "r" * 1_500_000}).encode()), ApproveSignal)
    assert huge == "reviewer: String should have at most 200 characters"
    assert decode(raw(b'{"approval_id": "a", "reviewer": "b"}'), ApproveSignal) == ApproveSignal(
        approval_id="a", reviewer="b"
    )


def test_one_payload_shows_the_sdk_a_single_raw_parameter() -> None:
    import inspect

    from temporalio.common import _type_hints_from_func

    from workflows.agent import AgentWorkflow

    for handler in (AgentWorkflow.run, AgentWorkflow.approve, AgentWorkflow.reject, AgentWorkflow.resolve):
        arg_types, _ = _type_hints_from_func(handler)
        assert arg_types == [RawValue], handler
        assert len(inspect.signature(handler).parameters) == 2  # self, raw
