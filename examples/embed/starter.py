"""Run ``ReportWorkflow`` once and print its report as JSON.

    .venv/bin/python -m examples.embed.starter "the stock of A-1001" [--id ID] [--tools a,b] [--typed]

``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE`` and ``EMBED_TASK_QUEUE`` (default ``my-app``)
say where the worker of ``examples.embed.worker`` listens.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from datetime import timedelta

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from durable_agents import Settings, exit_process
from examples.embed.workflows import BACKSTOP_S, TASK_QUEUE, ReportInput, ReportWorkflow


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.embed.starter", description="Run ReportWorkflow once and print its report."
    )
    parser.add_argument("topic", help="what the report is about")
    parser.add_argument("--id", default="", help="workflow id (default: report-<random>)")
    parser.add_argument("--tools", default=None, help="comma-separated tool names (default: all; '' for none)")
    parser.add_argument("--timeout", type=int, default=600, help="the agent's time limit in seconds")
    parser.add_argument("--typed", action="store_true", help="ask the agent for typed findings (JSON)")
    return parser.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    settings = Settings.from_env()
    # A starter only needs the data converter; the plugin (tools, providers, store) belongs in the worker.
    client = await Client.connect(
        settings.temporal.address, namespace=settings.temporal.namespace, data_converter=pydantic_data_converter
    )
    tools = None if args.tools is None else [t.strip() for t in args.tools.split(",") if t.strip()]
    params = ReportInput(topic=args.topic, tools=tools, timeout_s=args.timeout, typed=args.typed)
    report = await client.execute_workflow(
        ReportWorkflow.run,
        params,
        id=args.id or f"report-{uuid.uuid4().hex[:8]}",
        task_queue=settings.variable("EMBED_TASK_QUEUE", TASK_QUEUE),
        execution_timeout=timedelta(seconds=params.timeout_s + 2 * BACKSTOP_S),
    )
    print(report.model_dump_json(indent=2))


if __name__ == "__main__":
    asyncio.run(main())
    # A short-lived client process: leave without interpreter teardown, which the Temporal core
    # runtime's threads can crash (PyGILState_Release at finalization) after the report is printed.
    exit_process(0)
