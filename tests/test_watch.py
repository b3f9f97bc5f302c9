"""Live progress: ``durable_agents.cli.watch`` on the run's Workflow Stream, and ``starter.py watch``.

Runs go through real dev servers (one of them suggests continue-as-new after a
few dozen events), the real fake-LLM HTTP server and an HTTP sink as the tool
destination.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from durable_agents.cli.common import cli_command
from durable_agents.cli.watch import EventPrinter, watch
from tests.conftest import WorkerFactory, start_agent
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.progress import ProgressEvent
from workflows.types import AgentResult, Limits

ROOT = Path(__file__).resolve().parent.parent


def get(sink: HttpSink, path: str) -> tuple[str, str]:
    return ("http_request", json.dumps({"method": "GET", "url": f"{sink.url}{path}"}))


async def start(client: Client, task_queue: str, **fields: Any) -> str:
    fields.setdefault("task", "watch me")
    return (await start_agent(client, task_queue, id_prefix="watch", **fields)).id


async def collect(client: Client, workflow_id: str, from_offset: int = 0) -> list[tuple[int, ProgressEvent]]:
    seen: list[tuple[int, ProgressEvent]] = []
    out = io.StringIO()
    await asyncio.wait_for(
        watch(
            client,
            workflow_id,
            json_lines=True,
            from_offset=from_offset,
            on_event=lambda offset, event: seen.append((offset, event)),
            file=out,
        ),
        timeout=30,
    )
    lines = out.getvalue().splitlines()
    assert [ProgressEvent.model_validate_json(line) for line in lines] == [event for _, event in seen]
    return seen


async def test_watch_sees_a_run_in_order(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    with HttpSink() as sink:
        llm.enqueue(Scripted(tool_calls=[get(sink, "/stock")], input_tokens=11, output_tokens=4), Scripted(text="ok"))
        async with run_worker(dev_env.client, runtime) as tq:
            workflow_id = await start(dev_env.client, tq)
            seen = await collect(dev_env.client, workflow_id)
            again = await collect(dev_env.client, workflow_id, from_offset=3)  # a late subscriber, mid-stream

    kinds = [event.kind for _, event in seen]
    assert kinds == [
        "started",
        "turn_started",
        "model_answered",
        "tool_decided",
        "tool_started",
        "tool_finished",
        "turn_started",
        "model_answered",
        "finished",
    ]
    assert [offset for offset, _ in seen] == list(range(len(seen)))
    assert [event.step for _, event in seen] == [0, 1, 1, 1, 1, 1, 2, 2, 2]
    answered = seen[2][1]
    assert answered.data["input_tokens"] == 11 and answered.data["output_tokens"] == 4
    assert answered.data["tool_calls"] == ["http_request"]
    assert seen[3][1].tool == "http_request" and seen[3][1].data["verdict"] == "allow"
    assert seen[5][1].data["ok"] is True
    assert seen[-1][1].data["status"] == "completed"
    assert again == seen[3:]


async def test_watch_shows_approvals_with_the_commands(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    with HttpSink() as sink:
        post = ("http_request", json.dumps({"method": "POST", "url": f"{sink.url}/orders", "json": {"n": 1}}))
        llm.enqueue(Scripted(tool_calls=[post]), Scripted(text="ordered"))
        async with run_worker(dev_env.client, runtime) as tq:
            workflow_id = await start(dev_env.client, tq)
            out = io.StringIO()
            approved = asyncio.Event()
            deciding: list[asyncio.Task[None]] = []

            async def approve_once_shown(approval_id: str) -> None:
                # The commands are printed while the approval waits: decide once they are on the screen.
                await eventually(lambda: f"reject {workflow_id} {approval_id}" in out.getvalue(), "the commands")
                await dev_env.client.get_workflow_handle(workflow_id).signal(
                    "approve", {"approval_id": approval_id, "reviewer": "wendy"}
                )
                approved.set()

            def decide(offset: int, event: ProgressEvent) -> None:
                if event.kind == "approval_requested":
                    deciding.append(asyncio.create_task(approve_once_shown(event.data["approval_id"])))

            await asyncio.wait_for(watch(dev_env.client, workflow_id, json_lines=False, on_event=decide, file=out), 30)
            await asyncio.gather(*deciding)
            # Watched again once the run has ended: the same events, no command for what nobody waits for.
            later = io.StringIO()
            await asyncio.wait_for(watch(dev_env.client, workflow_id, json_lines=False, file=later), 30)
    assert " approval_requested: " in later.getvalue() and "approved by wendy" in later.getvalue()
    assert "reject " not in later.getvalue() and "temporal workflow signal" not in later.getvalue(), later.getvalue()
    assert approved.is_set()
    text = out.getvalue()
    lines = text.splitlines()
    [request] = [i for i, line in enumerate(lines) if " approval_requested: " in line]
    assert lines[request + 1].strip() == f"http_request POST {sink.url}/orders"  # the call it waits for, then
    commands = next(i for i in range(request, len(lines)) if cli_command(f"approve {workflow_id}") in lines[i])
    assert lines[commands].strip().startswith(cli_command(f"approve {workflow_id} ap_"))
    assert "temporal workflow signal --workflow-id" in lines[commands + 1]
    assert lines[commands + 2].strip().startswith(cli_command(f"reject {workflow_id} ap_"))
    assert any(" approval_decided: " in line and "approved by wendy" in line for line in lines), text
    assert lines[-1].endswith("finished: finished: completed")


def test_printer_renders_rich_and_plain() -> None:
    event = ProgressEvent(
        kind="model_answered",
        step=3,
        text="turn 3: openai:x answered with 0 tool call(s)",
        at="2025-01-01T12:00:00+00:00",
        data={"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.00012},
    )
    plain, rich = io.StringIO(), io.StringIO()
    EventPrinter("wf", mode="plain", file=plain)(7, event)
    EventPrinter("wf", mode="rich", file=rich)(7, event)
    assert plain.getvalue().endswith(
        "[step 3] model_answered: turn 3: openai:x answered with 0 tool call(s) · 10 in / 5 out tokens · $0.0001\n"
    )
    assert "step 3" in rich.getvalue() and "model_answered" in rich.getvalue() and "10 in / 5 out" in rich.getvalue()


# --- continue-as-new ---------------------------------------------------------------------------


def reads_until(sink: HttpSink, turns: int) -> Any:
    """A model that GETs once per turn and answers after ``turns - 1`` rounds (decided by the transcript)."""

    def reply(body: dict[str, Any]) -> Scripted:
        rounds = (len(body.get("messages", [])) - 2) // 2
        if rounds >= turns - 1:
            return Scripted(text=f"done after {rounds} reads")
        return Scripted(tool_calls=[get(sink, f"/page/{rounds}")])

    return reply


async def test_watch_follows_continue_as_new(
    can_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    turns = 8
    client = can_env.client
    with HttpSink() as sink:
        llm.default = reads_until(sink, turns)
        async with run_worker(client, runtime) as tq:
            workflow_id = await start(client, tq, limits=Limits(max_steps=50))
            first_run_id = (await client.get_workflow_handle(workflow_id).describe()).run_id
            seen = await collect(client, workflow_id)
            result = await client.get_workflow_handle(workflow_id, result_type=AgentResult).result()
            last_run_id = (await client.get_workflow_handle(workflow_id).describe()).run_id
            replayed = await collect(client, workflow_id)  # after the end: everything again, from the last run

    assert result.status == "completed" and result.steps == turns
    assert last_run_id != first_run_id, "the run should have continued as new"
    offsets = [offset for offset, _ in seen]
    assert offsets == list(range(len(seen))), "offsets strictly increasing, none missing, none twice"
    kinds = [event.kind for _, event in seen]
    assert kinds[0] == "started" and kinds.count("started") == 1
    assert kinds[-1] == "finished"
    assert "continued_as_new" in kinds
    after = kinds.index("continued_as_new")
    assert kinds[after + 1] == "turn_started", "the next run's events follow the hand-over"
    assert seen[after + 1][1].step == seen[after][1].step + 1
    turn_steps = [event.step for _, event in seen if event.kind == "turn_started"]
    assert turn_steps == list(range(1, turns + 1)), "every turn announced exactly once"
    assert len({(e.kind, e.step, e.text) for _, e in seen}) == len(seen), "no duplicates"
    assert replayed == seen


# --- the command line --------------------------------------------------------------------------


def starter(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "TEMPORAL_ADDRESS": address}
    return subprocess.run(
        [sys.executable, str(ROOT / "starter.py"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


async def test_starter_watch_prints_json_lines(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    address = dev_env.client.service_client.config.target_host
    with HttpSink() as sink:
        llm.enqueue(Scripted(tool_calls=[get(sink, "/a")]), Scripted(text="watched"))
        async with run_worker(dev_env.client, runtime) as tq:
            workflow_id = await start(dev_env.client, tq)
            live, late, missing = await asyncio.gather(
                asyncio.to_thread(starter, address, "watch", workflow_id, "--json"),
                asyncio.to_thread(starter, address, "watch", workflow_id, "--json", "--from", "6"),
                asyncio.to_thread(starter, address, "watch", "no-such-run"),
            )

    assert live.returncode == 0, live.stderr
    events = [ProgressEvent.model_validate_json(line) for line in live.stdout.splitlines()]
    assert events[0].kind == "started" and events[-1].kind == "finished"
    assert events[-1].data["status"] == "completed"
    assert [e.kind for e in events].count("tool_finished") == 1
    assert late.returncode == 0, late.stderr
    assert [ProgressEvent.model_validate_json(line) for line in late.stdout.splitlines()] == events[6:]
    assert missing.returncode == 1 and missing.stderr.strip() == "error: no run with id 'no-such-run'"
