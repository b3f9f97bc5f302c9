"""Run lifecycle: cancellation, the wall-clock limit, continue-as-new, history growth, retry reuse.

Workflow tests run against real Temporal dev servers and the real HTTP fake LLM,
cached and forced-replay (``run_worker``); the reuse tests drive one activity
directly, twice, the way a retry after a lost completion would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import WorkflowHandle, WorkflowHistory
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.model_turn import ModelActivities
from activities.runtime import Runtime
from activities.settings import ProviderEndpoint
from activities.tools.activity import run_invocation, tool_activities
from activities.tools.spec import SPEC_ATTRIBUTE, ToolContext, ToolSpec, tool
from tests.conftest import WorkerFactory, require_bwrap, start_agent, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.history_payloads import payloads
from workflows.agent import AgentWorkflow
from workflows.identity import sandbox_id_for
from workflows.types import AgentResult, Limits, Message, ModelRequest, ToolInvocation, TranscriptEntry

KB = 1024
PAYLOAD_LIMIT = 256 * KB  # no single history payload may come near Temporal's per-payload limits


def chat_requests(llm: FakeLLMServer) -> list[dict[str, Any]]:
    return [r for r in llm.requests if r["path"].endswith("/chat/completions")]


def sandbox_dir(runtime: Runtime, handle: WorkflowHandle[Any, Any], first_run_id: str) -> Path:
    return Path(runtime.settings.state_dir) / "sandboxes" / sandbox_id_for(f"{handle.id}/{first_run_id}")


def largest_payload(history: WorkflowHistory) -> int:
    return max((p.ByteSize() for event in history.events for p in payloads(event)), default=0)


def history_bytes(history: WorkflowHistory) -> int:
    """What the server stores: the serialized events (``to_json`` is ~3x: indented, base64 payloads)."""
    return History(events=history.events).ByteSize()


# --- cancellation ------------------------------------------------------------------------


async def test_cancel_stops_the_tool_and_removes_the_sandbox(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    llm.enqueue(Scripted(tool_calls=[("run_shell", json.dumps({"command": "sleep 30"}))]))
    llm.default = Scripted(text="the run went on after it was cancelled")
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, task="sleep for a while")
        first_run_id = handle.result_run_id or ""
        workspace = sandbox_dir(runtime, handle, first_run_id) / "workspace"
        last_event = ""
        for _ in range(200):  # bounded: at most ~10 s
            last_event = (await handle.query(AgentWorkflow.status)).last_event
            if "running run_shell" in last_event:  # tool_started comes after the sandbox exists
                break
            await asyncio.sleep(0.05)
        assert "running run_shell" in last_event, f"the tool never started; last event: {last_event!r}"
        assert workspace.is_dir(), "the run's sandbox should exist while run_shell runs"

        await handle.cancel()
        result = await handle.result()
        status = await handle.query(AgentWorkflow.status)

    assert result.status == "cancelled", f"cancel should end the run as cancelled, got {result!r}"
    assert result.steps == 1
    assert status.state == "cancelled"
    assert not workspace.parent.exists(), "cancelling must kill the sandbox and delete its workspace"
    assert len(chat_requests(llm)) == 1, "no model turn may follow a cancel"
    backend = runtime.sandbox_backend()
    assert not getattr(backend, "running", {}).get(workspace.parent.name), "the sleep must have been killed"


# --- wall-clock limit ----------------------------------------------------------------------


async def test_timeout_bounds_a_slow_model_turn(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(text="far too late", delay_s=2.5))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, limits=Limits(timeout_s=1))
        result = await handle.result()

    assert result.status == "limit_exceeded", result
    assert "timeout_s=1" in result.output
    assert result.steps == 1
    assert len(chat_requests(llm)) == 1, "a turn cut off by the deadline must not be retried"


# --- continue-as-new -----------------------------------------------------------------------


def write_until(turns: int) -> Any:
    """A model that writes a file each turn and answers after ``turns - 1`` tool rounds.

    It decides by the transcript it is sent (not by a request counter), so a
    retried request gets the same answer.
    """

    def reply(body: dict[str, Any]) -> Scripted:
        rounds = (len(body.get("messages", [])) - 2) // 2
        if rounds >= turns - 1:
            return Scripted(text=f"done after {rounds} files", input_tokens=7, output_tokens=3)
        return Scripted(tool_calls=[("write_file", json.dumps({"path": f"f{rounds}.txt", "content": str(rounds)}))])

    return reply


async def test_continue_as_new_keeps_the_run_whole(
    can_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    turns = 12
    llm.default = write_until(turns)
    client = can_env.client
    async with run_worker(client, runtime) as tq:
        handle = await start_agent(client, tq, task="write twelve files", limits=Limits(max_steps=50))
        first_run_id = handle.result_run_id or ""
        result = await handle.result()
        latest = await client.get_workflow_handle(handle.id).describe()
        first_history = await client.get_workflow_handle(handle.id, run_id=first_run_id).fetch_history()

    assert result.status == "completed", result
    assert result.output == f"done after {turns - 1} files"
    assert result.steps == turns
    assert result.usage.input_tokens == 10 * (turns - 1) + 7
    assert result.usage.output_tokens == 5 * (turns - 1) + 3
    assert latest.run_id != first_run_id, "the run should have continued as new at least once"
    assert first_history.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW

    chat = chat_requests(llm)
    assert len(chat) == turns
    last = chat[-1]["body"]["messages"]
    assert [m["role"] for m in last] == ["system", "user"] + ["assistant", "tool"] * (turns - 1)
    assert last[1]["content"] == "write twelve files"
    for index in range(turns - 1):
        call, answer = last[2 + 2 * index], last[3 + 2 * index]
        assert json.loads(call["tool_calls"][0]["function"]["arguments"])["path"] == f"f{index}.txt"
        assert answer["tool_call_id"] == call["tool_calls"][0]["id"]
        assert answer["content"] == f"wrote {len(str(index))} bytes to f{index}.txt"
    # One sandbox for the whole run, carried across runs and removed at the end.
    assert not sandbox_dir(runtime, handle, first_run_id).exists()


# --- history size ----------------------------------------------------------------------------


def reader(turns: int, size: int) -> Any:
    """Turn 1 makes a ``size``-byte file with a short command; every later turn reads it."""
    make = f"yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c {size} > data.txt"

    def reply(body: dict[str, Any]) -> Scripted:
        rounds = (len(body.get("messages", [])) - 2) // 2
        if rounds == 0:
            return Scripted(tool_calls=[("run_shell", json.dumps({"command": make}))])
        if rounds >= turns - 1:
            return Scripted(text="read enough")
        return Scripted(tool_calls=[("read_file", json.dumps({"path": "data.txt"}))])

    return reply


async def run_reader(
    env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, turns: int, size: int
) -> tuple[AgentResult, WorkflowHistory, list[dict[str, Any]]]:
    with FakeLLMServer(default=reader(turns, size)) as llm:
        # each run gets its own model server, so that the runs can overlap
        rt = with_settings(
            runtime, openai=ProviderEndpoint(llm.openai_url), anthropic=ProviderEndpoint(llm.anthropic_url)
        )
        try:
            async with run_worker(env.client, rt) as tq:
                handle = await start_agent(env.client, tq, task="read the file", limits=Limits(max_steps=turns + 5))
                result = await handle.result()
                history = await handle.fetch_history()
        finally:
            await rt.aclose()
        return result, history, chat_requests(llm)


async def test_history_grows_linearly_without_tool_outputs(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    require_bwrap()
    # Forced replay re-runs the whole history on every task (quadratic), so the long run is 20 turns, not more.
    few, many = 6, 20
    (small, small_history, _), (big, big_history, big_chat), (huge, huge_history, huge_chat) = await asyncio.gather(
        run_reader(dev_env, runtime, run_worker, few, 10 * KB),
        run_reader(dev_env, runtime, run_worker, many, 10 * KB),
        run_reader(dev_env, runtime, run_worker, 3, 300 * KB),
    )
    for result, turns in ((small, few), (big, many), (huge, 3)):
        assert result.status == "completed" and result.steps == turns, result

    # The model saw every full output: they live in the store, not in history.
    tool_outputs = [m["content"] for m in big_chat[-1]["body"]["messages"] if m["role"] == "tool"]
    assert len(tool_outputs) == many - 1
    assert all(len(text) == 10 * KB for text in tool_outputs[1:])
    assert len(huge_chat[-1]["body"]["messages"][-1]["content"]) == 300 * KB

    for history in (small_history, big_history, huge_history):
        assert largest_payload(history) < PAYLOAD_LIMIT
    assert largest_payload(huge_history) < 16 * KB, "a 300 KB output must reach history only as a preview"

    size_few, size_many = history_bytes(small_history), history_bytes(big_history)
    marginal = (size_many - size_few) / (many - few)
    assert marginal < 2 * size_few / few, f"history grows faster than linearly: {size_few} B, then {size_many} B"
    per_turn = size_many / many
    assert per_turn < 8 * KB, f"{per_turn:.0f} B per turn: the 10 KB tool outputs are leaking into history"


# --- reuse after a retry -------------------------------------------------------------------------


async def test_model_reply_stored_by_an_earlier_attempt_is_reused(runtime: Runtime, llm: FakeLLMServer) -> None:
    llm.enqueue(
        Scripted(tool_calls=[("write_file", json.dumps({"path": "a.txt", "content": "a"}))], input_tokens=42),
        Scripted(text="a second, different reply"),
    )
    activities = ModelActivities(runtime)
    opening = [Message(role="system", content="be brief"), Message(role="user", content="write a")]
    request = ModelRequest(
        conversation_id=f"conv-{uuid.uuid4().hex[:8]}",
        model="openai:test-model",
        turn=1,
        transcript_len=2,
        append=[TranscriptEntry(seq=i, message=m) for i, m in enumerate(opening)],
        tools=["write_file", "read_file"],
    )
    env = ActivityEnvironment()
    first = await env.run(activities.model, request)
    second = await env.run(activities.model, request)

    assert len(chat_requests(llm)) == 1, "the retry must not call the model again"
    assert second == first
    assert first.message_seq == 2 and first.usage.input_tokens == 42
    assert [c.name for c in first.tool_calls] == ["write_file"]
    stored = await runtime.store.get_message(request.conversation_id, 2)
    assert stored is not None and stored.message.tool_calls[0].name == "write_file"


async def _opened(runtime: Runtime, conversation_id: str, run_id: str) -> list[Message]:
    """The run's first two entries, stored as its first turn stores them."""
    opening = [Message(role="system", content="be brief"), Message(role="user", content="write a")]
    for seq, message in enumerate(opening):
        await runtime.store.put_message(conversation_id, seq, message, {"run": run_id})
    return opening


