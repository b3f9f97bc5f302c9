"""Example model provider ``echo``: offline, deterministic, and able to call a tool.

Load it with ``AGENT_PROVIDER_MODULES=examples.custom_provider.echo_provider`` and
select it with ``AGENT_MODEL=echo:v1`` (or a run's ``"model": "echo:v1"``).

What it answers, from the transcript alone (the same transcript gives the same reply):

- first turn, when ``stock_lookup`` (``examples.custom_tool.inventory_tools``) is offered
  and the task names an article (``A-1001``): a call of ``stock_lookup`` for it;
- otherwise: ``ECHO_PREFIX`` (default ``"echo: "``) plus the task, followed by one line per
  tool result the run has seen (``- stock_lookup: A-1001 (blue widget): 42 available ...``,
  ``- stock_lookup (error): ...`` for a failed call).

Only the model name ``v1`` exists; any other is a :class:`FatalProviderError`, which
ends the run ``failed``. A real provider raises :class:`RetryableProviderError` for
429s, 5xx and timeouts (an offline echo has none).
"""

from __future__ import annotations

import json
import re
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

LOOKUP_TOOL = "stock_lookup"
_ARTICLE = re.compile(r"\b[A-Z]-\d{4}\b")


class EchoProvider:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        if model != "v1":
            raise FatalProviderError(f"echo: unknown model {model!r} (available: v1)", status=404)
        task = next((m.content for m in messages if m.role == "user"), "")
        if not task:
            raise FatalProviderError("echo: the transcript has no user message")
        turn = sum(1 for m in messages if m.role == "assistant")
        tokens_in = sum(len(m.content) // 4 for m in messages)
        article = _ARTICLE.search(task)
        if turn == 0 and article and LOOKUP_TOOL in {t["name"] for t in tools}:
            call = RecordedToolCall(id="echo_0", name=LOOKUP_TOOL, arguments_json=json.dumps({"sku": article.group(0)}))
            return ProviderReply(
                text=f"Looking up {article.group(0)}.",
                tool_calls=[call],
                input_tokens=tokens_in,
                output_tokens=5,
                finish_reason="tool_calls",
            )
        lines = [f"{self.prefix}{task}"]
        lines += [f"- {m.name}{' (error)' if m.is_error else ''}: {m.content}" for m in messages if m.role == "tool"]
        return ProviderReply(
            text="\n".join(lines), input_tokens=tokens_in, output_tokens=len(lines) * 8, finish_reason="stop"
        )


@provider("echo")
def echo(settings: Settings) -> ModelProvider:
    # Extension configuration comes from settings.variable("NAME"), never os.environ.
    return EchoProvider(settings.variable("ECHO_PREFIX", "echo: "))
