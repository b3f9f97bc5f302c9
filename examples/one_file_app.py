"""A whole application in one module: your workflow, ``DurableAgentsPlugin``, a worker and a starter.

    python -m examples.one_file_app "What is the capital of France?"

``AskWorkflow`` runs ``AgentWorkflow`` as a child workflow and returns its answer. The module imports
``durable_agents`` at its top, as any module would: the workflow sandbox re-imports this module for
every run, and that import is safe there (``durable_agents`` loads its names on first use, and the
plugin passes its own modules through the sandbox). The worker runs in this process while the run
lasts; ``TEMPORAL_ADDRESS``, ``AGENT_TASK_QUEUE``, ``AGENT_MODEL`` and the rest come from ``Settings``.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from datetime import timedelta

import structlog
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agents import AgentInput, AgentResult, ConfigurationError, DurableAgentsPlugin, Settings, exit_process


@workflow.defn
class AskWorkflow:
    @workflow.run
    async def run(self, question: str) -> str:
        result = await workflow.execute_child_workflow(
            "AgentWorkflow",
            AgentInput(task=question, tools=[]),
            id=f"{workflow.info().workflow_id}-agent",  # a retried or replayed parent finds the same child
            task_queue=workflow.info().task_queue,
            result_type=AgentResult,
            execution_timeout=timedelta(minutes=15),
        )
        return f"{result.status}: {result.output}"


async def main(question: str) -> str:
    settings = Settings.from_env()
    # The agent's activities log through structlog: to stderr, below AGENT_LOG_LEVEL (default INFO) left out.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(settings.observability.log_level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    plugin = DurableAgentsPlugin(settings)  # ConfigurationError if the configuration is bad
    client = await Client.connect(settings.temporal.address, namespace=settings.temporal.namespace, plugins=[plugin])
    async with Worker(client, task_queue=settings.task_queue, workflows=[AskWorkflow]):  # + AgentWorkflow
        return await client.execute_workflow(
            AskWorkflow.run, question, id=f"ask-{uuid.uuid4().hex[:8]}", task_queue=settings.task_queue
        )


if __name__ == "__main__":
    try:
        print(asyncio.run(main(" ".join(sys.argv[1:]) or "Say hello.")))
    except ConfigurationError as exc:
        print(f"bad configuration: {exc}", file=sys.stderr)
        exit_process(2)
    exit_process(0)  # a short-lived client process: leave without interpreter teardown
