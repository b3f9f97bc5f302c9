"""Typed results: ``output_schema`` on the wire to each provider, answers checked, sent back, or the run fails."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from activities.model_turn import _shaped
from activities.models.anthropic import AnthropicProvider, OutputTool, parse_reply
from activities.models.openai import OpenAIProvider
from activities.models.scripted import ScriptedProvider
from activities.models.structured import OUTPUT_TOOL, check_output, instruction, with_instruction
from activities.runtime import Runtime
from tests.conftest import WorkerFactory, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.types import AgentInput, AgentResult, Limits, Message, SubagentDef, Usage


class City(BaseModel):
    name: str
    population: int


SCHEMA = City.model_json_schema()
VALID = '{"name": "Paris", "population": 2102650}'
QUESTION = [Message(role="user", content="Paris?")]


def user_texts(body: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m["role"] == "user"]


# --- on a real dev server -----------------------------------------------------------------------------


async def test_an_invalid_answer_goes_back_to_the_model_and_the_valid_one_is_the_result(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(Scripted(text="Paris, about two million people"), Scripted(text=f"```json\n{VALID}\n```"))
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, task="describe Paris", tools=[], output_schema=SCHEMA)
        result = await handle.result()

    assert result.status == "completed", result.output
    assert result.output_json == {"name": "Paris", "population": 2102650}
    assert result.output_as(City) == City(name="Paris", population=2102650)
    assert result.steps == 2
    # The schema went to the server natively, on every turn.
    for request in llm.requests:
        assert request["body"]["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": OUTPUT_TOOL, "schema": SCHEMA, "strict": False},
        }
    # The second turn was told why the first answer was refused.
    retry = user_texts(llm.requests[1]["body"])[-1]
    assert "does not match the required output schema" in retry and "not JSON" in retry, retry


async def test_an_answer_that_stays_invalid_fails_the_run_with_the_errors(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.default = Scripted(text='{"name": "Paris", "population": "many"}')
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, task="describe Paris", tools=[], output_schema=SCHEMA)
        result = await handle.result()
        fewer = await start_agent(
            dev_env.client, tq, task="again", tools=[], output_schema=SCHEMA, limits=Limits(max_output_retries=0)
        )
        once = await fewer.result()

    assert result.status == "failed"
    assert result.steps == 3  # the first answer and max_output_retries (2) more
    assert result.output_json is None
    assert "did not match output_schema after 3 attempt(s)" in result.output
    assert "at $.population: 'many' is not of type 'integer'" in result.output, result.output
    assert once.status == "failed" and once.steps == 1


async def test_anthropic_gets_a_forced_output_tool_and_its_call_is_the_answer(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    llm.enqueue(
        Scripted(text="Here it is.", tool_calls=[(OUTPUT_TOOL, VALID)]),
        Scripted(tool_calls=[(OUTPUT_TOOL, json.dumps({"output": ["a", "b"]}))]),
    )
    async with run_worker(dev_env.client, runtime) as tq:
        with_tools = await start_agent(
            dev_env.client, tq, model="anthropic:claude-test", tools=["always_fails"], output_schema=SCHEMA
        )
        result = await with_tools.result()
        listing = await start_agent(
            dev_env.client,
            tq,
            model="anthropic:claude-test",
            tools=[],
            output_schema={"type": "array", "items": {"type": "string"}},
        )
        listed = await listing.result()

    assert result.status == "completed", result.output
    assert result.output_json == {"name": "Paris", "population": 2102650}
    first = llm.requests[0]["body"]
    final = next(t for t in first["tools"] if t["name"] == OUTPUT_TOOL)
    assert final["input_schema"] == SCHEMA
    assert first["tool_choice"] == {"type": "any"}  # its own tools may come first
    assert [t["name"] for t in first["tools"]] == ["always_fails", OUTPUT_TOOL]
    # Alone, the answer tool is forced by name; a schema that is not an object travels wrapped.
    alone = llm.requests[1]["body"]
    assert alone["tool_choice"] == {"type": "tool", "name": OUTPUT_TOOL}
    assert alone["tools"][0]["input_schema"]["properties"]["output"] == {"type": "array", "items": {"type": "string"}}
    assert listed.status == "completed" and listed.output_json == ["a", "b"]


async def test_a_schema_that_is_not_json_schema_fails_the_run_at_start(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, output_schema={"type": "no-such-type"})
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    assert "output_schema: not a valid JSON Schema" in str(failure.value.cause)
    assert llm.requests == []  # no model turn was taken


async def test_a_subagent_with_an_output_schema_hands_its_parent_the_json(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    def model(body: dict[str, Any]) -> Scripted:
        messages = body["messages"]
        if messages[0]["content"] == "You are the reporter.":
            return Scripted(text=f"```json\n{VALID}\n```")
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if results:
            return Scripted(text=f"the reporter said {results[0]}")
        return Scripted(tool_calls=[("reporter", json.dumps({"task": "report on Paris"}))])

    llm.default = model
    reporter = SubagentDef(
        description="Reports.", system_prompt="You are the reporter.", tools=[], output_schema=SCHEMA
    )
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(dev_env.client, tq, tools=[], subagents={"reporter": reporter})
        result = await handle.result()
        child = await dev_env.client.get_workflow_handle(f"{handle.id}/reporter/s1c0", result_type=AgentResult).result()

    assert child.status == "completed" and child.output_json == {"name": "Paris", "population": 2102650}
    # The parent's model got the JSON itself, not the child's code fence.
    assert result.output == 'the reporter said {"name": "Paris", "population": 2102650}', result.output
    child_request = next(r for r in llm.requests if r["body"]["messages"][0]["content"] == "You are the reporter.")
    assert child_request["body"]["response_format"]["json_schema"]["schema"] == SCHEMA
    parent_request = llm.requests[0]["body"]
    assert "response_format" not in parent_request  # the parent has no schema of its own


async def test_the_demo_model_answers_a_schema_with_matching_json(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory
) -> None:
    async with run_worker(dev_env.client, runtime) as tq:
        handle = await start_agent(
            dev_env.client, tq, model="scripted:demo", tools=[], task="say hello", output_schema=SCHEMA
        )
        result = await handle.result()
    assert result.status == "completed", result.output
    city = result.output_as(City)
    assert city.name.startswith("Done.") and city.population == 0


# --- the pieces, without a server ---------------------------------------------------------------------------


def test_check_output_parses_forgives_one_fence_and_names_where_it_is_wrong() -> None:
    assert check_output(VALID, SCHEMA) == ({"name": "Paris", "population": 2102650}, [])
    assert check_output(f"```\n{VALID}\n```", SCHEMA)[0] == {"name": "Paris", "population": 2102650}
    value, errors = check_output('{"name": 3}', SCHEMA)
    assert value is None
    assert errors == ["at $: 'population' is a required property", "at $.name: 3 is not of type 'string'"]
    assert check_output("Paris", SCHEMA)[1][0].startswith("the answer is not JSON")
    assert check_output("x" * 40_000, SCHEMA)[1][0].startswith("the answer is 40000 bytes")
    # A remote $ref is never fetched.
    assert "cannot be resolved" in check_output("{}", {"$ref": "http://127.0.0.1:9/schema.json"})[1][0]


def test_a_provider_without_output_schema_gets_the_schema_in_its_system_prompt() -> None:
    transcript = [Message(role="system", content="Be brief."), Message(role="user", content="Paris?")]

    async def plain(model: str, messages: list[Message], tools: list[dict[str, Any]]) -> None: ...

    async def native(
        model: str, messages: list[Message], tools: list[dict[str, Any]], *, output_schema: dict[str, Any]
    ) -> None: ...

    sent, passed = _shaped(plain, transcript, SCHEMA)
    assert passed is None
    assert sent[0].content == f"Be brief.\n\n{instruction(SCHEMA)}" and sent[1] == transcript[1]
    assert transcript[0].content == "Be brief."  # the stored transcript is not changed
    assert _shaped(native, transcript, SCHEMA) == (transcript, SCHEMA)
    assert _shaped(plain, transcript, None) == (transcript, None)
    assert with_instruction([transcript[1]], SCHEMA)[0].role == "system"


def test_anthropic_reads_the_output_tool_as_the_answer_unless_other_calls_come_with_it() -> None:
    def reply(*blocks: dict[str, Any]) -> dict[str, Any]:
        return {"content": list(blocks), "usage": {"input_tokens": 1, "output_tokens": 1}}

    answer = {"type": "tool_use", "id": "t1", "name": OUTPUT_TOOL, "input": {"name": "Paris", "population": 1}}
    other = {"type": "tool_use", "id": "t2", "name": "search", "input": {"q": "x"}}
    parsed = parse_reply(reply({"type": "text", "text": "Here:"}, answer), [], output=OutputTool(wrapped=False))
    assert json.loads(parsed.text) == {"name": "Paris", "population": 1} and parsed.tool_calls == []
    both = parse_reply(reply(answer, other), [], output=OutputTool(wrapped=False))
    assert [c.name for c in both.tool_calls] == ["search"]
    wrapped = dict(answer, input={"output": [1, 2]})
    assert parse_reply(reply(wrapped), [], output=OutputTool(wrapped=True)).text == "[1, 2]"
    # Without a schema the tool is an ordinary call.
    assert [c.name for c in parse_reply(reply(answer), []).tool_calls] == [OUTPUT_TOOL]


async def test_openai_streams_with_response_format_too(llm: FakeLLMServer) -> None:
    llm.enqueue(Scripted(text=VALID))
    provider = OpenAIProvider(llm.openai_url, None)
    pieces: list[str] = []

    async def on_text(text: str) -> None:
        pieces.append(text)

    try:
        reply = await provider.stream(
            "m", [Message(role="user", content="Paris?")], [], on_text=on_text, output_schema=SCHEMA
        )
    finally:
        await provider.aclose()
    assert reply.text == VALID and "".join(pieces) == VALID
    assert llm.requests[0]["body"]["response_format"]["json_schema"]["schema"] == SCHEMA


async def test_anthropic_streams_the_output_tool_as_the_answer(llm: FakeLLMServer) -> None:
    llm.enqueue(Scripted(tool_calls=[(OUTPUT_TOOL, VALID)]))
    provider = AnthropicProvider(llm.anthropic_url, None)

    async def on_text(text: str) -> None: ...

    try:
        reply = await provider.stream(
            "m", [Message(role="user", content="Paris?")], [], on_text=on_text, output_schema=SCHEMA
        )
    finally:
        await provider.aclose()
    assert json.loads(reply.text) == {"name": "Paris", "population": 2102650} and reply.tool_calls == []
    assert llm.requests[0]["body"]["tool_choice"] == {"type": "tool", "name": OUTPUT_TOOL}


async def test_the_demo_model_fills_a_nested_schema() -> None:
    class Place(BaseModel):
        city: City
        tags: list[str] = []
        visited: bool
        rating: float | None = None

    messages = [Message(role="system", content="s"), Message(role="user", content="hi")]
    reply = await ScriptedProvider().complete("demo", messages, [], output_schema=Place.model_json_schema())
    value, errors = check_output(reply.text, Place.model_json_schema())
    assert errors == [] and Place.model_validate(value).visited is True


def test_with_output_and_output_as() -> None:
    inp = AgentInput(task="describe Paris", limits=Limits(max_steps=3)).with_output(City)
    assert inp.output_schema == SCHEMA and inp.limits.max_steps == 3
    result = AgentResult(status="completed", output=VALID, usage=Usage(), steps=1, output_json=json.loads(VALID))
    assert result.output_as(City).population == 2102650
    with pytest.raises(ValueError, match="no typed result"):
        AgentResult(status="failed", output="x", usage=Usage(), steps=1).output_as(City)


def test_output_schema_is_bounded_and_not_for_sessions() -> None:
    with pytest.raises(ValidationError, match="at most 32768"):
        AgentInput(task="x", output_schema={"description": "x" * 40_000})
    with pytest.raises(ValidationError, match="output_schema is for runs"):
        AgentInput.model_validate({"session": {}, "output_schema": SCHEMA})
    with pytest.raises(ValidationError):
        Limits(max_output_retries=11)
