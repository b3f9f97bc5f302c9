"""Sub-agent delegation: one tool call of a model turn run as a child ``AgentWorkflow``.

Deterministic workflow code, used by ``ToolCallRunner``. What bounds a tree of runs:

- every limit of a child is capped by what its parent has left (``child_limits``): tokens, cost,
  time, steps, and depth under the operator's ceiling (``AGENT_MAX_DEPTH``, ``Carry.max_depth``);
- one model turn makes at most ``Carry.max_subagent_calls`` sub-agent calls
  (``AGENT_MAX_SUBAGENT_CALLS_PER_TURN``); the extra calls get a tool error (``capped_calls``);
- every child's run is counted in the run store under the tree's root before it starts
  (``tree_run_reserve``, ``AGENT_MAX_TREE_RUNS``); past the cap the call gets a tool error;
- a child's start input names the tree's sub-agent definitions by digest (``Carry.subagents_ref``),
  never copies them; one that would still be too large (a huge task) is a tool error, as are the
  starts of one turn that together would be (``MAX_TURN_CHILD_INPUT_BYTES``): never a workflow
  task too large to complete.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ChildWorkflowError, is_cancelled_exception
from temporalio.workflow import ParentClosePolicy

from workflows.identity import sandbox_id_for
from workflows.inputs import problems
from workflows.limits import deadline
from workflows.narration import cause_text
from workflows.run_failure import result_of_failure
from workflows.types import (
    MAX_RUN_INPUT_BYTES,
    MAX_TURN_CHILD_INPUT_BYTES,
    AgentInput,
    AgentResult,
    Carry,
    Limits,
    SubagentDef,
    ToolCall,
    TreeRunRequest,
    TreeRunVerdict,
)

# Each child start is counted against AGENT_MAX_TREE_RUNS first (an activity before the child; runs
# recorded before start their children at once).
TREE_RUNS_PATCH = "tree-runs-v1"
# A run input over MAX_RUN_INPUT_BYTES is refused (decided only for such inputs: runs recorded before
# with one replay unchanged).
INPUT_SIZE_PATCH = "run-input-size-v1"
# A child start refused for what runs recorded before started anyway: a parent with no steps left, a start
# input too large (decided only when it refuses, so those runs replay their starts).
CHILD_REFUSALS_PATCH = "child-refusals-v1"
MAX_SUBAGENT_RESULT_CHARS = 32 * 1024  # of a child's output, as the parent's tool result


class Delegator:
    """Starts the sub-agents of one run and keeps what each did (for the run's final report)."""

    def __init__(
        self,
        on_usage: Callable[[Carry], None] | None = None,
        on_child: Callable[[str], None] | None = None,
        on_child_ended: Callable[[str], None] | None = None,
    ) -> None:
        self.on_usage = on_usage
        self.on_child = on_child or (lambda _: None)
        self.on_child_ended = on_child_ended or (lambda _: None)
        self.children: dict[str, str] = {}  # child workflow id -> what it did
        self.turn_bytes = 0  # of the child inputs started in the current model turn
        # Resolved when the turn's latest delegation started its child (or gave up): each waits for the one
        # before it, so that children start in call order however their tree_run_reserve activities return.
        self._started: asyncio.Future[None] | None = None

    def start_turn(self) -> None:
        self.turn_bytes, self._started = 0, None

    async def result(self, inp: AgentInput, carry: Carry, call: ToolCall, index: int) -> tuple[str, bool]:
        """The child's output as the call's result (or why it was not started), and whether it completed."""
        previous, started = self._started, asyncio.get_running_loop().create_future()
        self._started = started
        try:
            return await self._result(inp, carry, call, index, previous, started)
        finally:
            if not started.done():
                started.set_result(None)

    async def _result(
        self,
        inp: AgentInput,
        carry: Carry,
        call: ToolCall,
        index: int,
        previous: asyncio.Future[None] | None,
        started: asyncio.Future[None],
    ) -> tuple[str, bool]:
        definition = carry.subagents.get(call.name)
        if definition is None:  # validated by the model activity against this same list
            return f"Error: unknown sub-agent {call.name!r}.", False
        max_depth = min(inp.limits.max_depth, carry.max_depth)
        if inp.depth >= max_depth:
            return f"Error: max_depth reached ({max_depth}); {call.name} was not started.", False
        limits = child_limits(definition.limits or Limits(), inp.limits, carry, workflow.now().timestamp())
        if isinstance(limits, str):
            return f"Error: {limits}; {call.name} was not started.", False
        if parent_steps_left(inp.limits, carry) < 1 and workflow.patched(CHILD_REFUSALS_PATCH):
            return f"Error: max_steps={inp.limits.max_steps} reached; {call.name} was not started.", False
        task = str(call.arguments.get("task", ""))
        try:
            child = child_input(inp, carry, call.name, definition, task, limits)
        except ValidationError as err:  # a task the model sent that no run input may hold
            return f"Error: {call.name} was not started: {problems(err)}", False
        size = len(child.model_dump_json().encode())
        if size > MAX_RUN_INPUT_BYTES and workflow.patched(CHILD_REFUSALS_PATCH):
            return (
                f"Error: {call.name}'s start input would be {size} bytes, over the limit of {MAX_RUN_INPUT_BYTES}; "
                f"it was not started (give it a shorter task).",
                False,
            )
        if self.turn_bytes + size > MAX_TURN_CHILD_INPUT_BYTES and workflow.patched(CHILD_REFUSALS_PATCH):
            return (
                f"Error: this turn's sub-agent starts would be over {MAX_TURN_CHILD_INPUT_BYTES} bytes together; "
                f"{call.name} was not started (call it again in a later turn).",
                False,
            )
        self.turn_bytes += size
        child_id = child_workflow_id(call, carry, index)
        if workflow.patched(TREE_RUNS_PATCH):
            refusal = await _count_run(carry, call, child_id)
            if refusal:
                return refusal, False
        if previous is not None:
            await previous  # done at once unless an earlier call of this turn still waits for its count
        if definition.share_sandbox and not carry.sandbox_id:
            # The child creates it (idempotent id) when it first needs it; this run kills it at its end.
            carry.sandbox_id = sandbox_id_for(carry.conversation_id)
        started.set_result(None)  # this child's start command goes out in this same step, before the next one's
        return await self._run_child(carry, call, definition, child, child_id)

    async def _run_child(
        self, carry: Carry, call: ToolCall, definition: SubagentDef, child: AgentInput, child_id: str
    ) -> tuple[str, bool]:
        self.on_child(child_id)
        self.children[child_id] = "started; no result yet"
        try:
            result: AgentResult = await workflow.execute_child_workflow(
                "AgentWorkflow",
                child,
                id=child_id,
                result_type=AgentResult,
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                static_summary=f"{call.name} for {workflow.info().workflow_id}: {child.task[:200]}",
            )
        except ChildWorkflowError as err:
            if is_cancelled_exception(err):
                self.children[child_id] = "cancelled"
                raise
            failed = result_of_failure(err)  # a child that ended failed or limit_exceeded with the flag on
            if failed is None:
                self.children[child_id] = f"failed: {cause_text(err)[:200]}"
                return f"Error: sub-agent {call.name} ({child_id}) failed: {cause_text(err)}", False
            result = failed
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
        # A typed result reaches the parent's model as its JSON (no code fence or spacing of the child's model).
        output = result.output if result.output_json is None else json.dumps(result.output_json, ensure_ascii=False)
        text = output[:MAX_SUBAGENT_RESULT_CHARS]
        if result.status != "completed":
            text += f"\n[sub-agent {call.name} ({child_id}) ended {result.status} after {result.steps} steps]"
        return text, result.status == "completed"


async def _count_run(carry: Carry, call: ToolCall, child_id: str) -> str:
    """Count the child among its tree's runs; why it may not start, or ``""``."""
    root = carry.budget.root if carry.budget is not None else carry.conversation_id
    try:
        verdict: TreeRunVerdict = await workflow.execute_activity(
            "tree_run_reserve",
            TreeRunRequest(root=root, child_id=child_id),
            result_type=TreeRunVerdict,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=5),
            summary=f"count {call.name}'s run in the tree",
        )
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        return f"Error: {call.name} was not started: its run could not be counted in the tree ({cause_text(err)})."
    if verdict.granted:
        return ""
    return (
        f"Error: this tree of runs has started its {verdict.cap} runs (AGENT_MAX_TREE_RUNS); "
        f"{call.name} was not started. Finish the task without more sub-agents."
    )


