"""The HTTP API in tests: a tokens file, the app served by real uvicorn on 127.0.0.1 (in this process or
as ``starter.py serve`` subprocesses), and a few tenants' tokens."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from durable_agents.agent_client import AgentClient
from durable_agents.api.app import bind, create_app, server
from durable_agents.api.tokens import TokenRegistry, digest
from tests.conftest import TEMPORAL_CLI
from tests.waiting import eventually_sync
from workflows.progress import COST_USD, MODEL, PENDING_APPROVALS, STATE, TENANT

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Who:
    token: str
    tenant: str
    roles: tuple[str, ...]
    reviewer: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


ALICE = Who("tok-acme-alice-0123456789", "acme", ("starter", "reviewer"), "alice")
CAROL = Who("tok-acme-carol-0123456789", "acme", ("reviewer",), "carol")
BOB = Who("tok-globex-bob-0123456789", "globex", ("starter", "reviewer"), "bob")
ROOT_ADMIN = Who("tok-admin-0123456789", "", ("admin",), "root")
EVERYONE = (ALICE, CAROL, BOB, ROOT_ADMIN)


def write_tokens(path: Path, people: tuple[Who, ...] = EVERYONE) -> Path:
    entries = [
        {"sha256": digest(p.token), "tenant": p.tenant, "roles": list(p.roles), "reviewer": p.reviewer} for p in people
    ]
    path.write_text(json.dumps({"tokens": entries}))
    return path


@asynccontextmanager
async def indexed_server() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server of its own with the Agent* search attributes: the API lists runs by tenant and state."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        search_attributes=[STATE, PENDING_APPROVALS, TENANT, MODEL, COST_USD],
    )
    try:
        yield env
    finally:
        await env.shutdown()


@asynccontextmanager
async def serve_app(
    client: Client, task_queue: str, tokens_file: Path, *, store_url: str = "", **options: Any
) -> AsyncIterator[tuple[str, FastAPI]]:
    """The API on a free 127.0.0.1 port, served by uvicorn in this event loop; yields its base URL and app."""
    agents = AgentClient(client, task_queue=task_queue, store_url=store_url)
    app = create_app(agents, tokens=TokenRegistry(tokens_file), **options)
    sock = bind("127.0.0.1", 0)
    web = server(app)
    task = asyncio.create_task(web.serve(sockets=[sock]))
    try:
        while not web.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app
    finally:
        web.should_exit = True
        await task
        sock.close()


@asynccontextmanager
async def serve_api(
    client: Client, task_queue: str, tokens_file: Path, *, store_url: str = "", **options: Any
) -> AsyncIterator[str]:
    """:func:`serve_app`'s URL."""
    async with serve_app(client, task_queue, tokens_file, store_url=store_url, **options) as (url, _):
        yield url


class ServeProcess:
    """``starter.py serve --port 0`` as a process of its own; ``url`` once it printed where it listens."""

    def __init__(
        self,
        address: str,
        task_queue: str,
        tokens_file: Path | None,
        log: Path,
        *,
        insecure_local: bool = False,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
    ) -> None:
        self.log = log
        self._out = log.open("wb")
        flags = ["--insecure-local"] if insecure_local else []
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "starter.py"), "serve", "--port", "0", "--host", host, *flags],
            env={
                "PATH": os.environ["PATH"],
                "TEMPORAL_ADDRESS": address,
                "AGENT_TASK_QUEUE": task_queue,
                **({"AGENT_API_TOKENS_FILE": str(tokens_file)} if tokens_file else {}),
                **(env or {}),
            },
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        self.url = eventually_sync(self._listening, f"starter.py serve listening ({log})")

    def _listening(self) -> str:
        text = self.log.read_text(errors="replace")
        assert self.proc.poll() is None, f"serve exited {self.proc.returncode}: {text}"
        for line in text.splitlines():
            if line.startswith("API on http://"):
                return line.split()[2]
        return ""

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


async def get_json(http: httpx.AsyncClient, url: str, who: Who, **params: Any) -> Any:
    response = await http.get(url, headers=who.headers, params=params)
    assert response.status_code == 200, (url, response.status_code, response.text)
    return response.json()
