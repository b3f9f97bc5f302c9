"""Run a worker: ``AgentWorkflow`` plus every activity, until SIGTERM/SIGINT.

Configuration comes from the environment through ``Settings`` (every variable:
docs/reference/configuration.md): ``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE``, ``AGENT_TASK_QUEUE``, ``AGENT_MODEL``, ``AGENT_SANDBOX``,
``AGENT_HTTP_ALLOW``, ``AGENT_STORE_URL``, ``AGENT_TOOL_MODULES``,
``AGENT_PROVIDER_MODULES``, ...; worker tuning: ``AGENT_MAX_CACHED_WORKFLOWS``,
``AGENT_MAX_CONCURRENT_ACTIVITIES``, ``AGENT_MAX_CONCURRENT_WORKFLOW_TASKS``; deployment:
``AGENT_REQUIRE_SHARED_STORE`` (refuse a SQLite run store), ``AGENT_HEALTH_PORT``
(``/healthz`` and ``/readyz``), ``AGENT_HEAP_TRIM_INTERVAL_S`` (freed heap given back);
observability: ``AGENT_LOG_LEVEL``,
``AGENT_METRICS_PORT`` (Prometheus), ``OTEL_TRACES_EXPORTER`` /
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_SERVICE_NAME``. A bad configuration is one
line on stderr and exit code 2.
"""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta
from typing import Any

import structlog
from temporalio.client import Client
from temporalio.worker import Worker

from activities.runtime import Runtime
from activities.settings import ConfigurationError, Settings
from activities.store.factory import display_url
from durable_agents import logs, telemetry
from durable_agents.client import TemporalUnavailable, connect, exit_process
from durable_agents.heap import HeapTrimmer, trim_heap_forever
from durable_agents.plugin import DurableAgentsPlugin

log = structlog.get_logger("worker")
GRACEFUL_SHUTDOWN = timedelta(seconds=10)


def build_worker(client: Client, runtime: Runtime, *, task_queue: str, reaper: bool = False, **options: Any) -> Worker:
    """A worker for ``runtime`` as tests and benchmarks run it (the same plugin as ``main``).

    ``options`` are ``Worker`` options; those not given come from ``runtime.settings.worker``.
    """
    plugin = DurableAgentsPlugin(runtime=runtime, reaper=reaper, search_attributes=False)
    options.setdefault("graceful_shutdown_timeout", GRACEFUL_SHUTDOWN)
    for name, value in runtime.settings.worker.options().items():
        options.setdefault(name, value)
    return Worker(client, task_queue=task_queue, plugins=[plugin], **options)


async def main() -> int:
    try:
        settings = Settings.from_env()
    except ConfigurationError as exc:
        logs.configure()
        log.error("bad_configuration", error=str(exc))
        return 2
    logs.configure(settings.observability.log_level, secrets=settings.secret_values())
    try:
        return await _serve(settings)
    finally:
        telemetry.shutdown_tracing()  # the process leaves through os._exit: flush spans first


async def _serve(settings: Settings) -> int:
    telemetry.configure_tracing("durable-agents-worker", settings.observability)
    try:
        plugin = DurableAgentsPlugin(settings)
        await plugin.check()  # before connecting; the worker's own run does not repeat it
    except ConfigurationError as exc:
        log.error("bad_configuration", error=str(exc))
        return 2
    if unpriced := plugin.runtime.prices.unpriced_note(settings.model):
        log.warning("model_unpriced", model=settings.model, note=unpriced)
    try:
        client = await connect(
            settings.temporal,
            plugins=[*telemetry.temporal_plugins(), plugin],
            runtime=telemetry.temporal_runtime(settings.observability),
            keyring=settings.encryption.keyring,
        )
    except TemporalUnavailable as exc:
        log.error("temporal_unavailable", error=str(exc))
        await plugin.aclose()
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        **settings.worker.options(),
    )
    interval = settings.worker.heap_trim_interval_s
    trimmer = asyncio.create_task(trim_heap_forever(interval), name="heap-trimmer") if interval > 0 else None
    try:
        async with worker:
            await _run_until_stopped(worker, plugin, settings, client, stop)
    except ConfigurationError as exc:  # raised around the worker's start, e.g. a health port already in use
        log.error("bad_configuration", error=str(exc))
        return 2
    finally:
        if trimmer is not None:
            trimmer.cancel()
    log.info("worker_stopped")
    return 0


async def _run_until_stopped(
    worker: Worker, plugin: DurableAgentsPlugin, settings: Settings, client: Client, stop: asyncio.Event
) -> None:
    log.info(
        "worker_started",
        task_queue=settings.task_queue,
        namespace=client.namespace,
        model=settings.model,
        sandbox=settings.sandbox.backend,
        store=display_url(settings.store_url),
        payload_keys=list(settings.encryption.keyring.ids) if settings.encryption.keyring else "off",
        tools=plugin.runtime.tools.names(),
        providers=plugin.runtime.providers.registry.prefixes(),
        search_attributes=plugin.runtime.search_attributes_ready,
        tracing=telemetry.tracing_enabled(),
        metrics_port=settings.observability.metrics_port,
        health_port=settings.worker.health_port,
        heap_trim_s=settings.worker.heap_trim_interval_s if HeapTrimmer().available else "unavailable",
        # What the worker actually runs with (AGENT_MAX_*), read back from its configuration.
        **{name: worker.config().get(name) for name in settings.worker.options()},
    )
    await stop.wait()
    log.info("worker_stopping")


if __name__ == "__main__":
    exit_process(asyncio.run(main()))
