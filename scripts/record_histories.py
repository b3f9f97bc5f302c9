"""Record the histories replayed by ``tests/test_replay.py``.

    .venv/bin/python -m scripts.record_histories            # every scenario
    .venv/bin/python -m scripts.record_histories approvals  # one

``encrypted_*`` scenarios run with the test-only key ring ``durable_agents.testing._crypto_keys.TEST_ONLY_PAYLOAD_KEYS``
(payloads and run store encrypted); ``tests/test_replay.py`` replays them with it.

Run it when you add a scenario, never to "fix" a failing replay: a replay
failure means the loop's command sequence changed, which must be guarded with
``workflow.patched`` so that runs started before the change still replay.

``legacy_policy.json`` is not recorded here: it was recorded by the code before the
``policy-re2-known-keys-v1`` patch (commit e593983), with an operator rule using lookahead and a run
policy using ``\\d`` on an Arabic-Indic digit, lookahead and a misspelt key, all of which today's code
refuses at load. It proves such runs replay as they ran (Python's ``re``, unknown keys ignored).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.crypto.codec import encrypted_converter
from activities.runtime import Runtime
from activities.settings import EncryptionSettings, ProviderEndpoint, Settings
from durable_agents.testing._crypto_keys import TEST_ONLY_PAYLOAD_KEYS, ring
from durable_agents.testing._http_sink import HttpSink
from durable_agents.testing._llm_server import FakeLLMServer, Scripted
from durable_agents.testing._scenarios import SCENARIOS, SETTINGS, Handle, Scenario, approvals, pending_view
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.eval_types import (
    EVAL_WORKFLOW,
    EvalCase,
    EvalChecks,
    EvalInput,
    EvalReport,
    JudgeSpec,
    ToolExpectation,
)
from workflows.progress import PUBLISH_SIGNAL
from workflows.session_types import CloseSignal, SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, ApproveSignal, StatusView, SubagentDef

OUT = Path(__file__).resolve().parent.parent / "tests" / "histories"
TEMPORAL = Path(sys.executable).parent / "temporal"


async def junk_signals(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    """A run waiting for an approval gets malformed, oversized and unknown signals (each refused and
    counted), then one valid approval."""
    llm.enqueue(Scripted(tool_calls=[("read_file", json.dumps({"path": "missing"}))]), Scripted(text="done"))
    ask = {"rules": [{"name": "ask-reads", "tool": "read_file", "decision": "ask"}]}
    inp = AgentInput(task="ignore the junk", approvers=["alice"], policy=ask)
    handle = await client.start_workflow(AgentWorkflow.run, inp, id=wid, task_queue=tq)
    view = await pending_view(handle)
    aid = view.pending_approvals[0].approval_id
    surrogate = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=b'{"approval_id": "\\ud800"}'))
    junk: list[tuple[str, list[Any]]] = [
        ("approve", [{"approval_id": aid, "reviewer": "x" * 300}]),
        ("approve", [[1, 2]]),
        ("reject", [surrogate]),
        ("resolve", [{"approval_id": aid, "reviewer": "alice", "resolution": "maybe"}]),
        ("approve", []),
        ("approve", [{"approval_id": aid, "reviewer": "alice"}] * 2),
        ("approve", [{"approval_id": "ap_forged", "reviewer": "alice"}]),
        ("approve", [{"approval_id": aid, "reviewer": "mallory"}]),
        ("aprove", [{"approval_id": aid, "reviewer": "alice"}]),
        (PUBLISH_SIGNAL, [{"items": []}]),
    ]
    untyped = client.get_workflow_handle(wid)
    for name, args in junk:
        await untyped.signal(name, args=args)
    for _ in range(400):
        if (await handle.query(AgentWorkflow.status)).refused_total >= len(junk):
            break
        await asyncio.sleep(0.05)
    await handle.signal(AgentWorkflow.approve, ApproveSignal(approval_id=aid, reviewer="alice"))
    await handle.result()
    return handle


async def subagents(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    """A parent delegates to two sub-agents in one turn (concurrent child runs); one of them waits for
    an approval, which the parent lists (``child_approvals`` signals) and which is decided in the child."""

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body["messages"]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if messages[0]["content"] == "You are the writer.":
            if results:
                return Scripted(text="wrote it")
            return Scripted(tool_calls=[("write_file", json.dumps({"path": "a.txt", "content": "a"}))])
        if messages[0]["content"] == "You are the reader.":
            return Scripted(text="read it")
        if results:
            return Scripted(text=" | ".join(results))
        return Scripted(
            tool_calls=[("reader", json.dumps({"task": "read"})), ("writer", json.dumps({"task": "write"}))]
        )

    llm.default = reply
    ask = {"rules": [{"name": "ask-writes", "tool": "write_file", "decision": "ask"}]}
    inp = AgentInput(
        task="read and write",
        subagents={
            "reader": SubagentDef(description="Reads.", system_prompt="You are the reader.", tools=[]),
            "writer": SubagentDef(
                description="Writes.", system_prompt="You are the writer.", tools=["write_file"], policy=ask
            ),
        },
    )
    handle = await client.start_workflow(AgentWorkflow.run, inp, id=wid, task_queue=tq)
    view = await pending_view(handle)
    pending = view.pending_approvals[0]
    child = client.get_workflow_handle(pending.workflow_id)
    await child.signal("approve", ApproveSignal(approval_id=pending.approval_id, reviewer="alice"))
    await handle.result()
    return handle


async def eval_scenario(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    """An ``EvalWorkflow`` of two cases run at once: one whose POST asks for approval (decided by the case
    through the child's ``child_approvals`` report) and is graded by a judge, one scored by its checks alone."""

    def reply(body: dict[str, Any]) -> Scripted:
        messages = body["messages"]
        first = next((str(m["content"]) for m in messages if m["role"] == "user"), "")
        if first.startswith("Rubric:"):
            return Scripted(text='{"pass": true, "score": 1, "reason": "it posted"}')
        if "POST" in first and not any(m["role"] == "tool" for m in messages):
            args = {"method": "POST", "url": f"{sink.url}/orders", "json": {"n": 1}}
            return Scripted(tool_calls=[("http_request", json.dumps(args))])
        return Scripted(text="the answer is 42")

    llm.default = reply
    posted = ToolExpectation(name="http_request", args={"method": "POST"})
    inp = EvalInput(
        dataset="recorded.jsonl",
        cases=[
            EvalCase(
                name="post",
                input=AgentInput(task="POST an order", tools=["http_request"]),
                checks=EvalChecks(
                    tools_called=[posted], judge=JudgeSpec(model="openai:test-model", rubric="It must post.")
                ),
                approve="all",
            ),
            EvalCase(
                name="answer",
                input=AgentInput(task="what is six times seven?", tools=[]),
                checks=EvalChecks(output_matches="42", max_steps=1),
            ),
        ],
        concurrency=2,
    )
    handle = await client.start_workflow(EVAL_WORKFLOW, inp, id=wid, task_queue=tq, result_type=EvalReport)
    report = await handle.result()
    assert all(row.passed for row in report.results), report
    # A scenario returns a handle only for its history: the eval's, by its workflow id.
    return client.get_workflow_handle_for(AgentWorkflow.run, wid)


# Scenarios recorded on a server that suggests continue-as-new after this many events.
CAN_AFTER_EVENTS = 90  # message 3 is answered by event 75 or so
SUGGEST_CONTINUE_AS_NEW = {
    "session": CAN_AFTER_EVENTS,
    "session_continued": CAN_AFTER_EVENTS,
    "session_opened_by_run_config": CAN_AFTER_EVENTS,
}


async def _session(client: Client, tq: str, llm: FakeLLMServer, wid: str) -> tuple[str, str]:
    """A session (on a server that suggests continue-as-new early): message 1 writes a file; message 2's
    slow first turn gets message 3 queued (handed to its next turn); message 1's id sent again (until the
    history is long) is no new message; message 4 finds the history long, so the session continues as new
    between messages and the next run answers it; then ``close``. Returns the first and the last run's ids."""
    llm.enqueue(
        Scripted(tool_calls=[("write_file", json.dumps({"path": "n.txt", "content": "42"}))]),
        Scripted(text="noted"),
        Scripted(tool_calls=[("read_file", json.dumps({"path": "n.txt"}))], delay_s=1.5),
        Scripted(text="read it, and saw your second message"),
        Scripted(text="still here"),
    )
    handle = await client.start_workflow(AgentWorkflow.run, AgentInput(session=SessionSpec()), id=wid, task_queue=tq)
    current = client.get_workflow_handle(wid)

    async def send(message_id: str, text: str) -> None:
        await current.execute_update("send", SessionMessage(message_id=message_id, text=text), result_type=SendResult)

    async def replied(seq: int) -> None:
        for _ in range(600):
            view: StatusView = await current.query(AgentWorkflow.status)
            if view.replied >= seq and view.state == "idle":
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"no reply to message {seq}")

    await send("m1", "remember 42 in a file")
    await replied(1)
    await send("m2", "read it back")
    for _ in range(600):
        if len(llm.requests) >= 3:  # message 2's slow turn is in flight
            break
        await asyncio.sleep(0.05)
    await send("m3", "and tell me you saw this")
    await replied(3)
    # Repeats of message 1 (no new message) until the server suggests continue-as-new: message 4 then
    # starts the next run, between messages (never mid-exchange: the suggestion comes after message 3).
    for _ in range(40):
        await current.signal("message", SessionMessage(message_id="m1", text="remember 42 in a file"))
        if (await current.describe()).raw_description.workflow_execution_info.history_length >= CAN_AFTER_EVENTS:
            break
    await send("m4", "still there?")
    await replied(4)
    await current.signal("close", CloseSignal(reason="recorded"))
    await current.result()
    last_run = (await current.describe()).run_id
    return handle.first_execution_run_id or "", last_run


