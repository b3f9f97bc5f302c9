"""Long-term memory in two tenants' runs: each remembers, each recalls, neither sees the other's.

    python -m examples.memory.two_tenants

Runs a worker in this process (the ``notes`` example model, ``examples/memory/policy.json`` letting
``memory_save`` run without an approval) and six runs: tenant ``acme`` and tenant ``globex`` each save
a note, then each searches for it; then each asks a question with ``memory: {"recall": "auto"}``, so
its best memories are put into the model's context before its first turn. Each run's memory is the
namespace (tenant, user) of its input; the model cannot name another. ``TEMPORAL_ADDRESS``,
``AGENT_TASK_QUEUE``, ``AGENT_STORE_URL`` and the rest come from ``Settings`` as usual.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import uuid
from pathlib import Path

import structlog
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agents import (
    AgentInput,
    AgentResult,
    ConfigurationError,
    DurableAgentsPlugin,
    MemorySpec,
    Settings,
    exit_process,
)

HERE = Path(__file__).resolve().parent
PROVIDER = "examples.memory.notes_provider"


async def main() -> list[str]:
    settings = Settings.from_env()
    settings = dataclasses.replace(
        settings,
        model="notes:v1",
        policy_file=settings.policy_file or str(HERE / "policy.json"),
        extensions=dataclasses.replace(
            settings.extensions, provider_modules=(*settings.extensions.provider_modules, PROVIDER)
        ),
    )
    # The agent's activities log through structlog: to stderr, below AGENT_LOG_LEVEL (default INFO) left out.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(settings.observability.log_level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    plugin = DurableAgentsPlugin(settings, reaper=False)
    client = await Client.connect(settings.temporal.address, namespace=settings.temporal.namespace, plugins=[plugin])
    queue = settings.task_queue

    async def run(tenant: str, task: str, memory: MemorySpec | None = None) -> str:
        result: AgentResult = await client.execute_workflow(
            "AgentWorkflow",
            AgentInput(task=task, tenant=tenant, user="ann", tools=["memory_save", "memory_search"], memory=memory),
            id=f"memory-{tenant}-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            result_type=AgentResult,
        )
        return f"{tenant}: {result.status}: {result.output}"

    async with Worker(client, task_queue=queue):
        return [
            await run("acme", "remember: acme's launch party is on the roof"),
            await run("globex", "remember: globex's launch party is in the basement"),
            await run("acme", "recall: launch party"),
            await run("globex", "recall: launch party"),
            await run("acme", "ask: where is the launch party?", MemorySpec(recall="auto", k=3)),
            await run("globex", "ask: where is the launch party?", MemorySpec(recall="auto", k=3)),
        ]


if __name__ == "__main__":
    try:
        print("\n".join(asyncio.run(main())))
    except ConfigurationError as exc:
        print(f"bad configuration: {exc}", file=sys.stderr)
        exit_process(2)
    exit_process(0)
