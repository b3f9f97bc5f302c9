"""The HTTP API on the real dev server and a real worker, served by real uvicorn on 127.0.0.1: tenant
scoping (another tenant's run is 404 on every endpoint), the recorded reviewer, 401, 413, 429."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog.testing
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from durable_agents.api.tokens import TokenRegistry
from tests.api_support import (
    ALICE,
    BOB,
    CAROL,
    ROOT,
    ROOT_ADMIN,
    ServeProcess,
    Who,
    get_json,
    indexed_server,
    serve_api,
    write_tokens,
)
from tests.conftest import WorkerFactory
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.test_cli_bad_input import cli_env, starter
from tests.waiting import eventually


@pytest.fixture(scope="module")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """This module's own dev server, with the Agent* search attributes (listing by tenant needs them)."""
    async with indexed_server() as env:
        yield env


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    return write_tokens(tmp_path / "tokens.json")


@pytest.fixture
async def api(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, tokens: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    runtime.search_attributes_ready = True
    async with (
        run_worker(dev_env.client, runtime) as tq,
        serve_api(dev_env.client, tq, tokens, store_url=runtime.settings.store_url) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        yield http, tq


def post(sink: HttpSink, sku: int) -> tuple[str, str]:
    return ("http_request", json.dumps({"method": "POST", "url": f"{sink.url}/orders", "json": {"sku": sku}}))


async def start(http: httpx.AsyncClient, who: Who, **body: Any) -> str:
    body.setdefault("task", "place orders")
    response = await http.post("/v1/runs", json=body, headers=who.headers)
    assert response.status_code == 201, response.text
    ref = response.json()
    assert set(ref) == {"workflow_id", "run_id"} and ref["run_id"]
    return str(ref["workflow_id"])


async def approvals_of(http: httpx.AsyncClient, who: Who, workflow_id: str) -> list[dict[str, Any]]:
    body = await get_json(http, "/v1/approvals", who)
    return [a for a in body["approvals"] if a["workflow_id"] == workflow_id]


async def wait_state(http: httpx.AsyncClient, who: Who, workflow_id: str, *states: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        view = await get_json(http, f"/v1/runs/{workflow_id}", who)
        return view if view["state"] in states else None

    return await eventually(check, f"{workflow_id} in {states}")


async def test_another_tenants_run_is_404_on_every_endpoint_and_the_reviewer_is_the_tokens(
    api: tuple[httpx.AsyncClient, str], llm: FakeLLMServer, sink: HttpSink
) -> None:
    http, _ = api
    llm.enqueue(Scripted(tool_calls=[post(sink, 1)]), Scripted(text="ordered"))
    wid = await start(http, ALICE)
    [approval] = await eventually(lambda: approvals_of(http, ALICE, wid), "the run's approval in acme's inbox")
    aid = approval["approval_id"]
    assert approval["tool"] == "http_request" and approval["args"]["json"] == {"sku": 1}

    # globex's token: the run does not exist, whatever it asks.
    foreign = [
        ("GET", f"/v1/runs/{wid}", None),
        ("GET", f"/v1/runs/{wid}/transcript", None),
        ("GET", f"/v1/runs/{wid}/events", None),
        ("POST", f"/v1/runs/{wid}/cancel", {}),
        ("POST", f"/v1/approvals/{wid}/{aid}", {"decision": "approve"}),
        ("POST", f"/v1/approvals/{wid}/{aid}", {"decision": "reject", "reason": "no"}),
        ("GET", f"/v1/approvals?run={wid}", None),
        ("POST", f"/v1/sessions/{wid}/messages", {"text": "hello"}),
    ]
    for method, path, body in foreign:
        response = await http.request(method, path, json=body, headers=BOB.headers)
        assert response.status_code == 404, (method, path, response.status_code, response.text)
    assert await approvals_of(http, BOB, wid) == []
    listed = await get_json(http, "/v1/runs", BOB)
    assert wid not in {r["workflow_id"] for r in listed["runs"]}
    # ... and an unknown run answers exactly the same way.
    unknown = await http.get("/v1/runs/no-such-run-at-all", headers=BOB.headers)
    assert unknown.status_code == 404

    # acme's own token sees it; a body cannot claim another reviewer.
    assert wid in {r["workflow_id"] for r in (await get_json(http, "/v1/runs", ALICE))["runs"]}
    assert wid in {r["workflow_id"] for r in (await get_json(http, "/v1/runs", ROOT_ADMIN))["runs"]}
    claimed = await http.post(
        f"/v1/approvals/{wid}/{aid}", json={"decision": "approve", "reviewer": "mallory"}, headers=ALICE.headers
    )
    assert claimed.status_code == 400 and "alice" in claimed.text
    assert sink.writes() == []
    decided = await http.post(f"/v1/approvals/{wid}/{aid}", json={"decision": "approve"}, headers=ALICE.headers)
    assert decided.status_code == 200, decided.text
    assert decided.json()["reviewer"] == "alice"
    view = await wait_state(http, ALICE, wid, "completed")
    assert view["output"] == "ordered"
    assert [d["reviewer"] for d in view["decisions"]] == ["alice"]
    assert len(sink.writes()) == 1
    transcript = await get_json(http, f"/v1/runs/{wid}/transcript", ALICE)
    assert transcript["workflow_id"] == wid and transcript["messages"]


async def test_a_reviewer_the_run_does_not_list_is_refused(
    api: tuple[httpx.AsyncClient, str], llm: FakeLLMServer, sink: HttpSink
) -> None:
    http, _ = api
    llm.enqueue(Scripted(tool_calls=[post(sink, 2)]), Scripted(text="done"))
    wid = await start(http, ALICE, approvers=["alice"])
    [approval] = await eventually(lambda: approvals_of(http, CAROL, wid), "the approval in carol's inbox")
    refused = await http.post(
        f"/v1/approvals/{wid}/{approval['approval_id']}", json={"decision": "approve"}, headers=CAROL.headers
    )
    assert refused.status_code == 409 and "carol" in refused.text, refused.text
    # carol may decide but not start: a token's roles are its own.
    started = await http.post("/v1/runs", json={"task": "x"}, headers=CAROL.headers)
    assert started.status_code == 403
    cancelled = await http.post(f"/v1/runs/{wid}/cancel", json={"reason": "test over"}, headers=ALICE.headers)
    assert cancelled.status_code == 200, cancelled.text
    await wait_state(http, ALICE, wid, "cancelled")
    assert sink.writes() == []


async def test_a_caller_cannot_set_runtime_fields_or_another_tenant(api: tuple[httpx.AsyncClient, str]) -> None:
    http, _ = api
    for body in ({"task": "x", "depth": 2}, {"task": "x", "checkpoint": "ck"}, {"task": "x", "tenant": "globex"}):
        response = await http.post("/v1/runs", json=body, headers=ALICE.headers)
        assert response.status_code == 400, (body, response.text)
    typo = await http.post("/v1/runs", json={"taks": "x"}, headers=ALICE.headers)
    assert typo.status_code == 422 and "task" in typo.text


async def test_no_token_or_an_unknown_one_is_401(api: tuple[httpx.AsyncClient, str]) -> None:
    http, _ = api
    for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": f"Basic {ALICE.token}"}):
        for method, path in (("GET", "/v1/runs"), ("GET", "/v1/approvals"), ("POST", "/v1/runs")):
            response = await http.request(method, path, headers=headers, json={"task": "x"})
            assert response.status_code == 401, (headers, path, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
    spec = await http.get("/openapi.json")
    assert spec.status_code == 200
    paths = spec.json()["paths"]
    for path in (
        "/v1/runs",
        "/v1/runs/{workflow_id}",
        "/v1/runs/{workflow_id}/cancel",
        "/v1/sessions/{session_id}/messages",
        "/v1/runs/{workflow_id}/transcript",
        "/v1/runs/{workflow_id}/events",
        "/v1/approvals",
        "/v1/approvals/{workflow_id}/{approval_id}",
    ):
        assert path in paths, path


async def test_an_oversized_body_is_413_declared_or_streamed(api: tuple[httpx.AsyncClient, str]) -> None:
    http, _ = api
    big = {"task": "x" * (2 * 1024 * 1024)}
    declared = await http.post("/v1/runs", json=big, headers=ALICE.headers)
    assert declared.status_code == 413, declared.text

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b"x" * 64 * 1024

    streamed = await http.post("/v1/runs", content=chunks(), headers={**ALICE.headers, "Content-Type": "text/plain"})
    assert streamed.status_code == 413, streamed.text


async def test_a_token_over_its_rate_gets_429_with_retry_after(
    dev_env: WorkflowEnvironment, tokens: Path, tmp_path: Path
) -> None:
    async with (
        serve_api(dev_env.client, "nobody-polls", tokens, rate_per_minute=1) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        first = await http.get("/v1/me", headers=ALICE.headers)
        assert first.status_code == 200 and first.json()["reviewer"] == "alice"
        second = await http.get("/v1/me", headers=ALICE.headers)
        assert second.status_code == 429
        assert int(second.headers["retry-after"]) >= 1
        # The limit is per token: another token is not held back by alice's requests.
        assert (await http.get("/v1/me", headers=BOB.headers)).status_code == 200


async def test_the_tokens_file_is_reread_when_it_changes(tmp_path: Path, dev_env: WorkflowEnvironment) -> None:
    path = write_tokens(tmp_path / "tokens.json", (ALICE,))
    async with (
        serve_api(dev_env.client, "nobody-polls", path) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.get("/v1/me", headers=ALICE.headers)).status_code == 200
        assert (await http.get("/v1/me", headers=BOB.headers)).status_code == 401
        write_tokens(path, (BOB,))
        assert (await http.get("/v1/me", headers=BOB.headers)).status_code == 200
        assert (await http.get("/v1/me", headers=ALICE.headers)).status_code == 401


def test_a_tokens_file_holds_hashes_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"sha256": "not-hex", "tenant": "acme", "roles": ["starter"]}]}))
    with pytest.raises(ValueError, match="AGENT_API_TOKENS_FILE"):
        TokenRegistry(path)
    path.write_text(json.dumps({"tokens": [{"sha256": "a" * 64, "roles": ["starter"]}]}))
    with pytest.raises(ValueError, match="needs a tenant"):
        TokenRegistry(path)


