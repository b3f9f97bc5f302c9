"""``GET /v1/runs/{id}/events`` across two API processes: a client that disconnects mid-run and
reconnects with ``Last-Event-ID`` to the other process gets every event exactly once, in order."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.api_support import ALICE, BOB, ROOT, ServeProcess, Who, indexed_server, serve_app, write_tokens
from tests.conftest import WorkerFactory
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
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


async def read_events(
    http: httpx.AsyncClient, url: str, who: Who, *, last_event_id: str = "", until: str = "end"
) -> list[dict[str, Any]]:
    """SSE frames (id, event, data) up to the first of kind ``until`` (included), then disconnect."""
    headers = {**who.headers, **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    frames: list[dict[str, Any]] = []
    async with http.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        frame: dict[str, Any] = {}
        async for line in response.aiter_lines():
            if line == "":
                if "event" in frame:
                    frames.append(frame)
                    if frame["event"] == until:
                        return frames
                frame = {}
            elif line.startswith(":"):
                continue  # a heartbeat
            else:
                field, _, value = line.partition(": ")
                frame[field] = json.loads(value) if field == "data" else value
    raise AssertionError(f"the stream closed before {until}: {frames}")


def cursor(frame: dict[str, Any]) -> tuple[int, int]:
    offset, _, seq = frame["id"].partition(".")
    return int(offset), int(seq or 0)


async def test_a_client_resumes_on_the_other_api_process_with_every_event_once_in_order(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    sink: HttpSink,
    tmp_path: Path,
) -> None:
    tokens = write_tokens(tmp_path / "tokens.json")
    address = dev_env.client.service_client.config.target_host
    order = json.dumps({"method": "POST", "url": f"{sink.url}/orders", "json": {"sku": 7}})
    llm.enqueue(Scripted(text="checking", tool_calls=[("http_request", order)]), Scripted(text="ordered"))
    runtime.search_attributes_ready = True
    async with run_worker(dev_env.client, runtime) as tq:
        env = {"AGENT_STORE_URL": runtime.settings.store_url, "AGENT_LOG_LEVEL": "INFO"}
        first, second = await asyncio.gather(
            asyncio.to_thread(ServeProcess, address, tq, tokens, tmp_path / "api1.log", env=env),
            asyncio.to_thread(ServeProcess, address, tq, tokens, tmp_path / "api2.log", env=env),
        )
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(60, read=90)) as http:
                started = await http.post(f"{first.url}/v1/runs", json={"task": "order sku 7"}, headers=ALICE.headers)
                assert started.status_code == 201, started.text
                wid = started.json()["workflow_id"]
                events = f"/v1/runs/{wid}/events"

                # Up to the approval on the first process, then the client goes away mid-run.
                before = await read_events(http, first.url + events, ALICE, until="approval_requested")
                approval = before[-1]["data"]["progress"]["data"]["approval_id"]
                # The other tenant cannot follow it on either process.
                for url in (first.url, second.url):
                    assert (await http.get(url + events, headers=BOB.headers)).status_code == 404
                decided = await http.post(
                    f"{second.url}/v1/approvals/{wid}/{approval}", json={"decision": "approve"}, headers=ALICE.headers
                )
                assert decided.status_code == 200, decided.text
                after = await read_events(http, second.url + events, ALICE, last_event_id=before[-1]["id"])
                # A reader from the start, on the first process, sees the whole run for comparison.
                whole = await read_events(http, first.url + events, ALICE)
        finally:
            await asyncio.gather(asyncio.to_thread(first.stop), asyncio.to_thread(second.stop))

    resumed = before + after
    kinds = [f["event"] for f in resumed]
    assert kinds[0] == "started" and kinds[-1] == "end"
    assert "approval_decided" in kinds and "finished" in kinds
    ids = [cursor(f) for f in resumed if f["event"] != "end"]
    assert ids == sorted(ids) and len(ids) == len(set(ids)), ids  # once each, in order
    # Progress events are the run's own record: the resumed reader saw exactly what one reader from the start
    # saw, at the same offsets (how deltas interleave with them depends on when each reader read).
    progress = [(cursor(f)[0], f["data"]["progress"]) for f in resumed if f["event"] not in ("delta", "end")]
    whole_progress = [(cursor(f)[0], f["data"]["progress"]) for f in whole if f["event"] not in ("delta", "end")]
    assert progress == whole_progress
    assert len(sink.writes()) == 1
    await eventually(lambda: "api.request" in (tmp_path / "api2.log").read_text(), "the second process's access log")
    log = (tmp_path / "api2.log").read_text()
    assert ALICE.token not in log and "order sku 7" not in log  # no tokens, no bodies


async def test_the_http_api_example_follows_a_run_through_a_dropped_connection(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, tmp_path: Path
) -> None:
    tokens = write_tokens(tmp_path / "tokens.json")
    address = dev_env.client.service_client.config.target_host
    llm.enqueue(Scripted(text="hello from the model"))
    runtime.search_attributes_ready = True
    async with run_worker(dev_env.client, runtime) as tq:
        api = await asyncio.to_thread(ServeProcess, address, tq, tokens, tmp_path / "api.log")
        try:
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "examples.http_api.follow", "--api", api.url, "--token", ALICE.token],
                cwd=ROOT,
                env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
                capture_output=True,
                text=True,
                timeout=240,
            )
        finally:
            await asyncio.to_thread(api.stop)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    lines = done.stdout.splitlines()
    assert lines[0].startswith("started: ") and lines[-1] == "output: hello from the model", done.stdout
    ids = [line.split()[1].rstrip(":") for line in lines if line.startswith("event ")]
    assert ids and len(ids) == len(set(ids)), done.stdout  # the resumed stream repeated nothing
    assert any(" finished" in line for line in lines), done.stdout


async def test_many_clients_of_one_run_on_one_process_each_get_every_event(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, tmp_path: Path
) -> None:
    """One reader per run per process: a query per client would fill the server's query buffer for the run."""
    tokens = write_tokens(tmp_path / "tokens.json")
    llm.enqueue(*[Scripted(tool_calls=[("always_fails", "{}")], delay_s=0.5) for _ in range(3)], Scripted(text="done"))
    runtime.search_attributes_ready = True
    async with (
        run_worker(dev_env.client, runtime) as tq,
        serve_app(dev_env.client, tq, tokens, store_url=runtime.settings.store_url) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60, read=120), limits=httpx.Limits()) as http,
    ):
        started = await http.post("/v1/runs", json={"task": "fail thrice"}, headers=ALICE.headers)
        assert started.status_code == 201, started.text
        wid = started.json()["workflow_id"]
        readers = [asyncio.create_task(read_events(http, f"{url}/v1/runs/{wid}/events", ALICE)) for _ in range(60)]
        fanout = app.state.api.fanout
        # All 60 follow the run through one reader in this process.
        await eventually(lambda: wid in fanout.feeds and fanout.feeds[wid].subscribers == 60, "60 subscribers")
        assert list(fanout.feeds) == [wid]
        seen = await asyncio.gather(*readers)
    assert fanout.feeds == {}  # the last subscriber gone, the reader stopped
    ids = [[f["id"] for f in frames if f["event"] != "end"] for frames in seen]
    assert all(one == ids[0] for one in ids) and len(ids[0]) == len(set(ids[0])) > 10, ids[0]
    assert [f["event"] for f in seen[0]][-2:] == ["finished", "end"]


