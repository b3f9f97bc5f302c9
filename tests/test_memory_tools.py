"""The memory tools: on the real dev server two tenants' runs save and search memory and never see each
other's entries (the namespace comes from the run, never from the model's arguments); the tools'
bounds and bad arguments are errors the model reads; a save is idempotent by the call's key."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities.memory.base import MemoryLimits
from activities.memory.run_memory import RunMemory
from activities.memory.sqlite import SQLiteMemoryStore
from activities.runtime import Runtime
from activities.settings import ConfigurationError, Settings
from activities.tools.memory import MemorySaveArgs, MemorySearchArgs, memory_save, memory_search
from activities.tools.spec import ToolContext, ToolError
from tests.conftest import WorkerFactory, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, StatusView, SubagentDef, ToolInvocation

ALLOW_MEMORY = {"rules": [{"name": "memory", "tool": "memory_*", "decision": "allow"}]}


def memory_agent(body: dict[str, Any]) -> Scripted:
    """A model that does what its task says: ``save <text>`` or ``search <query>``, then reports the tool's result."""
    messages = body["messages"]
    tool_results = [m["content"] for m in messages if m["role"] == "tool"]
    if tool_results:
        return Scripted(text=f"tool said: {tool_results[-1]}")
    task = next(m["content"] for m in messages if m["role"] == "user")
    verb, _, rest = task.partition(" ")
    if verb == "save":
        return Scripted(tool_calls=[("memory_save", json.dumps({"text": rest}))])
    if verb == "delete":
        return Scripted(tool_calls=[("memory_delete", json.dumps({"key": rest}))])
    # A model that tries to name another namespace: the argument is refused, and there is no such field.
    if verb == "sneak":
        return Scripted(tool_calls=[("memory_search", json.dumps({"query": rest, "tenant": "acme"}))])
    return Scripted(tool_calls=[("memory_search", json.dumps({"query": rest, "limit": 5}))])


async def test_two_tenants_runs_never_see_each_others_memory(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(ALLOW_MEMORY))
    runtime = Runtime.from_settings(replace(runtime.settings, policy_file=str(policy)))
    llm.default = memory_agent
    client = dev_env.client
    acme_marker, globex_marker = f"acmeplan{uuid.uuid4().hex[:8]}", f"globexplan{uuid.uuid4().hex[:8]}"

    async def run(task: str, tenant: str, user: str = "ann") -> str:
        handle = await start_agent(client, tq, id_prefix=f"mem-{tenant}", task=task, tenant=tenant, user=user)
        result = await handle.result()
        assert result.status == "completed", result
        return result.output

    try:
        async with run_worker(client, runtime) as tq:
            saved_a = await run(f"save the launch plan is {acme_marker}", "acme")
            saved_b = await run(f"save the launch plan is {globex_marker}", "globex")
            assert "saved memory entry" in saved_a and "saved memory entry" in saved_b
            found_a = await run("search launch plan", "acme")
            found_b = await run("search launch plan", "globex")
            other_user = await run("search launch plan", "acme", user="bob")
            sneaky = await run(f"sneak {acme_marker}", "globex")
            key_a = found_a.split("[", 1)[1].split("]", 1)[0]
            deleted_by_b = await run(f"delete {key_a}", "globex")
            found_a_again = await run("search launch plan", "acme")
    finally:
        await runtime.aclose()
    assert acme_marker in found_a and globex_marker not in found_a
    assert globex_marker in found_b and acme_marker not in found_b
    assert "No memory entries matched" in other_user  # same tenant, another user: another namespace
    assert acme_marker not in sneaky and "tenant" in sneaky  # unknown argument: a tool error the model reads
    assert "no memory entry has the key" in deleted_by_b
    assert acme_marker in found_a_again


def helper_searches(body: dict[str, Any]) -> Scripted:
    """The parent delegates its task to ``helper``; the helper searches memory for it and reports what it read."""
    messages = body["messages"]
    tool_results = [m["content"] for m in messages if m["role"] == "tool"]
    if messages[0]["content"] == "You are the helper.":
        if tool_results:
            return Scripted(text=f"helper read: {tool_results[-1]}")
        task = next(m["content"] for m in messages if m["role"] == "user")
        return Scripted(tool_calls=[("memory_search", json.dumps({"query": task}))])
    if tool_results:
        return Scripted(text=f"parent got: {tool_results[-1]}")
    return (
        memory_agent(body)
        if not messages[-1]["content"].startswith("ask ")
        else Scripted(tool_calls=[("helper", json.dumps({"task": messages[-1]["content"][4:]}))])
    )


