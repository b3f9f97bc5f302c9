"""``starter.py eval DATASET.jsonl``: run a dataset of cases as agent runs, score them, compare models.

Each line of the dataset is one case (``workflows/eval_types.py``, ``EvalCase``): ``{"name", "input":
{AgentInput fields}, "checks": {...}, "approve": "all" | "none" | [tool names]}``. The whole dataset is
read and checked before anything starts: a line that is not a case (bad JSON, an unknown key, a
pattern RE2 refuses, a schema that is not one, a judge model no provider serves) is one line on
stderr naming the file and line number, and exit 2.

The eval runs as one ``EvalWorkflow`` (``workflows/eval.py``) whose id is derived from the dataset's
digest, the models, ``--runs``, ``--tag`` and the task queue: running the same command again, after
Ctrl-C, a lost connection or a worker that died, attaches to the same eval instead of starting over,
and once it has finished, prints its report again (``--tag`` names another eval of the same dataset).

The report: one row per model (pass rate, total cost, mean steps, p50/p95 wall time of the runs), a
case-by-model grid when several ``--model``\\ s are compared, then every failing check with its
reason. ``--json OUT`` writes it as JSON too (``-``: to stdout instead of the table). Exit 0 when every
run passed every check, 1 when any failed (or the eval itself failed), 2 for bad usage or a bad dataset.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.settings import Settings
from durable_agents.cli.common import (
    EXIT_OK,
    EXIT_RUN,
    EXIT_USAGE,
    CliError,
    _int_between,
    cli_command,
    on_interrupt,
    warn_when_no_worker,
)
from durable_agents.cli.names import check_model
from workflows.eval_types import (
    EVAL_ID_PREFIX,
    EVAL_WORKFLOW,
    MAX_CASES,
    MAX_CONCURRENCY,
    MAX_DATASET_BYTES,
    MAX_JOBS,
    MAX_LINE_BYTES,
    MAX_MODELS,
    MAX_RUNS,
    CaseRun,
    EvalCase,
    EvalInput,
    EvalReport,
)
from workflows.inputs import problems, safe

DEFAULT_MODEL_LABEL = "(each case's model)"
REASON_SHOWN = 200  # characters of a failing check's reason in the table (the JSON keeps the whole reason)


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "eval",
        help="run a dataset of cases (JSONL) as agent runs, score each with its checks, compare models",
        description="Run every case of DATASET (one JSON case a line) as an agent run, score it, print a report. "
        "Durable: running the same command again attaches to the same eval.",
    )
    parser.add_argument("dataset", help="a JSONL file: one case a line, {name, input, checks, approve}")
    parser.add_argument(
        "--model",
        dest="models",
        action="append",
        default=[],
        help="run every case with this model (repeat to compare models side by side; "
        "default: each case's own input.model, else the worker's AGENT_MODEL)",
    )
    parser.add_argument(
        "--runs",
        type=_int_between(1, MAX_RUNS, f"a number of runs from 1 to {MAX_RUNS}"),
        default=1,
        help="runs of each case with each model (default 1)",
    )
    parser.add_argument(
        "--concurrency",
        type=_int_between(1, MAX_CONCURRENCY, f"a number from 1 to {MAX_CONCURRENCY}"),
        default=4,
        help="runs at once (default 4)",
    )
    parser.add_argument(
        "--json", dest="json_out", metavar="OUT", help="also write the report as JSON to OUT ('-': stdout)"
    )
    parser.add_argument(
        "--tag",
        default="",
        help="a label in the eval's id: the same dataset, models and runs with another tag is a new eval",
    )


# --- the dataset ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    path: Path
    digest: str  # sha256 of its bytes
    cases: list[EvalCase]


def load_dataset(path: Path, settings: Settings | None = None) -> Dataset:
    """Every case of the JSONL file at ``path``, checked; ``CliError`` (exit 2) naming the first bad line.

    Blank lines are skipped. With ``settings``, a case's model and its judge's model must name a provider
    this environment has (as ``--model`` must).
    """
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CliError(f"cannot read dataset {path}: {err.strerror or err}", EXIT_USAGE) from None
    if len(data) > MAX_DATASET_BYTES:
        raise CliError(f"dataset {path} is {len(data)} bytes: at most {MAX_DATASET_BYTES}", EXIT_USAGE)
    cases: list[EvalCase] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        case = _case(raw, where)
        if case.name in seen:
            raise CliError(f"{where}: case name {case.name!r} is used on line {seen[case.name]} too", EXIT_USAGE)
        seen[case.name] = number
        _check_case(case, where, settings)
        cases.append(case)
        if len(cases) > MAX_CASES:
            raise CliError(f"{where}: dataset {path} has more than {MAX_CASES} cases", EXIT_USAGE)
    if not cases:
        raise CliError(f"dataset {path} has no cases (one JSON object a line)", EXIT_USAGE)
    return Dataset(path, "sha256:" + hashlib.sha256(data).hexdigest(), cases)


def _case(raw: bytes, where: str) -> EvalCase:
    if len(raw) > MAX_LINE_BYTES:
        raise CliError(f"{where}: the line is {len(raw)} bytes: at most {MAX_LINE_BYTES}", EXIT_USAGE)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CliError(f"{where}: not valid UTF-8 (byte {err.start})", EXIT_USAGE) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise CliError(f"{where}: not valid JSON: {err.msg} at column {err.colno}", EXIT_USAGE) from None
    except RecursionError:
        raise CliError(f"{where}: not valid JSON: nested too deeply", EXIT_USAGE) from None
    if not isinstance(value, dict):
        raise CliError(f"{where}: expected a JSON object (a case), got {type(value).__name__}", EXIT_USAGE)
    name = value.get("name")
    named = f" (case {safe(name, 64)!r})" if isinstance(name, str) else ""
    try:
        return EvalCase.model_validate(value)
    except ValidationError as err:
        raise CliError(f"{where}{named}: {problems(err)}", EXIT_USAGE) from None


def _check_case(case: EvalCase, where: str, settings: Settings | None) -> None:
    """What pydantic cannot check: the pattern (RE2), the schema, the models' providers."""
    from activities.evals import schema_problem
    from workflows.patterns import Pattern, PatternError

    checks = case.checks
    here = f"{where} (case {case.name!r})"
    if checks.output_matches is not None:
        try:
            Pattern(checks.output_matches, ignore_case=False)
        except PatternError as err:
            raise CliError(f"{here}: checks.output_matches: {err}", EXIT_USAGE) from None
    if checks.output_json_schema is not None:
        problem = schema_problem(checks.output_json_schema)
        if problem:
            raise CliError(f"{here}: checks.output_json_schema: {problem}", EXIT_USAGE)
    if settings is None:
        return
    for field, model in (
        ("input.model", case.input.model),
        ("checks.judge.model", checks.judge and checks.judge.model),
    ):
        if model:
            try:
                check_model(model, settings)
            except CliError as err:
                raise CliError(f"{here}: {field}: {str(err).removeprefix('--model ')}", EXIT_USAGE) from None


