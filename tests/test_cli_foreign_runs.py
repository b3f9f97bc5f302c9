"""Runs the CLI cannot read say what they are, in one line: another workflow type, encrypted payloads.

- ``status`` / ``watch`` / ``pending`` / ``cancel`` of a workflow that is not an ``AgentWorkflow``
  (a user's own workflow type, running with no worker or completed with a result that is no
  ``AgentResult``): ``<id> is a <Type> workflow, not an AgentWorkflow run``, exit 1.
- ``status`` / ``watch`` of an encrypted run from a CLI without keys: the line says the payloads
  are encrypted and that ``AGENT_PAYLOAD_KEYS`` gives the key ring, exit 2 (a configuration the
  command lacks); with the key ring the same commands read the run.

Each case runs ``starter.py`` as a real process against the session's dev server (``dev_env``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace

from temporalio import workflow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.crypto.codec import encrypted_converter
from activities.runtime import Runtime
from activities.settings import EncryptionSettings
from tests.conftest import WorkerFactory, start_agent
from tests.crypto_keys import TEST_ONLY_K1, ring
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.scenarios import pending_view
from tests.test_cli_bad_input import ASK_EVERYTHING, address, cache_mode, cli_env, nobody, one_line, starter

__all__ = ["address", "cache_mode"]  # fixtures, used by name


@workflow.defn(name="OrderWorkflow")
class OrderWorkflow:
    """A user's own workflow: its result is no ``AgentResult``."""

    @workflow.run
    async def run(self, order: str) -> dict[str, str]:
        return {"order": order, "state": "shipped"}


def not_ours(workflow_id: str) -> str:
    return f"{workflow_id} is a OrderWorkflow workflow, not an AgentWorkflow run"


async def test_a_workflow_of_another_type_is_named_in_one_line(address: str, dev_env: WorkflowEnvironment) -> None:
    client = dev_env.client
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[OrderWorkflow], workflow_runner=UnsandboxedWorkflowRunner()):
        done = await client.execute_workflow(
            OrderWorkflow.run, "o-1", id=f"order-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        assert done == {"order": "o-1", "state": "shipped"}
        completed = await client.list_workflows(f"TaskQueue = '{queue}'").__anext__()
    # Started through the client by name on a queue nobody polls: it runs, and no worker answers for it.
    running = await client.start_workflow(
        "OrderWorkflow", "o-2", id=f"order-{uuid.uuid4().hex[:8]}", task_queue=nobody()
    )
    try:
        env = cli_env(address)
        for workflow_id in (completed.id, running.id):
            for command in (("status",), ("status", "--json"), ("watch",), ("pending",), ("cancel",)):
                done_ = await asyncio.to_thread(starter, env, command[0], workflow_id, *command[1:])
                one_line(done_, 1, not_ours(workflow_id))
                assert done_.stdout == "", (command, done_.stdout)
    finally:
        await running.terminate("test over")


async def test_an_encrypted_run_without_keys_names_the_key_setting(
    address: str, dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    keyring = ring(TEST_ONLY_K1)
    client = Client(
        dev_env.client.service_client,
        namespace=dev_env.client.namespace,
        data_converter=encrypted_converter(pydantic_data_converter, keyring),
    )
    encrypted = Runtime.from_settings(replace(runtime.settings, encryption=EncryptionSettings(keyring=keyring)))
    llm.default = lambda body: (
        Scripted(text="done")
        if any(m["role"] == "tool" for m in body["messages"])
        else Scripted(tool_calls=[("always_fails", "{}")])
    )
    async with run_worker(client, encrypted) as task_queue:
        finished = await start_agent(client, task_queue, id_prefix="sealed", task="a secret task")
        assert (await finished.result()).status == "completed"
        waiting = await start_agent(client, task_queue, id_prefix="sealed", task="wait", policy=ASK_EVERYTHING)
        keyless, keyed = cli_env(address, task_queue), cli_env(address, task_queue, AGENT_PAYLOAD_KEYS=TEST_ONLY_K1)

        await pending_view(waiting)  # asked through the keyed client
        try:
            for workflow_id in (finished.id, waiting.id):
                for command in ("status", "watch"):
                    refused = await asyncio.to_thread(starter, keyless, command, workflow_id)
                    line = one_line(refused, 2, "payloads are encrypted (key id test-k1)", "AGENT_PAYLOAD_KEYS")
                    assert "internal error" not in line and "KeyError" not in line, line
            # list reads each listed run's input to mark sessions: encrypted ones are listed, unmarked, not an error.
            listing = await asyncio.to_thread(starter, keyless, "list", "--json")
            assert listing.returncode == 0, listing.stderr
            listed = {row["workflow_id"]: row for row in json.loads(listing.stdout)}
            assert finished.id in listed and waiting.id in listed and not listed[waiting.id]["session"]
            status = await asyncio.to_thread(starter, keyed, "status", finished.id)
            assert status.returncode == 0 and "completed" in status.stdout, status.stderr
            watched = await asyncio.to_thread(starter, keyed, "watch", finished.id)
            assert watched.returncode == 0 and "finished" in watched.stdout, watched.stderr
        finally:
            await waiting.terminate("test over")
