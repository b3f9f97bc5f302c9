"""Run a worker: ``AgentWorkflow`` plus every activity, until SIGTERM/SIGINT.

Configuration comes from the environment (see README / DESIGN.md):
``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``AGENT_TASK_QUEUE``, ``AGENT_MODEL``,
``AGENT_SANDBOX``, ``AGENT_HTTP_ALLOW``, ``AGENT_STORE_URL``; observability:
``AGENT_LOG_LEVEL``, ``AGENT_METRICS_PORT`` (Prometheus), ``OTEL_TRACES_EXPORTER`` /
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_SERVICE_NAME`` (traces, see ``durable_agents.telemetry``).
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
from activities.store.factory import display_url
from durable_agents import logs, telemetry
from durable_agents.client import TemporalUnavailable, connect, exit_process
from durable_agents.reaping import reap_forever
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
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        logs.configure()
        log.error("bad_configuration", error=str(exc))
        return 2
    logs.configure(secrets=settings.secret_values())
    try:
        return await _serve(settings)
    finally:
        telemetry.shutdown_tracing()  # the process leaves through os._exit: flush spans first


async def _serve(settings: Settings) -> int:
    telemetry.configure_tracing("durable-agents-worker")
    try:
        metrics = telemetry.temporal_runtime()
    except ValueError as exc:
        log.error("bad_configuration", error=str(exc))
        return 2
    try:
        client = await connect(plugins=telemetry.temporal_plugins(), runtime=metrics)
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
        store=display_url(settings.store_url),
        search_attributes=runtime.search_attributes_ready,
        tracing=telemetry.tracing_enabled(),
        metrics_port=telemetry.metrics_port(),
    )
    every_s = settings.reap_interval_s
    reaper = asyncio.create_task(reap_forever(client, runtime.sandbox_backend, every_s)) if every_s > 0 else None
    async with worker:
        await stop.wait()
        log.info("worker_stopping")
        if reaper is not None:
            reaper.cancel()
    await runtime.aclose()
    log.info("worker_stopped")
    return 0


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
