"""A run's input is checked field by field: a misspelled field fails the run at once, naming it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import WorkerFactory


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (
            {"task": "t", "limts": {"max_steps": 1}},
            "invalid run input: limts: unknown key 'limts' (did you mean 'limits'?)",
        ),
        (
            {"task": "t", "limits": {"max_step": 1}},
            "invalid run input: limits.max_step: unknown key 'max_step' (did you mean 'max_steps'?)",
        ),
        ({"tsk": "t"}, "invalid run input: tsk: unknown key 'tsk' (did you mean 'task'?)"),
    ],
)
async def test_unknown_fields_fail_the_run_naming_the_field(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, raw: dict[str, Any], problem: str
) -> None:
    async with run_worker(dev_env.client, runtime) as task_queue:
        handle = await dev_env.client.start_workflow(
            "AgentWorkflow", raw, id=f"input-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    assert problem in str(failure.value.cause)
