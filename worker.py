"""Run a worker: ``AgentWorkflow`` plus every activity, until SIGTERM/SIGINT.

Configuration comes from the environment (see README / DESIGN.md):
``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``AGENT_TASK_QUEUE``, ``AGENT_MODEL``,
``AGENT_SANDBOX``, ``AGENT_HTTP_ALLOW``, ``AGENT_STORE_URL``.
"""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta
from typing import Any

import structlog
from temporalio.client import Client
from temporalio.worker import Worker

from activities.config import Settings
from activities.runtime import Runtime, all_activities
from durable_agents import logs
from durable_agents.client import TemporalUnavailable, connect, exit_process
from durable_agents.search_attributes import ensure_search_attributes
from workflows.agent import AgentWorkflow

log = structlog.get_logger("worker")


def build_worker(client: Client, runtime: Runtime, *, task_queue: str, **options: Any) -> Worker:
    """The worker as tests and this script run it."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[AgentWorkflow],
        activities=all_activities(runtime),
        graceful_shutdown_timeout=timedelta(seconds=10),
        **options,
    )


async def main() -> int:
    logs.configure()
    settings = Settings.from_env()
    try:
        client = await connect()
    except TemporalUnavailable as exc:
        log.error("temporal_unavailable", error=str(exc))
        return 2
    runtime = Runtime.from_settings(settings)
    runtime.search_attributes_ready = await ensure_search_attributes(client)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = build_worker(client, runtime, task_queue=settings.task_queue)
    log.info(
        "worker_started",
        task_queue=settings.task_queue,
        namespace=client.namespace,
        model=settings.model,
        sandbox=settings.sandbox,
        store=settings.store_url,
    )
    async with worker:
        await stop.wait()
        log.info("worker_stopping")
    await runtime.aclose()
    log.info("worker_stopped")
    return 0


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
