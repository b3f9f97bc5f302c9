"""``starter.py eval`` end to end: models compared side by side, a failing check (exit 1, the case and the
reason named), a judge's grade in the JSON report, approvals decided by each case, the example dataset,
and an eval that survives its worker being killed halfway without running a finished case again.

Real dev server; the CLI runs as a subprocess (in a thread: an in-process worker answers on this test's
event loop). The models are the test providers of ``tests/fakes/eval_providers.py``; the kill test runs
``worker.py`` subprocesses (``tests/fakes/worker_proc.py``) that share one SQLite run store.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from activities.runtime import Runtime
from activities.settings import ExtensionSettings
from durable_agents.cli.eval import eval_id, load_dataset
from tests.conftest import TEST_TOOLS, WorkerFactory, replay_task_queue, require_bwrap
from tests.fakes import eval_providers
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer
from tests.fakes.worker_proc import WorkerProc, worker_env, write_policy
from tests.test_cli_sessions import Cli
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.eval import EvalWorkflow

ROOT = Path(__file__).resolve().parent.parent
PROVIDERS = "tests.fakes.eval_providers"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


@pytest.fixture
def cache_mode() -> str:
    return "cached"


@pytest.fixture
def eval_runtime(runtime: Runtime) -> Runtime:
    """The test runtime with the eval providers loaded and ``evalgood:v1`` as the worker's default model."""
    extensions = ExtensionSettings(tool_modules=(TEST_TOOLS,), provider_modules=(PROVIDERS,))
    return Runtime.from_settings(replace(runtime.settings, model="evalgood:v1", extensions=extensions))


def dataset(path: Path, *cases: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(case) + "\n" for case in cases))
    return path


def eval_cli(client: Client, task_queue: str) -> Cli:
    cli = Cli(client, task_queue)
    cli.env["AGENT_PROVIDER_MODULES"] = PROVIDERS  # --model and judge names are checked against these
    return cli


def calls_of(provider: str) -> list[str]:
    return [task for name, task in eval_providers.CALLS if name == provider]


async def test_two_models_side_by_side_a_failing_check_exits_1_and_the_judges_grade_is_reported(
    dev_env: WorkflowEnvironment, eval_runtime: Runtime, run_worker: WorkerFactory, tmp_path: Path
) -> None:
    cases = dataset(
        tmp_path / "cases.jsonl",
        {
            "name": "answer",
            "input": {"task": "what is six times seven?", "tools": []},
            "checks": {"output_matches": r"\b42\b", "max_steps": 1},
        },
        {
            "name": "as-json",
            "input": {"task": "six times seven, as json", "tools": []},
            "checks": {"output_json_schema": SCHEMA},
        },
        {
            "name": "judged",
            "input": {"task": "what is the answer?", "tools": []},
            "checks": {"judge": {"model": "judge:v1", "rubric": "The answer must name 42."}},
        },
    )
    out = tmp_path / "report.json"
    eval_providers.CALLS.clear()
    async with run_worker(dev_env.client, eval_runtime) as tq:
        cli = eval_cli(dev_env.client, tq)
        args = ("eval", str(cases), "--model", "evalgood:v1", "--model", "evalbad:v1", "--json", str(out))
        done = await cli(*args)
        assert done.returncode == 1, done
        lines = done.stdout.splitlines()
        assert "evalgood:v1  3/3 (100%)" in done.stdout, done.stdout
        assert "evalbad:v1   0/3 (0%)" in done.stdout, done.stdout
        assert [line.rstrip() for line in lines if line.startswith(("case ", "answer "))] == [
            "case     evalgood:v1  evalbad:v1",
            "answer   pass         FAIL",
        ], done.stdout
        assert "  FAIL answer run 1 with evalbad:v1: output_matches: /\\b42\\b/ not found in 'I do not know'" in lines
        assert (
            "  FAIL as-json run 1 with evalbad:v1: output_json_schema: the output does not match the schema: "
            "$.answer: 'many' is not of type 'integer'"
        ) in lines, done.stdout
        assert "  FAIL judged run 1 with evalbad:v1: judge (judge:v1, score 0.10): the answer does not name 42" in lines
        assert not any("with evalgood:v1" in line for line in lines if line.startswith("  FAIL")), done.stdout

        report = json.loads(out.read_text())
        assert [m["pass_rate"] for m in report["models"]] == [1.0, 0.0]
        judged = {r["model"]: r for r in report["results"] if r["case"] == "judged"}
        assert judged["evalgood:v1"]["judge"] == {
            "model": "judge:v1",
            "passed": True,
            "score": 0.9,
            "reason": "the answer names 42",
            "cost_usd": 0.0,
            "answered": True,
        }
        assert judged["evalbad:v1"]["judge"]["passed"] is False and judged["evalbad:v1"]["judge"]["score"] == 0.1
        first = report["results"][0]
        assert (first["case"], first["model"], first["status"], first["output"]) == (
            "answer",
            "evalgood:v1",
            "completed",
            "the answer is 42",
        )
        assert first["passed"] and first["steps"] == 1 and first["seconds"] > 0
        assert [(c["check"], c["passed"]) for c in first["checks"]] == [
            ("run", True),
            ("output_matches", True),
            ("max_steps", True),
        ]
        assert (len(calls_of("evalgood")), len(calls_of("evalbad")), len(calls_of("judge"))) == (3, 3, 2)

        # The same command again: the finished eval's report, nothing run again.
        again = await cli(*args)
        assert again.returncode == 1 and "has finished: attaching" in again.stderr, again
        assert again.stdout == done.stdout
        assert (len(calls_of("evalgood")), len(calls_of("evalbad")), len(calls_of("judge"))) == (3, 3, 2)
    assert await replay_task_queue(dev_env.client, tq, workflows=(AgentWorkflow, EvalWorkflow)) == 7


