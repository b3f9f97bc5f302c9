"""Follow a run's model text as it is written: ``AgentClient.events`` with a ``DeltaReader``.

    python -m examples.streaming.follow

Runs a worker in this process with the offline ``typewriter`` model (``typewriter_provider``), says it
listens to a new run, starts the run and prints its deltas as they arrive, then the run's result and
how many deltas carried the text. ``TEMPORAL_ADDRESS``, ``AGENT_TASK_QUEUE``, ``AGENT_STORE_URL`` and the
rest come from ``Settings``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import uuid

import structlog
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agents import AgentInput, ConfigurationError, DeltaReader, DurableAgentsPlugin, Settings, exit_process
from durable_agents.agent_client import AgentClient

PROVIDER = "examples.streaming.typewriter_provider"


async def main() -> None:
    settings = Settings.from_env()
    settings = dataclasses.replace(
        settings,
        model="typewriter:v1",
        extensions=dataclasses.replace(
            settings.extensions, provider_modules=(*settings.extensions.provider_modules, PROVIDER)
        ),
    )
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(settings.observability.log_level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    plugin = DurableAgentsPlugin(settings, reaper=False)
    client = await Client.connect(settings.temporal.address, namespace=settings.temporal.namespace, plugins=[plugin])
    reader = DeltaReader.from_settings(settings)
    agents = AgentClient(client, task_queue=settings.task_queue, deltas=reader, store_url=settings.store_url)
    workflow_id = f"follow-{uuid.uuid4().hex[:8]}"
    try:
        async with Worker(client, task_queue=settings.task_queue):
            await reader.listen(workflow_id)  # before the run's first turn: that turn streams
            await agents.start(AgentInput(task="say something"), workflow_id=workflow_id)
            deltas = 0
            async for event in agents.events(workflow_id):
                if event.kind == "delta":
                    if event.data["restart"]:
                        print("\n[the model call was retried: its text starts again]")
                    print(event.text, end="", flush=True)
                    deltas += 1
            result = await agents.result(workflow_id)
            print(f"\nresult: {result.status}: {result.output}")
            print(f"deltas: {deltas}")
    finally:
        await reader.close()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except ConfigurationError as exc:
        print(f"bad configuration: {exc}", file=sys.stderr)
        exit_process(2)
    exit_process(0)
