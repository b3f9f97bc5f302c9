"""``AGENT_TENANT_MAX_OPEN_RUNS``: a tenant's open top-level runs and sessions are counted and capped.

The count is taken at each run's start in trusted code (``run_config``) and given back by the run's
cleanup; a run that never cleaned up (terminated) is found closed by the next start that finds the
tenant full, or by the reaper. Other tenants, runs without a tenant and sub-agents are not held back.
The CLI starts a tenant's runs with the tenant as their Temporal fairness key.
"""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.tenant_quota import open_checker, release_closed
from durable_agents.cli.run import start_agent_run
from durable_agents.fairness import fairness_key
from tests.conftest import WorkerFactory, start_agent, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.session_types import SessionSpec
from workflows.types import TENANT_QUOTA_EXCEEDED, AgentInput, AgentResult


async def refusal(handle: WorkflowHandle[Any, Any]) -> tuple[str, str]:
    """The failure type and message of a run that must fail."""
    try:
        await handle.result()
    except WorkflowFailureError as err:
        return str(getattr(err.cause, "type", "")), str(getattr(err.cause, "message", err.cause))
    raise AssertionError(f"{handle.id} should have failed")


async def open_session(client: Client, tq: str, tenant: str) -> WorkflowHandle[Any, AgentResult]:
    """A session of ``tenant`` that waits for its first message: open, and counted once it started."""
    return await client.start_workflow(
        AgentWorkflow.run,
        AgentInput(session=SessionSpec(), tenant=tenant),
        id=f"quota-session-{uuid.uuid4().hex[:10]}",
        task_queue=tq,
    )


async def test_the_run_over_the_limit_is_refused_with_its_reason_and_others_go_on(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = lambda body: Scripted(text="done")
    client = dev_env.client
    runtime = with_settings(runtime, tenant_max_open_runs=2)
    store = runtime.store
    async with run_worker(client, runtime) as tq:
        first, second = await open_session(client, tq, "acme"), await open_session(client, tq, "acme")

        async def both_counted() -> bool:
            return {w for _, w in await store.tenant_runs("acme")} == {first.id, second.id}

        await eventually(both_counted, "both sessions counted")
        over = await start_agent(client, tq, id_prefix="quota-over", tenant="acme")
        kind, message = await refusal(over)
        assert kind == TENANT_QUOTA_EXCEEDED, (kind, message)
        assert message.startswith("tenant 'acme' has 2 open runs, the most AGENT_TENANT_MAX_OPEN_RUNS=2 allows")
        assert first.id in message and second.id in message
        # A session over the limit is refused the same way.
        kind, message = await refusal(await open_session(client, tq, "acme"))
        assert kind == TENANT_QUOTA_EXCEEDED, (kind, message)
        assert message.startswith("tenant 'acme' has 2 open runs, the most AGENT_TENANT_MAX_OPEN_RUNS=2 allows")
        assert len(await store.tenant_runs("acme")) == 2  # the refused run and session hold no place

        # Another tenant and a run without one are not held back by acme's count.
        assert (await (await start_agent(client, tq, id_prefix="quota-beta", tenant="beta")).result()).output == "done"
        assert (await (await start_agent(client, tq, id_prefix="quota-none")).result()).output == "done"
        assert await store.tenant_runs("beta") == []  # a finished run gave its place back

        # A session that closes gives its place back at its cleanup: the next run of acme starts.
        await first.signal("close")
        await first.result()
        assert [w for _, w in await store.tenant_runs("acme")] == [second.id]
        after_close = await start_agent(client, tq, id_prefix="quota-after", tenant="acme")
        assert (await after_close.result()).output == "done"

        # A terminated run never cleaned up: the next start that finds acme full sees it closed.
        third = await open_session(client, tq, "acme")
        await eventually(lambda: _counted(store, "acme", 2), "two acme sessions counted")
        await second.terminate("test")
        replacing = await start_agent(client, tq, id_prefix="quota-freed", tenant="acme")
        assert (await replacing.result()).output == "done"
        assert [w for _, w in await store.tenant_runs("acme")] == [third.id]
        await third.signal("close")
        await third.result()


async def _counted(store: Any, tenant: str, n: int) -> bool:
    return len(await store.tenant_runs(tenant)) == n


async def test_the_reaper_frees_the_places_of_runs_that_closed_without_giving_them_back(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    client = dev_env.client
    runtime = with_settings(runtime, tenant_max_open_runs=5)
    store = runtime.store
    async with run_worker(client, runtime) as tq:
        kept, ended = await open_session(client, tq, "gamma"), await open_session(client, tq, "gamma")
        await eventually(lambda: _counted(store, "gamma", 2), "both sessions counted")
        await ended.terminate("test")
        await store.tenant_run_reserve("gamma", "never-started-" + uuid.uuid4().hex[:6], 5)  # unknown to Temporal
        assert await release_closed(store, open_checker(client), "gamma") == 2
        assert [w for _, w in await store.tenant_runs("gamma")] == [kept.id]
        assert await release_closed(store, open_checker(client), "gamma") == 0
        await kept.signal("close")
        await kept.result()
    assert await store.tenant_runs("gamma") == []


async def test_the_cli_starts_a_tenants_run_with_the_tenant_as_its_fairness_key(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = lambda body: Scripted(text="fair")
    client = dev_env.client
    long_tenant = "t" * 80  # over the server's 64 bytes: a stable digest stands in
    async with run_worker(client, runtime) as tq:
        for tenant in ("acme", long_tenant, ""):
            inp = AgentInput(task="hi", tenant=tenant)
            handle = await start_agent_run(
                client, inp, f"fair-{uuid.uuid4().hex[:8]}", tq, summary="fairness", details=""
            )
            assert (await handle.result()).output == "fair"
            info = (await handle.describe()).raw_description.workflow_execution_info
            assert info.priority.fairness_key == fairness_key(tenant)
    assert fairness_key("acme") == "acme" and fairness_key("") == ""
    assert len(fairness_key(long_tenant).encode()) <= 64 and fairness_key(long_tenant) == fairness_key(long_tenant)
