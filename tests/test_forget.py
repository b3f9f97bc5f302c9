"""``starter.py forget``: a tenant's (or user's) runs, sessions, sub-agents, checkpoints and blobs deleted.

Real dev server, an in-process worker with the bubblewrap sandbox and a run store (SQLite, PostgreSQL,
and SQLite encrypted at rest with its Temporal payloads encrypted too), the fake model server; ``forget``
runs as a subprocess. Tenants A and B each run an agent run that writes a
file holding its marker plus a file of the same bytes in both (one shared blob), asks a sub-agent
(A's), posts its marker after an approval, and a two-message session that writes a file too.
After ``forget --tenant A``: A's marker is in none of the store's files (it was before, except
encrypted, where it never is), the PostgreSQL server's files included, Temporal
lists none of A's runs, B reads its transcript and checkpoint files (the shared one included), a
second forget deletes nothing, a dry run deletes nothing, an open run is left alone and listed,
and ``--include-open`` cancels it and forgets it. ``--user`` forgets one user of a tenant only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.checkpoints.gc import workflow_of
from activities.crypto.codec import encrypted_converter
from activities.runtime import Runtime
from activities.sandbox.checkpointable import Manifest
from activities.settings import EncryptionSettings, Settings
from durable_agents.search_attributes import ensure_search_attributes
from tests.conftest import WorkerFactory, require_bwrap, start_agent
from tests.crypto_keys import TEST_ONLY_K1, ring
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.pg import StoppablePostgres
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, AgentResult, ApproveSignal, StatusView, SubagentDef

ROOT = Path(__file__).resolve().parent.parent
SHARED = "the same bytes in every tenant's workspace"
HELPER = {"helper": SubagentDef(description="Helps.", system_prompt="You are the helper.")}
COUNT_KINDS = ("runs", "conversations", "messages", "checkpoints", "blobs", "ledger entries", "memory entries")


@pytest.fixture
def cache_mode() -> str:
    return "cached"


class Store:
    """Where the test's run store keeps its bytes, and whether it and the payloads are encrypted."""

    def __init__(self, url: str, keys: str = "", pgdata: Path | None = None) -> None:
        self.url, self.keys, self.pgdata = url, keys, pgdata

    def holds(self, marker: str) -> bool:
        """Whether ``marker``'s bytes are anywhere in the store's files. PostgreSQL: in the files of its
        tables and indexes (``base/``), after a CHECKPOINT so that rows reach them and not only the WAL;
        the server's WAL keeps them until it is recycled, which is the operator's (docs/tenants.md)."""
        if self.pgdata is None:
            return in_store_files(self.url, marker)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        tables = str(self.pgdata / "base")
        found = subprocess.run(["grep", "-r", "-a", "-F", "-q", "-e", marker, tables], check=False)
        assert found.returncode in (0, 1, 2), found  # 2: a file the server removed while grep read the tree
        return found.returncode == 0


@pytest.fixture(params=["sqlite", "postgres", "sqlite-encrypted"])
def store(request: pytest.FixtureRequest, settings: Settings) -> Iterator[Store]:
    if request.param == "postgres":
        server: StoppablePostgres = request.getfixturevalue("stoppable_postgres")
        yield Store(server.url, pgdata=Path(server._server.pgdata))
    else:
        yield Store(settings.store_url, keys=TEST_ONLY_K1 if request.param == "sqlite-encrypted" else "")


@pytest.fixture
async def tenant_runtime(settings: Settings, store: Store) -> Any:
    keys = EncryptionSettings(keyring=ring(store.keys)) if store.keys else settings.encryption
    rt = Runtime.from_settings(dataclasses.replace(settings, store_url=store.url, encryption=keys))
    yield rt
    await rt.aclose()


def client_for(env: WorkflowEnvironment, store: Store) -> Client:
    """The dev server's client; encrypted runs get their payloads encrypted with the store's key ring."""
    if not store.keys:
        return env.client
    converter = encrypted_converter(pydantic_data_converter, ring(store.keys))
    return Client(env.client.service_client, namespace=env.client.namespace, data_converter=converter)


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


