"""What a run shows the outside: Temporal UI metadata, search attributes, traces, logs and metrics.

Everything runs against the real dev server. The UI checks read histories with
the real ``temporal`` CLI; the trace check captures spans in memory through a
replay-safe tracer provider installed once for this test process; the logs and
metrics check runs ``worker.py`` and ``starter.py`` as processes with tracing to
the console, JSON logs at DEBUG and a Prometheus endpoint.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from durable_agents import telemetry
from durable_agents.search_attributes import ensure_search_attributes
from tests.conftest import TEMPORAL_CLI
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.progress import COST_USD, MODEL, PENDING_APPROVALS, STATE, TENANT
from workflows.types import AgentInput, AgentResult, ApproveSignal, StatusView

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sk-obs-DISTINCTIVE-7f3a9c1e5b"

Handle = WorkflowHandle[AgentWorkflow, AgentResult]


def get(sink: HttpSink, path: str) -> tuple[str, str]:
    return ("http_request", json.dumps({"method": "GET", "url": f"{sink.url}{path}"}))


def post(sink: HttpSink, path: str) -> tuple[str, str]:
    return ("http_request", json.dumps({"method": "POST", "url": f"{sink.url}{path}", "json": {"qty": 1}}))


async def pending(handle: Handle) -> StatusView:
    async def view() -> StatusView | None:
        found: StatusView = await handle.query(AgentWorkflow.status)
        return found if found.pending_approvals else None

    return await eventually(view, f"{handle.id} waits for an approval")


def temporal(address: str, *args: str) -> Any:
    done = subprocess.run(
        [str(TEMPORAL_CLI), *args, "--address", address, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else []


async def listed(address: str, query: str, workflow_id: str) -> bool:
    """Whether ``temporal workflow list --query`` finds the run (visibility is eventually consistent)."""

    async def found() -> bool:
        rows = await asyncio.to_thread(temporal, address, "workflow", "list", "--query", query)
        return any(row.get("execution", {}).get("workflowId") == workflow_id for row in rows)

    return await eventually(found, f"{query} lists {workflow_id}", every_s=0.2)


def decode(payload: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(payload["data"]))


def starter_env(address: str, task_queue: str, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "TEMPORAL_ADDRESS": address, "AGENT_TASK_QUEUE": task_queue, **extra}


def starter(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "starter.py"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


# --- the Temporal UI: summaries, static details, search attributes ------------------------------


async def test_ui_metadata_and_search_attributes(
    dev_env: WorkflowEnvironment, runtime: Runtime, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    address = client.service_client.config.target_host
    runtime.search_attributes_ready = await ensure_search_attributes(client)
    assert runtime.search_attributes_ready, "the dev server lets the worker register its search attributes"
    task = "Check the stock level, then reserve one unit " + "and explain every step in detail " * 6
    workflow_id = f"obs-ui-{uuid.uuid4().hex[:8]}"
    tq = f"obs-{uuid.uuid4().hex[:8]}"
    with HttpSink() as sink:
        llm.enqueue(
            Scripted(tool_calls=[get(sink, "/stock")]),
            Scripted(tool_calls=[post(sink, "/reservations")]),
            Scripted(text="reserved"),
        )
        async with build_worker(client, runtime, task_queue=tq):
            started = await asyncio.to_thread(
                starter, starter_env(address, tq), "run", task, "--id", workflow_id, "--tenant", "acme"
            )
            assert started.returncode == 0, started.stderr
            handle: Handle = client.get_workflow_handle_for(AgentWorkflow.run, workflow_id)
            view = await pending(handle)
            assert await listed(address, f"AgentState='waiting_approval' AND WorkflowId='{workflow_id}'", workflow_id)
            waiting = (await handle.describe()).typed_search_attributes
            assert waiting.get(STATE) == "waiting_approval" and waiting.get(PENDING_APPROVALS) == 1

            await handle.signal(
                AgentWorkflow.approve, ApproveSignal(approval_id=view.pending_approvals[0].approval_id, reviewer="ui")
            )
            result = await handle.result()
            assert result.status == "completed", result
            assert await listed(address, f"AgentState='completed' AND WorkflowId='{workflow_id}'", workflow_id)
            assert await listed(address, "AgentTenant='acme' AND AgentModel='openai:test-model'", workflow_id)
            desc = await handle.describe()

    attributes = desc.typed_search_attributes
    assert attributes.get(STATE) == "completed"
    assert attributes.get(PENDING_APPROVALS) == 0
    assert attributes.get(TENANT) == "acme"
    assert attributes.get(MODEL) == "openai:test-model"
    assert attributes.get(COST_USD) == pytest.approx(result.usage.cost_usd)

    # Static summary and details, as set by `starter.py run`.
    summary = await desc.static_summary()
    assert summary is not None and len(summary) == 120 and summary.endswith("…")
    assert summary[:-1] == " ".join(task.split())[:119]
    details = await desc.static_details()
    assert details is not None
    assert "**task**" in details and "Check the stock level" in details
    assert "**model** the worker default" in details and "**limits** 20 steps" in details
    assert "**tenant** acme" in details

    # Every scheduled activity and the approval's timer carry a summary (the real CLI's history).
    history = await asyncio.to_thread(temporal, address, "workflow", "show", "--workflow-id", workflow_id)
    events = history["events"]
    scheduled = [e for e in events if e["eventType"] in ("EVENT_TYPE_ACTIVITY_TASK_SCHEDULED", "ActivityTaskScheduled")]
    timers = [e for e in events if e["eventType"] in ("EVENT_TYPE_TIMER_STARTED", "TimerStarted")]
    assert len(scheduled) >= 5, [e["eventType"] for e in events]
    summaries: dict[str, list[Any]] = {}
    for event in scheduled:
        kind = event["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        summaries.setdefault(kind, []).append(decode(event["userMetadata"]["summary"]))
    assert summaries["model"] == [
        "openai:test-model · turn 1",
        "openai:test-model · turn 2",
        "openai:test-model · turn 3",
    ]
    assert summaries["http_request"] == [
        f"http_request GET {sink.url.split('://')[1]}/stock",
        f"http_request POST {sink.url.split('://')[1]}/reservations",
    ]
    assert all(isinstance(s, str) and s for values in summaries.values() for s in values), summaries
    [timer] = timers
    assert decode(timer["userMetadata"]["summary"]) == f"approval {view.pending_approvals[0].approval_id} expires"


async def test_runs_complete_without_search_attributes(
    dev_env: WorkflowEnvironment, runtime: Runtime, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    # A namespace the worker cannot manage: one clear warning, False, and runs go on without the attributes.
    elsewhere = Client(client.service_client, namespace="no-such-namespace", data_converter=pydantic_data_converter)
    assert await ensure_search_attributes(elsewhere) is False

    runtime.search_attributes_ready = False
    llm.enqueue(Scripted(text="fine without them"))
    async with build_worker(client, runtime, task_queue=f"obs-{uuid.uuid4().hex[:8]}") as worker:
        handle = await client.start_workflow(
            AgentWorkflow.run,
            AgentInput(task="no attributes", tenant="acme"),
            id=f"obs-nosa-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
        result = await handle.result()
        desc = await handle.describe()
    assert result.status == "completed" and result.output == "fine without them"
    assert desc.typed_search_attributes.get(STATE) is None and desc.typed_search_attributes.get(TENANT) is None


# --- traces -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    """The process's one global tracer provider (replay-safe), exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = telemetry.configure_tracing("durable-agents-test", exporter=exporter)
    if provider is None:
        pytest.fail("a global tracer provider was installed before this module's")
    return exporter