async def test_a_sub_agent_searches_its_parents_namespace_only(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(ALLOW_MEMORY))
    runtime = Runtime.from_settings(replace(runtime.settings, policy_file=str(policy)))
    llm.default = helper_searches
    client = dev_env.client
    helper = {"helper": SubagentDef(description="Searches memory.", system_prompt="You are the helper.")}

    async def run(task: str, tenant: str) -> str:
        handle = await start_agent(
            client, tq, id_prefix=f"memsub-{tenant}", task=task, tenant=tenant, user="ann", subagents=helper
        )
        result = await handle.result()
        assert result.status == "completed", result
        return result.output

    try:
        async with run_worker(client, runtime) as tq:
            await run("save the acme budget is 42 dollars", "acme")
            await run("save the globex budget is 99 dollars", "globex")
            acme = await run("ask budget", "acme")
            globex = await run("ask budget", "globex")
    finally:
        await runtime.aclose()
    assert "42 dollars" in acme and "99 dollars" not in acme, acme
    assert "99 dollars" in globex and "42 dollars" not in globex, globex


async def test_sessions_of_two_tenants_keep_their_memory_apart_in_search_and_delete(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(ALLOW_MEMORY))
    runtime = Runtime.from_settings(replace(runtime.settings, policy_file=str(policy)))

    def session_agent(body: dict[str, Any]) -> Scripted:
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return Scripted(text=f"tool said: {messages[-1]['content']}")
        verb, _, rest = messages[-1]["content"].partition(" ")
        tools = {"save": ("memory_save", {"text": rest}), "delete": ("memory_delete", {"key": rest})}
        tool = tools.get(verb, ("memory_search", {"query": rest}))
        return Scripted(tool_calls=[(tool[0], json.dumps(tool[1]))])

    llm.default = session_agent
    client = dev_env.client

    async def chat(tenant: str, texts: list[str]) -> str:
        handle = await client.start_workflow(
            AgentWorkflow.run,
            AgentInput(session=SessionSpec(), tenant=tenant, user="ann"),
            id=f"memsession-{tenant}-{uuid.uuid4().hex[:8]}",
            task_queue=tq,
        )
        for number, text in enumerate(texts, 1):
            sent = await handle.execute_update(
                "send", SessionMessage(message_id=f"m{number}", text=text), result_type=SendResult
            )
            assert sent.accepted

            async def replied(seq: int = number) -> bool:
                view: StatusView = await handle.query(AgentWorkflow.status)
                return view.replied >= seq and view.state == "idle"

            await eventually(replied, f"{tenant}'s reply {number}")
        await handle.signal("close")
        return (await handle.result()).output

    try:
        async with run_worker(client, runtime) as tq:
            acme = await chat("acme", ["save acme's wifi password hint is parrot", "search wifi password"])
            [entry] = await runtime.memory.search("acme", "ann", "wifi", 5)
            globex = await chat("globex", ["search wifi password"])
            globex_delete = await chat("globex", [f"delete {entry.key}"])  # acme's key, from globex's session
            kept = await runtime.memory.count("acme", "ann")
            acme_delete = await chat("acme", [f"delete {entry.key}"])
            left = await runtime.memory.count("acme", "ann")
    finally:
        await runtime.aclose()
    assert "parrot" in acme, acme
    assert "parrot" not in globex and "No memory entries matched" in globex, globex
    assert f"no memory entry has the key [{entry.key}]" in globex_delete and kept == 1, globex_delete
    assert f"deleted memory entry [{entry.key}]" in acme_delete and left == 0, acme_delete


def _context(memory: SQLiteMemoryStore, key: str, tenant: str = "t") -> ToolContext:
    invocation = ToolInvocation(
        conversation_id="c",
        workflow_id="w",
        step=1,
        call_id="call",
        call_index=0,
        seq=1,
        tool="memory_save",
        arguments={},
        idempotency_key=key,
        tenant=tenant,
        user="u",
    )
    return ToolContext(invocation=invocation, settings=Settings(), memory=RunMemory(lambda: memory, tenant, "u"))


