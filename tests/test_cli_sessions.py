"""``starter.py send`` / ``close`` / ``transcript`` and sessions in ``list`` / ``watch``.

Real dev server, an in-process worker, the fake model server; ``starter.py`` runs as a subprocess
(in a thread: the worker answers on this test's event loop). The model answers from the prompt
alone: a user message ``write NAME`` gets a ``write_file`` call, a tool result gets ``saved``,
any other message ``echo: <text>``, so replies say which message they answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.crypto.codec import encrypted_converter, payload_key_id
from activities.runtime import Runtime
from activities.settings import EncryptionSettings, Settings
from tests.conftest import WorkerFactory
from tests.crypto_keys import TEST_ONLY_K1, ring
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.interrupts import as_from_a_terminal
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, AgentResult, StatusView

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache_mode() -> str:
    """One worker mode: these tests are about the command line, not about replay."""
    return "cached"


def model(body: dict[str, Any]) -> Scripted:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Scripted(text="saved")
    text = str(last.get("content") or "")
    if text == "post it":  # a side effect: the run waits for an approval (a run that keeps running)
        post = json.dumps({"method": "POST", "url": "http://127.0.0.1:65000/orders", "body": "{}"})
        return Scripted(tool_calls=[("http_request", post)])
    if text.startswith("write "):
        name = text.split()[1]
        return Scripted(tool_calls=[("write_file", json.dumps({"path": name, "content": "42"}))])
    return Scripted(text=f"echo: {text}")


class Cli:
    def __init__(self, client: Client, task_queue: str) -> None:
        self.client = client
        self.env = {
            "PATH": os.environ["PATH"],
            "TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "AGENT_TASK_QUEUE": task_queue,
        }

    def _run(self, args: tuple[str, ...], stdin: str | None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "starter.py"), *args],
            env=self.env,
            cwd=ROOT,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )

    async def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(self._run, args, stdin)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """A command left running; it takes Ctrl-C (SIGINT) as from a terminal, also when the suite runs
        as a background job (which starts its children with SIGINT ignored)."""
        return subprocess.Popen(
            [sys.executable, str(ROOT / "starter.py"), *args],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=as_from_a_terminal,
        )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def new_id() -> str:
    return f"cs-{uuid.uuid4().hex[:10]}"


async def transcript(cli: Cli, session_id: str) -> list[dict[str, Any]]:
    shown = await cli("transcript", session_id, "--json")
    assert shown.returncode == 0, shown.stderr
    entries: list[dict[str, Any]] = json.loads(shown.stdout)
    return entries


def exchanges(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The entries without their times, as comparable tuples."""
    rows: list[tuple[Any, ...]] = []
    for entry in entries:
        assert entry["at"], entry
        if entry["kind"] == "tool_call":
            rows.append(("tool_call", entry["seq"], entry["name"], entry["arguments"].get("path"), entry["result"]))
        else:
            rows.append((entry["kind"], entry["seq"], entry["text"]))
    return rows


