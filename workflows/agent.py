"""``AgentWorkflow``: one deterministic loop per run.

model turn → validated tool calls → results → next turn, until the model
answers without tool calls, a limit trips, the model fails for good, or the run
is cancelled. The transcript lives in the run store; history carries positions,
tool calls and previews only, so it grows linearly with the number of steps.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.approvals import ApprovalBook, Outcome, Verdict
    from workflows.identity import approval_id, canonical_json, idempotency_key, sandbox_id_for
    from workflows.policy import Decision, Policy, decide, parse_run_policy
    from workflows.types import (
        AgentInput,
        AgentResult,
        ApproveSignal,
        Carry,
        DecideRequest,
        DecideResult,
        Message,
        ModelRequest,
        ModelTurn,
        PendingApproval,
        RejectSignal,
        ResultStatus,
        RunConfig,
        RunConfigRequest,
        RunState,
        SandboxRef,
        SandboxRequest,
        SignatureCheck,
        StatusView,
        ToolCall,
        ToolInvocation,
        ToolOutcome,
        TranscriptEntry,
        Usage,
    )

MODEL_TIMEOUT = timedelta(seconds=180)
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=6,
    non_retryable_error_types=["ModelRejected", "InvalidInput"],
)
HOUSEKEEPING_TIMEOUT = timedelta(seconds=30)
HOUSEKEEPING_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=5)
DEFAULT_SYSTEM_PROMPT = (
    "You are an agent running inside a durable runtime. Use the tools to do the task; "
    "code runs in an isolated sandbox with no network. When you are done, answer without calling tools."
)


def _cause(err: BaseException) -> str:
    """The innermost readable message of an activity failure."""
    cause: BaseException | None = err
    while isinstance(cause, ActivityError) and cause.cause is not None:
        cause = cause.cause
    return str(cause) if cause is not None else str(err)


@workflow.defn(name="AgentWorkflow")
class AgentWorkflow:
    def __init__(self) -> None:
        self._state: RunState = "running"
        self._step = 0
        self._usage = Usage()
        self._model = ""
        self._output = ""
        self._last_event = "starting"
        self._sandbox_failure = ""
        self._book = ApprovalBook(approvers=[], signing_required=False)
        self._operator_policy = Policy()
        self._run_policy: Policy | None = None

    # --- public read side ----------------------------------------------------------

    @workflow.query(name="status")
    def status(self) -> StatusView:
        state: RunState = "waiting_approval" if self._state == "running" and self._book.pending else self._state
        return StatusView(
            state=state,
            step=self._step,
            pending_approvals=self._book.views(),
            usage=self._usage,
            model=self._model,
            output=self._output,
            last_event=self._last_event,
            refused=self._book.refused,
        )

    # --- approvals: two signals and one update, one semantics ------------------------

    @workflow.signal(name="approve")
    async def approve(self, decision: ApproveSignal) -> None:
        await self._decide(DecideRequest(decision="approve", **decision.model_dump()), source="signal")

    @workflow.signal(name="reject")
    async def reject(self, decision: RejectSignal) -> None:
        fields = decision.model_dump()
        fields["comment"] = fields.pop("reason")
        await self._decide(DecideRequest(decision="reject", **fields), source="signal")

    @workflow.update(name="decide")
    async def decide_update(self, request: DecideRequest) -> DecideResult:
        return await self._decide(request, source="update")

    @decide_update.validator
    def _validate_decide(self, request: DecideRequest) -> None:
        # Refused updates never reach history; the caller gets the reason at once.
        problem = self._book.problem(request.approval_id, request.reviewer, request.signature, workflow.now())
        if problem:
            raise ValueError(problem)

    async def _decide(self, request: DecideRequest, *, source: str) -> DecideResult:
        aid = request.approval_id
        problem = self._book.problem(aid, request.reviewer, request.signature, workflow.now())
        if not problem and self._book.signing_required:
            problem = await self._signature_problem(request)
            # The book may have changed while the signature was checked.
            problem = problem or self._book.problem(aid, request.reviewer, request.signature, workflow.now())
        if problem:
            message = f"refused {request.decision} by {request.reviewer!r} via {source}: {problem}"
            workflow.logger.warning(message)
            self._book.refuse(message)
            if source == "update":
                raise ApplicationError(problem, type="DecisionRefused", non_retryable=True)
            return DecideResult(accepted=False, message=problem)
        outcome: Outcome = "approved" if request.decision == "approve" else "rejected"
        self._book.record(aid, Verdict(outcome, request.reviewer, request.comment))
        workflow.logger.info("approval %s %s by %s via %s", aid, outcome, request.reviewer, source)
        self._note(f"{aid} {outcome} by {request.reviewer}")
        return DecideResult(accepted=True, message=f"{aid} {outcome} by {request.reviewer}")

    async def _signature_problem(self, request: DecideRequest) -> str:
        approval = self._book.pending[request.approval_id]
        check = SignatureCheck(
            approval_id=request.approval_id,
            decision=request.decision,
            reviewer=request.reviewer,
            expires_at=approval.expires_at,
            signature=request.signature,
        )
        valid = await workflow.execute_local_activity(
            "verify_decision",
            check,
            result_type=bool,
            start_to_close_timeout=HOUSEKEEPING_TIMEOUT,
            retry_policy=HOUSEKEEPING_RETRY,
        )
        return "" if valid else "the decision's signature does not verify"

    # --- the loop --------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: AgentInput) -> AgentResult:
        carry = inp.carry or await self._fresh_carry(inp)
        self._step, self._usage, self._model = carry.step, carry.usage, carry.model
        self._book = ApprovalBook(approvers=inp.approvers, signing_required=carry.signing_required)
        self._operator_policy = Policy.model_validate(carry.policy)
        try:
            self._run_policy = parse_run_policy(inp.policy)
        except ValueError as exc:
            raise ApplicationError(
                f"invalid run input: policy: {exc}", type="InvalidInput", non_retryable=True
            ) from None
        try:
            return await self._loop(inp, carry)
        except asyncio.CancelledError:
            # Cleanup must still run: the cancel was delivered to the awaited activity, not to new ones.
            self._note("cancelled")
            await asyncio.shield(asyncio.ensure_future(self._cleanup(carry)))
            return self._finish("cancelled", "the run was cancelled")

    async def _fresh_carry(self, inp: AgentInput) -> Carry:
        info = workflow.info()
        try:
            config = await workflow.execute_local_activity(
                "run_config",
                RunConfigRequest(model=inp.model, tools=inp.tools),
                result_type=RunConfig,
                start_to_close_timeout=HOUSEKEEPING_TIMEOUT,
                retry_policy=RetryPolicy(
                    maximum_attempts=3, non_retryable_error_types=["InvalidInput", "InvalidPolicy"]
                ),
            )
        except ActivityError as err:
            raise ApplicationError(
                f"invalid run input: {_cause(err)}", type="InvalidInput", non_retryable=True
            ) from None
        opening = [
            Message(role="system", content=inp.system_prompt or DEFAULT_SYSTEM_PROMPT),
            Message(role="user", content=inp.task),
        ]
        return Carry(
            conversation_id=f"{info.workflow_id}/{info.first_execution_run_id}",
            step=0,
            transcript_len=len(opening),
            usage=Usage(),
            started_at=workflow.now().timestamp(),
            model=config.model,
            tools=config.tools,
            policy=config.policy,
            signing_required=config.signing_required,
            pending=[TranscriptEntry(seq=i, message=m) for i, m in enumerate(opening)],
        )

    async def _loop(self, inp: AgentInput, carry: Carry) -> AgentResult:
        while True:
            limit = self._limit_reason(inp, carry)
            if limit:
                await self._cleanup(carry)
                return self._finish("limit_exceeded", limit)
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                carry.continued += 1
                workflow.logger.info("continuing as new after step %d", carry.step)
                workflow.continue_as_new(inp.model_copy(update={"carry": carry}))

            self._step = carry.step = carry.step + 1
            self._note(f"turn {carry.step}: waiting for {carry.model}")
            try:
                turn = await self._model_turn(inp, carry)
            except ActivityError as err:
                await self._cleanup(carry)
                if self._deadline_passed(inp, carry):
                    return self._finish("limit_exceeded", f"timeout_s={inp.limits.timeout_s} reached")
                return self._finish("failed", f"model {carry.model} failed: {_cause(err)}")

            self._usage = carry.usage = carry.usage.plus(turn.usage)
            carry.transcript_len = turn.message_seq + 1
            if not turn.tool_calls:
                await self._cleanup(carry)
                return self._finish("completed", turn.text)
            await self._run_tools(inp, carry, turn)

    async def _model_turn(self, inp: AgentInput, carry: Carry) -> ModelTurn:
        request = ModelRequest(
            conversation_id=carry.conversation_id,
            model=carry.model,
            turn=carry.step,
            transcript_len=carry.transcript_len,
            append=carry.pending,
            tools=carry.tools,
        )
        turn: ModelTurn = await workflow.execute_activity(
            "model",
            request,
            result_type=ModelTurn,
            start_to_close_timeout=MODEL_TIMEOUT,
            schedule_to_close_timeout=self._remaining(inp, carry),
            retry_policy=MODEL_RETRY,
            summary=f"{carry.model} · turn {carry.step}",
        )
        carry.pending = []
        return turn

    async def _run_tools(self, inp: AgentInput, carry: Carry, turn: ModelTurn) -> None:
        """Every call gets exactly one result at its own position, in call order.

        Policy is decided for the whole turn first, so every call that needs a
        human is pending at once and can be decided independently. Calls then run
        one after another because later calls in a turn commonly depend on
        earlier ones (write a file, then run it).
        """
        base = carry.transcript_len
        decisions = {call.id: self._policy_for(call) for call in turn.tool_calls if not call.error}
        approvals = {
            call.id: self._open_approval(inp, carry, call, decisions[call.id])
            for call in turn.tool_calls
            if not call.error and decisions[call.id].verdict == "ask"
        }
        for index, call in enumerate(turn.tool_calls):
            seq = base + index
            refusal = call.error
            if not refusal and decisions[call.id].verdict == "deny":
                refusal = f"Error: policy denied {call.name} (rule {decisions[call.id].rule}); it was not run."
            if not refusal and call.id in approvals:
                refusal = await self._await_approval(carry, call, approvals[call.id])
            refusal = refusal or await self._ensure_sandbox(inp, carry, call)
            if refusal:
                self._note(f"turn {carry.step}: {call.name} not run")
                carry.pending.append(TranscriptEntry(seq=seq, message=_tool_error(call, refusal)))
                continue
            self._note(f"turn {carry.step}: running {call.name}")
            await self._execute_tool(inp, carry, call, index, seq)
        carry.transcript_len = base + len(turn.tool_calls)

    def _policy_for(self, call: ToolCall) -> Decision:
        return decide(self._operator_policy, self._run_policy, call.name, call.arguments, side_effect=call.side_effect)

    def _open_approval(self, inp: AgentInput, carry: Carry, call: ToolCall, decision: Decision) -> str:
        now = workflow.now()
        deadline = datetime.fromtimestamp(self._deadline(inp, carry), tz=UTC)
        expires_at = min(now + timedelta(seconds=decision.approval_timeout_s), deadline)
        aid = approval_id(workflow.info().workflow_id, carry.step, call.id, call.name, call.arguments)
        self._book.open(
            PendingApproval(
                approval_id=aid,
                tool=call.name,
                args=call.arguments,
                requested_at=now.isoformat(),
                expires_at=expires_at.isoformat(),
                reviewers=inp.approvers,
                rule=decision.rule,
                step=carry.step,
                call_id=call.id,
            ),
            expires_at,
        )
        workflow.logger.info("approval %s requested for %s (rule %s)", aid, call.name, decision.rule)
        return aid

    async def _await_approval(self, carry: Carry, call: ToolCall, aid: str) -> str:
        """Wait (on a durable timer) for the decision; return refusal text unless approved."""
        self._note(f"turn {carry.step}: waiting for approval {aid} of {call.name}")
        remaining = self._book.expires[aid] - workflow.now()
        if remaining.total_seconds() > 0:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: aid in self._book.decided, timeout=remaining, timeout_summary=f"approval {aid} expires"
                )
        self._book.expire(aid)
        verdict = self._book.decided[aid]
        if verdict.outcome == "approved":
            return ""
        if verdict.outcome == "rejected":
            reason = f": {verdict.note}" if verdict.note else ""
            return f"Error: {call.name} was rejected by {verdict.reviewer}{reason}. It was not run."
        expired_at = self._book.pending_expiry(aid)
        return f"Error: approval {aid} for {call.name} expired at {expired_at} without a decision; it was not run."

    async def _execute_tool(self, inp: AgentInput, carry: Carry, call: ToolCall, index: int, seq: int) -> None:
        workflow_id = workflow.info().workflow_id
        invocation = ToolInvocation(
            conversation_id=carry.conversation_id,
            workflow_id=workflow_id,
            step=carry.step,
            call_id=call.id,
            call_index=index,
            seq=seq,
            tool=call.name,
            arguments=call.arguments,
            idempotency_key=idempotency_key(workflow_id, carry.step, index, call.name, call.arguments),
            sandbox_id=carry.sandbox_id,
            tenant=inp.tenant,
        )
        try:
            await workflow.execute_activity(
                call.name,
                invocation,
                result_type=ToolOutcome,
                start_to_close_timeout=timedelta(seconds=call.timeout_s),
                heartbeat_timeout=timedelta(seconds=call.heartbeat_s * 3) if call.heartbeat_s else None,
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=30),
                    maximum_attempts=call.max_attempts,
                ),
                summary=_tool_summary(call),
            )
        except ActivityError as err:
            # The activity never stored a result (it stores before completing), so the workflow answers.
            message = _tool_error(call, f"Error: {call.name} failed after {call.max_attempts} attempts: {_cause(err)}")
            carry.pending.append(TranscriptEntry(seq=seq, message=message))

    async def _ensure_sandbox(self, inp: AgentInput, carry: Carry, call: ToolCall) -> str:
        """Create the run's sandbox on first use; return an error text if it cannot be had."""
        if not call.uses_sandbox or carry.sandbox_id:
            return ""
        if self._sandbox_failure:
            return self._sandbox_failure
        request = SandboxRequest(
            sandbox_id=sandbox_id_for(carry.conversation_id), conversation_id=carry.conversation_id, tenant=inp.tenant
        )
        try:
            ref = await workflow.execute_activity(
                "sandbox_create",
                request,
                result_type=SandboxRef,
                start_to_close_timeout=timedelta(seconds=120),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_attempts=5,
                    non_retryable_error_types=["SandboxUnavailable"],
                ),
                summary="create sandbox",
            )
        except ActivityError as err:
            self._sandbox_failure = f"Error: the code sandbox is unavailable, so {call.name} cannot run: {_cause(err)}"
            return self._sandbox_failure
        carry.sandbox_id = ref.sandbox_id
        return ""

    async def _cleanup(self, carry: Carry) -> None:
        """Kill the sandbox and store workflow-made results; never fails the run."""
        try:
            if carry.pending:
                await workflow.execute_activity(
                    "transcript_append",
                    args=[carry.conversation_id, carry.pending],
                    start_to_close_timeout=HOUSEKEEPING_TIMEOUT,
                    retry_policy=HOUSEKEEPING_RETRY,
                    summary="store final tool results",
                )
                carry.pending = []
            if carry.sandbox_id:
                await workflow.execute_activity(
                    "sandbox_kill",
                    SandboxRequest(sandbox_id=carry.sandbox_id, conversation_id=carry.conversation_id),
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=HOUSEKEEPING_RETRY,
                    summary="kill sandbox",
                )
                carry.sandbox_id = ""
        except ActivityError as err:
            workflow.logger.warning("cleanup failed: %s", _cause(err))

    # --- limits and bookkeeping ----------------------------------------------------------

    def _deadline(self, inp: AgentInput, carry: Carry) -> float:
        return carry.started_at + inp.limits.timeout_s

    def _deadline_passed(self, inp: AgentInput, carry: Carry) -> bool:
        return workflow.now().timestamp() >= self._deadline(inp, carry)

    def _remaining(self, inp: AgentInput, carry: Carry) -> timedelta:
        return timedelta(seconds=max(1.0, self._deadline(inp, carry) - workflow.now().timestamp()))

    def _limit_reason(self, inp: AgentInput, carry: Carry) -> str:
        limits = inp.limits
        if carry.step >= limits.max_steps:
            return f"max_steps={limits.max_steps} reached"
        if carry.usage.total_tokens >= limits.max_tokens:
            return f"max_tokens={limits.max_tokens} reached ({carry.usage.total_tokens} used)"
        if limits.max_cost_usd and carry.usage.cost_usd >= limits.max_cost_usd:
            return f"max_cost_usd={limits.max_cost_usd} reached (${carry.usage.cost_usd:.4f} spent)"
        if self._deadline_passed(inp, carry):
            return f"timeout_s={limits.timeout_s} reached"
        return ""

    def _note(self, event: str) -> None:
        self._last_event = event
        workflow.set_current_details(self._details())

    def _details(self) -> str:
        return (
            f"**state** {self._state} · **step** {self._step} · **model** {self._model}\n\n"
            f"**last** {self._last_event}\n\n"
            f"**usage** {self._usage.input_tokens} in / {self._usage.output_tokens} out tokens · "
            f"${self._usage.cost_usd:.4f}"
        )

    def _finish(self, status: ResultStatus, output: str) -> AgentResult:
        self._state = status
        self._output = output
        self._note(f"finished: {status}")
        return AgentResult(status=status, output=output, usage=self._usage, steps=self._step)


def _tool_error(call: ToolCall, text: str) -> Message:
    return Message(role="tool", content=text, tool_call_id=call.id, name=call.name, is_error=True)


def _tool_summary(call: ToolCall) -> str:
    args = call.arguments
    if call.name == "http_request":
        url = str(args.get("url", ""))
        return f"http_request {str(args.get('method', '')).upper()} {url.split('://', 1)[-1][:80]}"
    if call.name in ("write_file", "read_file"):
        return f"{call.name} {str(args.get('path', ''))[:80]}"
    if call.name == "run_python":
        return f"run_python · {str(args.get('code', '')).count(chr(10)) + 1} lines"
    if call.name == "run_shell":
        return f"run_shell {str(args.get('command', ''))[:80]}"
    return f"{call.name} {canonical_json(args)[:80]}"
