"""Model providers for the eval tests (``AGENT_PROVIDER_MODULES=tests.fakes.eval_providers``).

- ``evalgood:v1`` answers right: "the answer is 42" (``{"answer": 42}`` when the task says "as json");
  for a task naming ``POST <url>`` it first POSTs ``{"n": 1}`` there (a side effect: policy asks for
  approval), then answers with what the call returned.
- ``evalbad:v1`` answers wrong: "I do not know" (``{"answer": "many"}`` as json), and never calls a tool.
- ``judge:v1`` grades: a pass (score 0.9) when the transcript it is shown says 42, a fail (0.1) when not;
  when the rubric says "garble", it answers prose instead of a verdict.
- ``evalgate:v1`` is ``evalgood`` that, for a task saying "hold", waits until the file named by
  ``EVAL_GATE_FILE`` exists.

Every request is recorded: in :data:`CALLS` (in-process workers) and, with ``EVAL_CALLS_FILE``, as one
line ``<provider> <task>`` appended to that file (worker subprocesses).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from activities.models import ModelProvider, provider
from activities.models.base import ProviderReply
from activities.settings import Settings
from workflows.types import Message, RecordedToolCall

CALLS: list[tuple[str, str]] = []  # (provider, task) of every request, in this process
_POST = re.compile(r"POST (\S+)")


def _task(messages: list[Message]) -> str:
    return next((m.content for m in messages if m.role == "user"), "")


GATE_POLLS = 20 * 600  # ten minutes of 50 ms polls: a hang guard (the test opens the gate long before)


async def _opened(gate: Path) -> None:
    """Wait until the gate file exists (the test creates it); the model call heartbeats meanwhile."""
    for _ in range(GATE_POLLS):
        if await asyncio.to_thread(gate.exists):
            return
        await asyncio.sleep(0.05)


class _Recorder:
    def __init__(self, name: str, settings: Settings) -> None:
        self.name = name
        self.calls_file = settings.variable("EVAL_CALLS_FILE")
        self.gate_file = settings.variable("EVAL_GATE_FILE")

    def record(self, task: str) -> None:
        CALLS.append((self.name, task))
        if self.calls_file:
            with open(self.calls_file, "a") as f:
                f.write(f"{self.name} {' '.join(task.split())}\n")


class GoodModel(_Recorder):
    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        task = _task(messages)
        self.record(task)
        if "hold" in task and self.gate_file:
            await _opened(Path(self.gate_file))
        results = [m for m in messages if m.role == "tool"]
        target = _POST.search(task)
        if target and not results and any(t["name"] == "http_request" for t in tools):
            args = {"method": "POST", "url": target.group(1), "json": {"n": 1}}
            call = RecordedToolCall(id="post_1", name="http_request", arguments_json=json.dumps(args))
            return ProviderReply(tool_calls=[call], input_tokens=10, output_tokens=5, finish_reason="tool_calls")
        if results:
            last = results[-1]
            text = ("posted: " if not last.is_error else "not posted: ") + last.content.splitlines()[0][:200]
        elif "as json" in task:
            text = json.dumps({"answer": 42})
        else:
            text = "the answer is 42"
        return ProviderReply(text=text, input_tokens=10, output_tokens=5, finish_reason="stop")


class BadModel(_Recorder):
    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        task = _task(messages)
        self.record(task)
        text = json.dumps({"answer": "many"}) if "as json" in task else "I do not know"
        return ProviderReply(text=text, input_tokens=10, output_tokens=5, finish_reason="stop")


class JudgeModel(_Recorder):
    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        prompt = _task(messages)
        self.record(prompt[:80])
        rubric, _, rest = prompt.partition("Transcript:")
        if "garble" in rubric:
            text = "Well, I think it went rather fine overall."
        elif "42" in rest:
            text = 'Here is my verdict:\n```json\n{"pass": true, "score": 0.9, "reason": "the answer names 42"}\n```'
        else:
            text = '{"pass": false, "score": 0.1, "reason": "the answer does not name 42"}'
        return ProviderReply(text=text, input_tokens=50, output_tokens=20, finish_reason="stop")


@provider("evalgood")
def evalgood(settings: Settings) -> ModelProvider:
    return GoodModel("evalgood", settings)


@provider("evalbad")
def evalbad(settings: Settings) -> ModelProvider:
    return BadModel("evalbad", settings)


@provider("judge")
def judge(settings: Settings) -> ModelProvider:
    return JudgeModel("judge", settings)


@provider("evalgate")
def evalgate(settings: Settings) -> ModelProvider:
    return GoodModel("evalgate", settings)
