"""``durable_agents.testing``, the test kit for agent authors.

- ``ScriptedModel`` plays its script (text, tool calls, usage, provider errors), records every request, and
  says so when it runs out; on a worker, a retryable error is retried and a fatal one fails the run;
- ``AgentTestEnvironment`` runs agents on a plugin-built worker with the caller's tools and models (plaintext
  and with payload keys, on the dev server and on the time-skipping server) and replays them on exit;
- ``replay`` replays the recorded histories of ``tests/histories/`` and fails, naming the workflow id and the
  nondeterminism, on a changed workflow and on an edited history;
- ``eventually`` / ``eventually_sync`` return the first truthy value or fail quoting what was last seen;
- the user project of ``examples/testing/user_project`` runs its own tests with pytest, from a copy of it in a
  temporary directory, in a fresh venv with the built wheel installed and nothing of this checkout on its path.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

import durable_agents.testing as kit
from activities import catalog
from activities.models import FatalProviderError, RetryableProviderError
from activities.models.base import takes_output_cap
from activities.settings import Settings
from durable_agents.testing import (
    AgentTestEnvironment,
    ModelCall,
    NeverHappened,
    ReplayFailed,
    ScriptedModel,
    ScriptExhausted,
    ToolCall,
    Turn,
    call,
    eventually,
    eventually_sync,
    fail,
    replay,
    say,
)
from durable_agents.testing._crypto_keys import TEST_ONLY_PAYLOAD_KEYS
from examples.custom_tool import inventory_tools
from tests.test_replay import AgentWorkflowWithAnUnguardedTimer
from tests.test_wheel import HANG_GUARD_S, in_checkout, make_venv, wheel  # noqa: F401 (wheel: a fixture)
from workflows.types import Message

ROOT = Path(__file__).resolve().parent.parent
HISTORIES = ROOT / "tests" / "histories"
USER_PROJECT = ROOT / "examples" / "testing" / "user_project"
A1001 = "A-1001 (blue widget): 42 available (42 on hand, 0 reserved)"  # stock_lookup's answer on a fresh book


def transcript(*texts: str) -> list[Message]:
    return [Message(role="system", content="be brief"), *(Message(role="user", content=t) for t in texts)]


# --- ScriptedModel, in process ----------------------------------------------------------------------------


async def test_the_scripted_model_plays_its_turns_and_records_each_request() -> None:
    model = ScriptedModel(
        "test",
        [
            call("lookup", {"sku": "A-1"}, ToolCall("note", "{not json"), text="looking", input_tokens=30),
            lambda request: say(f"you said {request.last_user_message}", output_tokens=2),
        ],
    )
    tools = [{"name": "lookup", "description": "Looks up.", "parameters": {"type": "object"}}]
    first = await model.complete("x", transcript("find A-1"), tools, max_output_tokens=100)
    assert first.text == "looking" and first.input_tokens == 30 and first.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments_json) for c in first.tool_calls] == [
        ("scripted_0_0", "lookup", '{"sku": "A-1"}'),
        ("scripted_0_1", "note", "{not json"),  # sent verbatim: what a model writing bad JSON sends
    ]
    second = await model.complete("x", transcript("find A-1", "thanks"), [], output_schema={"type": "object"})
    assert second.text == "you said thanks" and second.output_tokens == 2 and not second.tool_calls
    assert model.remaining == 0
    assert [r.model for r in model.requests] == ["x", "x"]
    assert model.requests[0].tool_names == ["lookup"] and model.requests[0].max_output_tokens == 100
    assert model.requests[1].output_schema == {"type": "object"} and model.requests[1].max_output_tokens is None
    assert takes_output_cap(model)  # the model activity sends it the output cap


async def test_the_scripted_model_raises_its_errors_and_says_when_it_ran_out() -> None:
    busy = RetryableProviderError("busy", status=503, retry_after_s=0)
    model = ScriptedModel("test", [fail(busy), Turn(text="late", delay_s=0.01)])
    with pytest.raises(RetryableProviderError) as raised:
        await model.complete("x", transcript("hi"), [])
    assert raised.value is busy
    assert (await model.complete("x", transcript("hi"), [])).text == "late"
    with pytest.raises(ScriptExhausted) as ran_out:
        await model.complete("x", transcript("hi", "more?"), [])
    assert isinstance(ran_out.value, FatalProviderError)  # the run fails instead of retrying for good
    assert "ScriptedModel 'test' has no turn left: it played all 2 turn(s)" in ran_out.value.message
    assert "request 3" in ran_out.value.message and "user 'more?'" in ran_out.value.message
    assert len(model.requests) == 3  # every request is recorded, the unanswered one too
    model.extend(say("again"))
    assert (await model.complete("x", transcript("hi"), [])).text == "again"


def test_a_request_names_the_tool_results_it_carries() -> None:
    results = [
        Message(role="tool", name="lookup", tool_call_id="c1", content="first"),
        Message(role="tool", name="lookup", tool_call_id="c2", content="second", is_error=True),
    ]
    request = ModelCall(model="x", messages=[*transcript("go"), *results])
    assert request.tool_result("lookup").content == "second" and request.tool_result("lookup").is_error
    assert [m.content for m in request.tool_results] == ["first", "second"]
    with pytest.raises(AssertionError, match=r"no result of tool 'other' in this request \(tool results: "):
        request.tool_result("other")


def test_a_scripted_model_registers_under_its_name() -> None:
    registry = catalog.provider_registry(Settings())
    model = ScriptedModel("unit-test")
    assert model.add_to(registry) is registry
    model.add_to(registry)  # again: a no-op
    assert registry.check_model("unit-test:anything") == ("unit-test", "anything")
    assert registry.create("unit-test", Settings()) is model
    assert model.model == "unit-test:scripted"
    with pytest.raises(ValueError, match="provider prefix 'no spaces'"):
        ScriptedModel("no spaces")


# --- eventually ---------------------------------------------------------------------------------------------


async def test_eventually_returns_the_first_truthy_value_and_otherwise_quotes_the_last_seen() -> None:
    seen: list[int] = []

    async def grows() -> list[int] | None:
        seen.append(len(seen))
        if len(seen) < 3:
            raise AssertionError(f"only {len(seen)}")  # counts as "not yet"
        return list(seen)

    assert await eventually(grows, "three checks", every_s=0) == [0, 1, 2]
    with pytest.raises(NeverHappened, match=r"never: not within 0.05 s; last seen: 0"):
        await eventually(lambda: 0, "never", within_s=0.05, every_s=0.01)
    assert eventually_sync(lambda: "yes", "at once") == "yes"
    with pytest.raises(NeverHappened, match=r"no: not within 0.05 s; last seen: AssertionError\('nope'\)"):

        def refuses() -> bool:
            raise AssertionError("nope")

        eventually_sync(refuses, "no", within_s=0.05, every_s=0.01)


def test_the_tests_old_import_paths_are_the_kit_s_objects() -> None:
    from tests.fakes.llm_server import FakeLLMServer
    from tests.waiting import eventually as old_eventually

    assert old_eventually is eventually
    assert FakeLLMServer.__module__ == "durable_agents.testing._llm_server"


def test_import_durable_agents_does_not_load_the_kit() -> None:
    probe = "import sys, durable_agents; print(any(m.startswith('durable_agents.testing') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.stdout.split() == ["False"], done.stderr


# --- replay -------------------------------------------------------------------------------------------------


async def test_replay_passes_on_the_recorded_histories() -> None:
    plain = [p for p in sorted(HISTORIES.glob("*.json")) if not p.stem.startswith("encrypted_")]
    replayed = await replay(plain)
    assert [r.workflow_id for r in replayed] == [f"history-{p.stem}" for p in plain]  # the id each one recorded
    assert all(r.events > 10 for r in replayed)
    encrypted = HISTORIES / "encrypted_approvals.json"
    (only,) = await replay(encrypted, payload_keys=TEST_ONLY_PAYLOAD_KEYS)
    assert only.workflow_id == "history-encrypted_approvals" and only.source == str(encrypted)
    with pytest.raises(ReplayFailed, match=r"history-encrypted_approvals .*: replay error: .*without that key"):
        await replay(encrypted)


async def test_replay_names_the_run_a_changed_workflow_would_break() -> None:
    path = HISTORIES / "tools_and_errors.json"
    with pytest.raises(ReplayFailed) as failed:
        await replay([path, HISTORIES / "approvals.json"], workflows=[AgentWorkflowWithAnUnguardedTimer])
    text = str(failed.value)
    assert text.startswith("2 of 2 histories do not replay against this code:"), text
    assert f"- workflow history-tools_and_errors ({path}): nondeterminism: " in text, text
    assert "workflow.patched()" in text
    assert [f.workflow_id for f in failed.value.failures] == ["history-tools_and_errors", "history-approvals"]
    assert all(f.nondeterministic for f in failed.value.failures)


async def test_replay_names_an_edited_history_and_what_differs() -> None:
    data = json.loads((HISTORIES / "tools_and_errors.json").read_text())
    edited = copy.deepcopy(data)
    scheduled = next(e for e in edited["events"] if "activityTaskScheduledEventAttributes" in e)
    recorded = scheduled["activityTaskScheduledEventAttributes"]["activityType"]["name"]
    scheduled["activityTaskScheduledEventAttributes"]["activityType"]["name"] = "not_what_the_code_schedules"
    with pytest.raises(ReplayFailed) as failed:
        await replay([data, edited])  # parsed JSON, as `temporal workflow show --output json` writes it
    (failure,) = failed.value.failures
    assert failure.workflow_id == "history-tools_and_errors" and failure.source == "<mapping>"
    assert failure.nondeterministic
    assert recorded in failure.error and "not_what_the_code_schedules" in failure.error, failure.error
    assert str(failed.value).startswith("1 of 2 histories do not replay"), str(failed.value)


# --- AgentTestEnvironment, on real servers --------------------------------------------------------------------


async def test_the_environment_runs_an_agent_with_the_caller_s_tools_and_model(dev_env: WorkflowEnvironment) -> None:
    model = ScriptedModel(
        "test",
        [
            call("stock_lookup", {"sku": "A-1001"}, input_tokens=100, output_tokens=20),
            lambda request: say(f"Found: {request.tool_result('stock_lookup').content}", input_tokens=120),
        ],
    )
    async with AgentTestEnvironment(models=[model], tool_modules=[inventory_tools], env=dev_env) as env:
        assert env.settings.model == "test:scripted"
        store = env.settings.store_url
        assert Path(store).parent.name.startswith("durable-agents-test-")
        result = await env.run({"task": "How many A-1001?", "tools": ["stock_lookup"]})
        assert await env.replay_started() == 1
    assert result.status == "completed" and result.output == f"Found: {A1001}"
    assert result.usage.input_tokens == 220 and result.usage.output_tokens == 25
    first, second = model.requests
    assert first.tool_names == ["stock_lookup"] and first.last_user_message == "How many A-1001?"
    assert second.tool_result("stock_lookup").content == A1001
    assert not await asyncio.to_thread(os.path.exists, store)  # the temporary run store went with the environment


async def test_a_retryable_error_is_retried_and_a_fatal_one_fails_the_run(dev_env: WorkflowEnvironment) -> None:
    model = ScriptedModel(
        "test",
        [
            fail(RetryableProviderError("overloaded", status=529, retry_after_s=0)),
            say("second time lucky"),
            fail(FatalProviderError("bad key", status=401)),
        ],
    )
    async with AgentTestEnvironment(models=[model], env=dev_env) as env:
        retried = await env.run("say something")
        failed = await env.run("and again")
        exhausted = await env.run("once more")
    assert retried.status == "completed" and retried.output == "second time lucky" and retried.steps == 1
    assert model.requests[0].messages == model.requests[1].messages  # the retry sent the same turn again
    assert failed.status == "failed" and "bad key" in failed.output
    assert exhausted.status == "failed" and "ScriptedModel 'test' has no turn left" in exhausted.output
    assert len(model.requests) == 4  # neither the fatal error nor the exhausted script was retried


async def test_the_environment_encrypts_with_payload_keys_and_replays_with_them(dev_env: WorkflowEnvironment) -> None:
    model = ScriptedModel("test", [say("sealed")])
    async with AgentTestEnvironment(models=[model], env=dev_env, payload_keys=TEST_ONLY_PAYLOAD_KEYS) as env:
        handle = await env.start("a secret task")
        assert (await handle.result()).output == "sealed"
        history = await handle.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.input.payloads[0].metadata["encoding"] == b"binary/encrypted"
    assert b"a secret task" not in history.events[0].SerializeToString()
    assert [r.workflow_id for r in await replay(history, payload_keys=TEST_ONLY_PAYLOAD_KEYS)] == [handle.id]
    with pytest.raises(ReplayFailed, match=handle.id):
        await replay(history)


async def test_the_environment_runs_on_the_time_skipping_server(time_env: WorkflowEnvironment) -> None:
    model = ScriptedModel("test", [say("no time passed")])
    async with AgentTestEnvironment(models=[model], env=time_env) as env:
        assert env.client is time_env.client  # its own client keeps the time skipping
        assert (await env.run({"task": "wait", "limits": {"timeout_s": 3600}})).output == "no time passed"


# --- a user's project, from the built wheel ---------------------------------------------------------------------

RUN_THE_PROJECT_S_TESTS = """
import json, os, sys
import durable_agents, pytest
paths = [os.path.realpath(entry or os.curdir) for entry in sys.path]
print("probe " + json.dumps({"durable_agents": durable_agents.__file__, "sys_path": paths}), flush=True)
sys.exit(pytest.main(["-p", "no:cacheprovider", "-q", "test_my_tool.py"]))
"""


async def test_a_user_project_tests_its_own_tool_with_the_kit_from_the_wheel(wheel: Path, tmp_path: Path) -> None:  # noqa: F811
    venv = make_venv(tmp_path / "venv", wheel)
    project = tmp_path / "project"
    shutil.copytree(USER_PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # Only the temporal CLI (which comes with durable-agents) on PATH beside the system's: the kit finds it there.
    tools = tmp_path / "bin"
    tools.mkdir()
    temporal = kit.temporal_binary("temporal")
    assert temporal is not None
    (tools / "temporal").symlink_to(temporal)
    env = {"PATH": f"{tools}{os.pathsep}{os.defpath}", "HOME": str(tmp_path)}
    done = await asyncio.to_thread(
        subprocess.run,
        [str(venv / "bin" / "python"), "-c", RUN_THE_PROJECT_S_TESTS],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout, done.stdout
    line = next(line for line in done.stdout.splitlines() if line.startswith("probe "))
    probe: dict[str, Any] = json.loads(line.removeprefix("probe "))
    assert Path(probe["durable_agents"]).is_relative_to(venv), probe  # the wheel's package, not this checkout
    assert not in_checkout(probe["sys_path"]), probe
