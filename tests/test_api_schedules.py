"""``/v1/schedules`` on the real dev server and a real worker, served by real uvicorn on 127.0.0.1: the whole
life of a schedule over HTTP, a triggered firing's run, tenant separation (another tenant's schedule is 404
on every endpoint; two tenants may use the same name), the roles and the 4xx answers to bad input.

Schedules use a yearly cron and fire only through ``trigger``, so every run a test sees is one it asked for.
The fake model answers ``echo: <the last message>``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from durable_agents import AgentClient, InvalidSchedule
from tests.api_support import ALICE, BOB, CAROL, ROOT_ADMIN, Who, get_json, indexed_server, serve_api, write_tokens
from tests.conftest import WorkerFactory
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually

YEARLY = "0 0 1 1 *"  # never fires during a test


@pytest.fixture(scope="module")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """This module's own dev server, with the Agent* search attributes (the API reads runs by tenant)."""
    async with indexed_server() as env:
        yield env


@pytest.fixture
def cache_mode() -> str:
    return "cached"


@pytest.fixture
async def api(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, tmp_path: Path, llm: FakeLLMServer
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    llm.default = lambda body: Scripted(text=f"echo: {body['messages'][-1].get('content')}")
    runtime.search_attributes_ready = True
    tokens = write_tokens(tmp_path / "tokens.json")
    async with (
        run_worker(dev_env.client, runtime) as tq,
        serve_api(dev_env.client, tq, tokens, store_url=runtime.settings.store_url) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        yield http, tq


def new_name() -> str:
    return f"h-{uuid.uuid4().hex[:10]}"


async def create(http: httpx.AsyncClient, who: Who, **body: Any) -> dict[str, Any]:
    body.setdefault("cron", YEARLY)
    response = await http.post("/v1/schedules", json=body, headers=who.headers)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def listed(http: httpx.AsyncClient, who: Who, name: str) -> list[dict[str, Any]]:
    body = await get_json(http, "/v1/schedules", who)
    return [s for s in body["schedules"] if s["name"] == name]


def one_line(response: httpx.Response) -> str:
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and detail, response.text
    return detail


async def test_a_schedule_over_http_from_creation_through_a_triggered_run_to_deletion(
    api: tuple[httpx.AsyncClient, str],
) -> None:
    http, _ = api
    name = new_name()
    created = await create(http, ALICE, name=name, task="say hi", note="made over http")
    assert created["name"] == name and created["tenant"] == "acme" and created["kind"] == "task", created
    assert created["schedule_id"] == f"agent-schedule-{name}@acme" and created["task"] == "say hi", created
    assert created["paused"] is False and created["next_runs"] and created["note"] == "made over http", created
    again = await http.post("/v1/schedules", json={"name": name, "cron": YEARLY, "task": "x"}, headers=ALICE.headers)
    assert again.status_code == 409 and one_line(again) == f"a schedule named '{name}' exists already"

    described = await get_json(http, f"/v1/schedules/{name}", ALICE)
    assert described["schedule_id"] == created["schedule_id"] and described["actions"] == 0, described
    [row] = await eventually(lambda: listed(http, ALICE, name), "GET /v1/schedules lists it")
    assert row["task"] == "say hi" and row["cron"] == YEARLY, row

    paused = await http.post(f"/v1/schedules/{name}/pause", json={"note": "holidays"}, headers=ALICE.headers)
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True and paused.json()["note"] == "holidays", paused.text
    unpaused = await http.post(f"/v1/schedules/{name}/unpause", headers=ALICE.headers)  # no body: a default note
    assert unpaused.status_code == 200 and unpaused.json()["paused"] is False, unpaused.text
    assert unpaused.json()["note"] == "unpaused", unpaused.text

    fired = await http.post(f"/v1/schedules/{name}/trigger", headers=ALICE.headers)
    assert fired.status_code == 200 and fired.json()["name"] == name, fired.text

    async def ran() -> dict[str, Any] | None:
        info = await get_json(http, f"/v1/schedules/{name}", ALICE)
        return info if info["actions"] == 1 and not info["running"] and info["recent_runs"] else None

    info = await eventually(ran, "the triggered firing's run ended")
    run_id = info["recent_runs"][-1]["workflow_id"]
    assert run_id.startswith(f"agent-schedule-{name}@acme-"), run_id
    view = await get_json(http, f"/v1/runs/{run_id}", ALICE)  # the run is acme's: its token reads it
    assert view["state"] == "completed" and view["output"] == "echo: say hi", view

    deleted = await http.delete(f"/v1/schedules/{name}", headers=ALICE.headers)
    assert deleted.status_code == 200 and deleted.json() == {"name": name, "deleted": True}, deleted.text
    for method, path in (
        ("GET", f"/v1/schedules/{name}"),
        ("DELETE", f"/v1/schedules/{name}"),
        ("POST", f"/v1/schedules/{name}/trigger"),
    ):
        gone = await http.request(method, path, headers=ALICE.headers)
        assert gone.status_code == 404 and one_line(gone) == f"no schedule named '{name}'", (method, gone.text)
    assert (await get_json(http, f"/v1/runs/{run_id}", ALICE))["state"] == "completed"  # its run stays


async def test_another_tenants_schedule_is_404_everywhere_and_the_same_name_is_a_schedule_of_its_own(
    api: tuple[httpx.AsyncClient, str], dev_env: WorkflowEnvironment
) -> None:
    http, tq = api
    name = new_name()
    await create(http, ALICE, name=name, task="acme's task")

    foreign = [
        ("GET", f"/v1/schedules/{name}", None),
        ("POST", f"/v1/schedules/{name}/pause", {"note": "mine now"}),
        ("POST", f"/v1/schedules/{name}/unpause", None),
        ("POST", f"/v1/schedules/{name}/trigger", None),
        ("DELETE", f"/v1/schedules/{name}", None),
    ]
    for method, path, body in foreign:
        response = await http.request(method, path, json=body, headers=BOB.headers)
        assert response.status_code == 404, (method, path, response.status_code, response.text)
        assert one_line(response) == f"no schedule named '{name}'"  # as for a name no schedule has
    named = await http.get(f"/v1/schedules/{name}", params={"tenant": "acme"}, headers=BOB.headers)
    assert named.status_code == 400 and "scoped to tenant 'globex'" in one_line(named), named.text
    assert await listed(http, BOB, name) == []
    ours = await get_json(http, f"/v1/schedules/{name}", ALICE)
    assert ours["paused"] is False and ours["actions"] == 0 and ours["note"] != "mine now", ours

    # globex may use the name too: another schedule, and neither tenant sees the other's.
    theirs = await create(http, BOB, name=name, task="globex's task")
    assert theirs["tenant"] == "globex" and theirs["schedule_id"] == f"agent-schedule-{name}@globex", theirs
    assert (await get_json(http, f"/v1/schedules/{name}", ALICE))["task"] == "acme's task"
    assert (await get_json(http, f"/v1/schedules/{name}", BOB))["task"] == "globex's task"
    both = await eventually(
        lambda: _count(listed(http, ROOT_ADMIN, name), 2), "the admin token lists both schedules of the name"
    )
    assert sorted(s["tenant"] for s in both) == ["acme", "globex"], both
    assert [s["tenant"] for s in await listed(http, ALICE, name)] == ["acme"]
    assert [s["tenant"] for s in await listed(http, BOB, name)] == ["globex"]

    # The admin token and the unscoped client find a name among every tenant's, and ask for the tenant here.
    ambiguous = await http.get(f"/v1/schedules/{name}", headers=ROOT_ADMIN.headers)
    assert ambiguous.status_code == 400, ambiguous.text
    assert f"2 schedules are named '{name}', of tenants 'acme', 'globex': name the tenant" in one_line(ambiguous)
    picked = await http.get(f"/v1/schedules/{name}", params={"tenant": "globex"}, headers=ROOT_ADMIN.headers)
    assert picked.status_code == 200 and picked.json()["task"] == "globex's task", picked.text
    unscoped = AgentClient(dev_env.client, task_queue=tq)
    with pytest.raises(InvalidSchedule, match="name the tenant"):
        await unscoped.schedule_trigger(name)
    assert (await unscoped.schedule_describe(name, tenant="acme")).task == "acme's task"

    paused_theirs = await http.post(f"/v1/schedules/{name}/pause", headers=BOB.headers)
    assert paused_theirs.status_code == 200 and paused_theirs.json()["paused"] is True
    assert (await get_json(http, f"/v1/schedules/{name}", ALICE))["paused"] is False
    assert (await http.delete(f"/v1/schedules/{name}", headers=BOB.headers)).status_code == 200
    assert (await get_json(http, f"/v1/schedules/{name}", ALICE))["task"] == "acme's task"
    found = await unscoped.schedule_describe(name)  # one left: found by name alone again
    assert found.tenant == "acme" and found.task == "acme's task", found
    assert (await http.delete(f"/v1/schedules/{name}", headers=ALICE.headers)).status_code == 200

    # An admin token may name the tenant in the input (as in POST /v1/runs): the schedule is that tenant's.
    other = new_name()
    made = await create(http, ROOT_ADMIN, name=other, session="s-chat", message="hello", input={"tenant": "globex"})
    assert made["tenant"] == "globex" and made["kind"] == "session" and made["schedule_id"].endswith("@globex")
    assert (await get_json(http, f"/v1/schedules/{other}", BOB))["message"] == "hello"
    assert (await http.get(f"/v1/schedules/{other}", headers=ALICE.headers)).status_code == 404
    assert (await http.delete(f"/v1/schedules/{other}", headers=BOB.headers)).status_code == 200


async def _count(rows: Any, count: int) -> list[dict[str, Any]] | None:
    found: list[dict[str, Any]] = await rows
    return found if len(found) == count else None


async def test_bad_input_is_a_one_line_4xx_and_a_reviewer_token_cannot_change_schedules(
    api: tuple[httpx.AsyncClient, str],
) -> None:
    http, _ = api
    name = new_name()
    bad = {
        "hour '25' is not in 0-23": {"name": name, "cron": "0 25 * * *", "task": "x"},
        "expected 5 fields": {"name": name, "cron": "every day", "task": "x"},
        "bad schedule name 'bad/name'": {"name": "bad/name", "cron": YEARLY, "task": "x"},
        "a schedule needs a task": {"name": name, "cron": YEARLY},
        "needs --session and --message": {"name": name, "cron": YEARLY, "session": "s-1"},
        "set by the runtime, not by a caller: depth": {
            "name": name,
            "cron": YEARLY,
            "task": "x",
            "input": {"depth": 1},
        },
        "set by the runtime, not by a caller: checkpoint": {
            "name": name,
            "cron": YEARLY,
            "task": "x",
            "input": {"checkpoint": "ck-1"},
        },
        "bad run input: limits.max_steps": {
            "name": name,
            "cron": YEARLY,
            "task": "x",
            "input": {"limits": {"max_steps": 0}},
        },
        "unknown key 'taks'": {"name": name, "cron": YEARLY, "task": "x", "input": {"taks": "y"}},
        "starts runs for tenant 'acme' only": {
            "name": name,
            "cron": YEARLY,
            "task": "x",
            "input": {"tenant": "globex"},
        },
    }
    for why, body in bad.items():
        response = await http.post("/v1/schedules", json=body, headers=ALICE.headers)
        assert response.status_code == 400 and why in one_line(response), (body, response.status_code, response.text)
    unknown = await http.post("/v1/schedules", json={"name": name, "cron": YEARLY, "taks": "x"}, headers=ALICE.headers)
    assert unknown.status_code == 422, unknown.text
    hidden = await http.get("/v1/schedules/.hidden", headers=ALICE.headers)
    assert hidden.status_code == 400 and "bad schedule name" in one_line(hidden), hidden.text
    anonymous = await http.get("/v1/schedules")
    assert anonymous.status_code == 401
    paths = (await http.get("/openapi.json")).json()["paths"]
    for path in (
        "/v1/schedules",
        "/v1/schedules/{name}",
        "/v1/schedules/{name}/pause",
        "/v1/schedules/{name}/unpause",
        "/v1/schedules/{name}/trigger",
        "/v1/runs/{workflow_id}/fork",
        "/v1/runs/{workflow_id}/rewind",
    ):
        assert path in paths, path

    # A schedule made with input: the rest of each run's input, with the token's tenant.
    made = await create(http, ALICE, name=name, task="with limits", input={"limits": {"max_steps": 3}})
    assert made["tenant"] == "acme" and made["task"] == "with limits", made

    # carol's token of acme only reviews: she reads acme's schedules but changes none.
    assert (await get_json(http, f"/v1/schedules/{name}", CAROL))["name"] == name
    for method, path, body in (
        ("POST", "/v1/schedules", {"name": new_name(), "cron": YEARLY, "task": "x"}),
        ("POST", f"/v1/schedules/{name}/pause", None),
        ("POST", f"/v1/schedules/{name}/unpause", None),
        ("POST", f"/v1/schedules/{name}/trigger", None),
        ("DELETE", f"/v1/schedules/{name}", None),
    ):
        refused = await http.request(method, path, json=body, headers=CAROL.headers)
        assert refused.status_code == 403, (method, path, refused.text)
        assert one_line(refused) == "this token does not have the starter role"
    info = await get_json(http, f"/v1/schedules/{name}", ALICE)
    assert info["paused"] is False and info["actions"] == 0, info
    assert (await http.delete(f"/v1/schedules/{name}", headers=ALICE.headers)).status_code == 200
