"""``pending`` and ``list`` at scale: visibility queries on the ``Agent*`` search attributes, paged, counted.

A dev server of its own with the attributes registered; 60 runs through an
in-process worker and the fake LLM (answering at once): 48 answer and complete,
12 ask for an ``http_request`` POST (held for approval by the default policy),
across two tenants, one of them with a quote in its name. The commands run in
this process on a client whose visibility and query RPCs are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecution
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import Settings
from durable_agents.cli.approvals import listed_view
from durable_agents.cli.common import CliError, list_runs, query_literal
from durable_agents.cli.main import COMMANDS, build_parser, main
from durable_agents.cli.runs import list_query
from tests.conftest import TEMPORAL_CLI, WorkerFactory, start_agent
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer
from tests.test_cli_pending import waits_or_answers
from tests.waiting import eventually
from workflows.progress import COST_USD, MODEL, PENDING_APPROVALS, STATE, TENANT

ROOT = Path(__file__).resolve().parent.parent
ACME, QUOTED = "acme", "o'brien & co"  # the second tenant's quote must neither break nor extend a query
WAITING = {ACME: 7, QUOTED: 5}
DONE = {ACME: 24, QUOTED: 24}
PREFIX = {ACME: "acme", QUOTED: "obrien"}  # of the run ids
COUNTED_RPCS = (
    "list_workflow_executions",
    "count_workflow_executions",
    "query_workflow",
    "describe_workflow_execution",
    "describe_task_queue",
)


@pytest.fixture
def cache_mode() -> str:
    return "cached"


@pytest.fixture
async def indexed_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        search_attributes=[STATE, PENDING_APPROVALS, TENANT, MODEL, COST_USD],
    )
    yield env
    await env.shutdown()


@contextmanager
def counted(client: Client) -> Iterator[Counter[str]]:
    """Count the client's workflow-service RPCs of ``COUNTED_RPCS`` while inside."""
    service = client.workflow_service
    calls: Counter[str] = Counter()
    for name in COUNTED_RPCS:
        original = getattr(service, name)

        @functools.wraps(original)
        async def call(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            calls[_name] += 1
            return await _original(*args, **kwargs)

        setattr(service, name, call)
    try:
        yield calls
    finally:
        for name in COUNTED_RPCS:
            delattr(service, name)  # the class's method again


async def starter(
    client: Client, settings: Settings, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str, Counter[str]]:
    """A command run in this process on ``client``: exit code, stdout, stderr, the RPCs it made."""
    args = build_parser().parse_args(argv)
    capsys.readouterr()
    with counted(client) as calls:
        code = await COMMANDS[args.command](client, args, settings)
    out, err = capsys.readouterr()
    return code, out, err, calls


async def _count(client: Client, query: str) -> int:
    return (await client.count_workflows(query)).count


async def _until_visible(client: Client, expected: dict[str, int]) -> None:
    """Visibility lags the runs a little: wait until each query counts what it should."""

    async def counted() -> bool:
        counts = {query: await _count(client, query) for query in expected}
        assert counts == expected, counts
        return True

    await eventually(counted, "visibility counts the runs", every_s=0.2)


def _cli(address: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "TEMPORAL_ADDRESS": address}
    return subprocess.run(
        [sys.executable, str(ROOT / "starter.py"), *argv],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_pending_and_list_through_the_search_attributes(
    indexed_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = indexed_env.client
    settings = runtime.settings
    runtime.search_attributes_ready = True  # as the worker's plugin sets it on a namespace that has them
    with HttpSink() as sink:
        llm.default = waits_or_answers(sink)
        async with run_worker(client, runtime) as task_queue:
            starts = [
                start_agent(client, task_queue, id_prefix=f"wait-{PREFIX[tenant]}", task=f"wait {n}", tenant=tenant)
                for tenant, count in WAITING.items()
                for n in range(count)
            ] + [
                start_agent(client, task_queue, id_prefix=f"done-{PREFIX[tenant]}", task=f"answer {n}", tenant=tenant)
                for tenant, count in DONE.items()
                for n in range(count)
            ]
            handles = await asyncio.gather(*starts)
            waiting = {h.id for h in handles if h.id.startswith("wait-")}
            acme_waiting = {h.id for h in handles if h.id.startswith("wait-acme")}
            quoted_all = {h.id for h in handles if h.id.startswith(("wait-obrien", "done-obrien"))}
            assert len(handles) == 60 and len(waiting) == 12 and len(acme_waiting) == 7 and len(quoted_all) == 29
            await _until_visible(
                client,
                {
                    f"{PENDING_APPROVALS.name} > 0 AND ExecutionStatus = 'Running'": 12,
                    f"{STATE.name} = 'completed' AND ExecutionStatus = 'Completed'": 48,
                },
            )

            # pending: every waiting run, one visibility call, one status query each.
            code, out, err, calls = await starter(client, settings, capsys, "pending", "--json")
            assert code == 0, err
            rows = json.loads(out)
            assert {row["workflow_id"] for row in rows} == waiting and len(rows) == 12, err
            assert all(row["tool"] == "http_request" and row["args"]["method"] == "POST" for row in rows)
            assert calls["list_workflow_executions"] == 1 and calls["count_workflow_executions"] == 0, calls
            assert calls["query_workflow"] == 12 and calls["describe_workflow_execution"] == 0, calls
            assert calls["describe_task_queue"] == 1, calls  # one task queue: is anyone polling it
            assert err == ""

            code, out, err, calls = await starter(client, settings, capsys, "pending", "--limit", "5")
            assert code == 0, err
            lines = [line for line in out.splitlines() if not line.startswith(" ")]  # not the calls' lines
            assert len(lines) == 6 and {line.split()[0] for line in lines[:5]} <= waiting, out
            assert lines[5] == "... and 7 more run(s) waiting for approvals (--limit 12 shows them all)", out
            assert calls["list_workflow_executions"] == 1 and calls["query_workflow"] == 5, calls

            code, out, err, _ = await starter(client, settings, capsys, "pending", "--json", "--limit", "5")
            assert code == 0 and len(json.loads(out)) == 5
            assert err == "... and 7 more run(s) waiting for approvals (--limit 12 shows them all)\n"

            # list: the filters are a visibility query; no run is asked anything.
            code, out, err, calls = await starter(
                client, settings, capsys, "list", "--state", "waiting_approval", "--tenant", ACME, "--json"
            )
            assert code == 0, err
            listed = json.loads(out)
            assert {row["workflow_id"] for row in listed} == acme_waiting, listed
            assert {(row["status"], row["tenant"]) for row in listed} == {("waiting_approval", ACME)}
            assert calls["list_workflow_executions"] == 1 and calls["query_workflow"] == 0, calls
            assert err == ""

            code, out, err, calls = await starter(client, settings, capsys, "list", "--tenant", QUOTED, "--json")
            assert code == 0, err
            assert {row["workflow_id"] for row in json.loads(out)} == quoted_all
            injected = f"x' OR {TENANT.name} = '{ACME}"  # stays a tenant name: it matches nothing
            code, out, err, _ = await starter(client, settings, capsys, "list", "--tenant", injected, "--json")
            assert (code, json.loads(out), err) == (0, [], "")

            # list --limit 10: the first ten runs, and how many more (one page of ten, one count).
            code, out, err, calls = await starter(client, settings, capsys, "list", "--limit", "10")
            assert code == 0, err
            lines = out.splitlines()
            assert len(lines) == 11 and lines[10] == "... 10 of 60 shown; 50 more (--limit 60 shows them all)", out
            assert calls["list_workflow_executions"] == 1 and calls["count_workflow_executions"] == 1, calls
            code, out, err, _ = await starter(client, settings, capsys, "list", "--limit", "60", "--json")
            assert len(json.loads(out)) == 60 and err == ""

            # Paging itself: pages of 7 until 20 runs are in hand, all distinct, in the server's order.
            with counted(client) as calls:
                runs, total = await list_runs(client, list_query(None, None), 20, page_size=7)
            assert len({wf.id for wf in runs}) == 20 and total == 60
            everyone = [wf.id async for wf in client.list_workflows(list_query(None, None))]
            assert [wf.id for wf in runs] == everyone[:20]
            assert calls["list_workflow_executions"] == 3 and calls["count_workflow_executions"] == 1, calls
            with counted(client) as calls:
                runs, total = await list_runs(client, list_query("waiting_approval", QUOTED), 100, page_size=2)
            assert len(runs) == 5 and total == 5 and calls["count_workflow_executions"] == 0, calls

            # The real command line, once: text output of the filtered list.
            address = client.service_client.config.target_host
            shown = await asyncio.to_thread(_cli, address, "list", "--state", "waiting_approval", "--tenant", QUOTED)
            assert shown.returncode == 0 and shown.stderr == "", shown.stderr
            assert {line.split()[-1] for line in shown.stdout.splitlines()} == waiting - acme_waiting, shown.stdout
    assert sink.received == [], "nothing was approved, so nothing was sent"


def test_query_literal_keeps_quotes_and_backslashes_inside_the_string() -> None:
    assert query_literal("acme") == "'acme'"
    assert query_literal("o'brien") == "'o\\'brien'"
    assert query_literal("a\\'b") == "'a\\\\\\'b'"  # a backslash cannot escape the closing quote
    assert list_query("running", "x' OR 'a'='a") == (
        "WorkflowType = 'AgentWorkflow' AND ExecutionStatus != 'ContinuedAsNew' AND AgentState = 'running' "
        "AND ExecutionStatus = 'Running' AND AgentTenant = 'x\\' OR \\'a\\'=\\'a'"
    )


async def test_list_refuses_a_bad_state_and_an_empty_tenant(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, says in (
        (["list", "--state", "sleeping"], "argument --state: invalid choice: 'sleeping'"),
        (["list", "--tenant", " "], "argument --tenant: expected a tenant name"),
    ):
        assert await main(argv) == 2  # refused before connecting
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and says in err, err


def test_pending_limit_is_parsed() -> None:
    args = build_parser().parse_args(["pending", "--limit", "3"])
    assert isinstance(args, argparse.Namespace) and args.limit == 3 and args.workflow_id is None


async def test_a_run_that_does_not_answer_costs_seconds_and_is_named(
    indexed_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """The listing says it waits, but no worker answers its query: a warning naming it, within the deadline."""
    client = indexed_env.client
    handle = await start_agent(client, "nobody-polls", id_prefix="stuck")

    async def listing() -> list[WorkflowExecution]:  # visibility is eventually consistent
        return [wf async for wf in client.list_workflows(f"WorkflowId = {query_literal(handle.id)}")]

    [listed] = await eventually(listing, f"{handle.id} is listed", every_s=0.1)
    assert await listed_view(client, listed) is None
    err = capsys.readouterr().err
    assert err.startswith(f"warning: run {handle.id} is running but no worker answered: ") and err.count("\n") == 1


async def test_without_the_search_attributes_pending_says_so_and_list_refuses_filters(
    capsys: pytest.CaptureFixture[str], settings: Settings
) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI), data_converter=pydantic_data_converter, dev_server_log_level="error"
    )
    try:
        code, out, err, calls = await starter(env.client, settings, capsys, "pending")
        assert (code, out) == (0, "no running run waits for an approval\n"), err
        assert err.startswith("note: the namespace has no AgentPendingApprovals search attribute, so every running run")
        assert err.count("\n") == 1 and calls["list_workflow_executions"] == 2, calls  # refused, then the old way
        code, out, err, _ = await starter(env.client, settings, capsys, "list")
        assert (code, out, err) == (0, "no runs yet\n", "")
        with pytest.raises(CliError) as refused:
            await starter(env.client, settings, capsys, "list", "--state", "running")
        assert refused.value.code == 2 and "register the Agent* search attributes" in str(refused.value)
    finally:
        await env.shutdown()
