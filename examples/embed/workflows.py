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


class Report(BaseModel):
    topic: str
    agent_workflow_id: str
    status: str  # the agent's: completed, failed, cancelled or limit_exceeded
    text: str
    steps: int
    total_tokens: int


@workflow.defn
class ReportWorkflow:
    @workflow.run
    async def run(self, params: ReportInput) -> Report:
        agent_id = f"{workflow.info().workflow_id}-agent"
        result = await workflow.execute_child_workflow(
            "AgentWorkflow",
            AgentInput(
                task=f"Write a three-line report on {params.topic}",
                model=params.model,
                tools=params.tools,
                limits=Limits(timeout_s=params.timeout_s),
            ),
            id=agent_id,
            task_queue=workflow.info().task_queue,
            result_type=AgentResult,
            execution_timeout=timedelta(seconds=params.timeout_s + BACKSTOP_S),
        )
        return Report(
            topic=params.topic,
            agent_workflow_id=agent_id,
            status=result.status,
            text=f"Report on {params.topic}:\n{result.output}",
            steps=result.steps,
            total_tokens=result.usage.total_tokens,
        )