def model(sink: HttpSink) -> Any:
    """``write NAME TEXT`` writes NAME and the shared file (and asks the helper, in a run with one);
    ``post TEXT`` posts TEXT (an approval); a tool result gets ``saved``; the helper says ``helped``."""

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body["messages"]
        if messages[0]["content"] == "You are the helper.":
            return Scripted(text="helped")
        last = messages[-1]
        if last["role"] == "tool":
            return Scripted(text="saved")
        words = str(last.get("content") or "").split()
        if words[:1] == ["write"]:
            calls = [
                ("write_file", json.dumps({"path": words[1], "content": words[2]})),
                ("write_file", json.dumps({"path": "shared.txt", "content": SHARED})),
            ]
            if any(t.get("function", {}).get("name") == "helper" for t in body.get("tools", [])):
                calls.append(("helper", json.dumps({"task": f"remember {words[2]}"})))
            return Scripted(tool_calls=calls)
        if words[:1] == ["post"]:
            post = {"method": "POST", "url": f"{sink.url}/orders", "json": {"note": words[1]}}
            return Scripted(tool_calls=[("http_request", json.dumps(post))])
        return Scripted(text=f"echo: {' '.join(words)}")

    return reply


class Cli:
    def __init__(self, client: Client, task_queue: str, store_url: str, keys: str = "") -> None:
        self.env = {
            "PATH": os.environ["PATH"],
            "TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "AGENT_TASK_QUEUE": task_queue,
            "AGENT_STORE_URL": store_url,
        }
        if keys:
            self.env["AGENT_PAYLOAD_KEYS"] = keys

    async def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        """In a thread: the worker answers on this test's event loop (a cancelled run must still close)."""
        return await asyncio.to_thread(self._run, args)

    def _run(self, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "starter.py"), *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )


