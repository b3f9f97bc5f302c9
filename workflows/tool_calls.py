"""One model turn's tool calls: policy, approvals, the sandbox, execution, unknown outcomes.

Deterministic workflow code, used by ``AgentWorkflow``. Every call gets exactly
one result at its own transcript position, whatever happens to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ChildWorkflowError, is_cancelled_exception
from temporalio.workflow import ParentClosePolicy

from workflows.approvals import ApprovalBook
from workflows.identity import approval_id, idempotency_key, sandbox_id_for
from workflows.limits import deadline
from workflows.narration import cause_text, tool_error, tool_summary
from workflows.policy import Decision, Policy, decide
from workflows.types import (
    AgentInput,
    AgentResult,
    Carry,
    Limits,
    Message,
    ModelTurn,
    PendingApproval,
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
MAX_SUBAGENT_RESULT_CHARS = 32 * 1024  # of a child's output, as the parent's tool result


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
        self.on_usage = on_usage
        self.on_child = on_child or (lambda _: None)
        self.on_child_ended = on_child_ended or (lambda _: None)
        self.children: dict[str, str] = {}  # child workflow id -> what it did (for the run's final report)
        self.sandbox_failure = ""

    async def run_turn(self, inp: AgentInput, carry: Carry, turn: ModelTurn) -> None:
        """Every call gets exactly one result at its own position, in call order.

        Policy is decided for the whole turn first, so every call that needs a
        human is pending at once and can be decided independently. Calls then run
        one after another because later calls in a turn commonly depend on
        earlier ones (write a file, then run it).
        """
        base = carry.transcript_len
        decisions: dict[str, Decision] = {}
        for call in turn.tool_calls:
            if not call.error:
                verdict = decisions[call.id] = self._policy_for(call)
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
        if not refusal and call.id in approvals:
            refusal = await self._await_approval(carry, call, approvals[call.id])
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
            await self._execute_tool(inp, carry, call, decisions[call.id], index, seq)

    async def _delegate(self, inp: AgentInput, carry: Carry, call: ToolCall, index: int, seq: int) -> None:
        """Run the sub-agent as a child ``AgentWorkflow``; its output becomes the call's result."""
        text, ok = await self._child_result(inp, carry, call, index)
        self._finished(carry, call, ok, text)
        message = Message(role="tool", content=text, tool_call_id=call.id, name=call.name, is_error=not ok)
        carry.pending.append(TranscriptEntry(seq=seq, message=message))

    async def _child_result(self, inp: AgentInput, carry: Carry, call: ToolCall, index: int) -> tuple[str, bool]:
        definition = carry.subagents.get(call.name)
        if definition is None:  # validated by the model activity against this same list
            return f"Error: unknown sub-agent {call.name!r}.", False
        if inp.depth >= inp.limits.max_depth:
            return f"Error: max_depth reached ({inp.limits.max_depth}); {call.name} was not started.", False
        limits = child_limits(definition.limits or Limits(), inp.limits, carry, workflow.now().timestamp())
        if isinstance(limits, str):
            return f"Error: {limits}; {call.name} was not started.", False
        info = workflow.info()
        task = str(call.arguments.get("task", ""))
        if definition.share_sandbox and not carry.sandbox_id:
            # The child creates it (idempotent id) when it first needs it; this run kills it at its end.
            carry.sandbox_id = sandbox_id_for(carry.conversation_id)
        child = AgentInput(
            task=task,
            model=definition.model,
            tools=definition.tools,
            system_prompt=definition.system_prompt,
            limits=limits,
            policy=child_policy(inp.policy, definition.policy),
            approvers=inp.approvers,
            tenant=inp.tenant,
            subagents=dict(carry.subagents),
            depth=inp.depth + 1,
            budget=carry.budget,
            parent_conversation=carry.conversation_id if definition.share_sandbox else "",
            checkpoint=carry.checkpoint if definition.share_sandbox else "",
        )
        child_id = child_workflow_id(call, carry, index)
        self.on_child(child_id)
        self.children[child_id] = "started; no result yet"
        try:
            result: AgentResult = await workflow.execute_child_workflow(
                "AgentWorkflow",
                child,
                id=child_id,
                result_type=AgentResult,
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                static_summary=f"{call.name} for {info.workflow_id}: {task[:200]}",
            )
        except ChildWorkflowError as err:
            if is_cancelled_exception(err):
                self.children[child_id] = "cancelled"
                raise
            self.children[child_id] = f"failed: {cause_text(err)[:200]}"
            return f"Error: sub-agent {call.name} ({child_id}) failed: {cause_text(err)}", False
        except asyncio.CancelledError:
            self.children[child_id] = "cancel requested (it compensates and cleans up on its own)"
            raise
        finally:
            self.on_child_ended(child_id)
        first_line = (result.output.splitlines() or [""])[0][:200]
        self.children[child_id] = f"{result.status} after {result.steps} step(s): {first_line}"
        if definition.share_sandbox and result.checkpoint:
            carry.checkpoint = result.checkpoint  # it worked in this run's workspace
        carry.children_usage = carry.children_usage.plus(result.usage)
        carry.usage = carry.usage.plus(result.usage)
        if self.on_usage is not None:
            self.on_usage(carry)
        text = result.output[:MAX_SUBAGENT_RESULT_CHARS]
        if result.status != "completed":
            text += f"\n[sub-agent {call.name} ({child_id}) ended {result.status} after {result.steps} steps]"
        return text, result.status == "completed"

    def _finished(self, carry: Carry, call: ToolCall, ok: bool, preview: str) -> None:
        self.emit(
            "tool_finished",
            f"turn {carry.step}: {call.name} {'ok' if ok else 'failed'}",
            call.name,
            ok=ok,
            preview=preview[:200],
        )

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
        aid = approval_id(workflow.info().workflow_id, carry.step, call.id, call.name, call.arguments)
        if kind != "tool_call":
            aid = f"{aid}-{kind.split('_')[0]}{sum(1 for a in self.book.decided if a.startswith(aid))}"
        self.book.open(
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
                kind=kind,
            ),
            expires_at,
        )
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
        began = workflow.now()
        remaining = self.book.expires[aid] - began
        if remaining.total_seconds() > 0:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: aid in self.book.decided, timeout=remaining, timeout_summary=f"approval {aid} expires"
                )
        carry.waited_s += (workflow.now() - began).total_seconds()
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
        self, inp: AgentInput, carry: Carry, call: ToolCall, decision: Decision, index: int, seq: int
    ) -> None:
        workflow_id = workflow.info().workflow_id
        key = idempotency_key(workflow_id, carry.step, index, call.name, call.arguments)
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
            policy_verdict=decision.verdict,
            policy_rule=decision.rule,
            mcp=call.mcp,
            side_effect=call.side_effect,
            checkpoints=call.uses_sandbox,
            checkpoint=carry.checkpoint,
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


