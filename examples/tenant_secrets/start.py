"""Sign one invoice per ``TENANT:INVOICE`` argument, each in a run of that tenant, and print the answers.

    python -m examples.tenant_secrets.start acme:INV-1 globex:INV-1

``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE`` and ``AGENT_TASK_QUEUE`` say where the worker listens.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from durable_agents import AgentInput, AgentResult, Settings, exit_process


async def main(pairs: list[str]) -> None:
    settings = Settings.from_env()
    client = await Client.connect(
        settings.temporal.address, namespace=settings.temporal.namespace, data_converter=pydantic_data_converter
    )
    for pair in pairs:
        tenant, _, invoice = pair.partition(":")
        result = await client.execute_workflow(
            "AgentWorkflow",
            AgentInput(task=f"Sign invoice {invoice}.", tenant=tenant, tools=["sign_invoice"]),
            id=f"sign-{tenant}-{uuid.uuid4().hex[:8]}",
            task_queue=settings.task_queue,
            result_type=AgentResult,
        )
        print(f"{tenant}: {result.status}: {result.output}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or ["acme:INV-1"]))
    exit_process(0)  # a short-lived client: skip the interpreter teardown the Temporal runtime's threads dislike
