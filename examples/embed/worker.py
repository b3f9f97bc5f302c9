"""Your own worker: ``ReportWorkflow`` plus, through the plugin, ``AgentWorkflow`` and all its activities.

    TEMPORAL_ADDRESS=localhost:7233 .venv/bin/python -m examples.embed.worker

Configuration is the usual worker environment, read by ``Settings.from_env()``
(``AGENT_MODEL``, ``AGENT_TOOL_MODULES``, ``AGENT_STATE_DIR``, ...), plus
``EMBED_TASK_QUEUE`` (default ``my-app``). SIGINT or SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import structlog
from temporalio.client import Client
from temporalio.worker import Worker

from durable_agents import ConfigurationError, DurableAgentsPlugin, Settings
from examples.embed.workflows import TASK_QUEUE, ReportWorkflow


async def main() -> None:
    settings = Settings.from_env()
    # The agent's activities log through structlog; keep lines below AGENT_LOG_LEVEL (default INFO) out.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(settings.observability.log_level))
    plugin = DurableAgentsPlugin(settings)  # validates the configuration: ConfigurationError if bad
    client = await Client.connect(settings.temporal.address, namespace=settings.temporal.namespace, plugins=[plugin])
    task_queue = settings.variable("EMBED_TASK_QUEUE", TASK_QUEUE)
    worker = Worker(client, task_queue=task_queue, workflows=[ReportWorkflow])  # AgentWorkflow comes from the plugin

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with worker:
        print(f"worker polling task queue {task_queue!r}", flush=True)
        await stop.wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except ConfigurationError as exc:
        sys.exit(f"bad configuration: {exc}")
