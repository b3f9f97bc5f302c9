"""``memory: {"recall": "auto", "k": N}``: the namespace's best entries reach the model, in the transcript only.

On the real dev server: a run's first model turn sees the entries of its own (tenant, user) that best
match its task, best first, and none of another tenant's; a session's each message gets its own
recall; without ``memory`` nothing is recalled; the memory text is in no workflow history (it goes
into the run store's transcript by the activity itself).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.memory.recall import HEADER
from activities.runtime import Runtime
from tests.conftest import WorkerFactory, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.session_types import SendResult, SessionMessage, SessionSpec
from workflows.types import AgentInput, AgentResult, MemorySpec, StatusView


def recalled_in(body: dict[str, Any]) -> list[str]:
    """The memory entries (``[key] text`` lines) the model was shown, in order, from every recall in the prompt."""
    lines: list[str] = []
    for message in body["messages"]:
        content = message.get("content") or ""
        if isinstance(content, str) and content.startswith(HEADER):
            lines += [line[2:] for line in content.splitlines()[1:]]
    return lines


async def history_text(client: Client, workflow_id: str) -> str:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return history.to_json()


async def seed(runtime: Runtime, tenant: str, user: str, *texts: str) -> None:
    for i, text in enumerate(texts):
        await runtime.memory.save(tenant, user, f"{tenant}-{i}", text, f"seed-{uuid.uuid4().hex}")


async def test_a_run_sees_its_namespaces_best_memories_and_history_holds_none(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    marker = f"oolong{uuid.uuid4().hex[:8]}"
    await seed(
        runtime,
        "acme",
        "ann",
        f"ann drinks {marker} tea every morning, tea with no sugar",
        "ann's office is on the third floor",
        "the quarterly report is due in march",
    )
    await seed(runtime, "globex", "ann", "globex ann drinks tea too: green tea")
    await seed(runtime, "acme", "bob", "bob drinks tea: black tea")
    llm.default = lambda body: Scripted(text="ok")
    client = dev_env.client
    async with run_worker(client, runtime) as tq:
        recalled = await start_agent(
            client,
            tq,
            id_prefix="recall",
            task="what tea does ann drink in the morning?",
            tenant="acme",
            user="ann",
            memory=MemorySpec(recall="auto", k=2),
        )
        assert (await recalled.result()).status == "completed"
        seen = recalled_in(llm.requests[-1]["body"])
        plain = await start_agent(client, tq, id_prefix="norecall", task="what tea?", tenant="acme", user="ann")
        assert (await plain.result()).status == "completed"
        seen_without = recalled_in(llm.requests[-1]["body"])
    assert 1 <= len(seen) <= 2 and seen[0].startswith("[acme-0]") and marker in seen[0], seen
    assert not any("globex" in line or "bob" in line for line in seen), seen
    assert seen_without == []
    assert marker not in await history_text(client, recalled.id)  # the text went to the store, not history
    turns = [m for m in llm.requests[-2]["body"]["messages"] if m["role"] == "user"]
    assert turns[0]["content"].startswith("what tea") and turns[1]["content"].startswith(HEADER)


async def test_each_session_message_recalls_for_itself_and_another_tenant_sees_none(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    await seed(runtime, "acme", "", "the wifi password is kept by facilities", "lunch is served at noon")
    await seed(runtime, "initech", "", "initech lunch is at eleven")
    llm.default = lambda body: Scripted(text=f"answer {json.dumps(recalled_in(body))}")
    client = dev_env.client

    async def ask(handle: WorkflowHandle[Any, AgentResult], message_id: str, text: str, seq: int) -> None:
        sent: SendResult = await handle.execute_update(
            "send", SessionMessage(message_id=message_id, text=text), result_type=SendResult
        )
        assert sent.accepted

        async def replied() -> StatusView | None:
            view: StatusView = await handle.query(AgentWorkflow.status)
            return view if view.replied >= seq and view.state == "idle" else None

        await eventually(replied, f"reply to {message_id}")

    async with run_worker(client, runtime) as tq:
        session = await client.start_workflow(
            AgentWorkflow.run,
            AgentInput(session=SessionSpec(), tenant="acme", memory=MemorySpec(recall="auto", k=1)),
            id=f"recall-session-{uuid.uuid4().hex[:8]}",
            task_queue=tq,
        )
        await ask(session, "a", "when is lunch?", 1)
        first = recalled_in(llm.requests[-1]["body"])
        await ask(session, "b", "who knows the wifi password?", 2)
        second = recalled_in(llm.requests[-1]["body"])
        await session.signal("close")
        await session.result()
    assert first == ["[acme-1] lunch is served at noon"], first
    # The second turn's prompt holds the first message's recall too, then its own.
    assert second == ["[acme-1] lunch is served at noon", "[acme-0] the wifi password is kept by facilities"], second
    assert "eleven" not in json.dumps(llm.requests[-1])
    assert "facilities" not in await history_text(client, session.id)
