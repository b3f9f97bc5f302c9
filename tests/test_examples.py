"""The examples under ``examples/``, run for real: a Temporal dev server, worker processes, the ``temporal`` CLI.

- the custom tool and the custom provider, loaded into ``worker.py`` through
  ``AGENT_TOOL_MODULES`` / ``AGENT_PROVIDER_MODULES`` and driven by ``temporal workflow start``;
- ``ReportWorkflow`` on a worker of its own built with ``DurableAgentsPlugin`` (in this
  process), and the runnable ``examples.embed.worker`` / ``examples.embed.starter`` pair;
- misspelled extension modules and an unknown model stop ``worker.py`` before it connects;
- the "Extending" snippets of docs/tools-and-providers.md are excerpts of these files.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities import catalog
from activities.models import FatalProviderError
from activities.settings import ExtensionSettings, Settings, TemporalSettings
from activities.tools import ToolContext, ToolError, ToolRegistry
from durable_agents import DurableAgentsPlugin
from examples.custom_tool.inventory_tools import (
    ReserveArgs,
    StockArgs,
    release_reservation,
    reserve_stock,
    stock_lookup,
)
from examples.embed.workflows import Findings, Report, ReportInput, ReportWorkflow
from tests.fakes.worker_proc import ROOT, WorkerProc, free_port, wait_until
from tests.test_e2e_cli import Cli
from workflows.types import AgentResult, Message, ToolInvocation

INVENTORY = "examples.custom_tool.inventory_tools"
ECHO = "examples.custom_provider.echo_provider"
A1001 = "A-1001 (blue widget): 42 available (42 on hand, 0 reserved)"  # stock_lookup's answer on a fresh book


def example_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A worker environment with the example tool and provider loaded; nothing inherited but ``PATH``."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_TOOL_MODULES": INVENTORY,
        "AGENT_PROVIDER_MODULES": ECHO,
        "AGENT_MODEL": "echo:v1",
        "AGENT_LOG_LEVEL": "WARNING",
    }
    env.update(extra)
    return env


def run_example(module: str, *args: str, env: dict[str, str], worker: WorkerProc) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` against ``worker``: it must exit 0 without a traceback."""
    run = subprocess.run(
        [sys.executable, "-m", module, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\nworker log:\n{worker.tail()}"
    assert "Traceback" not in run.stderr, run.stderr
    return run


def wait_closed(cli: Cli, workflow_id: str, worker: WorkerProc, within_s: float = 30.0) -> None:
    """Until ``temporal workflow describe`` shows the run closed; fails at once if the worker process exits."""

    def closed() -> bool:
        assert worker.alive(), f"worker exited with {worker.proc.returncode}:\n{worker.tail()}"
        described = cli.temporal("workflow", "describe", "--workflow-id", workflow_id, "--output", "json")
        assert described.returncode == 0, described.stderr
        status: str = json.loads(described.stdout)["workflowExecutionInfo"]["status"]
        return status != "WORKFLOW_EXECUTION_STATUS_RUNNING"

    wait_until(closed, within_s, f"run {workflow_id} to close", interval=0.1)


def cli_result(cli: Cli, workflow_id: str, worker: WorkerProc) -> dict[str, object]:
    """``temporal workflow result --output json``'s ``result`` (the AgentResult as JSON)."""
    wait_closed(cli, workflow_id, worker)
    done = cli.temporal("workflow", "result", "--workflow-id", workflow_id, "--output", "json")
    assert done.returncode == 0, f"{done.stderr}\nworker log:\n{worker.tail()}"
    result = json.loads(done.stdout)
    assert result["status"] == "COMPLETED", done.stdout
    return dict(result["result"])


# --- custom tool + custom provider in worker.py, started from the Temporal CLI ---------------------------


def test_custom_tool_and_provider_from_environment_variables(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    address = dev_env.client.service_client.config.target_host
    env = example_env(
        tmp_path, TEMPORAL_ADDRESS=address, AGENT_TASK_QUEUE=f"ex-{uuid.uuid4().hex[:8]}", ECHO_PREFIX="stock bot: "
    )
    worker = WorkerProc(env, tmp_path / "worker.log")
    try:
        cli = Cli(env, address)
        runs = {
            "lookup": '{"task": "how many A-1001 are in stock?"}',
            "no-tools": '{"task": "how many A-1001 are in stock?", "tools": []}',
            "bad-model": '{"task": "hello", "model": "echo:v2"}',
        }
        ids = {name: f"ex-{name}-{uuid.uuid4().hex[:8]}" for name in runs}
        for name, input_json in runs.items():
            started = cli.start_run(ids[name], input_json)
            assert started.returncode == 0, started.stderr

        # The provider called the tool on its first turn and answered with the tool's real result;
        # its prefix came from the worker's environment through settings.variable("ECHO_PREFIX").
        lookup = cli_result(cli, ids["lookup"], worker)
        assert lookup["status"] == "completed" and lookup["steps"] == 2, lookup
        assert lookup["output"] == f"stock bot: how many A-1001 are in stock?\n- stock_lookup: {A1001}"

        # Without the tool on offer the provider only echoes.
        no_tools = cli_result(cli, ids["no-tools"], worker)
        assert no_tools["status"] == "completed" and no_tools["steps"] == 1, no_tools
        assert no_tools["output"] == "stock bot: how many A-1001 are in stock?"

        # An unknown model name is a FatalProviderError: the run fails with the provider's message.
        bad = cli_result(cli, ids["bad-model"], worker)
        assert bad["status"] == "failed" and "echo: unknown model 'v2' (available: v1)" in str(bad["output"]), bad

        history = cli.temporal("workflow", "show", "--workflow-id", ids["lookup"], "--output", "json")
        assert history.returncode == 0, history.stderr
        activities = [
            e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
            for e in json.loads(history.stdout)["events"]
            if "activityTaskScheduledEventAttributes" in e
        ]
        assert "stock_lookup" in activities  # the tool ran as its own activity
        assert worker.alive(), worker.tail()
    finally:
        code = worker.stop()
    assert code == 0, worker.tail()


# --- embedding: ReportWorkflow on the user's own worker ----------------------------------------------------


async def test_embedded_plugin_runs_agent_as_child_workflow(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    target = dev_env.client.service_client.config.target_host
    task_queue = f"embed-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        model="scripted:demo",
        store_url=str(tmp_path / "s.sqlite3"),
        state_dir=tmp_path / "agent",
        temporal=TemporalSettings(address=target, task_queue=task_queue),
    )
    plugin = DurableAgentsPlugin(settings)
    # A new client, no data_converter given: the plugin set the pydantic one.
    client = await Client.connect(target, namespace="default", plugins=[plugin])
    assert client.data_converter.payload_converter_class is PydanticPayloadConverter

    parent_id = f"report-{uuid.uuid4().hex[:8]}"
    # Only the user's workflow is passed; AgentWorkflow and its activities come from the plugin.
    async with Worker(client, task_queue=task_queue, workflows=[ReportWorkflow]):
        report = await client.execute_workflow(
            ReportWorkflow.run,
            ReportInput(topic="the weather", tools=[], typed=True),
            id=parent_id,
            task_queue=task_queue,
            execution_timeout=timedelta(seconds=60),
        )
        child = client.get_workflow_handle(f"{parent_id}-agent", result_type=AgentResult)
        agent = await child.result()
        description = await child.describe()
        parent_events = [event async for event in client.get_workflow_handle(parent_id).fetch_history_events()]

    assert isinstance(report, Report)
    assert report.agent_workflow_id == f"{parent_id}-agent"
    assert agent.status == "completed" and report.status == "completed"
    # A typed result: scripted:demo answers Findings' schema with JSON made of its usual answer.
    assert report.findings is not None and agent.output_as(Findings) == report.findings
    assert "no tools were needed" in report.findings.summary  # scripted:demo's answer when offered no tools
    assert report.findings.sources == 0
    assert report.text == f"Report on the weather:\n{report.findings.summary}"
    assert report.steps == agent.steps == 1 and report.total_tokens == agent.usage.total_tokens > 0
    assert description.workflow_type == "AgentWorkflow" and description.parent_id == parent_id
    completed = [
        e.child_workflow_execution_completed_event_attributes
        for e in parent_events
        if e.HasField("child_workflow_execution_completed_event_attributes")
    ]
    assert [(c.workflow_type.name, c.workflow_execution.workflow_id) for c in completed] == [
        ("AgentWorkflow", f"{parent_id}-agent")
    ]


def test_embed_worker_and_starter_modules(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    address = dev_env.client.service_client.config.target_host
    env = example_env(tmp_path, TEMPORAL_ADDRESS=address, EMBED_TASK_QUEUE=f"my-app-{uuid.uuid4().hex[:8]}")
    log_path = tmp_path / "embed-worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "examples.embed.worker"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:

        def polling() -> bool:
            assert worker.poll() is None, log_path.read_text()
            return b"worker polling task queue" in log_path.read_bytes()

        wait_until(polling, 30, "the embed worker to start")
        report_id = f"report-{uuid.uuid4().hex[:8]}"
        started = subprocess.run(
            [sys.executable, "-m", "examples.embed.starter", "the stock of A-1001", "--id", report_id],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert started.returncode == 0, f"{started.stderr}\nworker log:\n{log_path.read_text()}"
        report = json.loads(started.stdout)
        assert report["status"] == "completed" and report["agent_workflow_id"] == f"{report_id}-agent"
        assert report["text"] == (
            "Report on the stock of A-1001:\n"
            "echo: Write a three-line report on the stock of A-1001\n"
            f"- stock_lookup: {A1001}"
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    assert code == 0, log_path.read_text()


def test_one_file_app_runs_an_agent_as_a_child_workflow(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    # One module (a workflow, the plugin, a worker, a starter) importing durable_agents at its top: the
    # sandbox re-imports it to validate AskWorkflow and for each run, and that import must pass there.
    address = dev_env.client.service_client.config.target_host
    env = example_env(tmp_path, TEMPORAL_ADDRESS=address, AGENT_TASK_QUEUE=f"one-file-{uuid.uuid4().hex[:8]}")
    run = subprocess.run(
        [sys.executable, "-m", "examples.one_file_app", "What is the capital of France?"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Failed validating workflow" not in run.stderr, run.stderr
    assert run.returncode == 0, run.stderr
    assert run.stdout == "completed: echo: What is the capital of France?\n", (run.stdout, run.stderr)


# --- configuration errors stop worker.py before it connects ------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("AGENT_TOOL_MODULES", "examples.custom_tool.does_not_exist", "examples.custom_tool.does_not_exist"),
        ("AGENT_PROVIDER_MODULES", "no_such_provider_module", "no_such_provider_module"),
        ("AGENT_MODEL", "nope:v1", "nope:v1"),
    ],
)
def test_misconfigured_worker_exits_2_with_one_line(tmp_path: Path, variable: str, value: str, named: str) -> None:
    # Nothing listens on this address: the worker must fail on its configuration, not on the connection.
    env = example_env(tmp_path, TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}", **{variable: value})
    run = subprocess.run(
        [sys.executable, str(ROOT / "worker.py")], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and run.stdout == "", (run.stdout, run.stderr)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    line = json.loads(lines[0])
    assert line["event"] == "bad_configuration" and line["level"] == "error", line
    assert line["error"].startswith(f"{variable}:") and repr(named) in line["error"], line


def test_misconfigured_embed_worker_stops_with_one_line(tmp_path: Path) -> None:
    env = example_env(tmp_path, TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}", AGENT_TOOL_MODULES="examples.nope")
    run = subprocess.run(
        [sys.executable, "-m", "examples.embed.worker"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip() == (
        "bad configuration: AGENT_TOOL_MODULES: cannot import 'examples.nope': "
        "ModuleNotFoundError: No module named 'examples.nope'"
    )


# --- the tool module and the provider module on their own --------------------------------------------------


def context(settings: Settings, key: str) -> ToolContext:
    invocation = ToolInvocation(
        conversation_id="conv-1",
        workflow_id="wf-1",
        step=1,
        call_id=f"call-{key}",
        call_index=0,
        seq=2,
        tool="reserve_stock",
        arguments={},
        idempotency_key=key,
    )
    return ToolContext(invocation=invocation, settings=settings)


async def test_inventory_tools_register_and_reserve_once_per_key(tmp_path: Path) -> None:
    registry = ToolRegistry()
    registry.load_modules([INVENTORY])
    assert registry.names() == ["reserve_stock", "stock_lookup"]
    lookup_spec, reserve_spec = registry.get("stock_lookup"), registry.get("reserve_stock")
    assert lookup_spec is not None and not lookup_spec.side_effect
    assert reserve_spec is not None and reserve_spec.side_effect and reserve_spec.recovery == "idempotent_by_key"
    assert reserve_spec.compensate is release_reservation

    settings = Settings(state_dir=tmp_path / "state")
    first, retry = context(settings, "key-1"), context(settings, "key-1")
    assert await stock_lookup(StockArgs(sku=" a-1001 "), first) == A1001
    assert await reserve_stock(ReserveArgs(sku="A-1001", quantity=40), first) == "reserved 40 of A-1001; 2 left"
    # A retry with the same idempotency key gets the first answer and reserves nothing more.
    assert await reserve_stock(ReserveArgs(sku="A-1001", quantity=40), retry) == "reserved 40 of A-1001; 2 left"
    assert await stock_lookup(StockArgs(sku="A-1001"), first) == (
        "A-1001 (blue widget): 2 available (42 on hand, 40 reserved)"
    )
    with pytest.raises(ToolError, match="cannot reserve 3 of A-1001: only 2 available"):
        await reserve_stock(ReserveArgs(sku="A-1001", quantity=3), context(settings, "key-2"))
    with pytest.raises(ToolError, match="unknown article 'Z-9'"):
        await stock_lookup(StockArgs(sku="Z-9"), first)

    # The compensation deletes exactly this call's reservation.
    assert await release_reservation(ReserveArgs(sku="A-1001", quantity=40), first, "reserved 40") == (
        "released the reservation (reserved 40)"
    )
    assert await stock_lookup(StockArgs(sku="A-1001"), first) == A1001
    assert await release_reservation(ReserveArgs(sku="A-1001", quantity=40), first, "") == "nothing to release"


async def test_echo_provider_registers_under_its_prefix() -> None:
    settings = Settings(model="echo:v1", extensions=ExtensionSettings(provider_modules=(ECHO,)))
    registry = catalog.provider_registry(settings)
    assert registry.check_model("echo:v1") == ("echo", "v1")
    echo = registry.create("echo", settings)
    messages = [Message(role="system", content="be brief"), Message(role="user", content="check A-1001")]
    lookup_tool = [{"name": "stock_lookup", "description": "", "parameters": {}}]

    first = await echo.complete("v1", messages, lookup_tool)
    assert [(c.name, json.loads(c.arguments_json)) for c in first.tool_calls] == [("stock_lookup", {"sku": "A-1001"})]
    assert first.finish_reason == "tool_calls"
    assert (await echo.complete("v1", messages, [])).text == "echo: check A-1001"  # no tool offered: an echo
    with pytest.raises(FatalProviderError, match="unknown model 'v2'"):
        await echo.complete("v2", messages, lookup_tool)


# --- the docs' snippets are excerpts of the examples ----------------------------------------------------


def extending_snippets() -> list[tuple[str, list[str]]]:
    """``(path, lines)`` of every Python block in the docs' "Extending" section (first line ``# <path>``)."""
    readme = (ROOT / "docs" / "tools-and-providers.md").read_text()
    section = readme.split("\n## Extending\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    snippets = []
    for block in blocks:
        header, *lines = block.splitlines()
        match = re.fullmatch(r"# (examples/\S+\.py)( \(excerpt\))?", header)
        assert match, f"a docs snippet must start with '# examples/<file>.py': {header!r}"
        snippets.append((match.group(1), lines))
    return snippets


def test_readme_snippets_are_excerpts_of_the_examples() -> None:
    snippets = extending_snippets()
    assert {path for path, _ in snippets} == {
        "examples/custom_tool/inventory_tools.py",
        "examples/custom_provider/echo_provider.py",
        "examples/embed/workflows.py",
        "examples/embed/worker.py",
    }
    for path, lines in snippets:
        source = iter((ROOT / path).read_text().splitlines())
        for line in (line.rstrip() for line in lines):
            if line and line.strip() != "...":
                # Each shown line appears in the file, in order (lines may be left out, never changed).
                assert any(line == candidate for candidate in source), (
                    f"{path}: not in the file (or out of order): {line!r}"
                )


def test_memory_example_keeps_two_tenants_apart(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    address = dev_env.client.service_client.config.target_host
    env = example_env(tmp_path, TEMPORAL_ADDRESS=address, AGENT_TASK_QUEUE=f"memory-{uuid.uuid4().hex[:8]}")
    run = subprocess.run(
        [sys.executable, "-m", "examples.memory.two_tenants"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    saved_a, saved_b, recalled_a, recalled_b, asked_a, asked_b = re.split(r"\n(?=acme: |globex: )", run.stdout.strip())
    assert saved_a.startswith("acme: completed: saved memory entry"), run.stdout
    assert saved_b.startswith("globex: completed: saved memory entry"), run.stdout
    assert recalled_a.startswith("acme: completed") and "on the roof" in recalled_a, run.stdout
    assert "basement" not in recalled_a, run.stdout
    assert recalled_b.startswith("globex: completed") and "in the basement" in recalled_b, run.stdout
    assert "roof" not in recalled_b, run.stdout
    # memory.recall: auto put each tenant's own note into its context, and only that.
    assert asked_a.startswith("acme: completed: from memory:") and "on the roof" in asked_a, run.stdout
    assert "basement" not in asked_a, run.stdout
    assert asked_b.startswith("globex: completed: from memory:") and "in the basement" in asked_b, run.stdout
    assert "roof" not in asked_b, run.stdout


def test_offboarding_example_caps_a_tenant_then_forgets_it_and_keeps_the_other(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = dev_env.client.service_client.config.target_host
    env = example_env(tmp_path, TEMPORAL_ADDRESS=address, AGENT_TASK_QUEUE=f"offboarding-{uuid.uuid4().hex[:8]}")
    run = subprocess.run(
        [sys.executable, "-m", "examples.tenants.offboarding"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(": ", 1) for line in re.split(r"\n(?=[a-z ]+: )", run.stdout.strip()))
    assert lines["acme saves"].startswith("completed: saved memory entry"), run.stdout
    assert lines["acme while its session is open"].startswith("refused: tenant 'acme-"), run.stdout
    assert "has 1 open run, the most AGENT_TENANT_MAX_OPEN_RUNS=1 allows" in lines["acme while its session is open"]
    assert "channel 6" in lines["globex meanwhile"] and "channel 11" not in lines["globex meanwhile"], run.stdout
    assert lines["dry run"] == lines["forget"], run.stdout
    assert "memory_entries 1" in lines["forget"] and "runs 2" in lines["forget"], run.stdout
    assert all(count.endswith(" 0") for count in lines["again"].split(", ")), run.stdout
    assert lines["acme afterwards"] == "completed: No memory entries matched.", run.stdout
    assert "channel 6" in lines["globex afterwards"], run.stdout


def test_streaming_example_prints_a_turns_text_as_it_streams(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    address = dev_env.client.service_client.config.target_host
    env = example_env(tmp_path, TEMPORAL_ADDRESS=address, AGENT_TASK_QUEUE=f"follow-{uuid.uuid4().hex[:8]}")
    env["AGENT_STORE_URL"] = str(tmp_path / "store.sqlite3")
    run = subprocess.run(
        [sys.executable, "-m", "examples.streaming.follow"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    streamed, result, deltas = run.stdout.rstrip("\n").rsplit("\n", 2)
    assert result == f"result: completed: {streamed}", run.stdout
    assert streamed.startswith("You asked: say something. Here is a reply"), run.stdout
    assert int(deltas.removeprefix("deltas: ")) > 1, run.stdout  # it came in pieces, not as one reply
