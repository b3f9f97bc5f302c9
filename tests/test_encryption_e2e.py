"""Encrypted runs on a real dev server: nothing readable at rest, the codec server decodes, bad keys fail
visibly and recover, and a run started before a key rotation completes after it.

The dev server keeps its SQLite database in a temporary directory, so the test can read every byte
Temporal stored (WAL files included); the run store's files are read the same way.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message as ProtoMessage
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.crypto.codec import encrypted_converter, payload_key_id
from activities.runtime import Runtime
from activities.settings import EncryptionSettings, ExtensionSettings, Settings
from activities.store.encrypted import EncryptedRunStore
from tests.conftest import TEMPORAL_CLI, TEST_TOOLS
from tests.crypto_keys import TEST_ONLY_K1, TEST_ONLY_K2, TEST_ONLY_WRONG_K1, ring
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.scenarios import pending_view
from tests.waiting import eventually
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, AgentResult, ApproveSignal

ROOT = Path(__file__).resolve().parent.parent
ROTATED = f"{TEST_ONLY_K2},{TEST_ONLY_K1}"
Handle = WorkflowHandle[AgentWorkflow, AgentResult]


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[WorkflowEnvironment, Path]]:
    """A dev server of its own whose database file the test can read."""
    db = tmp_path_factory.mktemp("temporal") / "temporal.sqlite"
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        dev_server_database_filename=str(db),
    )
    yield env, db
    await env.shutdown()


def client_with(env: WorkflowEnvironment, keys: str | None) -> Client:
    """A client on the server's connection whose payloads use ``keys`` (``None``: no codec at all)."""
    converter = encrypted_converter(pydantic_data_converter, ring(keys) if keys else None)
    return Client(env.client.service_client, namespace=env.client.namespace, data_converter=converter)


def runtime_with(settings: Settings, keys: str | None) -> Runtime:
    return Runtime.from_settings(
        replace(
            settings,
            encryption=EncryptionSettings(keyring=ring(keys) if keys else None),
            extensions=ExtensionSettings(tool_modules=(TEST_TOOLS, "tests.fakes.echo_tools")),
        )
    )


def files_bytes(path: Path) -> bytes:
    """A SQLite database and its -wal / -shm / -journal files (a live server's journal comes and goes with
    each transaction: one deleted between the listing and the read held nothing the others don't)."""
    chunks = []
    for p in sorted(path.parent.glob(path.name + "*")):
        with contextlib.suppress(FileNotFoundError):
            chunks.append(p.read_bytes())
    return b"".join(chunks)


def payloads_of(message: ProtoMessage) -> Iterator[Payload]:
    """Every ``Payload`` inside a proto message (history events carry them at many depths)."""
    if isinstance(message, Payload):
        yield message
        return
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        if descriptor.message_type.GetOptions().map_entry:
            for item in value.values():
                if isinstance(item, ProtoMessage):
                    yield from payloads_of(item)
        elif isinstance(value, ProtoMessage):
            yield from payloads_of(value)
        else:  # a repeated field
            for item in value:
                yield from payloads_of(item)


async def start(client: Client, task_queue: str, task: str, **fields: Any) -> Handle:
    return await client.start_workflow(
        AgentWorkflow.run,
        AgentInput(task=task, **fields),
        id=f"enc-{uuid.uuid4().hex[:10]}",
        task_queue=task_queue,
    )


async def first_event(handle: WorkflowHandle[Any, Any], event_type: EventType.ValueType) -> Any:
    """The first event of ``event_type`` in the run's history, once there is one."""

    async def found() -> Any:
        async for event in handle.fetch_history_events():
            if event.event_type == event_type:
                return event
        return None

    return await eventually(found, f"a {EventType.Name(event_type)} event in {handle.id}")


def key_ids(events: list[Any]) -> set[str]:
    """The key ids of the encrypted payloads in ``events``."""
    return {key for e in events for p in payloads_of(e) if (key := payload_key_id(p)) is not None}


class CodecServer:
    """``starter.py codec-server --port 0`` as a subprocess; ``url`` once it listens."""

    def __init__(self, keys: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        env.update(PYTHONPATH=str(ROOT), AGENT_PAYLOAD_KEYS=keys)
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "starter.py"), "codec-server", "--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("codec server on http://"), line + (self.proc.stderr.read() if self.proc.stderr else "")
        self.url = line.split()[3]

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return err


