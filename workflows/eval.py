"""``EvalWorkflow``: a dataset's cases, run as child ``AgentWorkflow``\\ s and scored, durably.

Every (model, case, run) of :class:`~workflows.eval_types.EvalInput` is one *job*: a child
``AgentWorkflow`` with a deterministic workflow id, ``<eval id>/<case>/m<model>r<run>``, whose input is
the case's with the model replaced (when models are compared). At most ``concurrency`` children run at
once; the jobs start in a fixed order (run, then case, then model), so that models compared side by side
meet a case at about the same time. When a child ends, the ``eval_score`` activity scores it from its
result and its transcript in the run store (regex, JSON Schema, tools, steps, cost, wall time:
``activities/evals.py``), then ``eval_judge`` asks the case's judge model for a grade, when it has one.
The workflow returns the :class:`~workflows.eval_types.EvalReport`.

Durability is Temporal's: a child that completed, and a score that was recorded, are in this workflow's
history, so a worker that dies halfway leaves the eval to the next worker, which replays the history
and starts only the jobs that had not started (a child already running goes on where it was).

Approvals: the children are started as sub-agents are (``depth`` 1), so each reports what it waits for
to its parent with the ``child_approvals`` signal (``workflows/approval_handlers.py``), and this
workflow answers every tool-call approval by the case's ``approve`` with an ``approve`` or ``reject``
signal from reviewer ``eval``. Questions (``ask_human``) and unknown outcomes are not decided: the run
waits for a person (or its approval timeout). A run whose worker requires signed decisions
(``AGENT_APPROVAL_KEY``) refuses the eval's unsigned ones. Signals name no sender, so a forged report
can make this workflow decide an approval of one of its children by the case's rule; anyone who can
send that signal can send the decision itself too, so it gives no more than signalling the child does.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from workflows.eval_types import (
        EVAL_JUDGE_ACTIVITY,
        EVAL_REVIEWER,
        EVAL_SCORE_ACTIVITY,
        EVAL_WORKFLOW,
        MAX_OUTPUT_CHARS,
        MAX_REASON_CHARS,
        Approve,
        CaseRun,
        CheckResult,
        EvalCase,
        EvalInput,
        EvalProgress,
        EvalReport,
        JudgeGrade,
        JudgeRequest,
        ScoreRequest,
        ScoreResult,
    )
    from workflows.inputs import NO_PAYLOAD, decode, one_payload, safe
    from workflows.run_failure import result_of_failure
    from workflows.types import (
        MAX_APPROVERS,
        AgentInput,
        AgentResult,
        ApproveSignal,
        ChildApprovalsSignal,
        PendingApproval,
        RejectSignal,
        Usage,
    )

if TYPE_CHECKING:
    EvalRawInput = EvalInput | RawValue
    ChildApprovalsInput = ChildApprovalsSignal | RawValue
else:
    EvalRawInput = ChildApprovalsInput = RawValue

AGENT_WORKFLOW = "AgentWorkflow"
# Scoring reads the run store and Temporal: transient failures are retried, for at most ~5 minutes.
SCORE_TIMEOUT = timedelta(minutes=2)
SCORE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=10
)
# A judge is a model call: the provider's own retryable errors (429, 5xx) are retried like a run's turn.
JUDGE_TIMEOUT = timedelta(minutes=5)
JUDGE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=60), maximum_attempts=6
)


def child_workflow_id(eval_id: str, case: EvalCase, model_index: int, run: int) -> str:
    """The deterministic id of a job's run: the same eval always names the same children."""
    return f"{eval_id}/{case.name}/m{model_index + 1}r{run}"


def child_input(case: EvalCase, model: str) -> AgentInput:
    """The case's input for one job: ``model`` in place of its own (when given), one level deep.

    ``depth`` 1 is what turns the child's approval reports to its parent on (a top-level run reports to
    no one); it also counts the run as one level of delegation. A case with ``approvers`` gets ``eval``
    among them, so that the eval's decisions are accepted.
    """
    update: dict[str, Any] = {"depth": 1}
    if model:
        update["model"] = model
    approvers = case.input.approvers
    if approvers and EVAL_REVIEWER not in approvers and len(approvers) < MAX_APPROVERS:
        update["approvers"] = [*approvers, EVAL_REVIEWER]
    return case.input.model_copy(update=update)


def decision_for(rule: Approve, approval: PendingApproval) -> bool:
    """Whether the case approves this call (``all``, or its tool named in the list); else it is rejected."""
    if rule == "all":
        return True
    if rule == "none":
        return False
    return approval.tool in rule