def child_workflow_id(call: ToolCall, carry: Carry, index: int) -> str:
    """The child run of a delegation: one per (run, step, call), so a retry or replay never starts two."""
    return f"{workflow.info().workflow_id}/{call.name}/s{carry.step}c{index}"


def child_limits(own: Limits, parent: Limits, carry: Carry, now: float) -> Limits | str:
    """The sub-agent's limits capped by what the parent has left, or why nothing is left."""
    tokens = parent.max_tokens - carry.usage.total_tokens
    if tokens < 1:
        return f"max_tokens={parent.max_tokens} reached"
    cost = own.max_cost_usd
    if parent.max_cost_usd:
        left = round(parent.max_cost_usd - carry.usage.cost_usd, 8)
        if left <= 0:
            return f"max_cost_usd={parent.max_cost_usd} reached"
        cost = min(cost, left) if cost else left
    seconds = int(deadline(parent, carry) - now)
    if seconds < 1:
        return f"timeout_s={parent.timeout_s} reached"
    return own.model_copy(
        update={
            "max_tokens": min(own.max_tokens, tokens),
            "max_cost_usd": cost,
            "timeout_s": min(own.timeout_s, seconds),
            "max_depth": min(own.max_depth, parent.max_depth),
        }
    )


def child_policy(parent: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The child's run policy: never looser than the parent's.

    Rules are first-match. The sub-agent's ``deny`` rules come first (nothing is stricter), then
    the parent's rules in their order, then the sub-agent's ``ask`` rules (they only decide calls
    no parent rule matched, where the default is ``allow`` or ``ask``). Its ``allow`` rules are
    dropped: they could loosen the parent's defaults.
    """
    own_rules = [r for r in own.get("rules", []) if isinstance(r, dict)]
    rules = [
        *(r for r in own_rules if r.get("decision") == "deny"),
        *parent.get("rules", []),
        *(r for r in own_rules if r.get("decision") == "ask"),
    ]
    merged = {**parent, "rules": rules}
    if "approval_timeout_s" in own:
        merged["approval_timeout_s"] = min(own["approval_timeout_s"], parent.get("approval_timeout_s", 10**9))
    return merged