def counts(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found: dict[str, int] = {}
    for line in proc.stdout.splitlines():
        label, colon, value = line.strip().partition(": ")
        label = label.removesuffix(" (Temporal executions)")
        if colon and label in COUNT_KINDS:
            found[label] = int(value)
    assert set(found) == set(COUNT_KINDS), proc.stdout
    return found


def audit(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one audit line forget writes (JSON on stderr: not a terminal)."""
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    records = [r for r in lines if r.get("event") == "forget"]
    assert len(records) == 1, proc.stderr
    record: dict[str, Any] = records[0]
    return record


def in_store_files(store_url: str, marker: str) -> bool:
    """Whether ``marker``'s bytes are anywhere in the SQLite store's files (database, WAL, shared memory).

    Read by another process: closing a file descriptor of the database in this one would drop every
    POSIX lock this process's own connection holds on it (the worker's), and SQLite would then think
    another connection the last one.
    """
    files = [store_url + suffix for suffix in ("", "-wal", "-shm") if Path(store_url + suffix).exists()]
    found = subprocess.run(["grep", "-a", "-F", "-q", "-e", marker, *files], check=False)
    assert found.returncode in (0, 1), found
    return found.returncode == 0


async def conversations_of(runtime: Runtime, workflow_ids: set[str]) -> list[str]:
    return [c for c, _ in await runtime.store.conversations() if workflow_of(c)[0] in workflow_ids]


async def tenant_runs(client: Client, tenant: str) -> list[str]:
    return sorted({wf.id async for wf in client.list_workflows(f"AgentTenant = '{tenant}'")})


async def approved_post(
    client: Client, tq: str, tenant: str, marker: str, user: str = ""
) -> WorkflowHandle[AgentWorkflow, AgentResult]:
    handle = await start_agent(
        client, tq, id_prefix=f"fg-post-{tenant}", task=f"post {marker}", tenant=tenant, user=user
    )
    view: StatusView = await eventually(lambda: _pending(handle), "the post waits for its approval")
    await handle.signal(
        AgentWorkflow.approve, ApproveSignal(approval_id=view.pending_approvals[0].approval_id, reviewer="ops")
    )
    assert (await handle.result()).status == "completed"
    return handle


async def _pending(handle: WorkflowHandle[AgentWorkflow, AgentResult]) -> StatusView | None:
    view: StatusView = await handle.query(AgentWorkflow.status)
    return view if view.pending_approvals else None


async def session(client: Client, tq: str, tenant: str, marker: str, user: str = "") -> str:
    """A two-message session that writes a file, closed afterwards."""
    session_id = f"fg-session-{tenant}-{uuid.uuid4().hex[:8]}"
    handle = await client.start_workflow(
        AgentWorkflow.run, AgentInput(session=SessionSpec(), tenant=tenant, user=user), id=session_id, task_queue=tq
    )
    for n, text in enumerate((f"write s.txt {marker}-session", "hello"), start=1):
        sent: SendResult = await handle.execute_update(
            "send", SessionMessage(message_id=f"m{n}", text=text), result_type=SendResult
        )
        assert sent.accepted, sent

        async def replied(seq: int = n) -> bool:
            view: StatusView = await handle.query(AgentWorkflow.status)
            return view.replied >= seq and view.state == "idle"

        await eventually(replied, f"the session replies to message {n}")
    await handle.signal("close")
    await handle.result()
    return session_id


async def tenant_work(
    client: Client, runtime: Runtime, tq: str, sink: HttpSink, tenant: str, marker: str, user: str = ""
) -> set[str]:
    """A run with a sub-agent that writes files, an approved post, a session and a memory entry; their
    workflow ids."""
    await runtime.memory.save(tenant, user, "", f"remember {marker}-memory", f"fg-{uuid.uuid4().hex}")
    run = await start_agent(
        client,
        tq,
        id_prefix=f"fg-run-{tenant}",
        task=f"write own.txt {marker}",
        tenant=tenant,
        user=user,
        subagents=HELPER,
    )
    assert (await run.result()).output == "saved"
    post = await approved_post(client, tq, tenant, marker, user)
    return {run.id, f"{run.id}/helper/s1c2", post.id, await session(client, tq, tenant, marker, user)}


async def last_checkpoint_files(runtime: Runtime, conversation_id: str) -> dict[str, bytes | None]:
    entries = await runtime.store.transcript(conversation_id)
    [checkpoint, *_] = [e.meta["checkpoint"] for e in reversed(entries) if isinstance(e.meta.get("checkpoint"), str)]
    assert isinstance(checkpoint, str)
    manifest = Manifest.decode(await runtime.store.get_blob(checkpoint) or b"")
    return {e.path: await runtime.store.get_blob(e.hash) for e in manifest.entries if e.kind == "file"}


async def test_forget_a_tenant_deletes_its_data_and_runs_and_keeps_the_other_tenants(
    dev_env: WorkflowEnvironment,
    tenant_runtime: Runtime,
    store: Store,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    sink: HttpSink,
) -> None:
    require_bwrap()
    runtime = tenant_runtime
    client = client_for(dev_env, store)
    runtime.search_attributes_ready = await ensure_search_attributes(client)
    assert runtime.search_attributes_ready, "forget finds a tenant's runs by their AgentTenant search attribute"
    suffix = uuid.uuid4().hex[:8]
    tenant_a, tenant_b = f"acme-{suffix}", f"globex-{suffix}"
    marker_a, marker_b, marker_open = (f"MARKER{x}{uuid.uuid4().hex}" for x in ("A", "B", "OPEN"))
    llm.default = model(sink)
    async with run_worker(client, runtime) as tq:
        cli = Cli(client, tq, store.url, store.keys)
        a_ids = await tenant_work(client, runtime, tq, sink, tenant_a, marker_a)
        b_ids = await tenant_work(client, runtime, tq, sink, tenant_b, marker_b)
        assert len(sink.received) == 2 and marker_a.encode() in sink.received[0].body
        still_open = await start_agent(client, tq, id_prefix="fg-open", task=f"post {marker_open}", tenant=tenant_a)
        await eventually(lambda: _pending(still_open), "the open run waits for its approval")
        assert await tenant_runs(client, tenant_a) == sorted(a_ids | {still_open.id})

        a_conversations = await conversations_of(runtime, a_ids)
        b_conversations = await conversations_of(runtime, b_ids)
        assert len(a_conversations) == 4 and len(b_conversations) == 4, (a_conversations, b_conversations)
        assert any([await runtime.store.ledger(w) for w in a_ids]), "the approved post has its ledger entry"
        # The positive control: the markers are plaintext in the store (short entries and files are not
        # compressed); encrypted at rest, no marker is ever there.
        plaintext = not store.keys
        assert store.holds(marker_a) is plaintext and store.holds(marker_b) is plaintext
        assert store.holds(f"{marker_a}-memory") is plaintext  # the memory entry's text as well

        dry = await cli("forget", "--tenant", tenant_a, "--dry-run")
        planned = counts(dry)
        assert "dry run: nothing deleted" in dry.stdout and "open runs left alone" in dry.stdout, dry.stdout
        assert still_open.id in dry.stdout
        assert planned["runs"] == 4 and planned["conversations"] == 4, dry.stdout
        assert min(planned.values()) > 0, dry.stdout
        assert audit(dry)["dry_run"] is True
        assert await conversations_of(runtime, a_ids) == a_conversations
        assert store.holds(marker_a) is plaintext

        first = await cli("forget", "--tenant", tenant_a)
        deleted = counts(first)
        assert deleted == planned, (first.stdout, dry.stdout)
        assert "blob(s) kept: other runs still use the same content" in first.stdout, first.stdout
        assert f"open runs left alone (--include-open cancels and forgets them): {still_open.id}" in first.stdout
        record = audit(first)
        assert record["tenant"] == tenant_a and record["dry_run"] is False and record["blobs"] == deleted["blobs"]
        assert marker_a not in first.stderr
        assert not store.holds(marker_a), "A's marker is still in the store's files"
        assert not store.holds(f"{marker_a}-memory")
        left = await conversations_of(runtime, a_ids)
        assert left == [], left
        assert deleted["memory entries"] == 1 and await runtime.memory.count(tenant_a, None) == 0
        [b_memory] = await runtime.memory.search(tenant_b, "", "remember", 5)
        assert b_memory.text == f"remember {marker_b}-memory"
        assert [await runtime.store.ledger(w) for w in sorted(a_ids)] == [[]] * len(a_ids)

        async def only_open() -> bool:
            return await tenant_runs(client, tenant_a) == [still_open.id]

        await eventually(only_open, "Temporal lists none of A's closed runs")

        # B: its runs, transcripts and checkpoint files, the blob it shared with A included.
        assert await tenant_runs(client, tenant_b) == sorted(b_ids)
        assert sorted(await conversations_of(runtime, b_ids)) == sorted(b_conversations)
        [b_run] = [c for c in b_conversations if workflow_of(c)[0].startswith("fg-run-") and "/helper/" not in c]
        files = await last_checkpoint_files(runtime, b_run)
        assert files == {"own.txt": marker_b.encode(), "shared.txt": SHARED.encode()}, files
        [b_session] = [c for c in b_conversations if c.endswith("/session")]
        texts = [e.message.content for e in await runtime.store.transcript(b_session)]
        assert f"write s.txt {marker_b}-session" in texts and "echo: hello" in texts, texts

        second = await cli("forget", "--tenant", tenant_a)
        assert set(counts(second).values()) == {0}, second.stdout
        assert still_open.id in second.stdout

        with_open = await cli("forget", "--tenant", tenant_a, "--include-open")
        forgot_open = counts(with_open)
        assert forgot_open["runs"] == 1 and forgot_open["messages"] > 0, with_open.stdout
        assert "open runs" not in with_open.stdout and "still open" not in with_open.stdout, with_open.stdout
        assert not store.holds(marker_open)
        await eventually(lambda: _no_runs(client, tenant_a), "Temporal lists none of A's runs")
        assert set(counts(await cli("forget", "--tenant", tenant_a)).values()) == {0}
        assert store.holds(marker_b) is plaintext


async def _no_runs(client: Client, tenant: str) -> bool:
    return await tenant_runs(client, tenant) == []


async def test_forget_a_user_deletes_only_that_users_runs(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, sink: HttpSink
) -> None:
    require_bwrap()
    client = dev_env.client
    runtime.search_attributes_ready = await ensure_search_attributes(client)
    assert runtime.search_attributes_ready, "forget finds a tenant's runs by their AgentTenant search attribute"
    tenant = f"initech-{uuid.uuid4().hex[:8]}"
    marker_ann, marker_bob = f"MARKERANN{uuid.uuid4().hex}", f"MARKERBOB{uuid.uuid4().hex}"
    llm.default = model(sink)
    async with run_worker(client, runtime) as tq:
        cli = Cli(client, tq, runtime.settings.store_url)
        ann = await tenant_work(client, runtime, tq, sink, tenant, marker_ann, user="ann")
        bob = await tenant_work(client, runtime, tq, sink, tenant, marker_bob, user="bob")
        bob_conversations = sorted(await conversations_of(runtime, bob))
        forgot = await cli("forget", "--tenant", tenant, "--user", "ann")
        assert counts(forgot)["runs"] == 4 and f"forgot user 'ann' of tenant '{tenant}'" in forgot.stdout
        assert audit(forgot)["user"] == "ann"
        assert await conversations_of(runtime, ann) == []
        assert sorted(await conversations_of(runtime, bob)) == bob_conversations
        store_url = runtime.settings.store_url
        assert not in_store_files(store_url, marker_ann) and in_store_files(store_url, marker_bob)
        assert counts(forgot)["memory entries"] == 1
        assert await runtime.memory.count(tenant, "ann") == 0 and await runtime.memory.count(tenant, "bob") == 1

        async def bob_left() -> bool:
            return await tenant_runs(client, tenant) == sorted(bob)

        await eventually(bob_left, "Temporal lists only bob's runs")
