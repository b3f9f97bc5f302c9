"""A model without a price (issue 21, item 10): said at start and in ``status``; an explicit cap is refused.

Runs go through an in-process worker on the real dev server. ``openai:test-model`` (the fake LLM
server's model) is in no price table, ``openai:gpt-4o`` is in the built-in one.
"""

from __future__ import annotations

import io
import json
import uuid
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import Settings
from durable_agents.cli.runs import _show
from tests.conftest import WorkerFactory, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.test_configuration import run_worker_process
from tests.test_mcp_runs import progress
from workflows.agent import AgentWorkflow
from workflows.types import Limits

NOT_TRACKED = "cost not tracked: model openai:test-model has no price"


def started_text(events: list[Any]) -> str:
    [started] = [e for e in events if e.kind == "started"]
    return str(started.text)


async def test_an_explicit_cost_cap_with_an_unpriced_model_is_refused_at_start(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    async with run_worker(dev_env.client, runtime) as tq:
        typed = await start_agent(dev_env.client, tq, id_prefix="unpriced-cap", limits=Limits(max_cost_usd=1.0))
        # the same through raw JSON, as `temporal workflow start --input` would send it
        raw = await dev_env.client.start_workflow(
            "AgentWorkflow",
            {"task": "t", "limits": {"max_cost_usd": 0.5}},
            id=f"unpriced-raw-{uuid.uuid4().hex[:8]}",
            task_queue=tq,
        )
        for handle in (typed, raw):
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
            cause = failure.value.cause
            assert isinstance(cause, ApplicationError)
            message = cause.message
            assert message.startswith("invalid run input: limits.max_cost_usd: model openai:test-model has no price"), (
                message
            )
            assert "AGENT_PRICES" in message and "AGENT_ALLOW_UNPRICED=1" in message
    assert llm.requests == [], "nothing ran"


async def test_an_unpriced_model_without_a_cap_of_its_own_runs_and_says_cost_is_not_tracked(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(text="done"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, id_prefix="unpriced-default", limits=Limits(max_steps=3))
        result = await handle.result()
        status = await handle.query(AgentWorkflow.status)
        events = await progress(dev_env.client, handle.id)  # the stream is read through the worker
    assert result.status == "completed", result.output
    assert not status.cost_tracked and [n for n in status.notes if n.startswith(NOT_TRACKED)], status.notes
    assert "max_cost_usd is not enforced; set AGENT_PRICES" in status.notes[0]
    assert NOT_TRACKED in started_text(events)
    shown = io.StringIO()
    with redirect_stdout(shown):
        _show({"workflow_id": handle.id, **status.model_dump()}, False)
    assert "cost: not tracked (the model has no price): set AGENT_PRICES" in shown.getvalue()
    assert NOT_TRACKED in shown.getvalue()


async def test_the_operator_may_allow_unpriced_models_and_priced_ones_need_nothing(
    dev_env: WorkflowEnvironment, settings: Settings, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    allowing = Runtime.from_settings(replace(settings, allow_unpriced=True))
    llm.enqueue(Scripted(text="unpriced, allowed"), Scripted(text="priced"))
    try:
        async with run_worker(dev_env.client, allowing) as tq:
            unpriced = await start_agent(dev_env.client, tq, id_prefix="unpriced-ok", limits=Limits(max_cost_usd=1.0))
            first = await unpriced.result()
            unpriced_status = await unpriced.query(AgentWorkflow.status)
            priced = await start_agent(
                dev_env.client, tq, id_prefix="priced", model="openai:gpt-4o", limits=Limits(max_cost_usd=1.0)
            )
            second = await priced.result()
            priced_status = await priced.query(AgentWorkflow.status)
            scripted = await start_agent(
                dev_env.client, tq, id_prefix="scripted", model="scripted:demo", limits=Limits(max_cost_usd=1.0)
            )
            third = await scripted.result()
            scripted_status = await scripted.query(AgentWorkflow.status)
            priced_events = await progress(dev_env.client, priced.id)
    finally:
        await allowing.aclose()
    assert first.status == "completed" and first.output == "unpriced, allowed"
    assert not unpriced_status.cost_tracked, "allowed, and still reported as not tracked"
    assert second.status == "completed" and priced_status.cost_tracked and priced_status.notes == []
    assert third.status == "completed" and scripted_status.cost_tracked, "scripted models are $0 on purpose"
    assert "cost not tracked" not in started_text(priced_events)


@pytest.mark.parametrize(
    ("env", "warned"),
    [
        ({"AGENT_MODEL": "openai:my-local-llama", "OPENAI_API_KEY": "sk-unused"}, True),
        ({"AGENT_MODEL": "openai:gpt-4o-mini", "OPENAI_API_KEY": "sk-unused"}, False),
        ({"AGENT_MODEL": "scripted:demo"}, False),
    ],
    ids=["unpriced", "priced", "scripted"],
)
def test_the_worker_warns_at_start_when_its_default_model_has_no_price(
    tmp_path: Path, env: dict[str, str], warned: bool
) -> None:
    done = run_worker_process(tmp_path, **env)  # stops at the unreachable Temporal, after its checks
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    unpriced = [line for line in lines if line.get("event") == "model_unpriced"]
    assert len(unpriced) == (1 if warned else 0), done.stderr
    if warned:
        assert unpriced[0]["level"] == "warning" and "set AGENT_PRICES" in unpriced[0]["note"]
