"""Evals without a server: reading a dataset (each bad line named), scoring the checks, the judge's verdict,
the report, the eval's id, and the workflow's pure helpers (a job's input, an approval's decision)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from activities.evals import Call, contains, parse_verdict, schema_problem, score, tool_calls
from durable_agents.cli.common import EXIT_USAGE, CliError
from durable_agents.cli.eval import Dataset, eval_id, load_dataset, render, report_json
from durable_agents.cli.main import main
from workflows.eval import child_input, decision_for, passed_all
from workflows.eval_types import (
    MAX_JOBS,
    MAX_LINE_BYTES,
    CaseRun,
    CheckResult,
    EvalCase,
    EvalChecks,
    EvalInput,
    EvalReport,
    JudgeGrade,
    ScoreRequest,
)
from workflows.types import Message, PendingApproval, RecordedToolCall

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "evals" / "dataset.jsonl"
GOOD = {"name": "ok", "input": {"task": "say 42"}, "checks": {"output_matches": "42"}}


def write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def refusal(path: Path) -> str:
    with pytest.raises(CliError) as caught:
        load_dataset(path)
    assert caught.value.code == EXIT_USAGE
    return str(caught.value)


def test_the_example_dataset_loads() -> None:
    dataset = load_dataset(EXAMPLE)
    assert [case.name for case in dataset.cases] == [
        "prime-stats",
        "no-tools-needed",
        "reservation-rejected",
        "reservation-approved",
    ]
    assert dataset.digest.startswith("sha256:") and len(dataset.digest) == 71
    assert dataset.cases[0].approve == "none"  # the default
    assert dataset.cases[3].approve == ["http_request"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"name": "x", "input": ', ":2: not valid JSON: Expecting value at column 24"),
        ("[1, 2]", ":2: expected a JSON object (a case), got list"),
        ({**GOOD, "name": "b", "chekcs": {}}, ":2 (case 'b'): chekcs: unknown key 'chekcs' (did you mean 'checks'?)"),
        ({**GOOD, "name": "b", "input": {"tsk": "x"}}, ":2 (case 'b'): input.tsk: unknown key 'tsk'"),
        ({**GOOD, "name": "has space"}, ":2 (case 'has space'): name: String should match pattern"),
        ({**GOOD, "name": "b", "approve": "some"}, ":2 (case 'b'): approve"),
        ({**GOOD, "name": "b", "checks": {"output_matches": "(a)\\1"}}, "checks.output_matches: invalid regular"),
        ({**GOOD, "name": "b", "checks": {"output_matches": "a{1000}b{1000}"}}, "is too large"),
        ({**GOOD, "name": "b", "checks": {"output_json_schema": {"type": "objekt"}}}, "not a valid JSON Schema"),
        (
            {**GOOD, "name": "b", "checks": {"output_json_schema": {"patternProperties": {"^a": {}}}}},
            "patternProperties is not supported",
        ),
        ({**GOOD, "name": "b", "checks": {"judge": {"model": "judge:v1", "rubric": "x" * 5000}}}, "judge.rubric"),
        ({**GOOD, "name": "b", "input": {"task": "x", "session": {}}}, "no 'session'"),
        ({**GOOD, "name": "ok"}, ":2: case name 'ok' is used on line 1 too"),
        ({**GOOD, "name": "b", "checks": {"max_steps": -1}}, "checks.max_steps"),
    ],
)
def test_a_bad_line_is_refused_naming_its_number_and_what_is_wrong(tmp_path: Path, line: Any, expected: str) -> None:
    path = write(tmp_path, GOOD, line)
    message = refusal(path)
    assert message.startswith(str(path)), message
    assert expected in message, message


def test_size_bounds_and_empty_datasets(tmp_path: Path) -> None:
    long = {**GOOD, "name": "long", "input": {"task": "x" * MAX_LINE_BYTES}}
    assert f":2: the line is {len(json.dumps(long))} bytes: at most {MAX_LINE_BYTES}" in refusal(
        write(tmp_path, GOOD, long)
    )
    assert "has no cases" in refusal(write(tmp_path, "", "  "))
    assert "cannot read dataset" in refusal(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_bytes(b'{"name": "\xff"}\n')
    assert ":1: not valid UTF-8 (byte 10)" in refusal(tmp_path / "bad.jsonl")
    case = EvalCase.model_validate(GOOD)
    too_many = [case.model_copy(update={"name": f"c{i}"}) for i in range(MAX_JOBS // 2 + 1)]
    with pytest.raises(ValueError, match="at most 200 in one eval"):
        EvalInput(cases=too_many, models=["a:b", "c:d"])


async def test_the_cli_refuses_a_bad_dataset_in_one_line_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")  # nothing listens: the dataset is refused first
    path = write(tmp_path, GOOD, GOOD, "{")
    assert await main(["eval", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {path}:2: case name 'ok' is used on line 1 too"]
    assert await main(["eval", str(write(tmp_path, GOOD)), "--runs", "0"]) == 2
    assert "--runs: " in capsys.readouterr().err
    assert await main(["eval", str(write(tmp_path, GOOD)), "--model", "nosuch:x"]) == 2
    assert "unknown model provider 'nosuch'" in capsys.readouterr().err
    assert await main(["eval", str(write(tmp_path, GOOD)), "--json", str(tmp_path / "no" / "out.json")]) == 2
    assert "--json" in capsys.readouterr().err


# --- the checks ------------------------------------------------------------------------------------


def request(
    output: str, *, status: Any = "completed", steps: int = 2, cost: float = 0.01, **checks: Any
) -> ScoreRequest:
    return ScoreRequest(
        workflow_id="w",
        run_id="r",
        status=status,
        output=output,
        steps=steps,
        cost_usd=cost,
        checks=EvalChecks.model_validate(checks),
    )


def by_check(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.check: r for r in results}


def test_output_matches_is_an_re2_search() -> None:
    found = by_check(score(request("the answer is 42", output_matches=r"answer is \d+$"), [], 1.0))
    assert found["run"].passed and found["output_matches"].passed
    missed = by_check(score(request("I do not know", output_matches="42"), [], 1.0))["output_matches"]
    assert not missed.passed and missed.reason == "/42/ not found in 'I do not know'"
    huge = by_check(score(request("x" * 70_000, output_matches="x"), [], 1.0))["output_matches"]
    assert not huge.passed and "over 65536 bytes" in huge.reason


def test_a_run_that_did_not_complete_fails() -> None:
    [run] = score(request("max_steps reached (2)\nmore", status="limit_exceeded"), [], 1.0)
    assert not run.passed and run.reason == "the run ended limit_exceeded: max_steps reached (2)"


SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "why": {"pattern": "^b"}},
    "required": ["answer"],
}


@pytest.mark.parametrize(
    ("output", "passed", "reason"),
    [
        ('{"answer": 42}', True, "valid"),
        ('```json\n{"answer": 42}\n```', True, "valid"),
        (
            '{"answer": "many"}',
            False,
            "the output does not match the schema: $.answer: 'many' is not of type 'integer'",
        ),
        ('{"answer": 1, "why": "a"}', False, "$.why: 'a' does not match '^b'"),
        ("{}", False, "$: 'answer' is a required property"),
        ("I do not know", False, "the output is not JSON (Expecting value at line 1 column 1): 'I do not know'"),
        ("[" * 100_000, False, "the output is not JSON"),
    ],
)
def test_output_json_schema_names_the_errors(output: str, passed: bool, reason: str) -> None:
    check = by_check(score(request(output, output_json_schema=SCHEMA), [], 1.0))["output_json_schema"]
    assert check.passed is passed
    assert reason in check.reason, check.reason


def test_schema_problems() -> None:
    assert schema_problem(SCHEMA) == ""
    assert "RE2" in schema_problem({"pattern": "(?=a)"})
    assert "not a valid JSON Schema" in schema_problem({"type": 5})


def test_tools_called_match_by_name_and_argument_subset() -> None:
    calls = [
        Call("http_request", {"method": "GET", "url": "http://x/a", "json": None}),
        Call("http_request", {"method": "POST", "url": "http://x/b", "json": {"n": 1, "m": [1, 2]}}),
    ]
    ok = by_check(
        score(
            request(
                "",
                tools_called=["http_request", {"name": "http_request", "args": {"method": "POST", "json": {"n": 1}}}],
                tools_not_called=["write_file", {"name": "http_request", "args": {"method": "DELETE"}}],
            ),
            calls,
            1.0,
        )
    )
    assert ok["tools_called"].passed and ok["tools_called"].reason == "called http_request"
    assert ok["tools_not_called"].passed
    bad = by_check(
        score(
            request(
                "",
                tools_called=[{"name": "http_request", "args": {"json": {"n": True}}}, "run_python"],
                tools_not_called=[{"name": "http_request", "args": {"method": "POST"}}],
            ),
            calls,
            1.0,
        )
    )
    assert not bad["tools_called"].passed
    assert bad["tools_called"].reason == (
        """no call of http_request with args '{"json": {"n": true}}'; run_python (called: http_request)"""
    )
    assert not bad["tools_not_called"].passed and bad["tools_not_called"].reason.startswith("called http_request")
    assert contains({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 2}})
    assert not contains({"a": 1}, {"a": True}) and not contains({"a": [1, 2]}, {"a": [1]})


def test_limits_checks() -> None:
    found = by_check(score(request("", steps=3, cost=0.5, max_steps=2, max_cost_usd=1, max_seconds=10), [], 12.5))
    assert not found["max_steps"].passed and found["max_steps"].reason == "3 steps (at most 2)"
    assert found["max_cost_usd"].passed
    assert not found["max_seconds"].passed and found["max_seconds"].reason == "12.5 s (at most 10 s)"


def test_tool_calls_are_read_from_the_transcript() -> None:
    messages = [
        Message(role="user", content="go"),
        Message(
            role="assistant",
            tool_calls=[
                RecordedToolCall(id="1", name="a", arguments_json='{"x": 1}'),
                RecordedToolCall(id="2", name="b", arguments_json="not json"),
            ],
        ),
        Message(role="tool", content="ok", tool_call_id="1", name="a"),
    ]
    assert tool_calls(messages) == [Call("a", {"x": 1}), Call("b", {})]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ('{"pass": true, "score": 0.8, "reason": "fine"}', (True, 0.8, "fine")),
        ('Verdict:\n```json\n{"pass": false, "score": 0, "reason": "no"}\n```', (False, 0.0, "no")),
        ('I think {"passed": true} and more {', (True, 1.0, "")),
        ("", "the judge answered nothing"),
        ("Looks great to me.", "the judge's answer is not a JSON verdict: 'Looks great to me.'"),
        ('{"pass": "yes"}', "no boolean 'pass'"),
        ('{"pass": true, "score": 7}', "score is not a number from 0 to 1: '7'"),
        ('{"pass": true, "score": true}', "score is not a number from 0 to 1"),
        ("{" * 10_000, "not a JSON verdict"),
    ],
)
def test_a_judges_answer_is_parsed_robustly(answer: str, expected: Any) -> None:
    got = parse_verdict(answer)
    if isinstance(expected, str):
        assert isinstance(got, str) and expected in got, got
    else:
        assert got == expected


# --- the workflow's helpers -------------------------------------------------------------------------


def test_a_jobs_input_reports_to_its_parent_and_takes_the_compared_model() -> None:
    case = EvalCase.model_validate({**GOOD, "input": {"task": "x", "model": "a:b", "approvers": ["alice"]}})
    inp = child_input(case, "c:d")
    assert (inp.depth, inp.model, inp.approvers) == (1, "c:d", ["alice", "eval"])
    assert child_input(case, "").model == "a:b"
    assert case.input.depth == 0 and case.input.approvers == ["alice"]  # the case is not changed
    assert child_input(EvalCase.model_validate(GOOD), "").approvers == []  # anyone may decide: nothing added


def test_an_approval_is_decided_by_the_case() -> None:
    approval = PendingApproval(approval_id="ap_1", tool="http_request", args={}, requested_at="", expires_at="")
    assert decision_for("all", approval) and not decision_for("none", approval)
    assert decision_for(["http_request"], approval) and not decision_for(["write_file"], approval)
    ok = CheckResult(check="run", passed=True)
    assert passed_all([ok], None) and not passed_all([ok], JudgeGrade(passed=False))


# --- the report ----------------------------------------------------------------------------------


def row(model: str, case: str, passed: bool, seconds: float, **fields: Any) -> CaseRun:
    checks = [CheckResult(check="run", passed=True)]
    if not passed:
        checks.append(CheckResult(check="output_matches", passed=False, reason="/42/ not found in 'no'"))
    return CaseRun(
        model=model, case=case, passed=passed, seconds=seconds, checks=checks, steps=2, cost_usd=0.01, **fields
    )


def test_the_report_compares_models_and_lists_each_failure() -> None:
    grade = JudgeGrade(model="judge:v1", passed=False, score=0.1, reason="no 42", answered=True)
    report = EvalReport(
        dataset="cases.jsonl",
        digest="sha256:" + "ab" * 32,
        models=["good:v1", "bad:v1"],
        results=[
            row("good:v1", "answer", True, 1.0),
            row("bad:v1", "answer", False, 3.0),
            row("good:v1", "judged", True, 2.0),
            row("bad:v1", "judged", True, 5.0, judge=grade),
        ],
    )
    report.results[3].passed = False
    lines = render(report, "eval-x")
    text = "\n".join(lines)
    assert lines[0] == "eval eval-x: cases.jsonl (sha256:abababababab), 4 run(s), 2 passed"
    assert "good:v1  2/2 (100%)  $0.0200  2.0    1.0s  2.0s" in text
    assert "bad:v1   0/2 (0%)    $0.0200  2.0    3.0s  5.0s" in text
    assert "case    good:v1  bad:v1\nanswer  pass     FAIL\njudged  pass     FAIL" in text
    assert "  FAIL answer run 1 with bad:v1: output_matches: /42/ not found in 'no'" in lines
    assert "  FAIL judged run 1 with bad:v1: judge (judge:v1, score 0.10): no 42" in lines
    document = report_json(report, "eval-x")
    assert document["passed"] is False
    assert document["models"][1] == {
        "model": "bad:v1",
        "runs": 2,
        "passed": 0,
        "pass_rate": 0.0,
        "cost_usd": 0.02,
        "mean_steps": 2.0,
        "p50_seconds": 3.0,
        "p95_seconds": 5.0,
    }
    assert document["results"][3]["judge"]["reason"] == "no 42"
    assert set(document["results"][0]) >= {"status", "output", "checks", "judge", "steps", "cost_usd", "seconds"}


def test_the_eval_id_is_the_same_for_the_same_command_only(tmp_path: Path) -> None:
    dataset = Dataset(tmp_path / "my cases.jsonl", "sha256:" + "0" * 64, [])
    first = eval_id(dataset, ["a:b"], 1, "agents")
    assert first == eval_id(dataset, ["a:b"], 1, "agents") and first.startswith("eval-my-cases-")
    others = {
        eval_id(dataset, ["a:c"], 1, "agents"),
        eval_id(dataset, ["a:b"], 2, "agents"),
        eval_id(dataset, ["a:b"], 1, "other"),
        eval_id(dataset, ["a:b"], 1, "agents", "v2"),
        eval_id(Dataset(dataset.path, "sha256:" + "1" * 64, []), ["a:b"], 1, "agents"),
    }
    assert first not in others and len(others) == 5
