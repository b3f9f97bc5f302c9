"""Every policy document refuses keys it does not know, naming the nearest valid one (issue 21, item 9).

A rule with ``wen`` for ``when`` used to load as a rule with no condition: ``allow``
for every POST. The operator's file, ``starter.py run --policy``, a run's ``policy``
input, sub-agent definitions (their ``policy`` too), the sub-agents file and the MCP
configuration all refuse it at load, in one line.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities.approvals import load_policy
from activities.mcp.config import load_mcp_config
from activities.runtime import Runtime
from activities.settings import ConfigurationError, Settings
from activities.subagents import load_subagents, resolve
from durable_agents.cli.approvals import load_run_policy
from durable_agents.cli.common import EXIT_USAGE, CliError
from tests.conftest import WorkerFactory
from tests.test_configuration import run_worker_process
from workflows.inputs import problems
from workflows.known_keys import unknown_key_message
from workflows.policy import Policy, parse_run_policy
from workflows.types import SubagentDef

TYPO_RULE = {"tool": "http_request", "wen": {"url": "^https://pay\\."}, "decision": "allow"}
WEN = "unknown key 'wen' (did you mean 'when'?)"


def write(tmp_path: Path, name: str, document: Any) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


def test_the_nearest_valid_key_is_suggested() -> None:
    assert unknown_key_message("wen", ["name", "tool", "when"]) == WEN
    assert unknown_key_message("When", ["when"]) == "unknown key 'When' (did you mean 'when'?)"
    assert unknown_key_message("zzz", ["a", "b"]) == "unknown key 'zzz' (valid keys: a, b)"
    assert len(unknown_key_message("k" * 5000, ["when"])) < 200, "a huge key is quoted in part"


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"rules": [TYPO_RULE]}, f"rules.0.wen: {WEN}"),
        (
            {"rules": [], "aproval_timeout_s": 60},
            "aproval_timeout_s: unknown key 'aproval_timeout_s' (did you mean 'approval_timeout_s'?)",
        ),
        (
            {"rules": [{"tool": "x", "decison": "deny"}]},
            "rules.0.decison: unknown key 'decison' (did you mean 'decision'?)",
        ),
        (
            {"rules": [{"tool": "x", "allowonly": {"a": ["b"]}, "decision": "deny"}]},
            "rules.0.allowonly: unknown key 'allowonly' (did you mean 'allow_only'?)",
        ),
    ],
)
def test_a_policy_refuses_unknown_keys(document: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_run_policy(document)
    assert problem in problems(caught.value)
    with pytest.raises(ValidationError):
        Policy.model_validate(document)


def test_the_operator_file_refuses_a_misspelt_condition(tmp_path: Path) -> None:
    path = write(tmp_path, "policy.json", {"rules": [TYPO_RULE]})
    with pytest.raises(ConfigurationError) as caught:
        load_policy(path)
    assert str(caught.value) == f"AGENT_POLICY_FILE={path}: rules.0.wen: {WEN}"


def test_a_policy_file_with_wen_stops_the_worker_with_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, "policy.json", {"rules": [TYPO_RULE]})
    done = run_worker_process(tmp_path, AGENT_POLICY_FILE=path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    event = json.loads(lines[0])
    assert event["event"] == "bad_configuration"
    assert "AGENT_POLICY_FILE=" in event["error"] and WEN in event["error"], event


def test_run_policy_file_of_the_cli_is_a_usage_error(tmp_path: Path) -> None:
    cases = [
        ({"rules": [{**TYPO_RULE, "decision": "deny"}]}, f"rules.0.wen: {WEN}"),
        ({"aproval_timeout_s": 5}, "aproval_timeout_s: unknown key 'aproval_timeout_s' (did you mean 'approval"),
    ]
    for document, problem in cases:
        path = write(tmp_path, "run-policy.json", document)
        with pytest.raises(CliError) as caught:
            load_run_policy(path)
        assert caught.value.code == EXIT_USAGE == 2
        assert str(caught.value).startswith(f"--policy {path}: {problem}")
        assert "\n" not in str(caught.value)


def test_sub_agent_definitions_refuse_unknown_keys_in_themselves_and_their_policy(tmp_path: Path) -> None:
    tools = ["read_file", "http_request"]
    cases = [
        ({"a": {"description": "x", "polcy": {}}}, "a.polcy: unknown key 'polcy' (did you mean 'policy'?)"),
        (
            {"a": {"description": "x", "limits": {"max_tokns": 5}}},
            "a.limits.max_tokns: unknown key 'max_tokns' (did you mean 'max_tokens'?)",
        ),
        ({"a": {"description": "x", "policy": {"rules": [TYPO_RULE]}}}, f"sub-agent 'a': policy.rules.0.wen: {WEN}"),
    ]
    for definitions, problem in cases:
        path = write(tmp_path, "subagents.json", definitions)
        with pytest.raises(ConfigurationError) as caught:
            load_subagents(path, tools, [])
        assert str(caught.value).startswith(f"AGENT_SUBAGENTS_FILE={path}: ")
        assert problem in str(caught.value) and "\n" not in str(caught.value)
    # A run's own definitions (run input) are checked the same way when the run starts.
    run_defined = {"b": SubagentDef(description="y", policy={"rules": [TYPO_RULE]})}
    with pytest.raises(ValueError, match=r"sub-agent 'b': policy\.rules\.0\.wen: unknown key 'wen'"):
        resolve({}, run_defined, tools, [])
    with pytest.raises(ValidationError, match="did you mean 'description'"):
        SubagentDef.model_validate({"descripton": "x"})


def test_the_mcp_configuration_suggests_the_key_it_knows(tmp_path: Path) -> None:
    document = {"mcpServers": {"x": {"command": sys.executable, "timout_s": 5, "tools": {"t": {"readonly": True}}}}}
    path = write(tmp_path, "mcp.json", document)
    with pytest.raises(ConfigurationError) as caught:
        load_mcp_config(Settings(mcp_config=path, environ={"PATH": str(Path(sys.executable).parent)}))
    message = str(caught.value)
    assert message.startswith(f"AGENT_MCP_CONFIG={path}: ")
    assert "mcpServers.x.timout_s: unknown key 'timout_s' (did you mean 'timeout_s'?)" in message
    document = {"mcpServers": {"x": {"command": sys.executable, "tools": {"t": {"readonly": True}}}}}
    path = write(tmp_path, "mcp.json", document)
    with pytest.raises(
        ConfigurationError, match=r"tools\.t\.readonly: unknown key 'readonly' \(did you mean 'read_only'"
    ):
        load_mcp_config(Settings(mcp_config=path, environ={"PATH": str(Path(sys.executable).parent)}))


async def test_a_run_policy_with_an_unknown_key_fails_the_run_before_anything_runs(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    raw = {"task": "pay", "policy": {"rules": [TYPO_RULE]}}
    async with run_worker(dev_env.client, runtime) as task_queue:
        handle = await dev_env.client.start_workflow(
            "AgentWorkflow", raw, id=f"typo-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        history = await handle.fetch_history()
    assert f"invalid run input: policy: rules.0.wen: {WEN}" in str(failure.value.cause)
    scheduled = [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")]
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert scheduled == [] and all(m.marker_recorded_event_attributes.marker_name == "core_patch" for m in markers)
