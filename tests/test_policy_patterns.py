"""Policy patterns run in linear time on bounded text (issue 21, item 5).

``(a+)+b`` against a URL ending in 25 ``a``\\ s used to hold the GIL for seconds
and stall every run on the worker. Patterns are RE2 now: what RE2 cannot match in
linear time is refused when the policy is loaded, naming the rule and the pattern,
and at most 64 KiB of an argument is matched (longer text fails closed).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities.approvals import load_policy
from activities.runtime import Runtime
from activities.settings import ConfigurationError
from durable_agents.cli.approvals import load_run_policy
from durable_agents.cli.common import CliError
from tests.conftest import WorkerFactory, start_agent
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.test_configuration import run_worker_process
from workflows.inputs import problems
from workflows.patterns import MAX_MATCHED_BYTES, Pattern, PatternError
from workflows.policy import Policy, PolicyRule, decide, parse_run_policy

CATASTROPHIC = "(a+)+b"
REFUSED = [r"(\w)\1", r"^(?!https://ok\.)", r"(?<=x)y", r"(?<!x)y", r"a++", r"end\Z"]


def rule(**fields: Any) -> dict[str, Any]:
    return {"tool": "http_request", **fields}


def test_catastrophic_patterns_are_decided() -> None:
    run = parse_run_policy({"rules": [rule(name="no-ab", when={"url": CATASTROPHIC}, decision="deny")]})
    for tail in ("a" * 25, "a" * 60_000):
        url = f"https://h.test/{tail}"
        assert decide(Policy(), run, "http_request", {"method": "GET", "url": url}, side_effect=True).verdict == "allow"
    url = "https://h.test/" + "a" * 60_000 + "b"
    denied = decide(Policy(), run, "http_request", {"method": "GET", "url": url}, side_effect=True)
    assert (denied.verdict, denied.rule) == ("deny", "no-ab")


@pytest.mark.parametrize("pattern", REFUSED)
def test_syntax_re2_refuses_is_refused_at_load_naming_the_rule_and_pattern(pattern: str) -> None:
    for document in (
        {"rules": [rule(name="mine", when={"url": pattern}, decision="deny")]},
        {"rules": [rule(name="mine", allow_only={"url": [pattern]}, decision="ask")]},
    ):
        with pytest.raises(ValidationError) as caught:
            parse_run_policy(document)
        message = problems(caught.value)
        assert message.startswith("rules.0: rule 'mine': ") and "invalid regular expression" in message, message
        assert repr(pattern) in message and "RE2" in message, message


def test_patterns_that_compile_too_large_are_refused() -> None:
    with pytest.raises(PatternError, match="too large"):
        Pattern("(?:a?){650}a{650}x", ignore_case=True)
    Pattern("^https://(api|pay)\\.example\\.com/v[0-9]+/", ignore_case=True)


def test_when_searches_ignoring_case_and_allow_only_fully_matches_with_case() -> None:
    op = Policy.model_validate(
        {
            "rules": [
                rule(name="no-pay", when={"url": r"//pay\."}, decision="deny"),
                {"tool": "run_shell", "allow_only": {"command": ["ls( [\\w./-]+)*"]}, "decision": "deny"},
            ]
        }
    )

    def verdict(tool: str, args: dict[str, Any]) -> str:
        return decide(op, None, tool, args, side_effect=True, sandboxed=True).verdict

    assert verdict("http_request", {"method": "POST", "url": "https://PAY.example/x"}) == "deny"
    assert verdict("http_request", {"method": "POST", "url": "https://shop.example/x"}) == "ask"
    assert verdict("run_shell", {"command": "ls src/a.py"}) == "allow"
    assert verdict("run_shell", {"command": "LS src"}) == "deny", "allow_only is case-sensitive"
    assert verdict("run_shell", {"command": "ls src; rm -rf /"}) == "deny", "allow_only matches the whole command"
    # As with Python's re.search, $ also matches before a final newline.
    ends = Policy.model_validate({"rules": [rule(when={"url": r"\.exe$"}, decision="deny")]})
    assert decide(ends, None, "http_request", {"url": "https://h/x.exe\n"}, side_effect=True).verdict == "deny"


def test_text_beyond_the_cap_fails_closed() -> None:
    over = "https://h.test/" + "x" * MAX_MATCHED_BYTES
    at_cap = "https://h.test/" + "x" * (MAX_MATCHED_BYTES - len("https://h.test/"))
    op = Policy.model_validate(
        {
            "rules": [
                rule(name="deny-evil", when={"url": "evil"}, decision="deny"),
                rule(name="allow-h", when={"url": "^https://h\\.test/"}, decision="allow"),
            ]
        }
    )

    def post(url: str) -> tuple[str, str]:
        found = decide(op, None, "http_request", {"method": "POST", "url": url}, side_effect=True)
        return found.verdict, found.rule

    assert post(at_cap) == ("allow", "allow-h"), "up to the cap, text is matched as usual"
    assert post(over) == ("deny", "deny-evil"), "a deny rule counts text beyond the cap as matching"
    lenient = Policy.model_validate({"rules": [rule(name="allow-h", when={"url": "^https://h"}, decision="allow")]})
    too_long = decide(lenient, None, "http_request", {"method": "POST", "url": over}, side_effect=True)
    assert (too_long.verdict, too_long.rule) == ("ask", "default:side-effect"), "an allow rule never matches it"
    listed = PolicyRule(tool="run_shell", allow_only={"command": ["echo x*"]}, decision="ask")
    assert listed.verdict_for({"command": "echo " + "x" * 100}) == "allow"
    assert listed.verdict_for({"command": "echo " + "x" * MAX_MATCHED_BYTES}) == "ask", "allow_only never allows it"
    # Counted in UTF-8 bytes: 2-byte characters reach the cap at half as many characters.
    assert Pattern("é", ignore_case=True).search("é" * (MAX_MATCHED_BYTES // 2)) is True
    assert Pattern("é", ignore_case=True).search("é" * (MAX_MATCHED_BYTES // 2 + 1)) is None


def test_the_operator_file_and_the_cli_refuse_lookaround_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"rules": [rule(name="not-ok", when={"url": REFUSED[1]}, decision="deny")]}))
    with pytest.raises(ConfigurationError) as caught:
        load_policy(str(path))
    message = str(caught.value)
    assert message.startswith(f"AGENT_POLICY_FILE={path}: rules.0: rule 'not-ok': when.url: invalid regular expression")
    assert "\n" not in message
    with pytest.raises(CliError) as refused:
        load_run_policy(str(path))
    assert refused.value.code == 2 and "rule 'not-ok': when.url: invalid regular expression" in str(refused.value)
    done = run_worker_process(tmp_path, AGENT_POLICY_FILE=str(path))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "rule 'not-ok'" in json.loads(lines[0])["error"], done.stderr


async def test_a_run_policy_re2_refuses_fails_the_run(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    raw = {"task": "t", "policy": {"rules": [rule(name="dup", when={"url": REFUSED[0]}, decision="deny")]}}
    async with run_worker(dev_env.client, runtime) as task_queue:
        handle = await dev_env.client.start_workflow(
            "AgentWorkflow", raw, id=f"re2-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    cause = str(failure.value.cause)
    assert "invalid run input: policy: rules.0: rule 'dup': when.url: invalid regular expression" in cause, cause


def script(body: dict[str, Any], base_url: str) -> Scripted:
    """The hostile run GETs two URLs ending in a's (26, then 8,000: http_request takes URLs up to 8,192
    characters); the normal one reads a missing file."""
    messages = body["messages"]
    task = next(m["content"] for m in messages if m["role"] == "user")
    turns = sum(1 for m in messages if m["role"] == "assistant")
    if task == "hostile" and turns < 2:
        url = f"{base_url}/{'a' * (26 if turns == 0 else 8_000)}"
        return Scripted(tool_calls=[("http_request", json.dumps({"method": "GET", "url": url}))])
    if task == "normal" and turns == 0:
        return Scripted(tool_calls=[("read_file", json.dumps({"path": "missing.txt"}))])
    return Scripted(text=f"{task} done")


async def test_a_catastrophic_pattern_stalls_neither_its_run_nor_the_one_beside_it(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    hostile_policy = {"rules": [rule(name="no-ab", when={"url": CATASTROPHIC}, decision="deny")]}
    with HttpSink() as sink:
        llm.default = lambda body: script(body, sink.url)
        async with run_worker(dev_env.client, runtime) as task_queue:
            hostile = await start_agent(dev_env.client, task_queue, task="hostile", policy=hostile_policy)
            normal = await start_agent(dev_env.client, task_queue, task="normal")
            # Generous deadline: with a backtracking engine the hostile run never finishes (each workflow
            # task spends minutes in one match and is failed by the deadlock detector, then retried).
            results = await asyncio.wait_for(asyncio.gather(hostile.result(), normal.result()), timeout=180)
    assert [r.status for r in results] == ["completed", "completed"]
    assert results[0].output == "hostile done" and results[1].output == "normal done"
    assert sum(1 for r in sink.received if r.path.endswith("a" * 26)) == 2, "both GETs were allowed and sent"
