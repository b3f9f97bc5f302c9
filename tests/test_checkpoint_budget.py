"""A run's checkpoints are bounded in the run store, steps without one cannot be forked, odd names are kept.

Real parts: the Temporal dev server, the local bubblewrap sandbox, the SQLite run store and the
``starter.py`` CLI (a subprocess). The scripted model decides by what it has been told so far.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.checkpoints import gc, ids
from activities.checkpoints.workspace import UNSAVED_RESTORED_NOTE
from activities.runtime import Runtime
from activities.sandbox.checkpointable import Manifest, ManifestEntry
from activities.sandbox.local.backend import LocalSandboxBackend
from activities.settings import CheckpointSettings, ConfigurationError, Settings
from activities.store.base import RunStore
from activities.tools.activity import tool_activities
from tests.conftest import WorkerFactory, remove_all, require_bwrap, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, AgentResult, ForkSpec, Message, ToolInvocation

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
Reply = Callable[[dict[str, Any]], Scripted]
# Three files of 60 MiB of random bytes, rewritten (new contents) by every step; their digests printed.
REWRITE = (
    "python3 -c \"import os\nfor i in range(3):\n    open(f'f{i}', 'wb').write(os.urandom(60 * 2**20))\" "
    "&& sha256sum f0 f1 f2"
)
STEPS = 4
STOPPED = "checkpoints stopped for this run"


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body.get("messages", []) if m.get("role") == "tool"]


def rewriting(steps: int) -> Reply:
    """``steps`` steps that rewrite 180 MiB each; a fork's "check the files" prints their digests."""

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body.get("messages", [])
        done = tool_results(body)
        if any(m.get("role") == "user" and m.get("content") == "check the files" for m in messages):
            if messages[-1].get("role") == "user":
                return Scripted(tool_calls=[("run_shell", json.dumps({"command": "sha256sum f0 f1 f2"}))])
            return Scripted(text=f"files: {done[-1]}")
        if len(done) < steps:
            return Scripted(tool_calls=[("run_shell", json.dumps({"command": REWRITE}))])
        return Scripted(text="rewrote them")

    return reply


