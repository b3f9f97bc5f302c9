"""The data contract of evals: a dataset's cases, ``EvalWorkflow``'s input and report, its activities' I/O.

An eval (``starter.py eval DATASET.jsonl``) runs every case of a dataset, for every model compared and
``runs`` times each, as a child ``AgentWorkflow`` of one ``EvalWorkflow`` (``workflows/eval.py``), then
scores each run with the ``eval_score`` activity (and ``eval_judge`` for a case with a ``judge``) in
``activities/evals.py``. Every size a dataset can set is bounded here, so that a hostile dataset cannot
grow the eval's history or its report past Temporal's payload limits.

Pure pydantic (workflow code imports it). New fields always get defaults.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from workflows.known_keys import KnownKeys
from workflows.types import MAX_NAME_CHARS, AgentInput, Name, ResultStatus

EVAL_WORKFLOW = "EvalWorkflow"
EVAL_SCORE_ACTIVITY = "eval_score"
EVAL_JUDGE_ACTIVITY = "eval_judge"
EVAL_REVIEWER = "eval"  # the reviewer of every decision an eval makes for its runs
EVAL_ID_PREFIX = "eval-"

MAX_LINE_BYTES = 64 * 1024  # of one dataset line (a case)
MAX_DATASET_BYTES = 1024 * 1024  # of a whole dataset: the eval's input carries it
MAX_CASES = 200
MAX_MODELS = 10
MAX_RUNS = 20  # of each (model, case)
MAX_JOBS = 200  # models x cases x runs: each is a child run and one entry of the report
MAX_CONCURRENCY = 50
MAX_PATTERN_CHARS = 1000  # of ``output_matches`` (its RE2 program is bounded too: workflows/patterns.py)
MAX_SCHEMA_BYTES = 16 * 1024  # of ``output_json_schema``, as JSON
MAX_ARGS_BYTES = 4 * 1024  # of a ``tools_called`` entry's ``args``, as JSON
MAX_RUBRIC_CHARS = 4000
MAX_TOOL_EXPECTATIONS = 20  # names in ``tools_called`` / ``tools_not_called``
MAX_REASON_CHARS = 500  # of a check's reason in the report
MAX_OUTPUT_CHARS = 2000  # of a run's output in the report (the run's own result keeps all of it)
CASE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"  # safe in a workflow id, a table and a shell


def json_bounded(value: dict[str, Any] | None, limit: int) -> dict[str, Any] | None:
    """``value`` unchanged when its JSON is at most ``limit`` bytes; ``ValueError`` otherwise."""
    if value is not None and len(json.dumps(value, default=str).encode()) > limit:
        raise ValueError(f"at most {limit} bytes of JSON")
    return value


Approve = Literal["all", "none"] | list[Name]
CheckKind = Literal[
    "output_matches",
    "output_json_schema",
    "tools_called",
    "tools_not_called",
    "max_steps",
    "max_cost_usd",
    "max_seconds",
    "judge",
    "run",  # the run itself: it did not complete, or could not be read
]


class ToolExpectation(KnownKeys):
    """A tool call a case expects (or forbids): its name and, optionally, a subset of its arguments.

    A call matches when its name is ``name`` and its arguments contain every key of ``args`` with an equal
    value (nested objects: the same rule, recursively). In a dataset, a bare string is ``{"name": ...}``.
    """

    name: Name = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("args")
    @classmethod
    def _args_bounded(cls, args: dict[str, Any]) -> dict[str, Any]:
        json_bounded(args, MAX_ARGS_BYTES)
        return args

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class JudgeSpec(KnownKeys):
    """A model that grades the run's transcript against ``rubric`` (``provider:model``, as a run's model)."""

    model: Name = Field(min_length=1)
    rubric: str = Field(min_length=1, max_length=MAX_RUBRIC_CHARS)


class EvalChecks(KnownKeys):
    """What a case's run must satisfy; every check set is scored, none set is a run that must complete."""

    output_matches: str | None = Field(default=None, min_length=1, max_length=MAX_PATTERN_CHARS)  # RE2, searched
    output_json_schema: dict[str, Any] | None = None  # the output is JSON valid under this JSON Schema
    tools_called: list[ToolExpectation] = Field(default_factory=list, max_length=MAX_TOOL_EXPECTATIONS)
    tools_not_called: list[ToolExpectation] = Field(default_factory=list, max_length=MAX_TOOL_EXPECTATIONS)
    max_steps: int | None = Field(default=None, ge=0, le=10**6)
    max_cost_usd: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False)
    max_seconds: float | None = Field(default=None, ge=0, le=1e7, allow_inf_nan=False)  # the run's wall time
    judge: JudgeSpec | None = None

    @field_validator("output_json_schema")
    @classmethod
    def _schema_bounded(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        return json_bounded(schema, MAX_SCHEMA_BYTES)


class EvalCase(KnownKeys):
    """One dataset line: a run's input, what its run must satisfy, and how its approvals are decided.

    ``approve``: ``"none"`` (the default) rejects every tool call that asks for approval, ``"all"``
    approves each, a list approves the calls of the tools it names and rejects the others.
    """

    name: str = Field(pattern=CASE_NAME_PATTERN)
    input: AgentInput
    checks: EvalChecks = Field(default_factory=EvalChecks)
    approve: Approve = "none"

    @field_validator("input")
    @classmethod
    def _plain_run(cls, inp: AgentInput) -> AgentInput:
        # A session waits for messages after its reply and a fork needs a source run: neither ends on its own.
        if inp.session is not None:
            raise ValueError("an eval case is a plain run: no 'session'")
        if inp.fork is not None:
            raise ValueError("an eval case is a plain run: no 'fork'")
        return inp


class EvalInput(BaseModel):
    """``EvalWorkflow``'s input: every case, run ``runs`` times with each model, ``concurrency`` at once.

    ``models`` empty: each case's own ``input.model`` (or the worker's default); else each model replaces it.
    """

    dataset: str = Field(default="", max_length=1000)  # the dataset's name, shown in the report
    digest: str = Field(default="", max_length=100)  # sha256 of the dataset's bytes
    cases: list[EvalCase] = Field(min_length=1, max_length=MAX_CASES)
    models: list[Name] = Field(default_factory=list, max_length=MAX_MODELS)
    runs: int = Field(default=1, ge=1, le=MAX_RUNS)
    concurrency: int = Field(default=4, ge=1, le=MAX_CONCURRENCY)
    task_queue: str = Field(default="", max_length=1000)  # the children's ("": the eval's own)

    @model_validator(mode="after")
    def _bounded_jobs(self) -> EvalInput:
        jobs = len(self.cases) * max(1, len(self.models)) * self.runs
        if jobs > MAX_JOBS:
            raise ValueError(f"{jobs} runs (cases x models x runs): at most {MAX_JOBS} in one eval")
        names = [case.name for case in self.cases]
        duplicate = next((name for name in names if names.count(name) > 1), "")
        if duplicate:
            raise ValueError(f"case name {duplicate!r} is used twice")
        if len(set(self.models)) != len(self.models):
            raise ValueError("a model is named twice")
        return self


Reason = Annotated[str, Field(max_length=MAX_REASON_CHARS)]


class CheckResult(BaseModel):
    check: CheckKind
    passed: bool
    reason: Reason = ""  # why it failed (or, for a pass, what was seen)


class JudgeGrade(BaseModel):
    """What the judge model answered (``passed`` false with the reason when its answer was not a verdict)."""

    model: str = Field(default="", max_length=MAX_NAME_CHARS)
    passed: bool = False
    score: float = Field(default=0.0, ge=0.0, le=1.0)
    reason: Reason = ""
    cost_usd: float = 0.0  # what the judge's own call cost (not counted in the run's cost)
    answered: bool = False  # the judge's answer parsed as a verdict


class ScoreRequest(BaseModel):
    """``eval_score``: the checks of one finished run, from its result and its transcript in the run store."""

    workflow_id: str = Field(max_length=1000)
    run_id: str = Field(default="", max_length=100)  # the child's first run (its conversation's)
    status: ResultStatus | Literal["error"] = "completed"
    output: str = ""
    steps: int = 0
    cost_usd: float = 0.0
    checks: EvalChecks = Field(default_factory=EvalChecks)


class ScoreResult(BaseModel):
    checks: list[CheckResult] = Field(default_factory=list)
    seconds: float = 0.0  # the run's wall time, start to close (its workflow's)
    tools: list[Name] = Field(default_factory=list, max_length=200)  # the tools it called, in order (cut at 200)


class JudgeRequest(BaseModel):
    """``eval_judge``: grade the run's transcript (read from the run store) against ``judge.rubric``."""

    workflow_id: str = Field(max_length=1000)
    run_id: str = Field(default="", max_length=100)
    judge: JudgeSpec
    output: str = ""


class CaseRun(BaseModel):
    """One (model, case, run) of the report."""

    model: str = Field(default="", max_length=MAX_NAME_CHARS)  # "" : the case's own model or the worker default
    case: str
    run: int = 1
    workflow_id: str = ""
    status: ResultStatus | Literal["error"] = "completed"  # error: the child failed as a workflow
    output: str = Field(default="", max_length=MAX_OUTPUT_CHARS + 1)
    passed: bool = False
    checks: list[CheckResult] = Field(default_factory=list)
    judge: JudgeGrade | None = None
    steps: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0


class EvalReport(BaseModel):
    """``EvalWorkflow``'s result: every run scored, in the order of the jobs (run, case, model)."""

    dataset: str = ""
    digest: str = ""
    models: list[str] = Field(default_factory=list)
    runs: int = 1
    results: list[CaseRun] = Field(default_factory=list)


class EvalProgress(BaseModel):
    """The ``progress`` query: how far the eval is."""

    total: int = 0
    started: int = 0
    finished: int = 0
    passed: int = 0
    decisions: int = 0  # approvals the eval decided for its runs
