"""A tenant's life on a shared deployment: a quota on its open runs, its memory, and forgetting it.

    python -m examples.tenants.offboarding

Runs a worker in this process with ``AGENT_TENANT_MAX_OPEN_RUNS=1`` and the offline ``notes`` model
(``examples/memory``). Tenant ``acme`` saves a note; while an ``acme`` session is open, a second
``acme`` run is refused with its reason and a ``globex`` run is not held back. Then the session
closes, and ``forget_tenant`` (what ``durable-agents forget`` runs) deletes everything of ``acme``:
a dry run first, then for real, then again (nothing more to delete). ``globex``'s memory is intact.
``TEMPORAL_ADDRESS``, ``AGENT_TASK_QUEUE``, ``AGENT_STORE_URL`` and the rest come from ``Settings``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.worker import Worker

from durable_agents import (
    AgentInput,
    AgentResult,
    ConfigurationError,
    DurableAgentsPlugin,
    SessionSpec,
    Settings,
    exit_process,
    forget_tenant,
)

MEMORY = Path(__file__).resolve().parent.parent / "memory"
PROVIDER = "examples.memory.notes_provider"
VISIBLE_WAIT_S = 120.0  # visibility lists a closed run soon after it closes, and drops a deleted one later


async def main() -> list[str]:
    settings = Settings.from_env()
    settings = dataclasses.replace(
        settings,
        model="notes:v1",
        tenant_max_open_runs=1,
        policy_file=settings.policy_file or str(MEMORY / "policy.json"),
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
    queue, suffix = settings.task_queue, uuid.uuid4().hex[:8]
    acme, globex = f"acme-{suffix}", f"globex-{suffix}"
    lines: list[str] = []

    async def run(tenant: str, task: str) -> str:
        try:
            result: AgentResult = await client.execute_workflow(
                "AgentWorkflow",
                AgentInput(task=task, tenant=tenant, tools=["memory_save", "memory_search"]),
                id=f"offboarding-{tenant}-{uuid.uuid4().hex[:6]}",
                task_queue=queue,
                result_type=AgentResult,
            )
        except WorkflowFailureError as err:
            return f"refused: {getattr(err.cause, 'message', err.cause)}"
        return f"{result.status}: {result.output}"

    async with Worker(client, task_queue=queue):
        lines.append(f"acme saves: {await run(acme, 'remember: the acme office wifi is on channel 11')}")
        lines.append(f"globex saves: {await run(globex, 'remember: the globex office wifi is on channel 6')}")
        session = await client.start_workflow(
            "AgentWorkflow",
            AgentInput(session=SessionSpec(), tenant=acme),
            id=f"offboarding-session-{suffix}",
            task_queue=queue,
        )
        await _until_idle(session)  # started: it holds acme's one place
        lines.append(f"acme while its session is open: {await run(acme, 'recall: wifi')}")
        lines.append(f"globex meanwhile: {await run(globex, 'recall: wifi')}")
        await session.signal("close")
        await session.result()

        # forget finds runs through visibility (AgentTenant, which a run sets once it has started: the
        # refused run never did, so only its start input, in its history, names acme; the CLI's runs carry
        # AgentTenant from their start).
        await _until_listed(client, acme, lambda closed: closed == 2)
        for label, dry_run in (("dry run", True), ("forget", False), ("again", False)):
            if label == "again":  # the server deletes executions asynchronously: until they are gone
                await _until_listed(client, acme, lambda closed: closed == 0)
            report = await forget_tenant(client, settings, acme, dry_run=dry_run)
            counts = ", ".join(
                f"{kind} {n}" for kind, n in sorted(report.counts.items()) if kind != "shared_blobs_kept"
            )
            lines.append(f"{label}: {counts}")
        lines.append(f"acme afterwards: {await run(acme, 'recall: wifi')}")
        lines.append(f"globex afterwards: {await run(globex, 'recall: wifi')}")
    return lines


async def _until_idle(session: WorkflowHandle[Any, Any]) -> None:
    """Wait (at most ``VISIBLE_WAIT_S``) until the session has started and waits for a message."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + VISIBLE_WAIT_S
    while loop.time() < deadline:
        if (await session.query("status"))["state"] == "idle":
            return
        await asyncio.sleep(0.2)


async def _until_listed(client: Client, tenant: str, done: Callable[[int], bool]) -> None:
    """Wait (at most ``VISIBLE_WAIT_S``) until the number of closed runs of ``tenant`` that visibility
    lists is ``done``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + VISIBLE_WAIT_S
    query = f"AgentTenant = '{tenant}' AND ExecutionStatus != 'Running'"
    while loop.time() < deadline:
        if done(len([w async for w in client.list_workflows(query)])):
            return
        await asyncio.sleep(0.5)


if __name__ == "__main__":
    try:
        print("\n".join(asyncio.run(main())))
    except ConfigurationError as exc:
        print(f"bad configuration: {exc}", file=sys.stderr)
        exit_process(2)
    exit_process(0)