def _attempt(env: ActivityEnvironment, attempt: int, run_id: str) -> ActivityEnvironment:
    env.info = dataclasses.replace(env.info, attempt=attempt, workflow_run_id=run_id)
    return env


async def test_a_turn_that_appends_nothing_is_not_looked_up_first_and_its_retry_reuses_the_reply(
    runtime: Runtime, llm: FakeLLMServer
) -> None:
    """A first attempt calls the model at once (no lookup); a retry (attempt 2) finds the reply it stored."""
    llm.enqueue(Scripted(text="the first reply"), Scripted(text="a second, different reply"))
    conversation_id = f"conv-{uuid.uuid4().hex[:8]}"
    await _opened(runtime, conversation_id, "run-1")
    request = ModelRequest(conversation_id=conversation_id, model="openai:test-model", turn=1, transcript_len=2)
    activities = ModelActivities(runtime)
    first = await _attempt(ActivityEnvironment(), 1, "run-1").run(activities.model, request)
    second = await _attempt(ActivityEnvironment(), 2, "run-1").run(activities.model, request)
    assert len(chat_requests(llm)) == 1, "the retry must not call the model again"
    assert second == first and first.text == "the first reply" and not first.conversation_id
    # Another first attempt of the same run at the same place (workflow code that asks again) is answered
    # from the store all the same: the put keeps the first reply.
    again = await _attempt(ActivityEnvironment(), 1, "run-1").run(activities.model, request)
    assert again.text == "the first reply" and not again.conversation_id