def tree(found: list[ReadableSpan], root: ReadableSpan) -> dict[int, ReadableSpan]:
    """Every span of ``root``'s trace by id, asserting each one reaches ``root`` through its parents."""
    by_id = {s.context.span_id: s for s in found if s.context.trace_id == root.context.trace_id}
    for span in by_id.values():
        node = span
        while node is not root:
            assert node.parent is not None, f"{span.name} does not reach {root.name}"
            assert node.parent.span_id in by_id, f"{node.name}'s parent is missing from the trace"
            node = by_id[node.parent.span_id]
    return by_id


def child(by_id: dict[int, ReadableSpan], parent: ReadableSpan, name: str) -> list[ReadableSpan]:
    return [
        s
        for s in by_id.values()
        if s.name == name and s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


@pytest.mark.parametrize("cache", ["cached", "replay"])
async def test_one_trace_from_start_to_tool(
    dev_env: WorkflowEnvironment, runtime: Runtime, llm: FakeLLMServer, spans: InMemorySpanExporter, cache: str
) -> None:
    config = dev_env.client.config()
    client = await Client.connect(
        config["service_client"].config.target_host,
        namespace=dev_env.client.namespace,
        data_converter=pydantic_data_converter,
        plugins=telemetry.temporal_plugins(),
    )
    assert telemetry.temporal_plugins(), "tracing is on: the Temporal plugin is used"
    spans.clear()
    options: dict[str, Any] = {"max_cached_workflows": 0} if cache == "replay" else {}
    with HttpSink() as sink:
        llm.enqueue(
            Scripted(tool_calls=[get(sink, "/traced")], input_tokens=13, output_tokens=7),
            Scripted(text="the traced answer", input_tokens=21, output_tokens=3),
        )
        async with build_worker(client, runtime, task_queue=f"obs-{uuid.uuid4().hex[:8]}", **options) as worker:
            handle = await client.start_workflow(
                AgentWorkflow.run,
                AgentInput(task="a very secret task text"),
                id=f"obs-trace-{uuid.uuid4().hex[:8]}",
                task_queue=worker.task_queue,
            )
            await handle.query(AgentWorkflow.status)
            result = await handle.result()
    assert result.status == "completed"
    found = list(spans.get_finished_spans())

    [start] = [s for s in found if s.name == "StartWorkflow:AgentWorkflow"]
    by_id = tree(found, start)
    [run] = child(by_id, start, "RunWorkflow:AgentWorkflow")
    model_starts = child(by_id, run, "StartActivity:model")
    [tool_start] = child(by_id, run, "StartActivity:http_request")
    assert len(model_starts) == 2, sorted(s.name for s in by_id.values())
    chats = []
    for scheduled in model_starts:
        [attempt] = child(by_id, scheduled, "RunActivity:model")
        chats += child(by_id, attempt, "chat test-model")
    [tool_attempt] = child(by_id, tool_start, "RunActivity:http_request")
    [tool] = child(by_id, tool_attempt, "execute_tool http_request")
    assert not [s for s in found if s.name.startswith(("HandleQuery:", "QueryWorkflow:"))], "queries are not traced"

    first, second = sorted(chats, key=lambda s: s.start_time or 0)
    for span, (tokens_in, tokens_out, finish) in ((first, (13, 7, "tool_calls")), (second, (21, 3, "stop"))):
        attrs = dict(span.attributes or {})
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "openai" and attrs["gen_ai.system"] == "openai"
        assert attrs["gen_ai.request.model"] == "test-model"
        assert attrs["gen_ai.usage.input_tokens"] == tokens_in
        assert attrs["gen_ai.usage.output_tokens"] == tokens_out
        assert attrs["gen_ai.response.finish_reasons"] == (finish,)
        assert str(attrs["gen_ai.response.id"]).startswith("chatcmpl-")
        assert "agent.cost_usd" in attrs
    assert first.attributes and second.attributes
    assert first.attributes["gen_ai.response.id"] != second.attributes["gen_ai.response.id"]
    reported = [dict(s.attributes or {}).get("gen_ai.usage.input_tokens") for s in chats]
    assert sum(v for v in reported if isinstance(v, int)) == result.usage.input_tokens == 13 + 21

    tool_attrs = dict(tool.attributes or {})
    assert tool_attrs["gen_ai.operation.name"] == "execute_tool"
    assert tool_attrs["gen_ai.tool.name"] == "http_request"
    assert str(tool_attrs["gen_ai.tool.call.id"]).startswith("call_")
    assert str(tool_attrs["agent.idempotency_key"]).startswith("ik_")
    assert tool_attrs["agent.tool.outcome"] == "ok"
    assert tool_attrs["agent.policy.verdict"] == "allow"

    # No prompt or completion content anywhere in the trace.
    values = json.dumps([dict(s.attributes or {}) for s in found], default=str)
    assert "a very secret task text" not in values and "the traced answer" not in values
    # Replays (cache off) do not duplicate spans: one RunWorkflow, one StartActivity per scheduled activity.
    assert len([s for s in by_id.values() if s.name == "RunWorkflow:AgentWorkflow"]) == 1


async def test_tool_span_records_the_policy_decision(runtime: Runtime, spans: InMemorySpanExporter) -> None:
    """The decision travels in the invocation; the span shows it (values independent of the workflow)."""
    from temporalio.testing import ActivityEnvironment

    from activities.tools.activity import tool_activities
    from workflows.types import ToolInvocation

    [tool] = [a for a in tool_activities(runtime) if getattr(a, "__name__", "") == "tool_http_request"]
    spans.clear()
    invocation = ToolInvocation(
        conversation_id="c1",
        workflow_id="wf-policy",
        step=4,
        call_id="call_9",
        call_index=0,
        seq=5,
        tool="http_request",
        arguments={"method": "GET", "url": "http://10.255.255.1/never"},  # not allowed: an error result, no I/O
        idempotency_key="ik_test",
        policy_verdict="ask",
        policy_rule="ops-approves-writes",
    )
    outcome = await ActivityEnvironment().run(tool, invocation)
    assert outcome.ok is False
    [span] = [s for s in spans.get_finished_spans() if s.name == "execute_tool http_request"]
    attrs = dict(span.attributes or {})
    assert attrs["agent.policy.verdict"] == "ask" and attrs["agent.policy.rule"] == "ops-approves-writes"
    assert attrs["agent.step"] == 4 and attrs["gen_ai.tool.call.id"] == "call_9"
    assert attrs["agent.tool.outcome"] == "error"


# --- processes: JSON logs, console traces across processes, Prometheus metrics -----------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def json_objects(text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


@dataclass
class WorkerProcess:
    env: dict[str, str]
    task_queue: str
    metrics_port: int
    stderr: Path
    process: subprocess.Popen[bytes]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@pytest.fixture
def worker_process(dev_env: WorkflowEnvironment, llm: FakeLLMServer, tmp_path: Path) -> Iterator[WorkerProcess]:
    """``worker.py`` at DEBUG with a distinctive API key, console traces and a Prometheus port."""
    address = dev_env.client.service_client.config.target_host
    task_queue = f"obs-proc-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {
        **starter_env(address, task_queue),
        "AGENT_MODEL": "openai:test-model",
        "OPENAI_BASE_URL": llm.openai_url,
        "OPENAI_API_KEY": API_KEY,
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_HTTP_ALLOW": "127.0.0.1:1024-65535",
        "AGENT_LOG_LEVEL": "DEBUG",
        "AGENT_METRICS_PORT": str(port),
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "obs-worker",
    }
    stderr = tmp_path / "worker.stderr"
    with open(stderr, "w") as out:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "worker.py")], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out
        )
    worker = WorkerProcess(env, task_queue, port, stderr, process)
    try:
        yield worker
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_worker_process_logs_traces_and_metrics(
    dev_env: WorkflowEnvironment, llm: FakeLLMServer, worker_process: WorkerProcess
) -> None:
    client = dev_env.client
    address = client.service_client.config.target_host
    tq = worker_process.task_queue
    task = "Please reserve the thing; the full prompt must never be logged at INFO"
    workflow_id = f"obs-proc-{uuid.uuid4().hex[:8]}"
    with HttpSink() as sink:
        llm.enqueue(
            Scripted(tool_calls=[get(sink, "/stock")], input_tokens=17, output_tokens=2),
            Scripted(tool_calls=[post(sink, "/reserve")]),
            Scripted(text="reserved it"),
        )
        try:
            started = await asyncio.to_thread(
                starter, starter_env(address, tq, OTEL_TRACES_EXPORTER="console"), "run", task, "--id", workflow_id
            )
            assert started.returncode == 0, started.stderr
            handle: Handle = client.get_workflow_handle_for(AgentWorkflow.run, workflow_id)
            view = await pending(handle)
            await handle.signal(
                AgentWorkflow.approve, ApproveSignal(approval_id=view.pending_approvals[0].approval_id, reviewer="ops")
            )
            result = await handle.result()
            run_id = (await handle.describe()).run_id
            metrics = await asyncio.to_thread(scrape, worker_process.metrics_port)
        finally:
            code = await asyncio.to_thread(worker_process.stop)
    output = worker_process.stderr.read_text()
    assert code == 0, output[-3000:]
    assert result.status == "completed", result

    # Logs: JSON lines bound to the run; the key appears nowhere, the task not at INFO.
    assert API_KEY not in output and API_KEY not in started.stderr
    records = [r for r in json_objects(output) if "event" in r and "level" in r]
    model_lines = [r for r in records if r["event"] == "model_answered"]
    assert len(model_lines) == 3
    for record in model_lines:
        assert record["workflow_id"] == workflow_id and record["run_id"] == run_id
        assert record["activity"] == "model" and record["attempt"] == 1 and record["step"] == record["turn"]
    assert model_lines[0]["input_tokens"] == 17 and model_lines[0]["step"] == 1
    tool_lines = [r for r in records if r["event"] == "tool_finished"]
    assert [(r["tool"], r["step"], r["attempt"], r["outcome"]) for r in tool_lines] == [
        ("http_request", 1, 1, "ok"),
        ("http_request", 2, 1, "ok"),
    ]
    assert all(r["workflow_id"] == workflow_id and r["run_id"] == run_id for r in tool_lines)
    [requested] = [r for r in records if str(r["event"]).startswith("approval ") and "requested" in r["event"]]
    assert requested["workflow_id"] == workflow_id and requested["run_id"] == run_id
    assert requested["logger"] == "temporalio.workflow" and requested["workflow_type"] == "AgentWorkflow"
    assert "({" not in requested["event"], "the ids are fields, not appended to the message"
    assert not [r for r in records if r["level"] in ("info", "warning", "error") and task in json.dumps(r)]
    assert any(r["level"] == "debug" for r in records), "the DEBUG level was on"

    # Traces: the starter's StartWorkflow span and the worker's spans share one trace.
    spans_out = [r for r in json_objects(output) if "context" in r and "name" in r]
    starter_spans = [r for r in json_objects(started.stderr) if "context" in r and "name" in r]
    [start] = [s for s in starter_spans if s["name"] == "StartWorkflow:AgentWorkflow"]
    trace_id = start["context"]["trace_id"]
    names = {s["name"] for s in spans_out if s["context"]["trace_id"] == trace_id}
    assert {"RunWorkflow:AgentWorkflow", "RunActivity:model", "chat test-model", "execute_tool http_request"} <= names
    assert all(s["resource"]["attributes"]["service.name"] == "obs-worker" for s in spans_out)
    assert API_KEY not in json.dumps(spans_out)

    # Metrics: the SDK's and ours, for Prometheus.
    assert "temporal_workflow_completed" in metrics and "temporal_activity_execution_latency" in metrics
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("agent_") and tq in line
    }
    tokens_in = [v for k, v in samples.items() if k.startswith("agent_model_tokens{") and 'token_type="input"' in k]
    assert tokens_in == [result.usage.input_tokens] == [17 + 10 + 10]
    tool_calls = [v for k, v in samples.items() if k.startswith("agent_tool_calls{") and 'outcome="ok"' in k]
    assert sum(tool_calls) == 2
    assert any(k.startswith("agent_model_cost_microusd{") for k in samples)
