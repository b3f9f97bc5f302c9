"""The scoring side of evals: ``eval_score`` (the checks) and ``eval_judge`` (a model's grade).

``eval_score`` reads a finished run's transcript from the run store (its conversation is
``<workflow id>/<first run id>``) for the tool calls the model made, asks Temporal for the run's wall
time (its workflow's start to close), and scores the case's checks (:func:`score`):

- ``run``: always; the run completed (any other status fails the case);
- ``output_matches``: an RE2 pattern (``workflows/patterns.py``: linear time, bounded program) found in
  the output; an output over 64 KiB is not matched and fails the check;
- ``output_json_schema``: the output (or the one fenced code block it is) parses as JSON and is valid
  under the schema, the errors named with their paths. ``pattern`` keywords are matched with RE2;
  a schema with ``patternProperties`` is refused when the dataset is read (jsonschema would match it
  with Python's backtracking ``re``);
- ``tools_called`` / ``tools_not_called``: a call counts when the model made it (whether it then ran,
  was refused by policy or a reviewer, or failed); it matches an expectation when the names are equal
  and its arguments contain the expectation's ``args`` (:func:`contains`);
- ``max_steps``, ``max_cost_usd``, ``max_seconds``.

``eval_judge`` asks the judge model, through the worker's provider registry as the ``model`` activity
does, to grade the transcript against the rubric and answer ``{"pass": bool, "score": 0..1, "reason":
str}``. An answer that is not such a verdict, or a model the worker cannot serve, is a failed grade
with that reason, never an error; a provider's retryable errors (429, 5xx) are retried by Temporal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from activities.models.base import FatalProviderError, RetryableProviderError, complete_capped
from activities.redaction import redact
from activities.runtime import Runtime
from activities.store_errors import store_guarded
from workflows.eval_types import (
    EVAL_JUDGE_ACTIVITY,
    EVAL_SCORE_ACTIVITY,
    MAX_REASON_CHARS,
    CheckResult,
    EvalChecks,
    JudgeGrade,
    JudgeRequest,
    ScoreRequest,
    ScoreResult,
    ToolExpectation,
)
from workflows.inputs import safe
from workflows.patterns import MAX_MATCHED_BYTES, Pattern, PatternError
from workflows.types import MAX_NAME_CHARS, Message

MAX_TRANSCRIPT_ENTRIES = 10_000  # read for the tool calls of one run
MAX_JUDGE_TRANSCRIPT_CHARS = 24_000  # of the transcript the judge reads (its start and its end)
MAX_VERDICT_CHARS = 64 * 1024  # of a judge's answer that is parsed
JUDGE_OUTPUT_TOKENS = 1024
PREVIEW = 120  # characters of a value a reason quotes
SCHEMA_ERRORS_SHOWN = 3

JUDGE_PROMPT = (
    "You are a strict grader of an AI agent's work. You get a rubric and the transcript of one run: "
    "the task, the agent's tool calls with their results, and its final answer. Decide whether the run "
    "meets the rubric. Answer with one JSON object and nothing else: "
    '{"pass": true or false, "score": a number from 0 to 1, "reason": "one or two sentences"}.'
)


@dataclass(frozen=True)
class Call:
    """A tool call the model made: its name and its arguments ({} when they were not a JSON object)."""

    name: str
    arguments: dict[str, Any]


# --- the checks (pure) -------------------------------------------------------------------------


def _cut(text: str, limit: int = MAX_REASON_CHARS) -> str:
    return safe(" ".join(text.split()), limit)


def _preview(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
    return repr(safe(" ".join(text.split()), PREVIEW))


def contains(actual: object, expected: object) -> bool:
    """Whether ``actual`` holds ``expected``: an object holds every key of ``expected`` with a value that holds
    that key's value; anything else must be equal (``true`` is not ``1``)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and contains(actual[k], v) for k, v in expected.items())
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    return actual == expected


def matches(call: Call, expected: ToolExpectation) -> bool:
    return call.name == expected.name and contains(call.arguments, expected.args)


