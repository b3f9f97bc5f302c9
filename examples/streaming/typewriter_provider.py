"""An offline provider that streams: ``typewriter:v1`` types its answer a word at a time.

A provider streams by having a ``stream`` method beside ``complete``: it hands each piece of text to
``on_text`` as it has it and answers the same ``ProviderReply`` at the end. The ``model`` activity calls
``stream`` only when someone listens to the run (``docs/front-ends.md``, Streaming).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from durable_agents import Message, ModelProvider, ProviderReply, Settings, provider

PACE_S = 0.01  # between two words: a model writes at its own pace


def answer(messages: list[Message]) -> str:
    task = next((m.content for m in reversed(messages) if m.role == "user"), "")
    return f"You asked: {task}. " + "Here is a reply that arrives word by word, out of band of history. " * 3


class TypewriterProvider:
    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        text = answer(messages)
        return ProviderReply(text=text, input_tokens=len(str(messages)) // 4, output_tokens=len(text) // 4)

    async def stream(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        on_text: Callable[[str], Awaitable[None]],
        max_output_tokens: int | None = None,
    ) -> ProviderReply:
        text = answer(messages)
        for word in re.findall(r"\S+\s*", text):
            await on_text(word)
            await asyncio.sleep(PACE_S)
        return ProviderReply(text=text, input_tokens=len(str(messages)) // 4, output_tokens=len(text) // 4)


@provider("typewriter")
def typewriter(settings: Settings) -> ModelProvider:
    return TypewriterProvider()