async def test_send_waits_for_each_reply_reads_stdin_and_list_shows_the_idle_session(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    session_id = new_id()
    async with run_worker(dev_env.client, runtime) as tq:
        cli = Cli(dev_env.client, tq)
        first = await cli("send", session_id, "hello", "--wait")
        assert first.returncode == 0, first.stderr
        out = first.stdout
        assert f"started session {session_id} on task queue {tq}" in out, out
        assert "accepted: message 1\n" in out and "reply to message 1:\necho: hello\n" in out, out
        assert f"send {session_id} " in out and f"transcript {session_id}" in out, out

        second = await cli("send", session_id, "again", "--wait", "--sender", "ana", "--message-id", "m-2")
        assert second.returncode == 0, second.stderr
        assert "started session" not in second.stdout
        assert "accepted: message 2\n" in second.stdout and "echo: again" in second.stdout, second.stdout

        repeat = await cli("send", session_id, "again", "--message-id", "m-2")
        assert repeat.returncode == 0, repeat.stderr
        assert "accepted: message 2 (sent before: the same message)" in repeat.stdout, repeat.stdout

        piped = await cli("send", session_id, "-", "--follow", stdin="from stdin\n")
        assert piped.returncode == 0, piped.stderr
        assert "accepted: message 3\n" in piped.stdout, piped.stdout
        assert "message_received: message 3: from stdin" in piped.stdout, piped.stdout
        assert "replied: replied to message 3" in piped.stdout, piped.stdout
        assert "message 2" not in piped.stdout.split("accepted: message 3", 1)[1], "follow starts at its message"
        assert "reply to message 3:\necho: from stdin\n" in piped.stdout, piped.stdout

        view = StatusView.model_validate(
            await dev_env.client.get_workflow_handle(session_id).query(AgentWorkflow.status)
        )
        assert view.state == "idle" and view.messages == 3 and view.replied == 3, view

        listed = await cli("list", "--json", "--limit", "1000")
        assert listed.returncode == 0, listed.stderr
        [row] = [r for r in json.loads(listed.stdout) if r["workflow_id"] == session_id]
        assert row["session"] is True and row["status"] == "idle" and row["messages"] == 3, row
        text = await cli("list", "--limit", "1000")
        [line] = [line for line in text.stdout.splitlines() if session_id in line]
        assert " idle " in line and line.endswith(f"{session_id}  [session, 3 messages]"), line
        await dev_env.client.get_workflow_handle(session_id).signal("close")
    chats = [r for r in llm.requests if r["path"].endswith("/chat/completions")]
    assert [m.get("content") for m in chats[-1]["body"]["messages"][1:]] == [
        "hello",
        "echo: hello",
        "again",
        "echo: again",
        "from stdin",
    ]


async def test_close_then_send_wakes_the_session_and_transcript_spans_both_runs(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    session_id = new_id()
    async with run_worker(dev_env.client, runtime) as tq:
        cli = Cli(dev_env.client, tq)
        first = await cli("send", session_id, "write n.txt", "--wait")
        assert first.returncode == 0, first.stderr
        assert "reply to message 1:\nsaved\n" in first.stdout, first.stdout

        closed = await cli("close", session_id, "--reason", "lunch")
        assert closed.returncode == 0, closed.stderr
        assert closed.stdout.startswith(f"close sent to session {session_id}"), closed.stdout
        handle = dev_env.client.get_workflow_handle(session_id, result_type=AgentResult)
        ended = await asyncio.wait_for(handle.result(), 60)
        assert ended.status == "completed" and ended.output == "saved"
        first_run = (await handle.describe()).run_id
        again = await cli("close", session_id)
        assert again.returncode == 0 and "has already ended (completed)" in again.stdout, again.stdout + again.stderr

        woken = await cli("send", session_id, "after the break", "--wait")
        assert woken.returncode == 0, woken.stderr
        assert f"woke session {session_id} (it had ended: completed)" in woken.stdout, woken.stdout
        assert "accepted: message 2\n" in woken.stdout, woken.stdout
        assert "reply to message 2:\necho: after the break\n" in woken.stdout, woken.stdout
        assert (await handle.describe()).run_id != first_run

        entries = await transcript(cli, session_id)
        assert exchanges(entries) == [
            ("message", 1, "write n.txt"),
            ("tool_call", 1, "write_file", "n.txt", "wrote 2 bytes to n.txt"),
            ("reply", 1, "saved"),
            ("message", 2, "after the break"),
            ("reply", 2, "echo: after the break"),
        ]
        assert entries[1]["ok"] is True
        shown = await cli("transcript", session_id)
        assert shown.returncode == 0, shown.stderr
        lines = [line[9:] for line in shown.stdout.splitlines()]  # without the clock
        assert lines == [
            "message 1: write n.txt",
            '   tool write_file {"path": "n.txt", "content": "42"} → wrote 2 bytes to n.txt',
            "reply to 1: saved",
            "message 2: after the break",
            "reply to 2: echo: after the break",
        ], shown.stdout
        await handle.signal("close")


async def test_transcript_follows_a_continue_as_new_chain(
    can_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    """``can_env`` suggests continue-as-new after a few dozen events: a session continues between messages."""
    llm.default = model
    session_id = new_id()
    client = can_env.client
    async with run_worker(client, runtime) as tq:
        handle = await client.start_workflow(
            AgentWorkflow.run, AgentInput(task="m1", session=SessionSpec()), id=session_id, task_queue=tq
        )
        for n in range(1, 6):
            if n > 1:
                message = SessionMessage(message_id=f"id-{n}", text=f"m{n}", sender="bo")
                taken = await handle.execute_update("send", message, result_type=SendResult)
                assert taken.seq == n
            await eventually(partial(_replied, client, session_id, n), f"the reply to message {n}")
        await handle.signal("message", SessionMessage(message_id="id-6", text="m6"))
        await eventually(lambda: _replied(client, session_id, 6), "the reply to message 6")
        runs = [wf async for wf in client.list_workflows(f"WorkflowId = '{session_id}'")]
        assert any(wf.status == WorkflowExecutionStatus.CONTINUED_AS_NEW for wf in runs), runs

        cli = Cli(client, tq)
        entries = await transcript(cli, session_id)
        expected: list[tuple[Any, ...]] = []
        for n in range(1, 7):
            expected += [("message", n, f"m{n}"), ("reply", n, f"echo: m{n}")]
        assert exchanges(entries) == expected
        assert [e["sender"] for e in entries if e["kind"] == "message"] == ["", "bo", "bo", "bo", "bo", ""]
        await handle.signal("close")


async def _in_state(client: Client, workflow_id: str, state: str) -> bool | None:
    view = StatusView.model_validate(await client.get_workflow_handle(workflow_id).query(AgentWorkflow.status))
    return view.state == state or None


def _shown(lines: list[str], text: str) -> bool | None:
    return any(text in line for line in lines) or None


async def _replied(client: Client, session_id: str, seq: int) -> StatusView | None:
    view = StatusView.model_validate(await client.get_workflow_handle(session_id).query(AgentWorkflow.status))
    return view if view.replied >= seq and view.state == "idle" else None


async def test_bad_arguments_plain_runs_and_missing_ids(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    async with run_worker(dev_env.client, runtime) as tq:
        cli = Cli(dev_env.client, tq)
        for bad in (
            ("send", "s-x"),
            ("send", "s-x", "   "),
            ("send", "s-x", "hi", "--wait", "--follow"),
            ("send", "s-x", "hi", "--message-id", ""),
            ("transcript",),
        ):
            shown = await cli(*bad)
            assert shown.returncode == 2, (bad, shown.stderr)
            one_line(shown)
        empty = await cli("send", "s-x", "-", stdin="\n\n")
        assert empty.returncode == 2 and "the message is empty" in one_line(empty)

        run = await dev_env.client.start_workflow(
            AgentWorkflow.run, AgentInput(task="just a task"), id=new_id(), task_queue=tq
        )
        assert (await run.result()).status == "completed"
        refused = await cli("send", run.id, "hello?", "--wait")
        assert refused.returncode == 1, refused.stderr
        assert "refused: not_a_session: " in one_line(refused)
        assert (await run.describe()).run_id == run.result_run_id, "no session was started under the run's id"
        not_closed = await cli("close", run.id)
        assert not_closed.returncode == 1 and "not_a_session" in one_line(not_closed)

        running = await dev_env.client.start_workflow(
            AgentWorkflow.run, AgentInput(task="post it"), id=new_id(), task_queue=tq
        )
        await eventually(partial(_in_state, dev_env.client, running.id, "waiting_approval"), "the run waiting")
        asked = await cli("send", running.id, "hello?")
        assert asked.returncode == 1, asked.stderr
        assert "refused: not_a_session: this run is not a session" in one_line(asked)
        await running.cancel()

        plain = await transcript(cli, run.id)
        assert exchanges(plain) == [("message", 1, "just a task"), ("reply", 1, "echo: just a task")]

        missing = new_id()
        for command in (("close", missing), ("transcript", missing)):
            shown = await cli(*command)
            assert shown.returncode == 1 and f"no run with id '{missing}'" in one_line(shown), shown.stderr


async def test_watch_of_a_session_goes_on_across_replies_until_it_closes(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    async with run_worker(dev_env.client, runtime) as tq:
        cli = Cli(dev_env.client, tq)
        handle = await dev_env.client.start_workflow(
            AgentWorkflow.run, AgentInput(session=SessionSpec()), id=new_id(), task_queue=tq
        )
        watcher = cli.popen("watch", handle.id)
        lines: list[str] = []
        stdout = watcher.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True)
        reader.start()
        try:
            for n in (1, 2):
                await handle.execute_update("send", SessionMessage(message_id=f"w{n}", text=f"hi {n}"))
                await eventually(partial(_shown, lines, f"replied: replied to message {n}"), f"watch: reply {n}")
            assert watcher.poll() is None, "watch went on after the replies"
            await handle.signal("close")
            code = await asyncio.to_thread(watcher.wait, 60)
        finally:
            if watcher.poll() is None:
                watcher.kill()
        reader.join(10)
        assert code == 0, watcher.stderr.read() if watcher.stderr else ""
        kinds = [line.split("] ", 1)[1].split(":", 1)[0] for line in lines if "] " in line]
        assert kinds.count("message_received") == 2 and kinds.count("replied") == 2, lines
        assert "idle" in kinds and kinds[-1] == "finished", lines
        assert any("message_received: message 2: hi 2" in line for line in lines), lines


async def test_an_encrypted_session_reads_with_the_key_ring_and_says_so_without_it(
    dev_env: WorkflowEnvironment, settings: Settings, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = model
    converter = encrypted_converter(pydantic_data_converter, ring(TEST_ONLY_K1))
    client = Client(dev_env.client.service_client, namespace=dev_env.client.namespace, data_converter=converter)
    runtime = Runtime.from_settings(replace(settings, encryption=EncryptionSettings(keyring=ring(TEST_ONLY_K1))))
    session_id = new_id()
    try:
        async with run_worker(client, runtime) as tq:
            keyless = Cli(client, tq)
            cli = Cli(client, tq)
            cli.env["AGENT_PAYLOAD_KEYS"] = TEST_ONLY_K1
            sent = await cli("send", session_id, "the secret word is plum", "--wait")
            assert sent.returncode == 0, sent.stderr
            assert "echo: the secret word is plum" in sent.stdout, sent.stdout
            started = await anext(aiter(dev_env.client.get_workflow_handle(session_id).fetch_history_events()))
            raw = started.workflow_execution_started_event_attributes.input.payloads[0]
            assert payload_key_id(raw) == "test-k1", "the session's input is encrypted at rest"
            assert exchanges(await transcript(cli, session_id)) == [
                ("message", 1, "the secret word is plum"),
                ("reply", 1, "echo: the secret word is plum"),
            ]
            refused = await keyless("transcript", session_id)
            assert refused.returncode == 2 and "AGENT_PAYLOAD_KEYS" in one_line(refused), refused.stderr
            assert "plum" not in refused.stdout + refused.stderr
            await client.get_workflow_handle(session_id).signal("close")
    finally:
        await runtime.aclose()