async def test_approvals_are_decided_by_each_case_and_all_passing_exits_0(
    dev_env: WorkflowEnvironment, eval_runtime: Runtime, run_worker: WorkerFactory, tmp_path: Path
) -> None:
    posted = {"name": "http_request", "args": {"method": "POST", "json": {"n": 1}}}
    with HttpSink() as sink:

        def case(name: str, approve: Any, expect: str, **input: Any) -> dict[str, Any]:
            task = {"task": f"POST {sink.url}/orders/{name}", "tools": ["http_request"], **input}
            checks = {"output_matches": expect, "tools_called": [posted]}
            return {"name": name, "input": task, "checks": checks, **({"approve": approve} if approve else {})}

        cases = dataset(
            tmp_path / "approvals.jsonl",
            case("all", "all", "^posted: "),
            case("by-name", ["http_request"], "^posted: "),
            case("other-name", ["write_file"], "^not posted: .*rejected by eval"),
            case("default", None, "^not posted: .*rejected by eval"),
            case("approvers", "all", "^posted: ", approvers=["alice"]),
        )
        async with run_worker(dev_env.client, eval_runtime) as tq:
            done = await eval_cli(dev_env.client, tq)("eval", str(cases), "--concurrency", "5")
        assert done.returncode == 0, done
        assert "(each case's model)  5/5 (100%)" in done.stdout, done.stdout
        assert "failures:" not in done.stdout
        assert sorted(r.path for r in sink.writes()) == ["/orders/all", "/orders/approvers", "/orders/by-name"]


