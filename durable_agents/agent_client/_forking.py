"""The history half of ``AgentClient``: a run's transcript, forking it, rewinding it.

All three read the run's Temporal history (``_transcript``, ``_history``), decoded with the
client's data converter, so an encrypted run reads with the same key ring as ``status``.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from durable_agents.agent_client._approvals import Approvals
from durable_agents.agent_client._checkpoints import decode_results, refuse_uncheckpointed
from durable_agents.agent_client._errors import InvalidRequest, RunNotFound
from durable_agents.agent_client._history import (
    KEPT_FIELDS,
    NoSuchStep,
    decode_model_inputs,
    describe_at,
    first_step,
    history,
    model_turns,
    reset_event_for_step,
    source_input,
    steps_done,
)
from durable_agents.agent_client._reading import RPC_TIMEOUT, check_agent_run
from durable_agents.agent_client._starting import start_agent_run, static_details
from durable_agents.agent_client._transcript import Transcript, read_transcript
from durable_agents.agent_client._types import RunRef
from workflows.progress import FORK_OF
from workflows.types import AgentInput, ForkSpec

FORK_SUMMARY_TASK_CHARS = 100


class ForkPlan(BaseModel):
    """A fork ready to start: its input (the source's, with ``fork`` set) and the source's task queue."""

    input: AgentInput
    task_queue: str  # where the source's workers (and so its run store) are
    step: int  # the source's steps it keeps
    source_id: str
    task: str | None = None  # the new instruction, when one was given (the summary says it)

    def default_id(self) -> str:
        return f"{self.source_id}-fork{self.step}-{uuid.uuid4().hex[:6]}"


class Forking(Approvals):
    """Transcripts, forks and rewinds (see :class:`AgentClient`)."""

    async def read_transcript(self, workflow_id: str) -> Transcript:
        """The run's conversation with what reading it cost (histories, events, bytes): :meth:`transcript`'s source."""
        await self.run(workflow_id)
        return await read_transcript(self.client, workflow_id)

    async def transcript(self, workflow_id: str) -> list[dict[str, Any]]:
        """The run's conversation from its histories (every execution of the id, oldest first): each entry a
        ``message`` (``seq``, ``text``, ``sender``), a ``reply`` (``seq``, ``text``) or a ``tool_call``
        (``name``, ``arguments``, ``result``, ``ok``), with ``at`` (ISO 8601). No worker is needed.

        >>> for entry in await agents.transcript("support-42"):
        ...     print(entry["kind"], entry.get("text") or entry.get("name"))
        """
        return [entry.as_json() for entry in (await self.read_transcript(workflow_id)).entries]

    async def plan_fork(
        self,
        workflow_id: str,
        *,
        step: int | None = None,
        task: str | None = None,
        model: str = "",
        run_id: str = "",
    ) -> ForkPlan:
        """What :meth:`fork` starts, checked against the source's history (nothing is started).

        ``NoSuchStep`` when the source has fewer complete steps, ``InvalidRequest`` when step ``step``'s
        workspace was not checkpointed or the fork's input is invalid.
        """
        handle, desc = await describe_at(self.client, workflow_id, run_id)
        check_agent_run(desc)
        if self.tenant is not None and not await self._is_mine(desc):
            raise RunNotFound(f"no run with id {workflow_id!r}")
        events = await history(handle)
        await decode_model_inputs(self.client, events)
        source = await source_input(self.client, workflow_id, events)
        steps = steps_done(events, source)
        step = steps if step is None else step
        if step > steps:
            raise NoSuchStep(f"run {workflow_id} has {steps} complete step(s); cannot fork at step {step}")
        await decode_results(self.client, events)
        refuse_uncheckpointed(events, workflow_id, step, "fork")
        # A session's fork does not take the source's first message again; a task given is its next message.
        default_task = "" if source.session is not None else source.task
        try:
            inp = AgentInput(
                task=default_task if task is None else task,
                model=model,
                fork=ForkSpec(workflow_id=workflow_id, run_id=run_id, step=step),
                **{name: getattr(source, name) for name in KEPT_FIELDS},
            )
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"]) or "input"
            raise InvalidRequest(f"invalid fork input: {where}: {first['msg']}") from None
        return ForkPlan(
            input=self.stamped(inp), task_queue=desc.task_queue, step=step, source_id=workflow_id, task=task
        )

    async def start_fork(self, plan: ForkPlan, *, new_id: str | None = None, reuse_id: bool = False) -> RunRef:
        """Start the fork :meth:`plan_fork` planned (``AgentForkOf`` set when the namespace has it)."""
        inp = self.stamped(plan.input)
        assert inp.fork is not None
        workflow_id = new_id or plan.default_id()
        summary = f"fork of {plan.source_id} at step {plan.step}"
        if plan.task:
            summary += f": {' '.join(plan.task.split())[:FORK_SUMMARY_TASK_CHARS]}"
        handle = await start_agent_run(
            self.client,
            inp,
            workflow_id,
            plan.task_queue,
            summary=summary,
            details=f"{static_details(inp)}\n\n**fork of** {inp.fork.workflow_id} at step {inp.fork.step}",
            search_attributes=TypedSearchAttributes([SearchAttributePair(FORK_OF, inp.fork.workflow_id)]),
            what="fork",
            reuse_id=reuse_id,
        )
        return RunRef(workflow_id=workflow_id, run_id=handle.result_run_id or "")

    async def fork(
        self,
        workflow_id: str,
        *,
        step: int | None = None,
        task: str | None = None,
        new_id: str | None = None,
        model: str = "",
        run_id: str = "",
        reuse_id: bool = False,
    ) -> RunRef:
        """A new run from the source's first ``step`` steps (default: all it completed): its transcript and
        its workspace then. ``task``: a new instruction after those steps; ``model``: another model;
        ``run_id``: fork that run of the id (one before a reset or a continue-as-new). The source is only read.

        >>> ref = await agents.fork("readme-1", step=2, task="now in French")
        """
        plan = await self.plan_fork(workflow_id, step=step, task=task, model=model, run_id=run_id)
        return await self.start_fork(plan, new_id=new_id, reuse_id=reuse_id)

    async def rewind(self, workflow_id: str, *, step: int, reason: str = "") -> RunRef:
        """Reset the run (its latest run, running or closed) to the end of step ``step``: its model is asked
        for step ``step + 1`` again, on a branch of its transcript; identical tool calls get their recorded
        results and the workspace is restored to step ``step``. Answers the new run.

        ``NoSuchStep`` when the run has no step after ``step``, or ran it in an earlier run of its
        continue-as-new chain; ``InvalidRequest`` when step ``step``'s workspace was not checkpointed.

        >>> ref = await agents.rewind("readme-1", step=1)
        """
        _, desc = await self.run(workflow_id)
        current = self.client.get_workflow_handle(workflow_id, run_id=desc.run_id)
        events = await history(current)
        await decode_model_inputs(self.client, events)
        target = reset_event_for_step(events, step)
        if target is None:
            turns = [turn for turn, _ in model_turns(events).values()]
            first = await first_step(self.client, events)
            if step + 1 <= first or (turns and step + 1 < min(turns)):
                raise NoSuchStep(
                    f"step {step + 1} of run {workflow_id} ran in an earlier run of its continue-as-new chain "
                    f"(the current run {desc.run_id} starts after step {first}): rewinding across continue-as-new "
                    "is not supported"
                )
            raise NoSuchStep(
                f"run {workflow_id} has no step after {step} to rewind from (steps it has: {max(turns, default=first)})"
            )
        await decode_results(self.client, events)
        refuse_uncheckpointed([e for e in events if e.event_id < target], workflow_id, step, "rewind")
        response = await self.client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=self.client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=desc.run_id),
                reason=reason or f"rewind to step {step}",
                workflow_task_finish_event_id=target,
                request_id=str(uuid.uuid4()),
                identity=self.client.identity,
            ),
            retry=True,
            timeout=RPC_TIMEOUT,
        )
        return RunRef(workflow_id=workflow_id, run_id=response.run_id)