async def test_a_reset_runs_first_attempt_goes_on_in_a_branch_when_its_put_finds_another_runs_reply(
    runtime: Runtime, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(text="the reset run's reply"))
    conversation_id = f"conv-{uuid.uuid4().hex[:8]}"
    await _opened(runtime, conversation_id, "run-old")
    await runtime.store.put_message(
        conversation_id, 2, Message(role="assistant", content="the old run's reply"), {"run": "run-old"}
    )
    request = ModelRequest(conversation_id=conversation_id, model="openai:test-model", turn=1, transcript_len=2)
    turn = await _attempt(ActivityEnvironment(), 1, "run-new").run(ModelActivities(runtime).model, request)

    assert len(chat_requests(llm)) == 1 and turn.text == "the reset run's reply"
    assert turn.conversation_id.startswith(f"{conversation_id}~"), turn.conversation_id
    branch = await runtime.store.transcript(turn.conversation_id)
    assert [m.message.content for m in branch] == ["be brief", "write a", "the reset run's reply"]
    assert branch[2].meta["run"] == "run-new"
    kept = await runtime.store.get_message(conversation_id, 2)
    assert kept is not None and kept.message.content == "the old run's reply", "the old future stays"


class _Counted(BaseModel):
    pass


def _third_position_call(tool_name: str, workflow_id: str) -> ToolInvocation:
    """A call of ``tool_name`` without arguments whose result goes to position 3 of a fresh conversation."""
    suffix = uuid.uuid4().hex[:8]
    return ToolInvocation(
        conversation_id=f"conv-{suffix}",
        workflow_id=workflow_id,
        step=1,
        call_id="call_1",
        call_index=0,
        seq=3,
        tool=tool_name,
        arguments={},
        idempotency_key=f"ik_{suffix}",
    )


