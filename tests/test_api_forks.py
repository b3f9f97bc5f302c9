"""``POST /v1/runs/{id}/fork`` and ``/rewind`` on the real dev server and a real worker, served by real uvicorn:
a fork of a completed run completes, a rewind asks the model again from the step after, another tenant's
run is 404, a reviewer-only token is 403, a step the run does not have is 409.

The source run takes three steps: two read-only ``http_request`` GETs to a local sink, then an answer
that counts the turns it saw. The fake model decides from the prompt alone, so a fork or a rewind gets
the same answers for the same transcript.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.api_support import ALICE, BOB, CAROL, Who, get_json, serve_api, write_tokens
from tests.conftest import TEMPORAL_CLI, WorkerFactory
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer
from tests.scenarios import FORK_STEPS, get_twice_then_count
from tests.waiting import eventually
from workflows.progress import COST_USD, FORK_OF, MODEL, PENDING_APPROVALS, STATE, TENANT
from workflows.types import AgentInput

STEPS = FORK_STEPS


@pytest.fixture(scope="module")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """This module's own dev server, with the Agent* search attributes (the API reads runs by tenant) and
    ``AgentForkOf`` (a worker that knows its namespace has them records a fork's source there)."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        search_attributes=[STATE, PENDING_APPROVALS, TENANT, MODEL, COST_USD, FORK_OF],
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def cache_mode() -> str:
    return "cached"


@pytest.fixture
async def source(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, tmp_path: Path, llm: FakeLLMServer
) -> AsyncIterator[tuple[httpx.AsyncClient, str, str]]:
    """The API, and a completed three-step run of acme's started through it (its workflow and run ids)."""
    runtime.search_attributes_ready = True
    tokens = write_tokens(tmp_path / "tokens.json")
    with HttpSink() as sink:
        llm.default = get_twice_then_count(sink)
        async with (
            run_worker(dev_env.client, runtime) as tq,
            serve_api(dev_env.client, tq, tokens, store_url=runtime.settings.store_url) as url,
            httpx.AsyncClient(base_url=url, timeout=60) as http,
        ):
            started = await http.post("/v1/runs", json={"task": "look two items up"}, headers=ALICE.headers)
            assert started.status_code == 201, started.text
            view = await completed(http, ALICE, started.json()["workflow_id"])
            assert view["step"] == STEPS and view["output"] == f"done after {STEPS - 1} turns", view
            yield http, started.json()["workflow_id"], started.json()["run_id"]


async def completed(http: httpx.AsyncClient, who: Who, workflow_id: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        view: dict[str, Any] = await get_json(http, f"/v1/runs/{workflow_id}", who)
        return view if view["state"] == "completed" else None

    return await eventually(check, f"{workflow_id} completed")


async def started_input(dev_env: WorkflowEnvironment, workflow_id: str) -> AgentInput:
    start = await anext(aiter(dev_env.client.get_workflow_handle(workflow_id).fetch_history_events(page_size=1)))
    [inp] = await dev_env.client.data_converter.decode(
        start.workflow_execution_started_event_attributes.input.payloads, [AgentInput]
    )
    assert isinstance(inp, AgentInput)
    return inp


async def test_a_fork_over_http_starts_a_run_of_the_sources_first_steps_that_completes(
    source: tuple[httpx.AsyncClient, str, str], dev_env: WorkflowEnvironment
) -> None:
    http, wid, _ = source
    fork_id = f"fork-{uuid.uuid4().hex[:8]}"
    forked = await http.post(
        f"/v1/runs/{wid}/fork", json={"step": 1, "task": "again", "workflow_id": fork_id}, headers=ALICE.headers
    )
    assert forked.status_code == 201, forked.text
    assert forked.json()["workflow_id"] == fork_id and forked.json()["run_id"], forked.text
    inp = await started_input(dev_env, fork_id)
    assert inp.fork is not None and inp.fork.workflow_id == wid and inp.fork.step == 1, inp
    assert inp.task == "again" and inp.tenant == "acme", inp
    desc = await dev_env.client.get_workflow_handle(fork_id).describe()
    assert desc.typed_search_attributes.get(FORK_OF) == wid
    done = await completed(http, ALICE, fork_id)
    assert done["output"].startswith("done after"), done
    assert (await http.get(f"/v1/runs/{fork_id}", headers=BOB.headers)).status_code == 404  # acme's, as its source

    # Without a body's id: one is made up from the source's; without a step: every step the source completed.
    whole = await http.post(f"/v1/runs/{wid}/fork", json={}, headers=ALICE.headers)
    assert whole.status_code == 201 and whole.json()["workflow_id"].startswith(f"{wid}-fork{STEPS}-"), whole.text
    assert (await started_input(dev_env, whole.json()["workflow_id"])).fork.step == STEPS  # type: ignore[union-attr]

    taken = await http.post(f"/v1/runs/{wid}/fork", json={"step": 1, "workflow_id": fork_id}, headers=ALICE.headers)
    assert taken.status_code == 409, taken.text
    too_far = await http.post(f"/v1/runs/{wid}/fork", json={"step": 9}, headers=ALICE.headers)
    assert too_far.status_code == 409, too_far.text
    assert too_far.json()["detail"] == f"run {wid} has {STEPS} complete step(s); cannot fork at step 9"
    for bad in ({"step": -1}, {"stp": 1}, {"workflow_id": "bad id!"}):
        refused = await http.post(f"/v1/runs/{wid}/fork", json=bad, headers=ALICE.headers)
        assert refused.status_code == 422, (bad, refused.text)
    blank = await http.post(f"/v1/runs/{wid}/fork", json={"step": 1, "task": "   "}, headers=ALICE.headers)
    assert blank.status_code == 400 and "invalid fork input: task" in blank.json()["detail"], blank.text


async def test_another_tenants_run_cannot_be_forked_or_rewound_and_a_reviewer_token_is_refused(
    source: tuple[httpx.AsyncClient, str, str], llm: FakeLLMServer
) -> None:
    http, wid, _ = source
    asked = len(llm.requests)
    for path, body in ((f"/v1/runs/{wid}/fork", {"step": 1}), (f"/v1/runs/{wid}/rewind", {"step": 1})):
        foreign = await http.post(path, json=body, headers=BOB.headers)
        assert foreign.status_code == 404 and foreign.json()["detail"] == f"no run with id {wid!r}", foreign.text
        reviewer = await http.post(path, json=body, headers=CAROL.headers)
        assert reviewer.status_code == 403 and "starter role" in reviewer.json()["detail"], reviewer.text
    unknown = await http.post("/v1/runs/no-such-run-here/fork", json={}, headers=BOB.headers)
    assert unknown.status_code == 404  # the same answer as for acme's run
    assert len(llm.requests) == asked, "nothing was started or reset"
    assert (await get_json(http, f"/v1/runs/{wid}", ALICE))["state"] == "completed"
    listed = await get_json(http, "/v1/runs", BOB)
    assert not [r for r in listed["runs"] if r["workflow_id"].startswith(wid)], listed


async def test_a_rewind_over_http_asks_the_model_again_from_the_step_after(
    source: tuple[httpx.AsyncClient, str, str], llm: FakeLLMServer, dev_env: WorkflowEnvironment
) -> None:
    http, wid, run_id = source
    for step in (STEPS, 9):
        refused = await http.post(f"/v1/runs/{wid}/rewind", json={"step": step}, headers=ALICE.headers)
        assert refused.status_code == 409, refused.text
        assert f"has no step after {step} to rewind from (steps it has: {STEPS})" in refused.json()["detail"]
    for bad in ({}, {"step": -1}, {"step": 1, "why": "x"}):
        malformed = await http.post(f"/v1/runs/{wid}/rewind", json=bad, headers=ALICE.headers)
        assert malformed.status_code == 422, (bad, malformed.text)

    asked = len(llm.requests)
    rewound = await http.post(f"/v1/runs/{wid}/rewind", json={"step": 1, "reason": "try again"}, headers=ALICE.headers)
    assert rewound.status_code == 200, rewound.text
    ref = rewound.json()
    assert ref["workflow_id"] == wid and ref["run_id"] and ref["run_id"] != run_id, ref
    handle = dev_env.client.get_workflow_handle(wid)
    assert (await handle.describe()).run_id == ref["run_id"]

    async def done() -> dict[str, Any] | None:
        closed = (await handle.describe()).close_time is not None  # the new run (the id's latest) has closed
        again: dict[str, Any] = await get_json(http, f"/v1/runs/{wid}", ALICE)
        return again if closed and again["state"] == "completed" else None

    again = await eventually(done, "the rewound run completed")
    assert again["step"] == STEPS and again["output"] == f"done after {STEPS - 1} turns", again
    # The model was asked again for steps 2 and 3 only, and step 2's prompt held step 1 (four messages).
    asked_again = llm.requests[asked:]
    assert len(asked_again) == 2, [r["body"]["messages"] for r in asked_again]
    assert len(asked_again[0]["body"]["messages"]) == 4, asked_again[0]["body"]["messages"]