def temporal_show(env: WorkflowEnvironment, workflow_id: str, *extra: str) -> str:
    target = env.client.service_client.config.target_host
    done = subprocess.run(
        [str(TEMPORAL_CLI), "workflow", "show", "--address", target, "-w", workflow_id, "-o", "json", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def shown_payloads(history_json: str) -> str:
    """The data of every payload in ``temporal workflow show -o json`` output (base64 there), as text."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("data"), str) and isinstance(node.get("metadata"), dict):
                found.append(base64.b64decode(node["data"]).decode("utf-8", "replace"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(history_json))
    return "\n".join(found)


async def test_nothing_readable_at_rest_and_the_codec_server_decodes(
    server: tuple[WorkflowEnvironment, Path], settings: Settings, llm: FakeLLMServer
) -> None:
    env, db = server
    marker = f"MARKER-{uuid.uuid4().hex[:12]}"
    llm.enqueue(Scripted(tool_calls=[("echo", json.dumps({"text": marker}))]), Scripted(text=f"done: {marker}"))
    client = client_with(env, TEST_ONLY_K1)
    runtime = runtime_with(settings, TEST_ONLY_K1)
    task_queue = f"enc-{uuid.uuid4().hex[:8]}"
    async with build_worker(client, runtime, task_queue=task_queue):
        handle = await start(client, task_queue, f"please echo {marker}")
        view = await pending_view(handle)
        await handle.signal(
            AgentWorkflow.approve, ApproveSignal(approval_id=view.pending_approvals[0].approval_id, reviewer="alice")
        )
        result = await handle.result()
    await runtime.aclose()
    assert result.status == "completed" and marker in result.output
    reader = runtime_with(settings, TEST_ONLY_K1)
    ledger = await reader.store.ledger(handle.id)
    await reader.aclose()
    assert [entry.result for entry in ledger] == [f"echoed: {marker}"], "the tool ran, and through the ledger"

    assert marker.encode() not in files_bytes(db), "Temporal's database holds the marker in plaintext"
    assert marker.encode() not in files_bytes(Path(settings.store_url)), "the run store holds it in plaintext"

    assert marker not in shown_payloads(temporal_show(env, handle.id))
    codec = CodecServer(TEST_ONLY_K1)
    try:
        shown = shown_payloads(temporal_show(env, handle.id, "--codec-endpoint", codec.url))
    finally:
        log = codec.stop()
    assert marker in shown and f"please echo {marker}" in shown
    assert marker not in log and '"path": "/decode"' in log and '"status": 200' in log


async def test_a_wrong_or_missing_key_fails_the_workflow_task_until_the_right_key_is_back(
    server: tuple[WorkflowEnvironment, Path], settings: Settings, llm: FakeLLMServer
) -> None:
    env, _ = server
    client = client_with(env, TEST_ONLY_K1)
    wrong_queue, keyless_queue = f"wrong-{uuid.uuid4().hex[:8]}", f"keyless-{uuid.uuid4().hex[:8]}"
    wrong = await start(client, wrong_queue, "say hello")
    keyless = await start(client, keyless_queue, "say hello")
    wrong_runtime, keyless_runtime = runtime_with(settings, TEST_ONLY_WRONG_K1), runtime_with(settings, None)
    async with (
        build_worker(client_with(env, TEST_ONLY_WRONG_K1), wrong_runtime, task_queue=wrong_queue),
        build_worker(client_with(env, None), keyless_runtime, task_queue=keyless_queue),
    ):
        failed_wrong = await first_event(wrong, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
        failed_keyless = await first_event(keyless, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    await wrong_runtime.aclose()
    await keyless_runtime.aclose()
    # The keyless worker says why in plain words; the wrong-key worker's failure is encrypted with its own key,
    # and says why once decoded with it.
    keyless_failure = failed_keyless.workflow_task_failed_event_attributes.failure
    assert "reached a worker without that key" in keyless_failure.message
    wrong_failure = await client_with(env, TEST_ONLY_WRONG_K1).data_converter.decode_failure(
        failed_wrong.workflow_task_failed_event_attributes.failure
    )
    assert "does not authenticate" in str(wrong_failure)
    for handle in (wrong, keyless):
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING  # not failed: it waits for a key

    runtime = runtime_with(settings, TEST_ONLY_K1)
    async with (
        build_worker(client, runtime, task_queue=wrong_queue),
        build_worker(client, runtime, task_queue=keyless_queue),
    ):
        results = [await wrong.result(), await keyless.result()]
    await runtime.aclose()
    assert [r.status for r in results] == ["completed", "completed"]


async def test_a_run_started_before_a_rotation_completes_after_it(
    server: tuple[WorkflowEnvironment, Path], settings: Settings, llm: FakeLLMServer
) -> None:
    env, _ = server
    marker = f"MARKER-{uuid.uuid4().hex[:12]}"
    llm.enqueue(Scripted(tool_calls=[("echo", json.dumps({"text": marker}))]), Scripted(text=f"done: {marker}"))
    task_queue = f"rotate-{uuid.uuid4().hex[:8]}"
    old_client, old_runtime = client_with(env, TEST_ONLY_K1), runtime_with(settings, TEST_ONLY_K1)
    async with build_worker(old_client, old_runtime, task_queue=task_queue):
        handle = await start(old_client, task_queue, f"please echo {marker}")
        view = await pending_view(handle)
    await old_runtime.aclose()
    events_before = [e async for e in handle.fetch_history_events()]

    new_client, new_runtime = client_with(env, ROTATED), runtime_with(settings, ROTATED)
    async with build_worker(new_client, new_runtime, task_queue=task_queue):
        approve = ApproveSignal(approval_id=view.pending_approvals[0].approval_id, reviewer="alice")
        await new_client.get_workflow_handle(handle.id).signal(AgentWorkflow.approve, approve)
        result = await new_client.get_workflow_handle_for(AgentWorkflow.run, handle.id).result()
    assert result.status == "completed" and marker in result.output
    events = [e async for e in handle.fetch_history_events()]
    old_ids, new_ids = key_ids(events_before), key_ids(events[len(events_before) :])
    assert old_ids == {"test-k1"} and new_ids == {"test-k2"}, (old_ids, new_ids)
    plaintext = {EventType.Name(e.event_type) for e in events for p in payloads_of(e) if payload_key_id(p) is None}
    # What the SDK core writes itself: patch markers, local-activity marker metadata, search attributes.
    assert plaintext <= {"EVENT_TYPE_MARKER_RECORDED", "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"}, plaintext
    store = new_runtime.store
    assert isinstance(store, EncryptedRunStore)
    [entry] = await store.inner.ledger(handle.id)
    assert entry.result.startswith("da.enc1:test-k2:"), "the tool ran after the rotation: its result is k2's"
    assert [e.result for e in await store.ledger(handle.id)] == [f"echoed: {marker}"]
    await new_runtime.aclose()
