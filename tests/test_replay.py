"""Determinism guard: every recorded history in ``tests/histories/`` must replay against today's code.

A failure here means the loop's command sequence changed in a way that would
break runs already in flight. Guard the change with ``workflow.patched`` (see
docs/concepts.md, "Changing the workflow safely"); do not re-record to make this pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from activities.crypto.codec import encrypted_converter
from activities.runtime import Runtime
from tests.conftest import WorkerFactory, replay_task_queue, start_agent
from tests.crypto_keys import TEST_ONLY_PAYLOAD_KEYS, ring
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.agent import AgentWorkflow, RunInput
from workflows.eval import EvalWorkflow
from workflows.inputs import NO_PAYLOAD, one_payload
from workflows.policy import STRICT_POLICY_PATCH
from workflows.progress import SEARCH_ATTRIBUTES_PATCH
from workflows.start_patch import RUN_START_PATCH, RUN_START_V2
from workflows.types import AgentInput, AgentResult, Carry, ModelTurn

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
# ``encrypted_*`` histories were recorded with the test-only key ring (payloads are AES-256-GCM ciphertext).
ENCRYPTED = encrypted_converter(pydantic_data_converter, ring(TEST_ONLY_PAYLOAD_KEYS))


def converter_for(path: Path) -> DataConverter:
    return ENCRYPTED if path.stem.startswith("encrypted_") else pydantic_data_converter


def load(path: Path) -> WorkflowHistory:
    # The workflow id is an input of the run (approval ids and idempotency keys derive from it),
    # so replay must use the id the history was recorded under (see scripts/record_histories.py).
    return WorkflowHistory.from_json(f"history-{path.stem}", json.loads(path.read_text()))


def test_there_are_recorded_histories() -> None:
    assert {p.stem for p in HISTORIES} >= {
        "tools_and_errors",
        "approvals",
        "limit_exceeded",
        "fork",
        "mcp_tools",
        "encrypted_approvals",
        "approvals_one_start_marker",
        "legacy_policy",
        "session",
        "session_continued",
        "eval",
    }


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_recorded_history_replays(path: Path) -> None:
    replayer = Replayer(workflows=[AgentWorkflow, EvalWorkflow], data_converter=converter_for(path))
    result = await replayer.replay_workflow(load(path), raise_on_replay_failure=True)
    assert result.replay_failure is None


async def test_an_encrypted_history_replays_only_with_its_key() -> None:
    """Without the key ring the replay fails (no plaintext guessed from ciphertext); a plaintext history also
    replays with the key ring (the codec leaves unencrypted payloads alone)."""
    path = next(p for p in HISTORIES if p.stem == "encrypted_approvals")
    history = load(path)
    keyless = Replayer(workflows=[AgentWorkflow], data_converter=pydantic_data_converter)
    failed = await keyless.replay_workflow(history, raise_on_replay_failure=False)
    assert failed.replay_failure is not None and "without that key" in str(failed.replay_failure)
    plain = next(p for p in HISTORIES if p.stem == "approvals")
    with_ring = Replayer(workflows=[AgentWorkflow], data_converter=ENCRYPTED)
    assert (await with_ring.replay_workflow(load(plain), raise_on_replay_failure=False)).replay_failure is None


@workflow.defn(name="AgentWorkflow", sandboxed=False)
class AgentWorkflowWithAnUnguardedTimer(AgentWorkflow):
    """Today's loop plus one timer before each model turn, added without ``workflow.patched``."""

    @workflow.run
    @one_payload
    async def run(self, raw: RunInput = NO_PAYLOAD, *extra: Any) -> AgentResult:
        return await super().run(raw, *extra)

    async def _model_turn(self, inp: AgentInput, carry: Carry) -> ModelTurn:
        await workflow.sleep(1)
        return await super()._model_turn(inp, carry)


async def test_replayer_catches_an_unguarded_change() -> None:
    """The guard itself works: an unguarded change to what the loop schedules fails the replay."""
    path = next(p for p in HISTORIES if p.stem == "tools_and_errors")
    replayer = Replayer(workflows=[AgentWorkflowWithAnUnguardedTimer], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(load(path), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "nondetermin" in str(result.replay_failure).lower()


async def test_every_test_worker_replays_what_it_ran(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    """The check ``run_worker`` makes after each test: the runs it ran replay, and a changed loop would not."""
    llm.enqueue(Scripted(tool_calls=[("always_fails", "{}")]))
    llm.default = Scripted(text="done")
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, task="replay me")
        assert (await handle.result()).status == "completed"
    assert await replay_task_queue(dev_env.client, tq) == 1
    with pytest.raises(AssertionError, match="does not replay"):
        await replay_task_queue(dev_env.client, tq, workflows=[AgentWorkflowWithAnUnguardedTimer])


def _patch_ids(events: Sequence[HistoryEvent]) -> list[str]:
    """The ids of the patch markers in ``events``, in order."""
    return [
        json.loads(e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data)["id"]
        for e in events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]


async def test_a_new_run_records_one_start_marker_for_its_start_patches(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    """``run-start-v2`` stands for the start-time patches: one marker and one ``TemporalChangeVersion``
    upsert in a new run's first workflow task, where each patch made its own pair (recorded runs replay)."""
    llm.enqueue(Scripted(tool_calls=[("always_fails", "{}")]))
    llm.default = Scripted(text="done")
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, task="one marker", policy={"rules": []})
        assert (await handle.result()).status == "completed"
    events = (await handle.fetch_history()).events
    patches = _patch_ids(events)
    assert patches == [RUN_START_PATCH], patches
    versions = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        and "TemporalChangeVersion"
        in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    ]
    assert len(versions) == 1
    first_task_done = next(e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    marker = next(e for e in events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED)
    assert marker.marker_recorded_event_attributes.workflow_task_completed_event_id == first_task_done


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("approvals", []),
        ("humans", [STRICT_POLICY_PATCH, SEARCH_ATTRIBUTES_PATCH]),
        ("approvals_one_start_marker", [RUN_START_V2]),
        ("session_opened_by_run_config", [RUN_START_PATCH]),
    ],
)
def test_recorded_histories_hold_each_generation_of_start_markers(path: str, expected: list[str]) -> None:
    """The replay above covers runs from before either start patch, with each its own marker, and with each
    generation of the one (v2: a session opened by ``session_open``; v3: by ``run_config``)."""
    events = load(Path(__file__).parent / "histories" / f"{path}.json").events
    patches = _patch_ids(events)
    one_marker = {RUN_START_PATCH, RUN_START_V2}
    assert patches[: len(expected)] == expected and (expected or not one_marker & set(patches)), patches