def passed_all(checks: list[CheckResult], judge: JudgeGrade | None) -> bool:
    return all(check.passed for check in checks) and (judge is None or judge.passed)


@workflow.defn(name=EVAL_WORKFLOW)
class EvalWorkflow:
    def __init__(self) -> None:
        self._rules: dict[str, Approve] = {}  # each started child's approval rule (its case's ``approve``)
        self._live: set[str] = set()  # children started and not ended
        self._decided: set[tuple[str, str]] = set()  # (run, approval id) the eval has answered
        self._running = 0
        self._progress = EvalProgress()

    @workflow.query(name="progress")
    def progress(self) -> EvalProgress:
        return self._progress

    @workflow.run
    @one_payload
    async def run(self, raw: EvalRawInput = NO_PAYLOAD, *extra: Any) -> EvalReport:
        """Run every job, at most ``concurrency`` at once, and return the report; an input that is not an
        ``EvalInput`` fails the eval on its first task with ``InvalidInput`` (never a task retried forever)."""
        inp = decode(raw, EvalInput, extra)
        if isinstance(inp, str):
            raise ApplicationError(f"invalid eval input: {inp}", type="InvalidInput", non_retryable=True)
        jobs = [
            (case_index, model_index, run)
            for run in range(1, inp.runs + 1)
            for case_index in range(len(inp.cases))
            for model_index in range(max(1, len(inp.models)))
        ]
        self._progress.total = len(jobs)
        results: list[CaseRun | None] = [None] * len(jobs)

        async def one(index: int, case_index: int, model_index: int, run: int) -> None:
            try:
                results[index] = await self._job(inp, inp.cases[case_index], model_index, run)
            finally:
                self._running -= 1
                self._progress.finished += 1

        tasks: list[asyncio.Task[None]] = []
        for index, (case_index, model_index, run) in enumerate(jobs):
            await workflow.wait_condition(lambda: self._running < inp.concurrency)
            self._running += 1
            self._progress.started += 1
            tasks.append(asyncio.create_task(one(index, case_index, model_index, run)))
        await asyncio.gather(*tasks)
        # Decisions still being sent finish before the workflow does (their children have ended anyway).
        await workflow.wait_condition(workflow.all_handlers_finished)
        return EvalReport(
            dataset=inp.dataset,
            digest=inp.digest,
            models=list(inp.models),
            runs=inp.runs,
            results=[r for r in results if r is not None],
        )

    async def _job(self, inp: EvalInput, case: EvalCase, model_index: int, run: int) -> CaseRun:
        """One child run, then its score (and its judge's grade)."""
        model = inp.models[model_index] if inp.models else ""
        child_id = child_workflow_id(workflow.info().workflow_id, case, model_index, run)
        row = CaseRun(model=model, case=case.name, run=run, workflow_id=child_id)
        run_id = ""
        try:
            handle = await workflow.start_child_workflow(
                AGENT_WORKFLOW,
                child_input(case, model),
                id=child_id,
                task_queue=inp.task_queue or None,
                result_type=AgentResult,
                # Cancelled with the eval: the run compensates and cleans up its sandbox on its own.
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                static_summary=f"eval case {case.name} run {run}" + (f" with {model}" if model else ""),
            )
            run_id = handle.first_execution_run_id or ""
            self._rules[child_id] = case.approve
            self._live.add(child_id)
            try:
                result: AgentResult = await handle
            finally:
                self._live.discard(child_id)
        except ChildWorkflowError as err:
            failed = result_of_failure(err)  # a run that ended failed with AGENT_FAIL_WORKFLOW_ON_ERROR
            if failed is None:
                return self._errored(row, f"the run failed as a workflow: {_cause(err)}")
            result = failed
        except WorkflowAlreadyStartedError as err:  # its id is taken by a workflow that still runs
            return self._errored(row, f"the run could not be started: {_cause(err)}")
        row.status, row.steps, row.cost_usd = result.status, result.steps, _cost(result.usage)
        row.output = result.output[:MAX_OUTPUT_CHARS]
        row.checks, row.seconds = await self._score(child_id, run_id, case, result)
        if case.checks.judge is not None:
            row.judge = await self._judge(child_id, run_id, case, result)
        row.passed = passed_all(row.checks, row.judge)
        if row.passed:
            self._progress.passed += 1
        return row

    async def _score(
        self, child_id: str, run_id: str, case: EvalCase, result: AgentResult
    ) -> tuple[list[CheckResult], float]:
        request = ScoreRequest(
            workflow_id=child_id,
            run_id=run_id,
            status=result.status,
            output=result.output,
            steps=result.steps,
            cost_usd=_cost(result.usage),
            checks=case.checks,
        )
        try:
            score: ScoreResult = await workflow.execute_activity(
                EVAL_SCORE_ACTIVITY,
                request,
                result_type=ScoreResult,
                start_to_close_timeout=SCORE_TIMEOUT,
                retry_policy=SCORE_RETRY,
                summary=f"score {child_id[-200:]}",
            )
        except ActivityError as err:
            return [CheckResult(check="run", passed=False, reason=_reason(f"could not score: {_cause(err)}"))], 0.0
        return score.checks, score.seconds

    async def _judge(self, child_id: str, run_id: str, case: EvalCase, result: AgentResult) -> JudgeGrade:
        judge = case.checks.judge
        assert judge is not None
        try:
            grade: JudgeGrade = await workflow.execute_activity(
                EVAL_JUDGE_ACTIVITY,
                JudgeRequest(workflow_id=child_id, run_id=run_id, judge=judge, output=result.output),
                result_type=JudgeGrade,
                start_to_close_timeout=JUDGE_TIMEOUT,
                retry_policy=JUDGE_RETRY,
                summary=f"judge {child_id[-200:]} with {judge.model}",
            )
        except ActivityError as err:
            return JudgeGrade(model=judge.model, reason=_reason(f"the judge could not grade: {_cause(err)}"))
        return grade

    @staticmethod
    def _errored(row: CaseRun, why: str) -> CaseRun:
        row.status = "error"
        row.output = why[:MAX_OUTPUT_CHARS]
        row.checks = [CheckResult(check="run", passed=False, reason=_reason(why))]
        return row

    # --- approvals: the children's reports, answered by each case's rule ----------------------

    @workflow.signal(name="child_approvals")
    @one_payload
    async def child_approvals(self, raw: ChildApprovalsInput = NO_PAYLOAD, *extra: Any) -> None:
        """A child reports what waits in its part of the tree: decide each new tool-call approval by its case.

        A report that does not decode, names no live child, or names runs outside the child's subtree is
        dropped (logged). Each approval is answered once (the eval remembers what it sent).
        """
        report = decode(raw, ChildApprovalsSignal, extra)
        if isinstance(report, str):
            workflow.logger.warning("eval: dropped a child_approvals signal: %s", report)
            return
        child_id = report.child_id
        if child_id not in self._live:
            return  # not one of ours, or it ended: nothing of it waits any more
        rule = self._rules[child_id]
        sends = []
        for approval in report.approvals:
            owner = approval.workflow_id or child_id
            if owner != child_id and not owner.startswith(f"{child_id}/"):
                workflow.logger.warning("eval: %s reported an approval of %s: not decided", child_id, safe(owner))
                continue
            key = (owner, approval.approval_id)
            if approval.kind != "tool_call" or key in self._decided:
                continue  # questions and unknown outcomes are a person's to answer
            self._decided.add(key)
            self._progress.decisions += 1
            sends.append(self._decide(owner, approval, rule))
        await asyncio.gather(*sends)

    async def _decide(self, owner: str, approval: PendingApproval, rule: Approve) -> None:
        handle = workflow.get_external_workflow_handle(owner)
        shown = rule if isinstance(rule, str) else ", ".join(rule)
        try:
            if decision_for(rule, approval):
                comment = f"eval: the case approves {shown}"
                await handle.signal(
                    "approve", ApproveSignal(approval_id=approval.approval_id, reviewer=EVAL_REVIEWER, comment=comment)
                )
            else:
                reason = f"eval: the case approves {shown}, not {approval.tool}"
                await handle.signal(
                    "reject", RejectSignal(approval_id=approval.approval_id, reviewer=EVAL_REVIEWER, reason=reason)
                )
        except Exception as err:  # the run ended meanwhile: nothing left to decide
            workflow.logger.warning("eval: could not decide %s of %s: %s", approval.approval_id, owner, err)


def _cost(usage: Usage) -> float:
    return round(usage.cost_usd, 8)


def _cause(err: BaseException) -> str:
    """The innermost message of a chain of Temporal failures, on one line."""
    while getattr(err, "cause", None) is not None:
        err = err.cause  # type: ignore[attr-defined]
    return " ".join(str(err).split())


def _reason(text: str) -> str:
    return safe(text, MAX_REASON_CHARS)