async def session(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    """The first run of ``_session``'s chain: three exchanges (one with a queued message), a repeated
    message id, then continue-as-new."""
    first_run, _ = await _session(client, tq, llm, wid)
    return client.get_workflow_handle_for(AgentWorkflow.run, wid, run_id=first_run)


async def session_continued(client: Client, tq: str, llm: FakeLLMServer, sink: HttpSink, wid: str) -> Handle:
    """The last run of ``_session``'s chain: started from the carry, it answers message 4 and closes."""
    _, last_run = await _session(client, tq, llm, wid)
    return client.get_workflow_handle_for(AgentWorkflow.run, wid, run_id=last_run)


# Scenarios recorded here only (durable_agents/testing/_scenarios.py holds the ones tests also run).
RECORDED: dict[str, Scenario] = {
    **SCENARIOS,
    "junk_signals": junk_signals,
    "subagents": subagents,
    # The same run under the tree bounds (patches tree-runs-v1, child-refusals-v1, run-input-size-v1 and
    # policy-re2-known-keys-v1; sub-agent definitions by digest): "subagents" keeps the run from before them.
    "subagents_bounded": subagents,
    "encrypted_approvals": approvals,  # with the test-only key ring
    # "approvals" again, with the start patches as one marker (run-start-v2); "approvals" and "humans" keep
    # the runs from before either start patch and from when each made its own marker.
    "approvals_one_start_marker": approvals,
    "session": session,
    "session_continued": session_continued,
    # "session" again with one start marker of run-start-v3: run_config opens the session (no session_open);
    # "session" keeps the run from before it.
    "session_opened_by_run_config": session,
    "eval": eval_scenario,
}


async def record(names: list[str]) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL), data_converter=pydantic_data_converter
    )
    suggesting: dict[int, WorkflowEnvironment] = {}
    try:
        for name in names:
            events = SUGGEST_CONTINUE_AS_NEW.get(name)
            if events and events not in suggesting:
                suggesting[events] = await WorkflowEnvironment.start_local(
                    dev_server_existing_path=str(TEMPORAL),
                    data_converter=pydantic_data_converter,
                    dev_server_extra_args=[
                        "--dynamic-config-value",
                        f"limit.historyCount.suggestContinueAsNew={events}",
                    ],
                )
            with tempfile.TemporaryDirectory() as tmp, FakeLLMServer() as llm, HttpSink() as sink:
                settings = Settings(
                    model="openai:test-model",
                    openai=ProviderEndpoint(llm.openai_url),
                    http_allow=("127.0.0.1:1024-65535",),
                    store_url=f"{tmp}/store.sqlite3",
                    state_dir=Path(tmp),
                )
                if name in SETTINGS:
                    settings = replace(settings, **SETTINGS[name](Path(tmp)))
                client = suggesting[events].client if events else env.client
                if name.startswith("encrypted_"):
                    keyring = ring(TEST_ONLY_PAYLOAD_KEYS)
                    settings = replace(settings, encryption=EncryptionSettings(keyring=keyring))
                    converter = encrypted_converter(pydantic_data_converter, keyring)
                    client = Client(client.service_client, namespace=client.namespace, data_converter=converter)
                runtime = Runtime.from_settings(settings)
                tq = f"record-{uuid.uuid4().hex[:8]}"
                async with build_worker(client, runtime, task_queue=tq):
                    handle = await RECORDED[name](client, tq, llm, sink, f"history-{name}")
                history = await handle.fetch_history()
                (OUT / f"{name}.json").write_text(history.to_json())
                print(f"recorded {name}: {len(history.events)} events")
                await runtime.aclose()
    finally:
        for other in suggesting.values():
            await other.shutdown()
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1:] or list(RECORDED)))
