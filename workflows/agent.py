"""``AgentWorkflow``: one deterministic loop per run.

model turn → validated tool calls → results → next turn, until the model
answers without tool calls, a limit trips, the model fails for good, or the run
is cancelled. The transcript lives in the run store; history carries positions,
tool calls and previews only, so it grows linearly with the number of steps.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from workflows.approval_handlers import (
        HOUSEKEEPING_RETRY,
        HOUSEKEEPING_TIMEOUT,
        REFUSAL_EVENT_EVERY,
        REFUSAL_EVENTS,
        REFUSAL_LINES_PER_TASK,
        ApprovalHandlers,
    )
    from workflows.approvals import ApprovalBook
    from workflows.delegation import INPUT_SIZE_PATCH, input_size_problem
    from workflows.ending import Ending, EndingScope
    from workflows.identity import session_conversation_id
    from workflows.inputs import MESSAGE_MAX, NO_PAYLOAD, decode, one_payload, problems, safe
    from workflows.limits import budget_spent, deadline, limit_reason
    from workflows.memory_recall import MEMORY_RECALL_PATCH, recall
    from workflows.narration import cause_text, details_markdown
    from workflows.policy import Decision, Policy, decide, parse_run_policy
    from workflows.progress import (
        FORK_OF,
        SEARCH_ATTRIBUTES_PATCH,
        SESSION_STREAM_RETAIN,
        STREAM_RETAIN,
        EventKind,
        Reporter,
    )
    from workflows.run_failure import FAILING_STATUSES, run_failed_error
    from workflows.session import SessionBook, SessionHandlers
    from workflows.session_types import SessionCarry, SessionMessage, SessionOpenRequest, SessionOpenResult
    from workflows.start_patch import session_opened_by_run_config, start_patched
    from workflows.tool_calls import ToolCallRunner
    from workflows.trust import Lineage, input_problem
    from workflows.typed_output import failure_text, retry_instruction
    from workflows.types import (
        DEFAULT_SYSTEM_PROMPT,
        MAX_APPROVAL_TIMEOUT_S,
        TENANT_QUOTA_EXCEEDED,
        AgentInput,
        AgentResult,
        Carry,
        CompensationRequest,
        ForkRequest,
        ForkResult,
        Message,
        ModelRequest,
        ModelTurn,
        PendingApproval,
        ResultStatus,
        RunConfig,
        RunConfigRequest,
        RunState,
        SandboxRequest,
        StatusView,
        TenantRunRelease,
        ToolCall,
        TranscriptEntry,
        TreeBudget,
        Usage,
    )

# What arrives from outside (the run input, signals, the update) is handed over raw and decoded by
# ``workflows.inputs.decode``: a payload the SDK failed to decode would fail every workflow task
# (run input) or be dropped with a traceback (signal) before any workflow code could refuse it.
# Callers still see the contract's models.
if TYPE_CHECKING:
    RunInput = AgentInput | dict[str, Any] | RawValue
else:
    RunInput = RawValue

MODEL_TIMEOUT = timedelta(seconds=180)
MODEL_HEARTBEAT_TIMEOUT = timedelta(seconds=20)  # a killed worker's model call is retried within ~20 s
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=6,
    non_retryable_error_types=["ModelRejected", "InvalidInput"],
)
# A failed transcript append no longer skips the sandbox kill (each cleanup step runs on its own).
CLEANUP_STEPS_PATCH = "cleanup-steps-independent-v1"
TENANT_SLOT_PATCH = "tenant-open-runs-v1"
BUDGET_EXHAUSTED = "BudgetExhausted"  # the model activity's refusal: the tree of runs spent its budget


@workflow.defn(name="AgentWorkflow")
class AgentWorkflow(ApprovalHandlers, SessionHandlers):
    @workflow.init
    @one_payload
    def __init__(self, raw: RunInput = NO_PAYLOAD, *extra: Any) -> None:
        # Decoded once, here, because the stream must be rebuilt here; ``run`` fails the run when
        # the input is invalid, on its first workflow task.
        decoded = decode(raw, AgentInput, extra)
        if isinstance(decoded, AgentInput):  # nothing of a runtime-only field is used unless it is backed
            decoded = input_problem(decoded, Lineage.of_this_run()) or decoded
        self._input = decoded if isinstance(decoded, AgentInput) else None
        self._input_problem = decoded if isinstance(decoded, str) else ""
        carry = self._input.carry if self._input else None
        self._reporter = Reporter(carry.stream if carry else None, refuse_publish=self._refuse_publish)
        self._tenant = self._input.tenant if self._input else ""
        self._search_attributes = False
        self._state: RunState = "running"
        self._step = 0
        self._refusal_lines = 0  # refusal log lines this activation wrote (see ``_refuse``)
        self._usage = Usage()
        self._children_usage = Usage()
        self._model = ""
        self._output = ""
        self._output_json: Any = None  # a completed run's typed result (``output_schema``)
        self._carry: Carry | None = None  # the loop's state once the run started (read by ``status``)
        self._last_event = "starting"
        # Refusals are counted from the first activation on (signals are handled before ``run``
        # starts), and carried across continue-as-new.
        self._book = ApprovalBook(
            approvers=self._input.approvers if self._input else [],
            signing_required=carry.signing_required if carry else False,  # a fresh run learns it in ``run``
        )
        if carry is not None:
            self._book.refused, self._book.refused_counts = list(carry.refused), dict(carry.refused_counts)
            self._book.decisions, self._book.decisions_total = list(carry.decisions), carry.decisions_total
            self._book.remembered = list(carry.remembered)
        self._book.on_open = self._take_early
        self._early = []  # decisions that came in the task that opens their approval (``_keep_early``)
        self._early_tasks = set()
        self._operator_policy = Policy()
        self._run_policy: Policy | None = None
        # Sub-agents: the children started (only they may report approvals) and what each waits for.
        self._child_ids: set[str] = set()
        self._live_children: set[str] = set()  # started and not ended (``status.subagents``)
        self._child_pending: dict[str, tuple[int, list[PendingApproval]]] = {}
        self._reported: list[tuple[str, str]] = []  # what this run last told its own parent
        self._report_seq = 0
        self._reports: set[asyncio.Future[None]] = set()
        self._child_reports_on = bool(self._input and self._input.depth > 0)  # started by an AgentWorkflow
        self._start_notes: list[str] = []  # what the run starts without (RunConfig.notes)
        # Sessions: messages taken and waiting (carried across continue-as-new), and the model turn in
        # flight, which a message may interrupt (``workflows.session``).
        spec = self._input.session if self._input else None
        self._sessions = SessionBook(spec, carry.session if carry and carry.session else SessionCarry())
        self._model_call: asyncio.Task[Any] | None = None
        self._interrupting = False

    # --- public read side ----------------------------------------------------------

    @workflow.query(name="status")
    def status(self) -> StatusView:
        pending = self._pending_in_tree()
        state: RunState = self._state
        if state == "running" and pending:
            state = "waiting_human" if any(a.kind == "question" for a in pending) else "waiting_approval"
        return StatusView(
            state=state,
            step=self._step,
            pending_approvals=pending,
            usage=self._usage,
            model=self._model,
            output=self._output,
            last_event=self._last_event,
            refused=self._book.refused,
            refused_total=self._book.refused_total,
            refused_counts=dict(self._book.refused_counts),
            own_usage=_minus(self._usage, self._children_usage),
            children_usage=self._children_usage,
            conversation_id=self._carry.conversation_id if self._carry else "",
            checkpoint=self._carry.checkpoint if self._carry else "",
            cost_tracked=self._carry.cost_tracked if self._carry else True,
            notes=self._start_notes,
            subagents=sorted(self._live_children),
            decisions=self._book.decisions,
            decisions_total=self._book.decisions_total,
            remembered=self._book.remembered,
            **self._session_view(),
        )

    def _session_view(self) -> dict[str, Any]:
        if not self._sessions.on:
            return {}
        state = self._sessions.state
        return {
            "session": True,
            "messages": state.messages,
            "replied": state.replied,
            "last_message_at": state.last_message_at,
            "queued": len(state.queue),
            "last_message": state.last_message,
        }

    # --- the loop --------------------------------------------------------------------

    @workflow.run
    @one_payload
    async def run(self, raw: RunInput = NO_PAYLOAD, *extra: Any) -> AgentResult:
        """Run the agent. ``raw`` (decoded in ``__init__``) must be an ``AgentInput`` whose runtime-only
        fields this run's lineage backs (``workflows.trust``); anything else fails the run on its first
        workflow task with ``invalid run input: ...``, never a workflow task retried forever."""
        if self._input is None:
            raise _invalid_input(self._input_problem)
        inp = self._input
        too_large = input_size_problem(inp)
        if too_large and workflow.patched(INPUT_SIZE_PATCH):
            raise _invalid_input(too_large)
        self._run_policy = _checked_policy(inp.policy, "policy")  # before any command: fail on the first task
        # Decide the start patches in the first activation, before any await (the policy's above): decided
        # later, a query or stream poll arriving first can split a marker from its command across workflow
        # tasks. Recorded runs made their markers in this order; a new run makes only the first.
        start_patched(SEARCH_ATTRIBUTES_PATCH)
        # Decided with the start patches, before any await: whether run_config opens a new run's session.
        opens_session = inp.session is not None and session_opened_by_run_config()
        carry = inp.carry or await self._fresh_carry(inp, opens_session)
        self._carry = carry
        self._step, self._usage, self._model = carry.step, carry.usage, carry.model
        self._children_usage = carry.children_usage
        self._search_attributes = carry.search_attributes
        if inp.carry is None:
            notes = "".join(f"\n{note}" for note in self._start_notes)
            if carry.fork_of:
                notes += f"\nforked from {carry.fork_of}"
            # The notes first: the event's text is cut at EVENT_TEXT_MAX, and a long tool list must not hide them.
            self._emit("started", f"started with {carry.model}{notes}\ntools: {', '.join(carry.tools)}")
        self._book.signing_required = carry.signing_required
        self._operator_policy = _checked_policy(carry.policy, "carry.policy") or Policy()
        self._tools = ToolCallRunner(
            self._book,
            self._emit,
            self._operator_policy,
            self._run_policy,
            on_usage=self._usage_changed,
            on_child=self._child_started,
            on_child_ended=self._child_ended,
        )
        try:
            if inp.session is not None:
                result = await self._run_session(inp, inp.session, carry)
            else:
                ending = await self._loop(inp, carry)
                await self._cleanup(carry)
                result = self._finish(ending.status, ending.text)
        except (asyncio.CancelledError, ActivityError, ChildWorkflowError) as err:
            if not is_cancelled_exception(err):
                raise
            # Cleanup must still run: the cancel was delivered to the awaited activity, not to new ones.
            self._emit("finished", "cancel requested: compensating and cleaning up")
            report = await asyncio.shield(asyncio.ensure_future(self._compensate(carry)))
            await asyncio.shield(asyncio.ensure_future(self._cleanup(carry)))
            return self._finish("cancelled", "the run was cancelled." + report + self._children_report())
        # AGENT_FAIL_WORKFLOW_ON_ERROR=1 (taken by run_config at the run's start, kept in the carry): a failed
        # or limit_exceeded run fails its workflow, the result in the failure's details; ``_finish`` set the
        # status view and search attributes first. Only the run's final command differs (fail instead of
        # complete), and only for runs started with the flag on, so no ``workflow.patched`` is needed:
        # recorded runs have the flag off in their run_config result and replay unchanged.
        if carry.fail_workflow_on_error and result.status in FAILING_STATUSES:
            raise run_failed_error(result)
        return result

    def _children_report(self) -> str:
        """What each sub-agent this run started did (each compensated and cleaned up in its own run)."""
        if not self._tools.children:
            return ""
        lines = ["", "Sub-agents:"]
        lines += [f"- {child_id}: {what}" for child_id, what in self._tools.children.items()]
        return "\n".join(lines)

    def _usage_changed(self, carry: Carry) -> None:
        self._usage, self._children_usage = carry.usage, carry.children_usage

    async def _compensate(self, carry: Carry) -> str:
        """Undo completed side effects that declare a compensation (newest first); report all of them."""
        if not carry.side_effects:
            return ""
        lines = ["", "Side effects that ran before the cancel:"]
        for effect in reversed(carry.side_effects):
            label = f"- {effect.tool} (step {effect.step}, key {effect.idempotency_key})"
            if not effect.compensable:
                lines.append(f"{label}: ran; no compensation declared")
                continue
            try:
                note = await workflow.execute_activity(
                    "compensate",
                    CompensationRequest(
                        tool=effect.tool,
                        arguments=effect.arguments,
                        idempotency_key=effect.idempotency_key,
                        workflow_id=workflow.info().workflow_id,
                        conversation_id=carry.conversation_id,
                        tenant=self._tenant,
                        user=self._input.user if self._input else "",
                    ),
                    result_type=str,
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=HOUSEKEEPING_RETRY,
                    summary=f"compensate {effect.tool}",
                )
                lines.append(f"{label}: ran; compensated: {note}")
            except ActivityError as err:
                lines.append(f"{label}: ran; compensation FAILED: {cause_text(err)}")
        return "\n".join(lines)

    async def _fresh_carry(self, inp: AgentInput, opens_session: bool) -> Carry:
        info = workflow.info()
        conversation_id = (
            session_conversation_id(info.workflow_id)
            if inp.session is not None
            else f"{info.workflow_id}/{info.first_execution_run_id}"
        )
        fork = await self._fork(inp, conversation_id) if inp.fork is not None else None
        session = (
            SessionOpenRequest(
                conversation_id=conversation_id, tenant=inp.tenant, user=inp.user, system_prompt=inp.system_prompt
            )
            if opens_session
            else None
        )
        try:
            config = await workflow.execute_local_activity(
                "run_config",
                RunConfigRequest(
                    model=inp.model or (fork.model if fork else ""),
                    tools=inp.tools,
                    subagents=inp.subagents,
                    subagents_ref=inp.subagents_ref,
                    as_subagent=inp.as_subagent,
                    explicit_cost_cap=inp.budget is None
                    and "max_cost_usd" in inp.limits.model_fields_set
                    and inp.limits.max_cost_usd > 0,
                    tenant=inp.tenant,
                    open_run=info.parent is None,
                    output_schema=inp.output_schema,
                    session=session,
                ),
                result_type=RunConfig,
                start_to_close_timeout=HOUSEKEEPING_TIMEOUT,
                retry_policy=RetryPolicy(
                    maximum_attempts=3,
                    non_retryable_error_types=["InvalidInput", "InvalidPolicy", TENANT_QUOTA_EXCEEDED],
                ),
            )
        except (ActivityError, ApplicationError) as err:  # a local activity's failure arrives unwrapped
            problem = err.message if isinstance(err, ApplicationError) else cause_text(err)
            if isinstance(err, ApplicationError) and err.type == TENANT_QUOTA_EXCEEDED:
                raise ApplicationError(
                    safe(problem, MESSAGE_MAX), type=TENANT_QUOTA_EXCEEDED, non_retryable=True
                ) from None
            raise _invalid_input(safe(problem, MESSAGE_MAX)) from None
        system_prompt = inp.system_prompt or config.system_prompt or DEFAULT_SYSTEM_PROMPT
        opening = [Message(role="system", content=system_prompt), Message(role="user", content=inp.task)]
        opened = config.session if session is not None else None
        if inp.session is not None and opened is None:  # a run recorded before run_config opened sessions
            opened = await self._open_session(inp, conversation_id, system_prompt)
        if opened is not None:  # the system prompt is stored (or was, by the session's earlier runs)
            opening = []
        self._start_notes = [safe(note, MESSAGE_MAX) for note in config.notes[:10]]
        carry = Carry(
            conversation_id=conversation_id,
            step=0,
            transcript_len=len(opening),
            usage=Usage(),
            started_at=workflow.now().timestamp(),
            model=config.model,
            tools=config.tools,
            policy=config.policy,
            signing_required=config.signing_required,
            search_attributes=config.search_attributes,
            subagents=config.subagents,
            subagents_ref=config.subagents_ref,
            max_subagent_calls=config.max_subagent_calls,
            max_depth=config.max_depth,
            shared_sandbox=inp.parent_conversation,
            mcp_snapshot=config.mcp_snapshot,
            mcp_per_run=config.mcp_per_run,
            cost_tracked=config.cost_tracked,
            fail_workflow_on_error=config.fail_workflow_on_error,
            tenant_slot=config.tenant_slot,
            output_schema_ref=config.output_schema_ref,
            budget=inp.budget
            or (
                TreeBudget(
                    # A session's tree is its run's (key scope), not its conversation's: a woken session spends
                    # a budget of its own, as its usage counts from its wake.
                    root=f"{info.workflow_id}/{info.first_execution_run_id}",
                    max_tokens=inp.limits.max_tokens,
                    max_cost_usd=inp.limits.max_cost_usd,
                )
                if config.subagents
                else None
            ),
            pending=[TranscriptEntry(seq=i, message=m) for i, m in enumerate(opening)],
            checkpoint=inp.checkpoint,
        )
        if opened is not None:
            self._adopt_session(inp, carry, opened)
        if fork is not None:  # the source's first steps are in the store already, copied by fork_prepare
            assert inp.fork is not None
            carry.step, carry.transcript_len, carry.pending = fork.step, fork.transcript_len, []
            carry.forked_at_step = fork.step
            carry.checkpoint = fork.checkpoint
            carry.fork_of = f"{inp.fork.workflow_id} step {fork.step}"
            if config.search_attributes:
                workflow.upsert_search_attributes([FORK_OF.value_set(inp.fork.workflow_id)])
        return carry

    async def _fork(self, inp: AgentInput, conversation_id: str) -> ForkResult:
        """Copy the source run's first steps into this run's transcript; where its workspace was then."""
        assert inp.fork is not None
        try:
            result: ForkResult = await workflow.execute_activity(
                "fork_prepare",
                ForkRequest(
                    source=inp.fork,
                    conversation_id=conversation_id,
                    task="" if inp.session is not None else inp.task,  # a session takes it as its first message
                    tenant=inp.tenant,
                    user=inp.user,
                ),
                result_type=ForkResult,
                start_to_close_timeout=timedelta(seconds=120),
                retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=["InvalidInput"]),
                summary=f"fork {inp.fork.workflow_id[:80]} at step {inp.fork.step}",
            )
            return result
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            refusal = err.cause.message if isinstance(err.cause, ApplicationError) else cause_text(err)
            raise _invalid_input(f"fork: {safe(refusal, MESSAGE_MAX)}") from None

    async def _loop(self, inp: AgentInput, carry: Carry) -> Ending:
        """Model turns and their tool calls until the work ends (the caller cleans up and finishes)."""
        session = inp.session is not None
        while True:
            limit = limit_reason(inp.limits, carry, workflow.now().timestamp())
            if limit:
                # A session's max_steps and timeout_s are each message's; max_tokens and max_cost_usd its own.
                scope: EndingScope = "message" if session and not budget_spent(inp.limits, carry) else "run"
                return Ending("limit_exceeded", limit, scope)
            if workflow.info().is_continue_as_new_suggested():
                await self._continue_as_new(inp, carry)
            if session:
                if self._sessions.state.closing:
                    return Ending("completed", "", "close")
                if self._sessions.hand_over(carry):
                    await self._recall(inp, carry, carry.pending[-1].message.content)
            elif carry.step == 0 and not carry.forked_at_step:
                await self._recall(inp, carry, inp.task)

            self._step = carry.step = carry.step + 1
            self._emit("turn_started", f"turn {carry.step}: waiting for {carry.model}")
            try:
                turn = await self._model_turn(inp, carry)
            except ActivityError as err:
                if is_cancelled_exception(err):
                    if self._interrupted():  # for a new message: the turn starts again with it
                        self._step = carry.step = carry.step - 1
                        self._emit("interrupted", f"turn {carry.step + 1}: interrupted by a new message")
                        continue
                    raise
                scope = "message" if session else "run"  # a session's model failing ends one message's work
                if isinstance(err.cause, ApplicationError) and err.cause.type == BUDGET_EXHAUSTED:
                    return Ending("limit_exceeded", f"the tree's budget is spent: {err.cause.message}")
                if self._deadline_passed(inp, carry):
                    return Ending("limit_exceeded", f"timeout_s={inp.limits.timeout_s} reached", scope)
                return Ending("failed", f"model {carry.model} failed: {cause_text(err)}", scope)
            self._interrupting = False  # a cancel that came too late: the turn is answered, and counts

            self._usage = carry.usage = carry.usage.plus(turn.usage)
            if turn.conversation_id and turn.conversation_id != carry.conversation_id:
                # The run was reset to an earlier step: its future goes on a branch of the transcript.
                self._emit("rewound", f"turn {carry.step}: continuing on transcript branch {turn.conversation_id}")
                carry.conversation_id = turn.conversation_id
            carry.transcript_len = turn.message_seq + 1
            self._emit(
                "model_answered",
                f"turn {carry.step}: {carry.model} answered with {len(turn.tool_calls)} tool call(s)",
                input_tokens=turn.usage.input_tokens,
                output_tokens=turn.usage.output_tokens,
                cost_usd=turn.usage.cost_usd,
                tool_calls=[c.name for c in turn.tool_calls],
            )
            if not turn.tool_calls:
                if turn.output_errors:  # a typed result that does not match the run's output_schema
                    if carry.output_retries >= inp.limits.max_output_retries:
                        return Ending("failed", failure_text(turn.output_errors, carry.output_retries + 1))
                    self._retry_output(inp, carry, turn.output_errors)
                    continue
                self._output_json = turn.output_json
                return Ending("completed", turn.text, "message" if session else "run")
            await self._tools.run_turn(inp, carry, turn)
            self._usage, self._children_usage = carry.usage, carry.children_usage

    def _retry_output(self, inp: AgentInput, carry: Carry, errors: list[str]) -> None:
        """Send a final answer that does not match the output schema back to the model, with why."""
        carry.output_retries += 1
        allowed = inp.limits.max_output_retries
        self._emit(
            "output_invalid",
            f"turn {carry.step}: the answer does not match output_schema; asking again "
            f"({carry.output_retries} of {allowed})",
            errors=errors,
        )
        text = retry_instruction(errors, carry.output_retries, allowed)
        carry.pending.append(TranscriptEntry(seq=carry.transcript_len, message=Message(role="user", content=text)))
        carry.transcript_len += 1

    async def _recall(self, inp: AgentInput, carry: Carry, query: str) -> None:
        if inp.memory is not None and inp.memory.recall == "auto" and workflow.patched(MEMORY_RECALL_PATCH):
            await recall(inp, carry, query, self._emit)

    def _interrupted(self) -> bool:
        """Whether the model turn was cancelled by this run for a new message (not the run's own cancel)."""
        interrupted, self._interrupting = self._interrupting, False
        task = asyncio.current_task()
        return interrupted and not (task is not None and task.cancelling())

    async def _continue_as_new(self, inp: AgentInput, carry: Carry) -> None:
        carry.continued += 1
        self._emit("continued_as_new", f"continuing as new after step {carry.step}")
        carry.stream = await self._reporter.hand_over(SESSION_STREAM_RETAIN if inp.session else STREAM_RETAIN)
        carry.refused, carry.refused_counts = self._book.refused, dict(self._book.refused_counts)
        carry.decisions, carry.decisions_total = self._book.decisions, self._book.decisions_total
        carry.remembered = self._book.remembered
        workflow.continue_as_new(inp.model_copy(update={"carry": carry}))

    async def _model_turn(self, inp: AgentInput, carry: Carry) -> ModelTurn:
        interruptible = inp.session is not None and inp.session.on_busy == "interrupt"
        request = ModelRequest(
            conversation_id=carry.conversation_id,
            model=carry.model,
            turn=carry.step,
            transcript_len=carry.transcript_len,
            append=carry.pending,
            tools=carry.tools,
            subagents={name: d.description for name, d in carry.subagents.items()},
            budget=carry.budget,
            mcp_snapshot=carry.mcp_snapshot,
            subagents_ref=carry.subagents_ref,
            interruptible=interruptible,
            output_schema_ref=carry.output_schema_ref,
        )
        # An interrupted turn is waited for until its activity has stopped, so that no reply it was still
        # writing lands where the next turn writes; ``close`` interrupts any session's turn the same way.
        call = workflow.start_activity(
            "model",
            request,
            result_type=ModelTurn,
            start_to_close_timeout=MODEL_TIMEOUT,
            heartbeat_timeout=MODEL_HEARTBEAT_TIMEOUT,
            schedule_to_close_timeout=self._remaining(inp, carry),
            retry_policy=MODEL_RETRY,
            summary=f"{carry.model} · turn {carry.step}",
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
            if inp.session is not None
            else ActivityCancellationType.TRY_CANCEL,
        )
        self._model_call = call
        try:
            turn: ModelTurn = await call
        finally:
            self._model_call = None
        carry.pending = []
        return turn

    async def _open_session(self, inp: AgentInput, conversation_id: str, system_prompt: str) -> SessionOpenResult:
        """Where the session's conversation stands (``session_open``): new, or left by its earlier runs."""
        try:
            opened: SessionOpenResult = await workflow.execute_activity(
                "session_open",
                SessionOpenRequest(
                    conversation_id=conversation_id, tenant=inp.tenant, user=inp.user, system_prompt=system_prompt
                ),
                result_type=SessionOpenResult,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=["InvalidInput"]),
                summary="open session",
            )
            return opened
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            refusal = err.cause.message if isinstance(err.cause, ApplicationError) else cause_text(err)
            raise _invalid_input(f"session: {safe(refusal, MESSAGE_MAX)}") from None

    def _adopt_session(self, inp: AgentInput, carry: Carry, opened: SessionOpenResult) -> None:
        """A new run of a session goes on from its conversation; its task, when given, is its first message."""
        info = workflow.info()
        state = self._sessions.state
        carry.transcript_len, carry.step, carry.pending = opened.transcript_len, opened.steps, []
        carry.checkpoint = inp.checkpoint or opened.checkpoint
        carry.key_scope = f"{info.workflow_id}/{info.first_execution_run_id}"
        state.messages = state.handed = state.replied = opened.messages
        state.last_reply, state.last_message = opened.last_reply, opened.last_message
        self._output = opened.last_reply
        if opened.closed_calls:
            self._start_notes.append(f"{opened.closed_calls} tool call(s) an earlier run left unfinished were closed")
        if inp.task:
            message = SessionMessage(message_id=f"task:{info.first_execution_run_id}", text=inp.task)
            self._sessions.take(message, workflow.now().isoformat())

    async def _cleanup(self, carry: Carry) -> None:
        """Store workflow-made results, then kill the sandbox: each step on its own; neither fails the run."""
        append_failed = False
        if carry.pending:
            try:
                await workflow.execute_activity(
                    "transcript_append",
                    args=[carry.conversation_id, carry.pending],
                    start_to_close_timeout=HOUSEKEEPING_TIMEOUT,
                    retry_policy=HOUSEKEEPING_RETRY,
                    summary="store final tool results",
                )
                carry.pending = []
            except ActivityError as err:
                append_failed = True
                workflow.logger.warning("cleanup: storing the final tool results failed: %s", cause_text(err))
        # Runs recorded before this patch skipped the kill after a failed append; they replay unchanged.
        # A sub-agent working in its parent's sandbox leaves it to the parent.
        if (
            carry.sandbox_id
            and not carry.shared_sandbox
            and (not append_failed or workflow.patched(CLEANUP_STEPS_PATCH))
        ):
            try:
                await workflow.execute_activity(
                    "sandbox_kill",
                    SandboxRequest(sandbox_id=carry.sandbox_id, conversation_id=carry.conversation_id),
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=HOUSEKEEPING_RETRY,
                    summary="kill sandbox",
                )
                carry.sandbox_id = ""
            except ActivityError as err:
                workflow.logger.warning("cleanup: killing sandbox %s failed: %s", carry.sandbox_id, cause_text(err))
        # Only runs with per-run MCP servers (none recorded before MCP existed) schedule this.
        if carry.mcp_per_run:
            try:
                await workflow.execute_activity(
                    "mcp_release",
                    carry.conversation_id,
                    result_type=int,
                    start_to_close_timeout=HOUSEKEEPING_TIMEOUT,
                    retry_policy=HOUSEKEEPING_RETRY,
                    summary=f"stop per-run MCP servers {', '.join(carry.mcp_per_run)[:100]}",
                )
            except ActivityError as err:
                workflow.logger.warning("cleanup: stopping per-run MCP servers failed: %s", cause_text(err))
        # Only runs counted among their tenant's open runs (none recorded before AGENT_TENANT_MAX_OPEN_RUNS).
        if carry.tenant_slot and workflow.patched(TENANT_SLOT_PATCH):
            try:
                await workflow.execute_activity(
                    "tenant_run_release",
                    TenantRunRelease(tenant=self._input.tenant if self._input else ""),
                    result_type=bool,
                    start_to_close_timeout=HOUSEKEEPING_TIMEOUT,
                    retry_policy=HOUSEKEEPING_RETRY,
                    summary="give back the tenant's open-run place",
                )
                carry.tenant_slot = False
            except ActivityError as err:  # the reaper gives it back once the run is closed
                workflow.logger.warning("cleanup: giving back the tenant's open-run place failed: %s", cause_text(err))

    # --- limits and bookkeeping ----------------------------------------------------------

    def _deadline_passed(self, inp: AgentInput, carry: Carry) -> bool:
        return workflow.now().timestamp() >= deadline(inp.limits, carry)

    def _remaining(self, inp: AgentInput, carry: Carry) -> timedelta:
        return timedelta(seconds=max(1.0, deadline(inp.limits, carry) - workflow.now().timestamp()))

    def _emit(self, kind: EventKind, text: str, tool: str = "", **data: object) -> None:
        """One progress event: stream, current details, search attributes."""
        self._last_event = text
        self._reporter.publish(kind, self._step, text, tool, **data)
        view = self.status()
        self._report_to_parent(view.pending_approvals)
        workflow.set_current_details(details_markdown(workflow.info().workflow_id, view, view.refused[-1:]))
        self._reporter.sync_search_attributes(
            self._search_attributes,
            state=view.state,
            pending=len(view.pending_approvals),
            tenant=self._tenant,
            model=self._model,
            cost_usd=self._usage.cost_usd,
        )

    def _policy_of(self, call: ToolCall) -> Decision:
        return decide(
            self._operator_policy,
            self._run_policy,
            call.name,
            call.arguments,
            side_effect=call.side_effect,
            sandboxed=call.uses_sandbox,
        )

    def _finish(self, status: ResultStatus, output: str) -> AgentResult:
        self._state = status
        self._output = output
        self._emit("finished", f"finished: {status}", status=status)
        checkpoint = self._carry.checkpoint if self._carry else ""
        return AgentResult(
            status=status,
            output=output,
            usage=self._usage,
            steps=self._step,
            checkpoint=checkpoint,
            decisions=self._book.decisions,
            output_json=self._output_json if status == "completed" else None,
        )


