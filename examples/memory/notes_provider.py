"""Example model provider ``notes``: offline and deterministic, it uses long-term memory as told.

Load it with ``AGENT_PROVIDER_MODULES=examples.memory.notes_provider`` and select it with
``AGENT_MODEL=notes:v1``. From the task alone:

- ``remember: TEXT`` calls ``memory_save {"text": TEXT}``;
- ``recall: WORDS`` calls ``memory_search {"query": WORDS}``;
- ``ask: QUESTION`` answers from the memories the run recalled into its context (``memory.recall: auto``),
  without a tool call;
- once the tool answered, the reply is what it said.

Which tenant's and user's memory the tools use is not the model's to say: it comes from the run.
"""

from __future__ import annotations

import json
from typing import Any

from durable_agents import (
    FatalProviderError,
    Message,
    ModelProvider,
    ProviderReply,
    RecordedToolCall,
    Settings,
    provider,
)

_VERBS = {"remember:": ("memory_save", "text"), "recall:": ("memory_search", "query")}


class NotesProvider:
    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        if model != "v1":
            raise FatalProviderError(f"notes: unknown model {model!r} (available: v1)", status=404)
        results = [m.content for m in messages if m.role == "tool"]
        if results:
            return ProviderReply(text=results[-1], output_tokens=10, finish_reason="stop")
        task = next((m.content for m in messages if m.role == "user"), "")
        verb, _, rest = task.partition(" ")
        if verb == "ask:":
            # What ``memory.recall: auto`` put after the task: one entry named "memory", a header line first.
            recalled = [line for m in messages if m.name == "memory" for line in m.content.splitlines()[1:]]
            answer = "from memory:\n" + "\n".join(recalled) if recalled else "I remember nothing about that."
            return ProviderReply(text=answer, output_tokens=10, finish_reason="stop")
        if verb not in _VERBS:
            return ProviderReply(text="Say 'remember: ...' or 'recall: ...'.", finish_reason="stop")
        tool, argument = _VERBS[verb]
        call = RecordedToolCall(id="notes_0", name=tool, arguments_json=json.dumps({argument: rest.strip()}))
        return ProviderReply(tool_calls=[call], output_tokens=5, finish_reason="tool_calls")


@provider("notes")
def notes(settings: Settings) -> ModelProvider:
    return NotesProvider()
