"""One model turn's tool calls: policy, approvals, the sandbox, execution, unknown outcomes.

Deterministic workflow code, used by ``AgentWorkflow``. Every call gets exactly
one result at its own transcript position, whatever happens to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, is_cancelled_exception

from workflows.approvals import ApprovalBook
from workflows.delegation import Delegator, capped_calls, child_workflow_id
from workflows.human_wait import pending_entry, wait_for_decision
from workflows.identity import approval_id, idempotency_key, sandbox_id_for
from workflows.narration import cause_text, edit_note, tool_error, tool_summary
from workflows.policy import Decision, Policy, decide
from workflows.questions import Questions
from workflows.types import (
    AgentInput,
    Carry,
    DecisionRecord,
    Message,
    ModelTurn,
    SandboxRef,
    SandboxRequest,
    SideEffect,
    ToolCall,
    ToolInvocation,
    ToolOutcome,
    TranscriptEntry,
)

Emit = Callable[..., None]
# Several read-only tool calls of one turn run concurrently (runs recorded before run them one by one).
PARALLEL_TOOLS_PATCH = "parallel-tool-calls-v1"


class ToolCallRunner:
    def __init__(
        self,
        book: ApprovalBook,
        emit: Emit,
        operator_policy: Policy,
        run_policy: Policy | None,
        on_usage: Callable[[Carry], None] | None = None,
        on_child: Callable[[str], None] | None = None,
        on_child_ended: Callable[[str], None] | None = None,
    ) -> None:
        self.book = book
        self.emit = emit
        self.operator_policy = operator_policy
        self.run_policy = run_policy
        self.delegator = Delegator(on_usage, on_child, on_child_ended)
        self.questions = Questions(book, emit)
        self.sandbox_failure = ""

    @property
    def children(self) -> dict[str, str]:
        """Child workflow id -> what it did (for the run's final report)."""
        return self.delegator.children

    async def run_turn(self, inp: AgentInput, carry: Carry, turn: ModelTurn) -> None:
        """Every call gets exactly one result at its own position, in call order.

        Policy is decided for the whole turn first, so every call that needs a
        human is pending at once and can be decided independently. Calls then run
        one after another because later calls in a turn commonly depend on
        earlier ones (write a file, then run it).
        """
        base = carry.transcript_len
        turn = turn.model_copy(update={"tool_calls": capped_calls(turn.tool_calls, carry.max_subagent_calls)})
        self.delegator.start_turn()
        decisions: dict[str, Decision] = {}
        for call in turn.tool_calls:
            if not call.error:
                verdict = decisions[call.id] = self._remembered(carry, call, self._policy_for(call))
                text = f"turn {carry.step}: {tool_summary(call)} → {verdict.verdict} (rule {verdict.rule})"
                self.emit("tool_decided", text, call.name, verdict=verdict.verdict, rule=verdict.rule)
        approvals = {
            call.id: self._open_approval(inp, carry, call, decisions[call.id])
            for call in turn.tool_calls
            if not call.error and decisions[call.id].verdict == "ask"
        }

        async def one(index: int, call: ToolCall) -> None:
            await self._run_call(inp, carry, call, decisions, approvals, index, base + index)

        for group in self._groups(turn.tool_calls, carry):
            if len(group) == 1:
                await one(group[0], turn.tool_calls[group[0]])
            else:  # concurrent; each call still writes its own position
                await asyncio.gather(*(one(index, turn.tool_calls[index]) for index in group))
        carry.transcript_len = base + len(turn.tool_calls)

    def _groups(self, calls: list[ToolCall], carry: Carry) -> list[list[int]]:
        """Call indexes in call order, grouped: consecutive concurrent calls together, every other call alone.

        Sub-agents (their own runs, sandboxes and budgets) and read-only tools outside the sandbox
        run concurrently; side-effecting and sandbox tools, and sub-agents that work in this run's
        sandbox (``share_sandbox``), run one at a time, in call order.
        """
        groups: list[list[int]] = []
        readonly = [c for c in calls if not c.subagent and not c.side_effect and not c.uses_sandbox]
        # Decided only for turns it changes, so that recorded runs replay their sequential commands.
        parallel_tools = len(readonly) > 1 and workflow.patched(PARALLEL_TOOLS_PATCH)
        previous = False
        for index, call in enumerate(calls):
            shares = call.subagent and call.name in carry.subagents and carry.subagents[call.name].share_sandbox
            concurrent = (call.subagent and not shares) or (
                parallel_tools and not call.subagent and not call.side_effect and not call.uses_sandbox
            )
            if concurrent and previous:
                groups[-1].append(index)
            else:
                groups.append([index])
            previous = concurrent
        return groups

    async def _run_call(
        self,
        inp: AgentInput,
        carry: Carry,
        call: ToolCall,
        decisions: dict[str, Decision],
        approvals: dict[str, str],
        index: int,
        seq: int,
    ) -> None:
        refusal = call.error
        if not refusal and decisions[call.id].verdict == "deny":
            refusal = f"Error: policy denied {call.name} (rule {decisions[call.id].rule}); it was not run."
        note = ""
        if not refusal and call.id in approvals:
            refusal = await self._await_approval(carry, call, approvals[call.id])
            edited = self.book.decided[approvals[call.id]].arguments
            if not refusal and edited is not None:  # the call runs as the reviewer changed it
                note = edit_note(self.book.decided[approvals[call.id]].reviewer, call.arguments, edited)
                call = call.model_copy(update={"arguments": edited})
        if not refusal and call.human:
            await self.questions.ask(inp, carry, call, decisions[call.id], seq)
            return
        if not call.subagent:
            refusal = refusal or await self._ensure_sandbox(inp, carry, call)
        if refusal:
            self.emit("tool_finished", f"turn {carry.step}: {call.name} not run", call.name, ok=False)
            carry.pending.append(TranscriptEntry(seq=seq, message=tool_error(call, refusal)))
            return
        if call.subagent:  # watchers follow the child's own progress from this event
            child_id = child_workflow_id(call, carry, index)
            text = f"turn {carry.step}: delegating to {call.name} ({child_id})"
            self.emit("tool_started", text, call.name, child_workflow_id=child_id)
        else:
            self.emit("tool_started", f"turn {carry.step}: running {tool_summary(call)}", call.name)
        if call.subagent:
            await self._delegate(inp, carry, call, index, seq)
        else:
            await self._execute_tool(inp, carry, call, decisions[call.id], index, seq, note)

    async def _delegate(self, inp: AgentInput, carry: Carry, call: ToolCall, index: int, seq: int) -> None:
        """Run the sub-agent as a child ``AgentWorkflow``; its output becomes the call's result."""
        text, ok = await self.delegator.result(inp, carry, call, index)
        self._finished(carry, call, ok, text)
        message = Message(role="tool", content=text, tool_call_id=call.id, name=call.name, is_error=not ok)
        carry.pending.append(TranscriptEntry(seq=seq, message=message))

    def _finished(self, carry: Carry, call: ToolCall, ok: bool, preview: str) -> None:
        self.emit(
            "tool_finished",
            f"turn {carry.step}: {call.name} {'ok' if ok else 'failed'}",
            call.name,
            ok=ok,
            preview=preview[:200],
        )

    def _remembered(self, carry: Carry, call: ToolCall, decision: Decision) -> Decision:
        """An ``ask`` an earlier approval of this run already answered (``remember``) is allowed."""
        if decision.verdict != "ask" or call.subagent or call.human:
            return decision
        entry = self.book.remembered_for(call.name, call.arguments)
        if entry is None:
            return decision
        self.book.audit(
            DecisionRecord(
                approval_id=entry.approval_id,
                tool=call.name,
                decision="remembered",
                reviewer=entry.reviewer,
                at=workflow.now().isoformat(),
                comment=f"approved by {entry.reviewer}'s remembered approval ({entry.scope})",
                step=carry.step,
            )
        )
        return decision.model_copy(update={"verdict": "allow", "rule": f"remembered:{entry.approval_id}"})

    def _policy_for(self, call: ToolCall) -> Decision:
        return decide(
            self.operator_policy,
            self.run_policy,
            call.name,
            call.arguments,
            side_effect=call.side_effect,
            sandboxed=call.uses_sandbox,
        )

    def _open_approval(
        self, inp: AgentInput, carry: Carry, call: ToolCall, decision: Decision, kind: str = "tool_call"
    ) -> str:
        now = workflow.now()
        expires_at = now + timedelta(seconds=decision.approval_timeout_s)
        aid = approval_id(
            carry.key_scope or workflow.info().workflow_id, carry.step, call.id, call.name, call.arguments
        )
        if kind != "tool_call":
            aid = f"{aid}-{kind.split('_')[0]}{sum(1 for a in self.book.decided if a.startswith(aid))}"
        entry = pending_entry(
            inp, carry, call, decision, aid, now, kind=kind,
            approvals_required=decision.approvals if kind == "tool_call" else 1,
        )  # fmt: skip
        self.book.open(entry, expires_at)
        self.book.calls[aid] = call
        self.book.remember_tool_allowed[aid] = decision.remember_tool
        workflow.logger.info("approval %s requested for %s (rule %s)", aid, call.name, decision.rule)
        return aid

    async def _await_approval(self, carry: Carry, call: ToolCall, aid: str) -> str:
        """Wait (on a durable timer) for the decision; return refusal text unless approved."""
        self.emit(
            "approval_requested",
            f"turn {carry.step}: waiting for approval {aid} of {call.name}",
            call.name,
            approval_id=aid,
            expires_at=self.book.pending_expiry(aid),
        )
        await wait_for_decision(self.book, carry, aid, f"approval {aid} expires")
        self.book.expire(aid)
        verdict = self.book.decided[aid]
        if verdict.outcome in ("approved", "retry", "mark_done", "fail"):
            return ""
        if verdict.outcome == "rejected":
            reason = f": {verdict.note}" if verdict.note else ""
            return f"Error: {call.name} was rejected by {verdict.reviewer}{reason}. It was not run."
        expired_at = self.book.pending_expiry(aid)
        return f"Error: approval {aid} for {call.name} expired at {expired_at} without a decision; it was not run."

    async def _execute_tool(
        self, inp: AgentInput, carry: Carry, call: ToolCall, decision: Decision, index: int, seq: int, note: str = ""
    ) -> None:
        workflow_id = workflow.info().workflow_id
        key = idempotency_key(carry.key_scope or workflow_id, carry.step, index, call.name, call.arguments)
        invocation = ToolInvocation(
            conversation_id=carry.conversation_id,
            workflow_id=workflow_id,
            step=carry.step,
            call_id=call.id,
            call_index=index,
            seq=seq,
            tool=call.name,
            arguments=call.arguments,
            idempotency_key=key,
            sandbox_id=carry.sandbox_id,
            tenant=inp.tenant,
            user=inp.user,
            policy_verdict=decision.verdict,
            policy_rule=decision.rule,
            mcp=call.mcp,
            side_effect=call.side_effect,
            checkpoints=call.uses_sandbox,
            checkpoint=carry.checkpoint,
            reviewer_note=note,
        )
        outcome = await self._invoke(call, invocation)
        self._adopt_checkpoint(carry, outcome)
        while isinstance(outcome, ToolOutcome) and outcome.unknown:
            # Never a blind retry: a human says whether it happened.
            aid = self._open_approval(inp, carry, call, decision, kind="resolve_unknown_outcome")
            refusal = await self._await_approval(carry, call, aid)
            verdict = self.book.decided[aid]
            if verdict.outcome == "expired":
                outcome = refusal.replace("expired", "(unknown outcome) expired", 1)
                break
            note = f"{verdict.reviewer}" + (f" ({verdict.note})" if verdict.note else "")
            invocation = invocation.model_copy(
                update={"resolution": verdict.outcome, "resolution_note": note, "checkpoint": carry.checkpoint}
            )
            outcome = await self._invoke(call, invocation)
            self._adopt_checkpoint(carry, outcome)
        ok = isinstance(outcome, ToolOutcome) and outcome.ok
        self._finished(carry, call, ok, outcome if isinstance(outcome, str) else outcome.preview)
        if isinstance(outcome, str):
            carry.pending.append(TranscriptEntry(seq=seq, message=tool_error(call, outcome)))
        elif call.side_effect and outcome.ok:
            carry.side_effects.append(
                SideEffect(
                    tool=call.name,
                    step=carry.step,
                    call_id=call.id,
                    idempotency_key=key,
                    arguments=call.arguments,
                    compensable=call.compensable,
                )
            )

    @staticmethod
    def _adopt_checkpoint(carry: Carry, outcome: ToolOutcome | str) -> None:
        """The workspace a sandbox tool left is what the next one must find (restored when it is not)."""
        if isinstance(outcome, ToolOutcome) and outcome.checkpoint:
            carry.checkpoint = outcome.checkpoint

    async def _invoke(self, call: ToolCall, invocation: ToolInvocation) -> ToolOutcome | str:
        """The tool activity's outcome, or error text when every attempt failed."""
        try:
            outcome: ToolOutcome = await workflow.execute_activity(
                "mcp" if call.mcp is not None else call.name,  # MCP tools share one activity type
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
                summary=tool_summary(call) + (f" · {invocation.resolution}" if invocation.resolution else ""),
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            # The activity never stored a result (it stores before completing), so the workflow answers.
            return f"Error: {call.name} failed after {call.max_attempts} attempts: {cause_text(err)}"
        return outcome

    async def _ensure_sandbox(self, inp: AgentInput, carry: Carry, call: ToolCall) -> str:
        """Create the run's sandbox on first use; return an error text if it cannot be had."""
        if not call.uses_sandbox or carry.sandbox_id:
            return ""
        if self.sandbox_failure:
            return self.sandbox_failure
        owner = carry.shared_sandbox or carry.conversation_id  # a sharing sub-agent's: its parent's
        request = SandboxRequest(sandbox_id=sandbox_id_for(owner), conversation_id=owner, tenant=inp.tenant)
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
            if is_cancelled_exception(err):
                raise
            self.sandbox_failure = (
                f"Error: the code sandbox is unavailable, so {call.name} cannot run: {cause_text(err)}"
            )
            return self.sandbox_failure
        carry.sandbox_id = ref.sandbox_id
        return ""