def _named(expected: ToolExpectation) -> str:
    return expected.name + (f" with args {_preview(expected.args)}" if expected.args else "")


def json_output(output: str) -> Any:
    """The output as JSON: the whole text, or the one fenced code block it is (```json ... ```)."""
    text = output.strip()
    fenced = re.fullmatch(r"```[A-Za-z0-9_-]*\n(.*)\n```", text, flags=re.DOTALL)
    return json.loads(fenced.group(1) if fenced else text)


def schema_problem(schema: dict[str, Any]) -> str:
    """Why ``schema`` cannot be an ``output_json_schema`` ("" when it can): not a valid JSON Schema, a
    ``pattern`` RE2 refuses, or ``patternProperties`` (which jsonschema matches with backtracking ``re``)."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    for key, value in _walk(schema):
        if key == "patternProperties":
            return "patternProperties is not supported (its patterns would not be matched with RE2); use propertyNames"
        if key == "pattern" and isinstance(value, str):
            try:
                Pattern(value, ignore_case=False)
            except PatternError as err:
                return f"pattern: {err}"
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as err:
        return f"not a valid JSON Schema: {_cut(err.message, 300)}"
    return ""


def _walk(value: object) -> Iterator[tuple[str, object]]:
    """Every (key, value) of every object nested in ``value``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                yield str(key), child
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)