async def test_a_retried_save_stores_one_entry_and_bounds_reach_the_model(tmp_path: Path) -> None:
    memory = SQLiteMemoryStore(tmp_path / "s.sqlite3", None, MemoryLimits(max_entries=1))
    try:
        first = await memory_save(MemorySaveArgs(text="the user likes tea"), _context(memory, "k1"))
        again = await memory_save(MemorySaveArgs(text="the user likes tea"), _context(memory, "k1"))
        assert first == again and await memory.count("t", "u") == 1
        try:
            await memory_save(MemorySaveArgs(text="another"), _context(memory, "k2"))
        except ToolError as exc:
            assert "AGENT_MEMORY_MAX_ENTRIES" in str(exc)
        else:
            raise AssertionError("a save over the bound should be a tool error")
        try:
            await memory_search(MemorySearchArgs(query="?? !!"), _context(memory, "k3"))
        except ToolError as exc:
            assert "no words" in str(exc)
        else:
            raise AssertionError("a query without words should be a tool error")
        found = await memory_search(MemorySearchArgs(query="tea"), _context(memory, "k4"))
        assert "the user likes tea" in found
        assert "No memory entries matched" in await memory_search(
            MemorySearchArgs(query="tea"), _context(memory, "k5", tenant="other")
        )
    finally:
        await memory.close()


async def test_the_reapers_expiry_pass_deletes_expired_entries(tmp_path: Path) -> None:
    from durable_agents.reaping import expire_memory

    memory = SQLiteMemoryStore(tmp_path / "s.sqlite3", None, MemoryLimits(ttl_s=60.0), clock=lambda: 1000.0)
    try:
        await memory.save("t", "u", "old", "an old note", "1")
        assert await expire_memory(memory, now=1059.0) == 0
        assert await expire_memory(memory, now=1061.0) == 1
        assert await memory.count("t", "u") == 0
    finally:
        await memory.close()
    assert await expire_memory(memory, now=2000.0) == 0  # a closed store: logged, never raised


def test_memory_settings_are_read_and_bounded() -> None:
    read = Settings.from_env(
        {"AGENT_MEMORY_MAX_ENTRIES": "7", "AGENT_MEMORY_MAX_MB": "3", "AGENT_MEMORY_TTL_DAYS": "1.5"}
    ).memory
    assert (read.max_entries, read.max_bytes, read.ttl_s) == (7, 3 * 1024 * 1024, 1.5 * 86400)
    assert Settings.from_env({}).memory.ttl_s is None
    for name, value in (
        ("AGENT_MEMORY_MAX_ENTRIES", "0"),
        ("AGENT_MEMORY_MAX_MB", "x"),
        ("AGENT_MEMORY_TTL_DAYS", "-1"),
    ):
        try:
            Settings.from_env({name: value})
        except ConfigurationError as exc:
            assert name in str(exc) and "\n" not in str(exc)
        else:
            raise AssertionError(f"{name}={value} should be refused")


async def test_the_workers_reaper_deletes_expired_entries(dev_env: WorkflowEnvironment, settings: Settings) -> None:
    from temporalio.worker import Worker

    from activities.memory import open_memory
    from activities.settings import MemorySettings, SandboxSettings
    from durable_agents import DurableAgentsPlugin

    fast = replace(
        settings,
        sandbox=SandboxSettings(reap_interval_s=0.05),
        memory=MemorySettings(ttl_days=0.5 / 86400),  # half a second
    )
    memory = open_memory(fast)
    try:
        await memory.save("t", "u", "k", "soon gone", "1")
        assert await memory.count("t", "u") == 1
        plugin = DurableAgentsPlugin(fast, search_attributes=False)
        async with Worker(dev_env.client, task_queue=f"memreap-{uuid.uuid4().hex[:8]}", plugins=[plugin]):

            async def reaped() -> bool:
                return await memory.count("t", "u") == 0

            await eventually(reaped, "the reaper to delete the expired entry")
    finally:
        await memory.close()