def child_input(
    inp: AgentInput, carry: Carry, name: str, definition: SubagentDef, task: str, limits: Limits
) -> AgentInput:
    """The child's start input: the definitions by digest (runs recorded before copy them whole)."""
    shared = {
        "task": task,
        "limits": limits,
        "policy": child_policy(inp.policy, definition.policy),
        "approvers": inp.approvers,
        "tenant": inp.tenant,
        "user": inp.user,
        "depth": inp.depth + 1,
        "budget": carry.budget,
        "parent_conversation": carry.conversation_id if definition.share_sandbox else "",
        "checkpoint": carry.checkpoint if definition.share_sandbox else "",
    }
    if carry.subagents_ref:
        return AgentInput(subagents_ref=carry.subagents_ref, as_subagent=name, **shared)
    return AgentInput(
        model=definition.model,
        tools=definition.tools,
        system_prompt=definition.system_prompt,
        subagents=dict(carry.subagents),
        **shared,
    )


def capped_calls(calls: list[ToolCall], cap: int) -> list[ToolCall]:
    """The turn's calls, every sub-agent call past the ``cap``-th (0: no cap) turned into a tool error."""
    if not cap:
        return calls
    capped, seen = [], 0
    for call in calls:
        if call.subagent and not call.error:
            seen += 1
            if seen > cap:
                text = (
                    f"Error: at most {cap} sub-agent calls per model turn (AGENT_MAX_SUBAGENT_CALLS_PER_TURN); "
                    f"{call.name} was not started (call it again in a later turn)."
                )
                call = call.model_copy(update={"error": text})
        capped.append(call)
    return capped


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
            "max_steps": min(own.max_steps, max(1, parent_steps_left(parent, carry))),
            "max_tokens": min(own.max_tokens, tokens),
            "max_cost_usd": cost,
            "timeout_s": min(own.timeout_s, seconds),
            "max_depth": min(own.max_depth, parent.max_depth, carry.max_depth),
        }
    )


def parent_steps_left(parent: Limits, carry: Carry) -> int:
    """The model turns the parent has after the current one (a fork counts its own steps, a session's
    message its own, as ``limit_reason`` does)."""
    return parent.max_steps - (carry.step - max(carry.forked_at_step, carry.message_step))


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


def input_size_problem(inp: AgentInput) -> str:
    """Why a run's input is too large to run (its size without ``carry``, in JSON bytes), or ``""``.

    Only a run's first execution is measured: a continuation carries the input it was started with.
    """
    if workflow.info().continued_run_id:
        return ""
    size = len(inp.model_dump_json(exclude={"carry"}).encode())
    if size <= MAX_RUN_INPUT_BYTES:
        return ""
    return f"the input is {size} bytes, over the limit of {MAX_RUN_INPUT_BYTES} bytes (count its task and prompts)"