def eval_id(dataset: Dataset, models: list[str], runs: int, task_queue: str, tag: str = "") -> str:
    """The eval's workflow id: the dataset's name and a digest of what makes it this eval (same command → same id)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", dataset.path.stem).strip("-")[:40] or "dataset"
    key = json.dumps([dataset.digest, models, runs, task_queue, tag])
    return f"{EVAL_ID_PREFIX}{stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


# --- the command ---------------------------------------------------------------------------------


def prepare_eval(args: argparse.Namespace, settings: Settings) -> None:
    """Check the arguments and read the dataset before connecting (``args.eval``): every problem is exit 2."""
    models: list[str] = list(dict.fromkeys(args.models))
    if len(models) > MAX_MODELS:
        raise CliError(f"at most {MAX_MODELS} --model values", EXIT_USAGE)
    for model in models:
        check_model(model, settings)
    _json_target(args.json_out)
    dataset = load_dataset(Path(args.dataset), settings)
    jobs = len(dataset.cases) * max(1, len(models)) * args.runs
    if jobs > MAX_JOBS:
        raise CliError(
            f"{jobs} runs ({len(dataset.cases)} cases x {max(1, len(models))} models x {args.runs}): "
            f"at most {MAX_JOBS} in one eval",
            EXIT_USAGE,
        )
    args.eval = (
        dataset,
        EvalInput(
            dataset=str(dataset.path)[-1000:],
            digest=dataset.digest,
            cases=dataset.cases,
            models=models,
            runs=args.runs,
            concurrency=args.concurrency,
        ),
    )


async def cmd_eval(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    """Start (or attach to) the eval, wait for its report, print it; 0 when every run passed, else 1."""
    if getattr(args, "eval", None) is None:
        prepare_eval(args, settings)
    dataset, inp = args.eval
    models = inp.models
    task_queue = settings.temporal.task_queue
    jobs = len(inp.cases) * max(1, len(models)) * inp.runs
    out = args.json_out
    workflow_id = eval_id(dataset, models, args.runs, task_queue, args.tag)
    attached = await _existing(client, workflow_id)
    if attached is None:
        say(
            f"eval {workflow_id}: {jobs} run(s) ({len(dataset.cases)} case(s) x {max(1, len(models))} model(s) x "
            f"{args.runs}), {args.concurrency} at once, on task queue {task_queue}"
        )
    else:
        say(f"eval {workflow_id} {attached}: attaching (it does not start over)")
    try:
        handle = await client.start_workflow(
            EVAL_WORKFLOW,
            inp,
            id=workflow_id,
            task_queue=task_queue,
            result_type=EvalReport,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            # A finished eval is not run again (its report is read); one that failed or was ended may be.
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            static_summary=f"eval of {safe(dataset.path.name, 100)}: {jobs} run(s)",
        )
    except WorkflowAlreadyStartedError:
        handle = client.get_workflow_handle(workflow_id, result_type=EvalReport)
    again = cli_command(_same_command(args, models))
    on_interrupt(f"eval {workflow_id} goes on (Ctrl-C stops this command, not the eval); attach again with: {again}")
    watchdog = asyncio.ensure_future(warn_when_no_worker(client, workflow_id, task_queue, doing="waits for it"))
    try:
        report = await handle.result()
    except WorkflowFailureError as err:
        cause: BaseException = err
        while isinstance(getattr(cause, "cause", None), BaseException):
            cause = getattr(cause, "cause")  # noqa: B009 (a chain of Temporal failures: each has ``cause``)
        raise CliError(f"eval {workflow_id} failed: {' '.join(str(cause).split())}", EXIT_RUN) from None
    finally:
        watchdog.cancel()
    document = report_json(report, workflow_id)
    if out == "-":
        print(json.dumps(document, indent=2))
    else:
        print("\n".join(render(report, workflow_id)))
        if out is not None:
            _write(Path(out), document)
    return EXIT_OK if all(row.passed for row in report.results) else EXIT_RUN


def _same_command(args: argparse.Namespace, models: list[str]) -> str:
    """The command line that attaches to this eval again (what its id depends on)."""
    words = ["eval", args.dataset]
    for model in models:
        words += ["--model", model]
    if args.runs != 1:
        words += ["--runs", str(args.runs)]
    if args.tag:
        words += ["--tag", args.tag]
    return " ".join(shlex.quote(word) for word in words)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _json_target(out: str | None) -> str | None:
    """``--json``'s target, checked before the eval starts: its folder must exist."""
    if out is None or out == "-":
        return out
    folder = Path(out).parent
    if not folder.is_dir():
        raise CliError(f"--json {out!r}: no folder {str(folder)!r}", EXIT_USAGE)
    return out


