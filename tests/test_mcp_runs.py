"""MCP tools in whole runs: results, validation, timeouts, per-run servers, run input, policy, names.

Every run goes through an in-process worker on the real Temporal dev server with a scripted model;
the servers are real (server-everything from npm over Streamable HTTP, mcp-server-time from PyPI,
the SDK-built shop in ``tests.fakes.mcp_orders``). What the shop did is read from its own ledger.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.mcp.catalog import MAX_NAME_CHARS, model_name
from activities.settings import Settings
from durable_agents.cli.watch import watch
from tests.conftest import WorkerFactory, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.mcp_servers import everything_http, free_port, read_ledger, url
from tests.scenarios import pending_view
from tests.test_mcp import ALLOW_SHOP, ROOT, TIME_SERVER, mcp_events, mcp_runtime, offered, orders_stdio, tool_messages
from workflows.agent import AgentWorkflow
from workflows.progress import ProgressEvent
from workflows.types import AgentResult, ApproveSignal

SHOP_TOOLS = {
    f"mcp__shop__{t}"
    for t in ("lookup_order", "place_order", "slow_order", "chart", "big_report", "always_fails", "show_env")
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MODEL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
RUN_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def everything() -> Iterator[str]:
    """One server-everything on Streamable HTTP for the module (each worker opens its own session)."""
    port = free_port()
    with everything_http(port):
        yield url(port)


async def finish(handle: WorkflowHandle[Any, AgentResult]) -> AgentResult:
    return await asyncio.wait_for(handle.result(), RUN_TIMEOUT_S)


async def approve(handle: WorkflowHandle[Any, Any], approval_id: str) -> None:
    await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=approval_id, reviewer="al"))


def call(name: str, **arguments: Any) -> tuple[str, str]:
    return (name, json.dumps(arguments))


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie nobody reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def progress(client: Client, workflow_id: str) -> list[ProgressEvent]:
    """Every progress event of a (finished) run, from its Workflow Stream."""
    seen: list[ProgressEvent] = []
    await asyncio.wait_for(
        watch(
            client,
            workflow_id,
            json_lines=True,
            on_event=lambda _offset, event: seen.append(event),
            file=io.StringIO(),
        ),
        timeout=30,
    )
    return seen


# --- 1. the real third-party server over Streamable HTTP ----------------------------------


async def test_server_everything_over_http_reads_run_at_once_and_writes_wait_for_approval(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    tmp_path: Path,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    everything: str,
) -> None:
    runtime = mcp_runtime(settings, tmp_path, {"ev": {"url": everything}})
    llm.enqueue(
        Scripted(tool_calls=[call("mcp__ev__echo", message="hello from the run")]),
        Scripted(tool_calls=[call("mcp__ev__toggle-simulated-logging")]),
        Scripted(text="done"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(
                dev_env.client, tq, id_prefix="mcp-ev", tools=["mcp__ev__echo", "mcp__ev__toggle-simulated-logging"]
            )
            view = await pending_view(handle)
            [approval] = view.pending_approvals
            assert approval.tool == "mcp__ev__toggle-simulated-logging"
            assert approval.rule == "default:side-effect"
            # The read-only echo ran without anyone asked; the write has not run yet.
            assert tool_messages(llm, 1) == ["Echo: hello from the run"]
            assert [e for e in await mcp_events(handle) if e[0] == "mcp"] == [("mcp", "mcp ev.echo")]
            await approve(handle, approval.approval_id)
            result = await finish(handle)
        entries = await runtime.store.ledger(handle.id)
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    answer = tool_messages(llm, 2)[-1]
    assert answer.startswith("Started simulated, random-leveled logging"), answer
    calls = [e for e in await mcp_events(handle) if e[0] == "mcp"]
    assert calls == [("mcp", "mcp ev.echo"), ("mcp", "mcp ev.toggle-simulated-logging")]
    [entry] = entries  # only the side effect is ledgered, once
    assert entry.state == "done"


# --- 2. results: images, long text, errors -------------------------------------------------


async def test_images_and_long_results_go_to_the_blob_store_and_tool_errors_reach_the_model(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    tmp_path: Path,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    everything: str,
) -> None:
    ledger = tmp_path / "orders.jsonl"
    servers = {"shop": orders_stdio(ledger, max_result_chars=5000), "ev": {"url": everything}}
    runtime = mcp_runtime(settings, tmp_path, servers)
    llm.enqueue(
        Scripted(
            tool_calls=[
                call("mcp__shop__chart"),
                call("mcp__shop__big_report", kb=200),
                call("mcp__shop__always_fails"),
                call("mcp__ev__get-tiny-image"),
            ]
        ),
        Scripted(text="seen it all"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(
                dev_env.client,
                tq,
                id_prefix="mcp-results",
                tools=["mcp__shop__chart", "mcp__shop__big_report", "mcp__shop__always_fails", "mcp__ev__*"],
            )
            result = await finish(handle)
        chart, report, failed, tiny = tool_messages(llm, 1)
        chart_digest = DIGEST.search(chart)
        report_digest = DIGEST.search(report[-400:])
        tiny_digest = DIGEST.search(tiny)
        assert chart_digest and report_digest and tiny_digest, (chart, report[-400:], tiny)
        chart_png = await runtime.store.get_blob(chart_digest.group())
        whole_report = await runtime.store.get_blob(report_digest.group())
        tiny_png = await runtime.store.get_blob(tiny_digest.group())
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output

    assert "image/png" in chart and "sales by quarter" in chart
    assert chart_png is not None and chart_png.startswith(PNG_SIGNATURE)
    assert f"{len(chart_png)} bytes" in chart

    assert len(report) <= 5200, len(report)
    assert report.startswith("report line: all orders nominal")
    assert "stored in the run store" in report[-400:]
    assert whole_report is not None and len(whole_report) == 200 * 1024
    assert whole_report.decode().startswith(report[:4000])

    assert failed.startswith("Error:"), failed
    assert "the order database is unavailable" in failed

    assert "image/png" in tiny
    assert tiny_png is not None and tiny_png.startswith(PNG_SIGNATURE)
    assert f"{len(tiny_png)} bytes" in tiny
    assert read_ledger(ledger) == []


# --- 3. arguments are checked against the snapshot's schema --------------------------------


async def test_arguments_that_do_not_fit_the_schema_are_an_error_for_the_model_not_a_call(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    ledger = tmp_path / "orders.jsonl"
    runtime = mcp_runtime(settings, tmp_path, {"shop": orders_stdio(ledger)})
    llm.enqueue(
        Scripted(
            tool_calls=[
                ("mcp__shop__place_order", json.dumps({"item": 5})),
                ("mcp__shop__place_order", '{"item": "mug", "quantity": '),
                ("mcp__shop__place_order", "[1, 2]"),
            ]
        ),
        Scripted(text="I will fix my arguments"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(dev_env.client, tq, id_prefix="mcp-schema", tools=["mcp__shop__place_order"])
            result = await finish(handle)  # nobody approves anything: no approval may be asked
        entries = await runtime.store.ledger(handle.id)
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    wrong_type, bad_json, not_object = tool_messages(llm, 1)
    assert wrong_type.startswith("Error: invalid arguments for mcp__shop__place_order"), wrong_type
    assert "item" in wrong_type and "quantity" in wrong_type
    assert bad_json.startswith("Error: arguments for mcp__shop__place_order are not valid JSON"), bad_json
    assert not_object.startswith("Error:") and "JSON object" in not_object, not_object
    assert read_ledger(ledger) == []
    assert entries == []
    assert [e for e in await mcp_events(handle) if e[0] == "mcp"] == []


# --- 4. a call that takes longer than the server's timeout ---------------------------------


async def test_a_read_only_call_over_its_timeout_is_an_error_naming_the_timeout(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    tmp_path: Path,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    everything: str,
) -> None:
    runtime = mcp_runtime(settings, tmp_path, {"ev": {"url": everything, "timeout_s": 2}})
    llm.enqueue(
        Scripted(tool_calls=[call("mcp__ev__trigger-long-running-operation", duration=10, steps=2)]),
        Scripted(text="too slow"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(
                dev_env.client, tq, id_prefix="mcp-timeout", tools=["mcp__ev__trigger-long-running-operation"]
            )
            result = await finish(handle)
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    [answer] = tool_messages(llm, 1)
    assert answer.startswith("Error:"), answer
    assert "did not answer within 2 s" in answer and "trigger-long-running-operation" in answer


async def test_a_stdio_call_over_its_timeout_is_an_error_and_the_server_still_answers_after(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    ledger = tmp_path / "orders.jsonl"
    shop = orders_stdio(ledger, timeout_s=2, tools={"slow_order": {"read_only": True}})
    runtime = mcp_runtime(settings, tmp_path, {"shop": shop})
    llm.enqueue(
        Scripted(tool_calls=[call("mcp__shop__slow_order", item="anvil", seconds=10)]),
        Scripted(tool_calls=[call("mcp__shop__lookup_order", order_id="C-3")]),
        Scripted(text="too slow"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(
                dev_env.client,
                tq,
                id_prefix="mcp-timeout-stdio",
                tools=["mcp__shop__slow_order", "mcp__shop__lookup_order"],
            )
            result = await finish(handle)
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    timed_out, looked_up = tool_messages(llm, 2)
    assert timed_out.startswith("Error:") and "did not answer within 2 s" in timed_out, timed_out
    assert "shop.slow_order" in timed_out
    assert looked_up == "order C-3: 1 x widget, shipped"
    # read_only made it a direct call: no ledger claim, and the shop never finished it
    assert [e.get("event") for e in read_ledger(ledger)] == ["started"]


# --- 5. per-run servers: a start that fails at call time, and cleanup -----------------------

FAILING_WRAPPER = (
    "import os, runpy, sys\n"
    "if os.path.exists(os.environ['SHOP_FAIL_FLAG']):\n"
    "    sys.exit(3)\n"
    "runpy.run_module('tests.fakes.mcp_orders', run_name='__main__')\n"
)


async def test_a_per_run_server_that_cannot_start_at_call_time_is_an_error_for_the_model(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    ledger, flag = tmp_path / "orders.jsonl", tmp_path / "fail-now"
    shop = {
        "command": sys.executable,
        "args": ["-c", FAILING_WRAPPER],
        "cwd": str(ROOT),
        "env": {"ORDERS_LEDGER": str(ledger), "SHOP_FAIL_FLAG": str(flag)},
        "per_run": True,
    }
    runtime = mcp_runtime(settings, tmp_path, {"shop": shop})

    def model(body: dict[str, Any]) -> Scripted:
        if not flag.exists():  # the first request: the run has started, its tools were listed
            flag.touch()
            return Scripted(tool_calls=[call("mcp__shop__lookup_order", order_id="A-1")])
        return Scripted(text="the shop is down")

    llm.default = model
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(dev_env.client, tq, id_prefix="mcp-nostart", tools=["mcp__shop__lookup_order"])
            result = await finish(handle)
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    [answer] = tool_messages(llm, 1)
    assert answer.startswith("Error: MCP server 'shop' could not be started"), answer
    assert ("mcp_release", "stop per-run MCP servers shop") in await mcp_events(handle)


async def test_a_per_run_server_is_stopped_when_its_run_ends(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    ledger = tmp_path / "orders.jsonl"
    runtime = mcp_runtime(settings, tmp_path, {"shop": orders_stdio(ledger, per_run=True)}, policy=ALLOW_SHOP)
    llm.enqueue(
        Scripted(tool_calls=[call("mcp__shop__place_order", item="mug", quantity=1)]),
        Scripted(text="ordered"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(dev_env.client, tq, id_prefix="mcp-perrun", tools=["mcp__shop__place_order"])
            result = await finish(handle)
            running = runtime.mcp.running()  # before the worker (and its pool) stops
            [delivery] = read_ledger(ledger)
            for _ in range(100):  # the release closes the process within CLOSE_TIMEOUT_S
                if not alive(delivery["pid"]):
                    break
                await asyncio.sleep(0.05)
            still_alive = alive(delivery["pid"])
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    assert delivery["item"] == "mug"
    assert ("mcp_release", "stop per-run MCP servers shop") in await mcp_events(handle)
    assert [key for key in running if key[1]] == [], running
    assert not still_alive, f"the run's shop server (pid {delivery['pid']}) is still running"


# --- 6. the run's tools input --------------------------------------------------------------


async def test_a_server_glob_offers_exactly_that_servers_tools_and_unknown_mcp_tools_fail_the_run(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    runtime = mcp_runtime(settings, tmp_path, {"shop": orders_stdio(tmp_path / "orders.jsonl")})
    llm.enqueue(Scripted(text="looked"))
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            glob = await start_agent(dev_env.client, tq, id_prefix="mcp-glob", tools=["mcp__shop__*"])
            result = await finish(glob)
            failures = {}
            for name in ("mcp__shop__nope", "mcp__ghost__x"):
                handle = await start_agent(dev_env.client, tq, id_prefix="mcp-unknown", tools=[name])
                with pytest.raises(WorkflowFailureError) as failure:
                    await asyncio.wait_for(handle.result(), RUN_TIMEOUT_S)
                failures[name] = str(failure.value.cause)
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    assert set(offered(llm)) == SHOP_TOOLS
    assert len(llm.requests) == 1  # the failed runs never reached the model
    for name, message in failures.items():
        assert f"unknown MCP tool {name!r}" in message, message


async def test_a_broken_server_does_not_stop_a_run_that_enables_every_tool(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    servers = {
        "shop": orders_stdio(tmp_path / "orders.jsonl"),
        "broken": {"command": sys.executable, "args": ["-c", "raise SystemExit(1)"]},
    }
    runtime = mcp_runtime(settings, tmp_path, servers)
    llm.enqueue(Scripted(tool_calls=[call("mcp__shop__lookup_order", order_id="B-2")]), Scripted(text="fine"))
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(dev_env.client, tq, id_prefix="mcp-broken")  # tools=None: everything
            result = await finish(handle)
            events = await progress(dev_env.client, handle.id)
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    tools = set(offered(llm))
    assert tools >= SHOP_TOOLS
    assert not any(name.startswith("mcp__broken__") for name in tools)
    assert "read_file" in tools  # builtins too: tools=None enables everything
    assert tool_messages(llm, 1) == ["order B-2: 1 x widget, shipped"]
    started = events[0]
    assert started.kind == "started"
    assert "MCP server 'broken'" in started.text and "not available to this run" in started.text, started.text


# --- 7. the operator's policy on MCP tools -------------------------------------------------


async def test_operator_policy_rules_deny_and_ask_for_mcp_tools(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    ledger = tmp_path / "orders.jsonl"
    policy = {
        "rules": [
            {"tool": "mcp__shop__place_order", "when": {"item": "^piano$"}, "decision": "deny", "name": "no-pianos"},
            {"tool": "mcp__time__*", "decision": "ask"},
        ]
    }
    servers = {"shop": orders_stdio(ledger), "time": {"command": TIME_SERVER}}
    runtime = mcp_runtime(settings, tmp_path, servers, policy=policy)
    llm.enqueue(
        Scripted(
            tool_calls=[
                call("mcp__shop__place_order", item="piano", quantity=1),
                call("mcp__shop__place_order", item="mug", quantity=3),
            ]
        ),
        Scripted(tool_calls=[call("mcp__time__get_current_time", timezone="UTC")]),
        Scripted(text="done"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(
                dev_env.client, tq, id_prefix="mcp-policy", tools=["mcp__shop__place_order", "mcp__time__*"]
            )
            view = await pending_view(handle)
            [mug] = view.pending_approvals
            assert mug.tool == "mcp__shop__place_order" and mug.args == {"item": "mug", "quantity": 3}
            assert mug.rule == "default:side-effect"
            await approve(handle, mug.approval_id)
            for _ in range(400):  # the mug's approval is gone; the time tool's comes
                view = await handle.query(AgentWorkflow.status)
                if [p.tool for p in view.pending_approvals] == ["mcp__time__get_current_time"]:
                    break
                await asyncio.sleep(0.05)
            [clock] = view.pending_approvals
            assert clock.tool == "mcp__time__get_current_time" and clock.rule == "operator#2"
            await approve(handle, clock.approval_id)
            result = await finish(handle)
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    piano, mug_answer = tool_messages(llm, 1)
    assert piano.startswith("Error: policy denied mcp__shop__place_order") and "no-pianos" in piano, piano
    assert mug_answer == "placed order: 3 x mug"
    assert [(e["item"], e["quantity"]) for e in read_ledger(ledger)] == [("mug", 3)]
    reported = json.loads(tool_messages(llm, 2)[-1])
    assert reported["timezone"] == "UTC"


# --- 8. model-facing names -----------------------------------------------------------------


def test_model_names_are_what_model_apis_accept_and_never_collide() -> None:
    tools = [
        "get-sum",
        "a.b/c",
        "a_b_c",
        "a b c",
        "x" * 100,
        "x" * 100 + "y",
        "ünïcode",
        "",
        "mcp__s__a_b_c",
    ]
    taken: set[str] = set()
    names = []
    for tool in tools:
        name = model_name("s", tool, taken)
        taken.add(name)
        names.append(name)
    assert names[0] == "mcp__s__get-sum"
    assert names[1] == "mcp__s__a_b_c"  # the first one keeps the readable name
    for tool, name in zip(tools, names, strict=True):
        assert MODEL_NAME.match(name), (tool, name)
        assert name.startswith("mcp__s__")
    assert len(set(names)) == len(names), names
    assert len(names[4]) == MAX_NAME_CHARS


def test_model_names_stay_unique_when_a_shortened_name_is_already_taken() -> None:
    """A tool whose own name is what another tool's shortened name would be, listed first."""
    long_name = "x" * 100
    first = model_name("s", long_name, set())
    # A server may well offer a tool literally named like that (it is a valid tool name).
    squatter = first.removeprefix("mcp__s__")
    taken: set[str] = set()
    names = []
    for tool in (squatter, long_name):
        name = model_name("s", tool, taken)
        taken.add(name)
        names.append(name)
    assert all(MODEL_NAME.match(n) for n in names), names
    assert len(set(names)) == 2, f"{squatter!r} and {long_name[:10]}... both became {names[0]!r}"
