"""``ReportWorkflow``: your own workflow, which runs an agent as a child workflow and builds on its answer.

The child is ``AgentWorkflow``, registered on your worker by ``DurableAgentsPlugin``
(see ``worker.py``). Its id is derived from the parent's (``<parent id>-agent``), so
a retried or replayed parent finds the same child instead of starting a second one.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from durable_agents import AgentInput, AgentResult, Limits

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, Field

TASK_QUEUE = "my-app"  # the default; worker.py and starter.py read EMBED_TASK_QUEUE
BACKSTOP_S = 300  # the child's execution timeout is its own timeout plus this (it may wait for approvals)


class ReportInput(BaseModel):
    topic: str = Field(min_length=1)
    tools: list[str] | None = None  # None: every tool the worker offers; []: none
    model: str = ""  # empty: the worker's AGENT_MODEL
    timeout_s: int = Field(default=600, ge=1)  # the agent's own time limit
    typed: bool = False  # ask the agent for ``Findings`` (a typed result) instead of free text


class Findings(BaseModel):
    """What a typed run answers: the agent's final answer must be JSON of this shape."""

    summary: str  # the report itself, at most three lines
    sources: int = Field(ge=0)  # how many tool results it is based on


class Report(BaseModel):
    topic: str
    agent_workflow_id: str
    status: str  # the agent's: completed, failed, cancelled or limit_exceeded
    text: str
    steps: int
    total_tokens: int
    findings: Findings | None = None  # with ``typed``: the agent's answer, parsed and validated


@workflow.defn
class ReportWorkflow:
    @workflow.run
    async def run(self, params: ReportInput) -> Report:
        agent_id = f"{workflow.info().workflow_id}-agent"
        task = AgentInput(
            task=f"Write a three-line report on {params.topic}",
            model=params.model,
            tools=params.tools,
            limits=Limits(timeout_s=params.timeout_s),
        )
        result = await workflow.execute_child_workflow(
            "AgentWorkflow",
            # A typed result: the answer must validate against Findings' JSON Schema, or the model is asked again.
            task.with_output(Findings) if params.typed else task,
            id=agent_id,
            task_queue=workflow.info().task_queue,
            result_type=AgentResult,
            execution_timeout=timedelta(seconds=params.timeout_s + BACKSTOP_S),
        )
        findings = result.output_as(Findings) if params.typed and result.status == "completed" else None
        return Report(
            topic=params.topic,
            agent_workflow_id=agent_id,
            status=result.status,
            text=f"Report on {params.topic}:\n{findings.summary if findings else result.output}",
            findings=findings,
            steps=result.steps,
            total_tokens=result.usage.total_tokens,
        )