def _re2_pattern(validator: Any, pattern: str, instance: object, schema: dict[str, Any]) -> Iterator[Any]:
    """jsonschema's ``pattern`` keyword, matched with RE2 (linear time) instead of Python's ``re``."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "string"):
        return
    try:
        found = Pattern(pattern, ignore_case=False).search(str(instance))
    except PatternError as err:
        yield ValidationError(str(err))
        return
    if not found:
        yield ValidationError(f"{_preview(instance)} does not match {pattern!r}")


def schema_errors(instance: object, schema: dict[str, Any]) -> list[str]:
    """``$.path: message`` for each way ``instance`` breaks ``schema`` (empty: valid), the first few, in order."""
    from jsonschema.validators import extend, validator_for

    base = validator_for(schema)
    checker = extend(base, {"pattern": _re2_pattern})(schema)
    errors = sorted(checker.iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    shown = []
    for err in errors[:SCHEMA_ERRORS_SHOWN]:
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        shown.append(f"{path}: {_cut(err.message, 150)}")
    if len(errors) > SCHEMA_ERRORS_SHOWN:
        shown.append(f"and {len(errors) - SCHEMA_ERRORS_SHOWN} more")
    return shown


def score(req: ScoreRequest, calls: list[Call], seconds: float) -> list[CheckResult]:
    """Every check of ``req.checks`` (and ``run``), in a fixed order, each with why it failed."""
    checks: EvalChecks = req.checks
    out: list[CheckResult] = []

    def add(kind: Any, passed: bool, reason: str) -> None:
        out.append(CheckResult(check=kind, passed=passed, reason=_cut(reason)))

    first_line = (req.output.strip().splitlines() or [""])[0]
    add("run", req.status == "completed", f"the run ended {req.status}" + (f": {first_line}" if first_line else ""))
    if checks.output_matches is not None:
        try:
            found = Pattern(checks.output_matches, ignore_case=False).search(req.output)
        except PatternError as err:
            add("output_matches", False, str(err))
        else:
            if found is None:
                add("output_matches", False, f"the output is over {MAX_MATCHED_BYTES} bytes: not matched")
            else:
                shown = f"/{safe(checks.output_matches, 80)}/"
                add("output_matches", found, f"{shown} {'found' if found else 'not found'} in {_preview(req.output)}")
    if checks.output_json_schema is not None:
        add("output_json_schema", *_schema_check(req.output, checks.output_json_schema))
    names = [call.name for call in calls]
    called = ", ".join(dict.fromkeys(names)) or "no tools"
    if checks.tools_called:
        missing = [e for e in checks.tools_called if not any(matches(c, e) for c in calls)]
        add(
            "tools_called",
            not missing,
            f"no call of {'; '.join(_named(e) for e in missing)} (called: {called})" if missing else f"called {called}",
        )
    if checks.tools_not_called:
        made = [(e, c) for e in checks.tools_not_called for c in calls if matches(c, e)]
        add(
            "tools_not_called",
            not made,
            "; ".join(f"called {c.name} {_preview(c.arguments)}" for _, c in made[:3])
            if made
            else f"none of {', '.join(e.name for e in checks.tools_not_called)} called",
        )
    if checks.max_steps is not None:
        add("max_steps", req.steps <= checks.max_steps, f"{req.steps} steps (at most {checks.max_steps})")
    if checks.max_cost_usd is not None:
        add(
            "max_cost_usd",
            req.cost_usd <= checks.max_cost_usd,
            f"${req.cost_usd:.4f} (at most ${checks.max_cost_usd:.4f})",
        )
    if checks.max_seconds is not None:
        add("max_seconds", seconds <= checks.max_seconds, f"{seconds:.1f} s (at most {checks.max_seconds:g} s)")
    return out


def _schema_check(output: str, schema: dict[str, Any]) -> tuple[bool, str]:
    try:
        instance = json_output(output)
    except json.JSONDecodeError as err:
        return False, f"the output is not JSON ({err.msg} at line {err.lineno} column {err.colno}): {_preview(output)}"
    except RecursionError:
        return False, "the output is not JSON: nested too deeply"
    problem = schema_problem(schema)
    if problem:
        return False, f"the schema: {problem}"
    try:
        errors = schema_errors(instance, schema)
    except RecursionError:
        return False, "the schema could not be checked: nested too deeply"
    return (False, "the output does not match the schema: " + "; ".join(errors)) if errors else (True, "valid")


def tool_calls(messages: list[Message]) -> list[Call]:
    """Every tool call the model made in a transcript, in order."""
    calls = []
    for message in messages:
        for call in message.tool_calls:
            try:
                arguments = json.loads(call.arguments_json or "{}")
            except (json.JSONDecodeError, RecursionError):
                arguments = {}
            calls.append(Call(call.name, arguments if isinstance(arguments, dict) else {}))
    return calls


# --- the judge's verdict (pure) ------------------------------------------------------------------


def parse_verdict(text: str) -> tuple[bool, float, str] | str:
    """``(passed, score, reason)`` from a judge's answer, or why it is not a verdict.

    Taken: a JSON object, alone, in a fenced code block, or the first ``{...}`` span of the text that
    parses; ``pass`` (or ``passed``) a boolean, ``score`` a number from 0 to 1 (missing: 1 for a pass,
    0 otherwise), ``reason`` a string (missing: "").
    """
    text = text[:MAX_VERDICT_CHARS].strip()
    if not text:
        return "the judge answered nothing"
    verdict = _first_object(text)
    if verdict is None:
        return f"the judge's answer is not a JSON verdict: {_preview(text)}"
    passed = verdict.get("pass", verdict.get("passed"))
    if not isinstance(passed, bool):
        return f"the judge's verdict has no boolean 'pass': {_preview(verdict)}"
    grade = verdict.get("score", 1.0 if passed else 0.0)
    if isinstance(grade, bool) or not isinstance(grade, int | float) or not 0 <= grade <= 1:
        return f"the judge's score is not a number from 0 to 1: {_preview(grade)}"
    reason = verdict.get("reason", "")
    if not isinstance(reason, str):
        reason = json.dumps(reason, default=str)
    return passed, float(grade), _cut(reason)


def _first_object(text: str) -> dict[str, Any] | None:
    """The text as a JSON object, else its fenced block, else the first object that starts at one of its
    first 50 ``{`` (what follows it is ignored)."""
    decoder = json.JSONDecoder()
    candidates = [text]
    fenced = re.search(r"```(?:json)?\s*\n(.*?)\n\s*```", text, flags=re.DOTALL)
    if fenced:
        candidates.append(fenced.group(1).strip())
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    start, tries = text.find("{"), 0
    while start != -1 and tries < 50:
        tries += 1
        try:
            value, _ = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def judge_prompt(rubric: str, messages: list[Message], output: str) -> list[Message]:
    """The judge's conversation: the grading instructions, then the rubric, the transcript and the output."""
    lines = []
    for message in messages:
        if message.role == "system":
            continue
        if message.role == "tool":
            lines.append(
                f"[tool result {message.name}{' (error)' if message.is_error else ''}] {message.content[:1000]}"
            )
            continue
        if message.content:
            lines.append(f"[{message.role}] {message.content[:4000]}")
        lines.extend(f"[tool call {call.name}] {call.arguments_json[:500]}" for call in message.tool_calls)
    transcript = "\n".join(lines)
    if len(transcript) > MAX_JUDGE_TRANSCRIPT_CHARS:
        half = MAX_JUDGE_TRANSCRIPT_CHARS // 2
        transcript = transcript[:half] + "\n[... transcript cut ...]\n" + transcript[-half:]
    text = (
        f"Rubric:\n{rubric}\n\nTranscript:\n{transcript or '(empty)'}\n\nFinal answer:\n{output[:8000]}\n\n"
        'Answer with JSON only: {"pass": true|false, "score": 0..1, "reason": "..."}'
    )
    return [Message(role="system", content=JUDGE_PROMPT), Message(role="user", content=text)]


# --- the activities ------------------------------------------------------------------------------


class EvalActivities:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def _messages(self, workflow_id: str, run_id: str) -> list[Message]:
        if not run_id:
            return []
        stored = await self._rt.store.transcript(f"{workflow_id}/{run_id}", limit=MAX_TRANSCRIPT_ENTRIES)
        return [entry.message for entry in stored]

    async def _seconds(self, workflow_id: str, run_id: str) -> float:
        """The run's wall time: its first execution's start to its latest's close (0 when unknown)."""
        client = activity.client()
        first = await client.get_workflow_handle(workflow_id, run_id=run_id or None).describe()
        last = first
        if first.status == WorkflowExecutionStatus.CONTINUED_AS_NEW:  # the chain ended in a later run
            last = await client.get_workflow_handle(workflow_id).describe()
        if first.start_time is None or last.close_time is None:
            return 0.0
        return round(max(0.0, (last.close_time - first.start_time).total_seconds()), 3)

    @activity.defn(name=EVAL_SCORE_ACTIVITY)
    @store_guarded
    async def eval_score(self, req: ScoreRequest) -> ScoreResult:
        calls = tool_calls(await self._messages(req.workflow_id, req.run_id))
        seconds = await self._seconds(req.workflow_id, req.run_id)
        return ScoreResult(
            checks=score(req, calls, seconds), seconds=seconds, tools=[c.name[:MAX_NAME_CHARS] for c in calls][:200]
        )

    @activity.defn(name=EVAL_JUDGE_ACTIVITY)
    @store_guarded
    async def eval_judge(self, req: JudgeRequest) -> JudgeGrade:
        judge = req.judge
        grade = JudgeGrade(model=judge.model)
        secrets = self._rt.settings.secret_values()
        try:
            prefix, name = self._rt.providers.registry.check_model(judge.model)
            provider = self._rt.providers.get(prefix)
            messages = judge_prompt(judge.rubric, await self._messages(req.workflow_id, req.run_id), req.output)
            cap = min(JUDGE_OUTPUT_TOKENS, self._rt.settings.max_output_tokens)
            reply = await complete_capped(provider, name, messages, [], cap)
        except RetryableProviderError as err:
            raise ApplicationError(redact(err.message, secrets), type="ModelUnavailable") from None
        except FatalProviderError as err:
            grade.reason = _cut(f"the judge model refused: {redact(err.message, secrets)}")
            return grade
        grade.cost_usd = self._rt.prices.cost_usd(judge.model, reply.input_tokens, reply.output_tokens)
        verdict = parse_verdict(redact(reply.text, secrets))
        if isinstance(verdict, str):
            grade.reason = verdict
            return grade
        grade.passed, grade.score, grade.reason = verdict
        grade.answered = True
        return grade