def _write(path: Path, document: dict[str, Any]) -> None:
    try:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(document, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as err:
        raise CliError(f"--json {str(path)!r}: cannot write it: {err.strerror or err}", EXIT_USAGE) from None
    say(f"report written to {path}")


async def _existing(client: Client, workflow_id: str) -> str | None:
    """How the eval of this id stands when one exists ("running", "finished"), else None."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    if desc.close_time is None:
        return "is running"
    status = desc.status.name.lower() if desc.status is not None else "closed"
    return "has finished" if status == "completed" else None  # a failed or ended one starts anew


# --- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSummary:
    model: str
    runs: int
    passed: int
    cost_usd: float
    mean_steps: float
    p50_s: float
    p95_s: float

    @property
    def rate(self) -> float:
        return self.passed / self.runs if self.runs else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "runs": self.runs,
            "passed": self.passed,
            "pass_rate": round(self.rate, 4),
            "cost_usd": round(self.cost_usd, 6),
            "mean_steps": round(self.mean_steps, 2),
            "p50_seconds": round(self.p50_s, 3),
            "p95_seconds": round(self.p95_s, 3),
        }


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def label(model: str) -> str:
    return model or DEFAULT_MODEL_LABEL


def summaries(report: EvalReport) -> list[ModelSummary]:
    """One summary per model, in the order the models were given."""
    order = list(dict.fromkeys([*report.models, *(row.model for row in report.results)])) or [""]
    out = []
    for model in order:
        rows = [row for row in report.results if row.model == model]
        seconds = [row.seconds for row in rows]
        out.append(
            ModelSummary(
                model=label(model),
                runs=len(rows),
                passed=sum(1 for row in rows if row.passed),
                cost_usd=sum(row.cost_usd for row in rows),
                mean_steps=sum(row.steps for row in rows) / len(rows) if rows else 0.0,
                p50_s=percentile(seconds, 0.5),
                p95_s=percentile(seconds, 0.95),
            )
        )
    return out


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *rows]
    ]


def failures(row: CaseRun) -> list[str]:
    """``check: reason`` for each failing check of one run (the judge's included)."""
    found = [f"{check.check}: {check.reason}" for check in row.checks if not check.passed]
    if row.judge is not None and not row.judge.passed:
        found.append(f"judge ({row.judge.model}, score {row.judge.score:.2f}): {row.judge.reason}")
    return found


def render(report: EvalReport, workflow_id: str) -> list[str]:
    """The text report: the models' table, the case grid when several models are compared, the failures."""
    total = len(report.results)
    passed = sum(1 for row in report.results if row.passed)
    lines = [f"eval {workflow_id}: {report.dataset} ({report.digest[:19]}), {total} run(s), {passed} passed", ""]
    rows = [
        [
            s.model,
            f"{s.passed}/{s.runs} ({s.rate:.0%})",
            f"${s.cost_usd:.4f}",
            f"{s.mean_steps:.1f}",
            f"{s.p50_s:.1f}s",
            f"{s.p95_s:.1f}s",
        ]
        for s in summaries(report)
    ]
    lines += _table(["model", "passed", "cost", "steps", "p50", "p95"], rows)
    models = list(dict.fromkeys(row.model for row in report.results))
    if len(models) > 1:
        cases = list(dict.fromkeys(row.case for row in report.results))
        grid = []
        for case in cases:
            cells = [case]
            for model in models:
                rows_of = [row for row in report.results if row.case == case and row.model == model]
                ok = sum(1 for row in rows_of if row.passed)
                cells.append(
                    ("pass" if ok == len(rows_of) else "FAIL") + (f" {ok}/{len(rows_of)}" if report.runs > 1 else "")
                )
            grid.append(cells)
        lines += ["", *_table(["case", *(label(m) for m in models)], grid)]
    failed = [row for row in report.results if not row.passed]
    if failed:
        lines += ["", "failures:"]
        for row in failed:
            who = f"{row.case} run {row.run}" + (f" with {row.model}" if row.model else "")
            for reason in failures(row) or ["failed"]:
                lines.append(f"  FAIL {who}: {safe(reason, REASON_SHOWN)}")
    return lines


def report_json(report: EvalReport, workflow_id: str) -> dict[str, Any]:
    """The ``--json`` document: the eval, the models' summaries, and every run with its checks."""
    return {
        "eval_id": workflow_id,
        "dataset": report.dataset,
        "digest": report.digest,
        "runs": report.runs,
        "passed": all(row.passed for row in report.results),
        "models": [s.as_json() for s in summaries(report)],
        "results": [row.model_dump(mode="json") for row in report.results],
    }


__all__ = ["Dataset", "add_command", "cmd_eval", "eval_id", "load_dataset", "render", "report_json"]