def starter(client_target: str, task_queue: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "TEMPORAL_ADDRESS": client_target, "AGENT_TASK_QUEUE": task_queue}
    return subprocess.run(
        [sys.executable, str(ROOT / "starter.py"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=90
    )


def stored_blob_bytes(store_path: str) -> int:
    with sqlite3.connect(store_path) as conn:
        return int(conn.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM blobs").fetchone()[0])


def digests(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if line.endswith((" f0", " f1", " f2"))]


@pytest.mark.parametrize("cache_mode", ["cached"])  # heavy: once, with the workflow cache
async def test_a_run_rewriting_180_mb_a_step_stays_under_its_checkpoint_budget_and_completes(
    dev_env: WorkflowEnvironment, settings: Settings, llm: FakeLLMServer, run_worker: WorkerFactory
) -> None:
    require_bwrap()
    budget_mb = 400  # two steps' checkpoints (2 x 180 MiB) fit, a third does not
    runtime = Runtime.from_settings(replace(settings, checkpoints=CheckpointSettings(run_max_mb=budget_mb)))
    llm.default = rewriting(STEPS)
    client = dev_env.client
    target = client.service_client.config.target_host
    try:
        async with run_worker(client, runtime) as task_queue:
            handle = await start_agent(client, task_queue, id_prefix="ck-budget", task="rewrite the files")
            result = await handle.result()
            assert result.status == "completed" and result.steps == STEPS + 1, result.output
            view = await handle.query(AgentWorkflow.status)

            # The run store holds at most the budget of this run's checkpoints (what it accounts, and really).
            usage = await runtime.store.checkpoint_usage(ids.run_key(view.conversation_id))
            assert usage.stopped and usage.count == 2 and usage.bytes <= budget_mb * MIB, usage
            assert stored_blob_bytes(settings.store_url) <= budget_mb * MIB

            # The model was told once, in the tool result of the step that passed it, and the run went on.
            [last_request] = [r for r in llm.requests if len(tool_results(r["body"])) == STEPS]
            results = tool_results(last_request["body"])
            assert [STOPPED in text for text in results] == [False, False, True, False], results
            assert "AGENT_CHECKPOINT_RUN_MAX_MB" in results[2] and "fork or rewind" in results[2]
            assert all("exit_code: 0" in text for text in results)

            # Steps 3 and 4 have no checkpoint of their own: a fork there says so (run input and CLI) ...
            fork = await client.start_workflow(
                AgentWorkflow.run,
                AgentInput(task="check the files", fork=ForkSpec(workflow_id=handle.id, step=3)),
                id=f"ck-budget-fork3-{uuid.uuid4().hex[:6]}",
                task_queue=task_queue,
            )
            with pytest.raises(WorkflowFailureError) as refused:
                await fork.result()
            message = str(refused.value.cause)
            assert "invalid run input: fork: " in message and "step 3 of" in message, message
            assert "no workspace checkpoint of its own" in message and "fork at step 2 or earlier" in message
            for command in (["fork", handle.id, "--at-step", "4"], ["rewind", handle.id, "--to-step", "3"]):
                shown = await asyncio.to_thread(starter, target, task_queue, *command)
                lines = shown.stderr.strip().splitlines()
                assert shown.returncode == 2 and len(lines) == 1, shown.stderr
                assert "has no workspace checkpoint of its own" in lines[0] and "at step 2 or earlier" in lines[0]
            assert (await handle.describe()).run_id == handle.result_run_id  # the refused rewind reset nothing

            # ... and a fork at step 2 gets step 2's files, not later ones.
            forked = await client.start_workflow(
                AgentWorkflow.run,
                AgentInput(task="check the files", fork=ForkSpec(workflow_id=handle.id, step=2)),
                id=f"ck-budget-fork2-{uuid.uuid4().hex[:6]}",
                task_queue=task_queue,
            )
            checked = await forked.result()
        assert checked.status == "completed", checked.output
        assert digests(checked.output) == digests(results[1]) != digests(results[3])
        assert len(digests(checked.output)) == 3
    finally:
        backend = runtime.sandbox_backend()
        if isinstance(backend, LocalSandboxBackend):
            await remove_all(backend)  # 180 MiB each
        await runtime.aclose()
        await asyncio.to_thread(Path(settings.store_url).unlink, missing_ok=True)


async def test_a_file_name_that_is_not_utf8_survives_a_fork(
    dev_env: WorkflowEnvironment, runtime: Runtime, llm: FakeLLMServer, run_worker: WorkerFactory
) -> None:
    require_bwrap()
    write = "python3 -c \"open(b'caf\\xe9.txt', 'wb').write(b'bonjour')\""
    check = "python3 -c \"import os; print(sorted(os.listdir(b'.')), open(b'caf\\xe9.txt', 'rb').read())\""

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body.get("messages", [])
        done = tool_results(body)
        if any(m.get("role") == "user" and m.get("content") == "check the file" for m in messages):
            if messages[-1].get("role") == "user":
                return Scripted(tool_calls=[("run_shell", json.dumps({"command": check}))])
            return Scripted(text=f"found: {done[-1]}")
        if not done:
            return Scripted(tool_calls=[("run_shell", json.dumps({"command": write}))])
        return Scripted(text="written")

    llm.default = reply
    async with run_worker(dev_env.client, runtime) as task_queue:
        source = await start_agent(dev_env.client, task_queue, id_prefix="ck-name", task="write it")
        assert (await source.result()).status == "completed"
        fork = await dev_env.client.start_workflow(
            AgentWorkflow.run,
            AgentInput(task="check the file", fork=ForkSpec(workflow_id=source.id, step=1)),
            id=f"ck-name-fork-{uuid.uuid4().hex[:6]}",
            task_queue=task_queue,
        )
        forked: AgentResult = await fork.result()
    assert forked.status == "completed", forked.output
    assert "[b'caf\\xe9.txt'] b'bonjour'" in forked.output, forked.output


async def test_the_store_counts_each_checkpoint_of_a_run_once(store: RunStore) -> None:
    digest, new = await store.add_blob(b"x" * 1000)
    assert new and (await store.add_blob(b"x" * 1000)) == (digest, False)
    assert await store.put_blob(b"x" * 1000) == digest
    run = "wf/run-1"
    assert (await store.checkpoint_usage(run)).bytes == 0
    await store.checkpoint_record(run, "sha256:" + "a" * 64, 1000)
    await store.checkpoint_record(run, "sha256:" + "a" * 64, 5000)  # a retry: the first record wins
    await store.checkpoint_record(run, "sha256:" + "b" * 64, 0)
    await store.checkpoint_record("wf/run-2", "sha256:" + "a" * 64, 7)
    usage = await store.checkpoint_usage(run)
    assert (usage.bytes, usage.count, usage.stopped) == (1000, 2, False)
    await store.checkpoint_record(run, "stopped", 0)
    assert await store.checkpoint_usage(run) == replace(usage, stopped=True)
    assert ids.run_key("a/b~c/run-1~0123456789") == "a/b~c/run-1" and ids.run_key("wf/run") == "wf/run"


def invocation(seq: int, tool: str, arguments: dict[str, Any], checkpoint: str) -> ToolInvocation:
    return ToolInvocation(
        conversation_id="wf-ck-cap/run-1",
        workflow_id="wf-ck-cap",
        step=seq,
        call_id=f"call_{seq}",
        call_index=0,
        seq=seq,
        tool=tool,
        arguments=arguments,
        idempotency_key=f"ik_ck_cap_{seq}",
        sandbox_id="sbx-ck-cap",
        checkpoints=True,
        checkpoint=checkpoint,
    )


@pytest.mark.parametrize("cap", ["bytes", "count"])
async def test_past_the_cap_steps_get_an_unsaved_id_and_a_lost_sandbox_comes_back_with_the_last_checkpoint(
    settings: Settings, cap: str
) -> None:
    require_bwrap()
    limits = CheckpointSettings(run_max_mb=1) if cap == "bytes" else CheckpointSettings(run_max_count=1)
    runtime = Runtime.from_settings(replace(settings, checkpoints=limits))
    try:
        tools = {fn.__name__: fn for fn in tool_activities(runtime)}
        backend = runtime.sandbox_backend()
        await backend.create("sbx-ck-cap", metadata={})
        env = ActivityEnvironment()
        shell = tools["tool_run_shell"]
        write = "head -c 700000 /dev/urandom > {0} && echo wrote {0}"
        first = await env.run(shell, invocation(1, "run_shell", {"command": write.format("a.bin")}, ""))
        assert first.ok and first.checkpoint.startswith("sha256:") and STOPPED not in first.preview
        second = await env.run(shell, invocation(2, "run_shell", {"command": write.format("b.bin")}, first.checkpoint))
        assert second.ok and STOPPED in second.preview, second.preview
        assert ("AGENT_CHECKPOINT_RUN_MAX_MB" if cap == "bytes" else "AGENT_CHECKPOINT_RUN_MAX_COUNT") in second.preview
        assert ids.unsaved_base(second.checkpoint) == first.checkpoint
        # the next step finds the workspace as it left it (nothing restored), and is not told again
        third = await env.run(shell, invocation(3, "run_shell", {"command": "ls"}, second.checkpoint))
        assert third.preview.startswith("exit_code: 0") and "b.bin" in third.preview and STOPPED not in third.preview
        assert ids.unsaved_base(third.checkpoint) == first.checkpoint != third.checkpoint != second.checkpoint

        await backend.kill("sbx-ck-cap")  # lost: it comes back with the last real checkpoint, and says so
        fourth = await env.run(shell, invocation(4, "run_shell", {"command": "ls"}, third.checkpoint))
        assert fourth.preview.startswith(UNSAVED_RESTORED_NOTE), fourth.preview
        assert "a.bin" in fourth.preview and "b.bin" not in fourth.preview

        # a rewind to step 1 (its checkpoint expected) after later uncheckpointed files: step 1's files
        await env.run(shell, invocation(5, "run_shell", {"command": write.format("c.bin")}, fourth.checkpoint))
        rewound = await env.run(shell, invocation(6, "run_shell", {"command": "ls"}, first.checkpoint))
        assert rewound.preview.startswith("exit_code: 0") and "a.bin" in rewound.preview
        assert "c.bin" not in rewound.preview, rewound.preview
    finally:
        if isinstance(backend := runtime.sandbox_backend(), LocalSandboxBackend):
            await remove_all(backend)
        await runtime.aclose()


async def test_gc_keeps_the_checkpoint_an_unsaved_step_follows(store: RunStore) -> None:
    data = b"the last checkpointed content"
    file_digest = await store.put_blob(data)
    entry = ManifestEntry(path="a.txt", kind="file", mode=0o644, size=len(data), hash=file_digest)
    checkpoint = await store.put_blob(Manifest(entries=[entry]).encode())
    tool = Message(role="tool", content="ok", tool_call_id="c1", name="run_shell")
    await store.put_message("wf/run-1", 0, tool, {"checkpoint": ids.unsaved_id(checkpoint, "ik")})
    await gc.collect(store, keep_conversation=keep_all, grace_s=0, now=time.time() + 10)
    assert await store.get_blob(checkpoint) is not None and await store.get_blob(file_digest) == data


async def keep_all(conversation_id: str, last_write: float) -> bool:
    return True


def test_the_run_budget_defaults_to_four_times_the_workspace_limit_and_is_read_from_the_environment() -> None:
    assert Settings.from_env({}).checkpoints.run_max_bytes == 4 * 256 * MIB
    assert Settings.from_env({"AGENT_CHECKPOINT_MAX_MB": "10"}).checkpoints.run_max_bytes == 40 * MIB
    read = Settings.from_env({"AGENT_CHECKPOINT_RUN_MAX_MB": "50", "AGENT_CHECKPOINT_RUN_MAX_COUNT": "7"}).checkpoints
    assert (read.run_max_bytes, read.run_max_count) == (50 * MIB, 7)
    assert Settings.from_env({}).checkpoints.run_max_count == 1000
    for variable in ("AGENT_CHECKPOINT_RUN_MAX_MB", "AGENT_CHECKPOINT_RUN_MAX_COUNT"):
        with pytest.raises(ConfigurationError, match=variable):
            Settings.from_env({variable: "0"})