def test_serve_refuses_to_start_without_tokens_unless_insecure_local(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = dev_env.client.service_client.config.target_host
    refused = starter(cli_env(address), "serve", "--port", "0")
    assert refused.returncode == 2
    assert "AGENT_API_TOKENS_FILE" in refused.stderr and "--insecure-local" in refused.stderr
    local = ServeProcess(address, "nobody-polls", None, tmp_path / "serve.log", insecure_local=True, host="0.0.0.0")
    try:
        assert local.url.startswith("http://127.0.0.1:")  # --host 0.0.0.0 is not honoured without tokens
        me = httpx.get(f"{local.url}/v1/me")
        assert me.status_code == 200 and "admin" in me.json()["roles"]
    finally:
        local.stop()


async def test_a_session_message_creates_the_session_and_stays_in_its_tenant(
    api: tuple[httpx.AsyncClient, str], llm: FakeLLMServer
) -> None:
    http, _ = api
    llm.enqueue(Scripted(text="hello, how can I help?"), Scripted(text="it ships tomorrow"))
    session = f"support-{uuid.uuid4().hex[:8]}"
    first = await http.post(f"/v1/sessions/{session}/messages", json={"text": "hi"}, headers=ALICE.headers)
    assert first.status_code == 200, first.text
    assert first.json()["accepted"] and first.json()["seq"] == 1
    view = await wait_state(http, ALICE, session, "idle")
    assert view["session"] is True
    # Another tenant can neither write to it nor start a session of its own under its id.
    foreign = await http.post(f"/v1/sessions/{session}/messages", json={"text": "mine now"}, headers=BOB.headers)
    assert foreign.status_code == 404, foreign.text
    again = await http.post(
        f"/v1/sessions/{session}/messages",
        json={"text": "where is my order?", "message_id": "m2"},
        headers=ALICE.headers,
    )
    assert again.status_code == 200 and again.json()["seq"] == 2, again.text
    retried = await http.post(
        f"/v1/sessions/{session}/messages",
        json={"text": "where is my order?", "message_id": "m2"},
        headers=ALICE.headers,
    )
    assert retried.json()["duplicate"] is True, retried.text

    async def replied() -> bool:
        return bool((await get_json(http, f"/v1/runs/{session}", ALICE))["replied"] >= 2)

    await eventually(replied, "the session replied to both messages")
    transcript = await get_json(http, f"/v1/runs/{session}/transcript", ALICE)
    assert "it ships tomorrow" in json.dumps(transcript["messages"])


async def test_the_docs_curl_examples_work(api: tuple[httpx.AsyncClient, str], llm: FakeLLMServer) -> None:
    """The HTTP API section's curl lines, run by bash against the API (but for those naming a placeholder
    approval id and the streams, which the SSE tests cover)."""
    http, _ = api
    llm.enqueue(Scripted(text="ordered sku 7"), Scripted(text="it ships tomorrow"))
    page = (ROOT / "docs" / "front-ends.md").read_text()
    section = page.split("## HTTP API", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in section.split("```bash\n")[1:] if "curl" in b).split("```", 1)[0]
    script: list[str] = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.startswith(("API=", "AUTH=")) or (
            line.startswith("curl") and "ap_..." not in line and " -sN " not in line
        ):
            script.append(line.split("  # ")[0])
    assert len(script) >= 6, script
    done = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-euc", "\n".join(s.replace("http://127.0.0.1:8080", str(http.base_url).rstrip("/")) for s in script)],
        env={"PATH": os.environ["PATH"], "ACME_TOKEN": ALICE.token},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"workflow_id":"order-7"' in done.stdout and '"approvals":' in done.stdout, done.stdout
    assert '"accepted":true' in done.stdout, done.stdout


async def test_each_request_is_one_access_log_line_without_body_or_token(
    api: tuple[httpx.AsyncClient, str],
) -> None:
    http, _ = api
    with structlog.testing.capture_logs() as logged:
        refused = await http.post("/v1/runs", json={"task": "secret task text", "depth": 1}, headers=ALICE.headers)
        anonymous = await http.get("/v1/runs?page_token=opaque-cursor")
    assert (refused.status_code, anonymous.status_code) == (400, 401)
    lines = [entry for entry in logged if entry["event"] == "api.request"]
    assert [(e["method"], e["path"], e["status"], e["tenant"]) for e in lines] == [
        ("POST", "/v1/runs", 400, "acme"),
        ("GET", "/v1/runs", 401, ""),
    ]
    assert all(isinstance(e["duration_ms"], float) for e in lines)
    text = repr(logged)
    assert ALICE.token not in text and "secret task text" not in text and "opaque-cursor" not in text


def test_the_docs_token_recipe_makes_an_entry_the_api_accepts(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "front-ends.md").read_text()
    section = page.split("## Tenant tokens", 1)[1].split("\n## ", 1)[0]
    recipe = next(b for b in section.split("```bash\n")[1:] if "sha256sum" in b).split("```", 1)[0]
    done = subprocess.run(
        ["bash", "-euc", recipe + 'echo "$TOKEN"'],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    sha256, token = done.stdout.split()
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"sha256": sha256, "tenant": "acme", "roles": ["starter"]}]}))
    found = TokenRegistry(path).lookup(token)
    assert found is not None and found.tenant == "acme"
    assert TokenRegistry(path).lookup(token + "x") is None