async def test_the_example_dataset_passes_with_the_scripted_model(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, tmp_path: Path
) -> None:
    require_bwrap()
    out = tmp_path / "example.json"
    async with run_worker(dev_env.client, runtime) as tq:
        done = await Cli(dev_env.client, tq)("eval", "examples/evals/dataset.jsonl", "--json", str(out))
    assert done.returncode == 0, done
    report = json.loads(out.read_text())
    assert [r["case"] for r in report["results"]] == [
        "prime-stats",
        "no-tools-needed",
        "reservation-rejected",
        "reservation-approved",
    ]
    assert all(r["passed"] for r in report["results"]), report


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def status_of(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    try:
        return (await client.get_workflow_handle(workflow_id).describe()).status
    except RPCError:
        return None


async def test_killing_the_worker_halfway_finishes_without_running_finished_cases_again(
    dev_env: WorkflowEnvironment, llm: FakeLLMServer, tmp_path: Path
) -> None:
    client = dev_env.client
    queue = f"evals-kill-{tmp_path.name[-8:]}"
    calls, gate = tmp_path / "calls.txt", tmp_path / "gate"
    env = worker_env(
        address=client.service_client.config.target_host,
        task_queue=queue,
        llm_url=llm.openai_url,
        state_dir=tmp_path / "state",
        policy_file=write_policy(tmp_path / "policy.json"),
        AGENT_MODEL="evalgate:v1",
        AGENT_PROVIDER_MODULES=PROVIDERS,
        EVAL_CALLS_FILE=str(calls),
        EVAL_GATE_FILE=str(gate),
    )
    tasks = ["case one", "case two", "case three: hold", "case four"]
    cases = dataset(
        tmp_path / "kill.jsonl",
        *(
            {"name": f"c{i}", "input": {"task": task, "tools": []}, "checks": {"output_matches": "42"}}
            for i, task in enumerate(tasks, 1)
        ),
    )
    workflow_id = eval_id(load_dataset(cases), [], 1, queue)
    child = {i: f"{workflow_id}/c{i}/m1r1" for i in range(1, 5)}
    cli = Cli(client, queue)
    first = WorkerProc(env, tmp_path / "worker-1.log")
    second: WorkerProc | None = None
    try:
        await first.async_wait_ready()
        command = cli.popen("eval", str(cases), "--concurrency", "1")
        # Cases 1 and 2 have finished, case 3's model call holds at the gate: kill the worker there.
        await eventually(lambda: "evalgate case three: hold" in lines_of(calls), "case 3's model call")
        for i in (1, 2):
            assert await status_of(client, child[i]) == WorkflowExecutionStatus.COMPLETED
        assert await status_of(client, child[4]) is None  # not started: concurrency 1
        first.kill()
        command.send_signal(signal.SIGINT)  # the command goes; the eval goes on
        _, stderr = command.communicate(timeout=60)
        assert command.returncode == 130 and "attach again with: " in stderr, stderr
        assert f"starter.py eval {cases} --concurrency" not in stderr  # what the eval's id depends on only
        assert f"starter.py eval {cases}" in stderr, stderr
        second = WorkerProc(env, tmp_path / "worker-2.log")
        await second.async_wait_ready()
        gate.touch()
        done = await cli("eval", str(cases), "--concurrency", "1")
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.stop()
    assert done.returncode == 0, (done, first.tail(), second.tail() if second else "")
    assert f"eval {workflow_id} is running: attaching (it does not start over)" in done.stderr, done.stderr
    assert "(each case's model)  4/4 (100%)" in done.stdout, done.stdout
    requests = lines_of(calls)
    # The finished cases were not asked again; case 3's call was asked again by the new worker.
    counts = [requests.count(f"evalgate {task}") for task in tasks]
    assert counts[:2] == [1, 1] and counts[2] >= 2 and counts[3] == 1, requests
    for workflow in [workflow_id, *child.values()]:
        executions = [wf async for wf in client.list_workflows(f'WorkflowId = "{workflow}"')]
        assert len(executions) == 1, (workflow, executions)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(workflows=[AgentWorkflow, EvalWorkflow], data_converter=pydantic_data_converter)
    assert (await replayer.replay_workflow(history, raise_on_replay_failure=True)).replay_failure is None


def test_the_eval_command_is_in_the_clis_help() -> None:
    shown = subprocess.run(
        [sys.executable, str(ROOT / "starter.py"), "eval", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert shown.returncode == 0 and "--concurrency" in shown.stdout and "--json OUT" in shown.stdout, shown