async def test_a_read_only_tools_retry_returns_the_entry_its_earlier_attempt_stored(runtime: Runtime) -> None:
    """A read-only tool outside the sandbox is not looked up before it runs: its retry runs it again, and
    the store's first-writer-wins put still returns the earlier attempt's result, so the run sees one."""
    calls: list[int] = []

    @tool("counted", description="Says how often it ran.", args=_Counted)
    async def counted(args: _Counted, ctx: ToolContext) -> str:
        calls.append(1)
        return f"run {len(calls)}"

    spec: ToolSpec = getattr(counted, SPEC_ATTRIBUTE)
    invocation = _third_position_call("counted", "wf-ro")
    env = ActivityEnvironment()
    first = await env.run(run_invocation, spec, runtime, invocation)
    second = await env.run(run_invocation, spec, runtime, invocation)
    assert first.ok and first.preview == "run 1" and second == first
    stored = await runtime.store.get_message(invocation.conversation_id, 3)
    assert stored is not None and stored.message.content == "run 1"


async def test_a_ledgered_tools_retry_returns_its_recorded_outcome_without_a_lookup(runtime: Runtime) -> None:
    """A tool with effects outside the sandbox asks the ledger, not the transcript, whether it ran: its retry
    gets the recorded outcome from the claim and the earlier entry from the first-writer-wins put, the
    effect runs once, and no attempt reads the transcript position first."""
    calls: list[int] = []

    @tool("charged", description="Charges once.", args=_Counted, side_effect=True)
    async def charged(args: _Counted, ctx: ToolContext) -> str:
        calls.append(1)
        return f"charge {len(calls)}"

    spec: ToolSpec = getattr(charged, SPEC_ATTRIBUTE)
    assert spec.ledgered and not spec.uses_sandbox
    invocation = _third_position_call("charged", "wf-fx")
    lookups: list[tuple[str, int]] = []
    original = runtime.store.get_message

    async def counting_get(conversation_id: str, seq: int) -> Any:
        lookups.append((conversation_id, seq))
        return await original(conversation_id, seq)

    runtime.store.get_message = counting_get  # type: ignore[method-assign]
    env = ActivityEnvironment()
    try:
        first = await env.run(run_invocation, spec, runtime, invocation)
        second = await env.run(run_invocation, spec, runtime, invocation)
    finally:
        del runtime.store.get_message
    assert calls == [1] and first.ok and first.preview == "charge 1" and second == first
    assert lookups == []
    entries = [e for e in await runtime.store.ledger("wf-fx") if e.key == invocation.idempotency_key]
    assert [(e.state, e.executions) for e in entries] == [("done", 1)]


async def test_tool_result_stored_by_an_earlier_attempt_is_reused(runtime: Runtime) -> None:
    require_bwrap()
    (write_file,) = [fn for fn in tool_activities(runtime) if fn.__name__ == "tool_write_file"]
    sandbox_id = f"sbx-reuse-{uuid.uuid4().hex[:8]}"
    sandbox = await runtime.sandbox_backend().create(sandbox_id, metadata={})
    target = Path(runtime.settings.state_dir) / "sandboxes" / sandbox_id / "workspace" / "a.txt"

    def invocation(content: str) -> ToolInvocation:
        return ToolInvocation(
            conversation_id=f"conv-{sandbox_id}",
            workflow_id="wf-reuse",
            step=1,
            call_id="call_1",
            call_index=0,
            seq=3,
            tool="write_file",
            arguments={"path": "a.txt", "content": content},
            idempotency_key="ik_reuse",
            sandbox_id=sandbox_id,
        )

    env = ActivityEnvironment()
    try:
        first = await env.run(write_file, invocation("a"))
        assert target.read_text() == "a"
        target.write_text("changed by someone else")
        second = await env.run(write_file, invocation("b"))
        after = target.read_text()
    finally:
        await sandbox.kill()

    assert first.ok and first.preview == "wrote 1 bytes to a.txt"
    assert second == first, "the retry must return the stored outcome"
    assert after == "changed by someone else", "the retry must not write the file again"
    stored = await runtime.store.get_message(f"conv-{sandbox_id}", 3)
    assert stored is not None and stored.message.content == "wrote 1 bytes to a.txt"