def _checked_policy(raw: dict[str, Any], where: str) -> Policy | None:
    """A policy from the run's input, or the run fails: its approval timeouts become timers."""
    try:
        policy = parse_run_policy(raw)
    except ValidationError as err:
        raise _invalid_input(f"{where}: {problems(err)}") from None
    if policy is None:
        return None
    longest = max([policy.approval_timeout_s, *(rule.approval_timeout_s or 0 for rule in policy.rules)])
    if longest > MAX_APPROVAL_TIMEOUT_S:
        raise _invalid_input(f"{where}: approval_timeout_s must be at most {MAX_APPROVAL_TIMEOUT_S} (365 days)")
    return policy


def _minus(total: Usage, part: Usage) -> Usage:
    return Usage(
        input_tokens=total.input_tokens - part.input_tokens,
        output_tokens=total.output_tokens - part.output_tokens,
        cost_usd=round(total.cost_usd - part.cost_usd, 8),
    )


def _invalid_input(problem: str) -> ApplicationError:
    return ApplicationError(f"invalid run input: {problem}", type="InvalidInput", non_retryable=True)


__all__ = [
    "HOUSEKEEPING_RETRY",
    "HOUSEKEEPING_TIMEOUT",
    "REFUSAL_EVENTS",
    "REFUSAL_EVENT_EVERY",
    "REFUSAL_LINES_PER_TASK",
    "AgentWorkflow",
    "RunInput",
]