async def test_an_sse_client_gets_the_models_text_before_the_turn_completes(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    sink: HttpSink,
    tmp_path: Path,
) -> None:
    """The client follows the run (so it listens) while the first turn waits for an approval; the next turn
    streams, and its first piece reaches the client while the fake model holds back the rest. (A worker
    keeps back as many characters as twice its longest secret until more come: the first piece is long.)"""
    tokens = write_tokens(tmp_path / "tokens.json")
    address = dev_env.client.service_client.config.target_host
    order = json.dumps({"method": "POST", "url": f"{sink.url}/orders", "json": {"sku": 9}})
    reply = "Ordered sku 9 for you; it ships tomorrow morning from the nearest warehouse."
    gate = threading.Event()
    llm.enqueue(Scripted(tool_calls=[("http_request", order)]), Scripted(text=reply, chunk_chars=45, hold=gate))
    runtime.search_attributes_ready = True
    async with run_worker(dev_env.client, runtime) as tq:
        env = {"AGENT_STORE_URL": runtime.settings.store_url, "AGENT_LOG_LEVEL": "INFO"}
        api = await asyncio.to_thread(ServeProcess, address, tq, tokens, tmp_path / "api.log", env=env)
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(60, read=90)) as http:
                started = await http.post(f"{api.url}/v1/runs", json={"task": "order sku 9"}, headers=ALICE.headers)
                assert started.status_code == 201, started.text
                wid = started.json()["workflow_id"]
                events = f"{api.url}/v1/runs/{wid}/events"
                before = await read_events(http, events, ALICE, until="approval_requested")
                approval = before[-1]["data"]["progress"]["data"]["approval_id"]
                decided = await http.post(
                    f"{api.url}/v1/approvals/{wid}/{approval}", json={"decision": "approve"}, headers=ALICE.headers
                )
                assert decided.status_code == 200, decided.text
                live = await read_events(http, events, ALICE, last_event_id=before[-1]["id"], until="delta")
                assert not gate.is_set()  # the model is still answering: the turn is open
                assert "model_answered" not in [f["event"] for f in live], live  # the second turn is open
                gate.set()
                rest = await read_events(http, events, ALICE, last_event_id=live[-1]["id"])
        finally:
            gate.set()
            await asyncio.to_thread(api.stop)
    frames = before + live + rest
    text = "".join(f["data"]["text"] for f in frames if f["event"] == "delta")
    assert text == reply  # the pieces, joined in order, once each, are the reply the transcript keeps
    # The second turn streamed (the first did too if the client was listening by the time it started).
    assert llm.requests[-1]["body"].get("stream") is True
    ids = [cursor(f) for f in frames if f["event"] != "end"]
    assert ids == sorted(ids) and len(ids) == len(set(ids)), ids
    assert frames[-1]["event"] == "end"
