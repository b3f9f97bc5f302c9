"""Anthropic Messages API provider.

One non-streaming ``POST {base_url}/v1/messages`` per turn. The neutral
transcript is reshaped to what the API demands: system messages go to the
top-level ``system`` field, tool results become ``tool_result`` blocks of a user
message, and consecutive same-role messages are merged because the API
requires user/assistant alternation. Errors: see ``http_errors``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from pydantic import SecretStr

from activities.models.base import ProviderReply
from activities.models.http_errors import as_int, missing, post_json
from activities.models.http_provider import HttpProvider
from activities.models.registry import provider
from activities.settings import Settings
from workflows.types import Message, RecordedToolCall

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
PROVIDER = "anthropic"


class AnthropicProvider(HttpProvider):
    """``ModelProvider`` over the Anthropic Messages API.

    ``x-api-key`` is sent only when a key is configured (keyless proxies).
    One ``httpx.AsyncClient`` per instance; call ``aclose()``.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: SecretStr | None = None,
        *,
        timeout_s: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        super().__init__(base_url or DEFAULT_BASE_URL, api_key, timeout_s=timeout_s, transport=transport)
        self.max_tokens = max_tokens

    async def complete(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        max_output_tokens: int | None = None,
    ) -> ProviderReply:
        """One Messages API call; ``model`` is Anthropic's model name (no ``anthropic:`` prefix).

        ``max_tokens`` (which the API requires) is ``max_output_tokens``, or the provider's own default.
        """
        self.require_key(DEFAULT_BASE_URL, "ANTHROPIC_API_KEY")
        secrets = self._secrets()
        headers = {"anthropic-version": API_VERSION}
        if secrets:
            headers["x-api-key"] = secrets[0]
        system, turns = render_messages(messages)
        body: dict[str, Any] = {"model": model, "max_tokens": max_output_tokens or self.max_tokens, "messages": turns}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [render_tool(t) for t in tools]
        data = await post_json(
            self._client, PROVIDER, f"{self.base_url}/v1/messages", headers=headers, body=body, secrets=secrets
        )
        return parse_reply(data, secrets)


def render_messages(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """``(system, messages)`` for the Messages API.

    System messages are joined with blank lines. Empty text blocks are dropped
    (the API rejects them) and a message left with no blocks is skipped.
    """
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = render_blocks(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:
        # The API wants tool_result blocks before any text in a user message.
        turn["content"].sort(key=lambda block: block["type"] != "tool_result")
    return system, turns


def render_blocks(message: Message) -> list[dict[str, Any]]:
    """The content blocks of one transcript message."""
    if message.role == "tool":
        return [
            {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content,
                "is_error": message.is_error,
            }
        ]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    if message.role == "assistant":
        blocks.extend(
            {"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(c.arguments_json)}
            for c in message.tool_calls
        )
    return blocks


def tool_input(arguments_json: str) -> dict[str, Any]:
    """``input`` for a replayed ``tool_use`` block.

    The API requires a JSON object here, so arguments that do not decode to one
    (the model emitted bad JSON, which our tool result already told it) are
    replayed as ``{}``; the raw text stays in our transcript.
    """
    try:
        value = json.loads(arguments_json)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def render_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A provider-neutral tool definition in Anthropic form."""
    return {
        "name": tool["name"],
        "description": tool.get("description", ""),
        "input_schema": tool.get("parameters") or {"type": "object", "properties": {}},
    }


def parse_reply(data: dict[str, Any], secrets: list[str]) -> ProviderReply:
    """``ProviderReply`` from a Messages API response; raises ``malformed`` if ``content`` is not a list."""
    content = data.get("content")
    if not isinstance(content, list):
        raise missing(PROVIDER, data, "content", secrets)
    texts: list[str] = []
    calls: list[RecordedToolCall] = []
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            raise missing(PROVIDER, data, f"content[{index}] object", secrets)
        if block.get("type") == "text":
            texts.append(str(block.get("text") or ""))
        elif block.get("type") == "tool_use":
            call_id = block.get("id")
            if not isinstance(call_id, str) or not call_id:
                call_id = f"call_{len(calls)}"
            calls.append(
                RecordedToolCall(
                    id=call_id,
                    name=str(block.get("name") or ""),
                    arguments_json=json.dumps(block.get("input") or {}, sort_keys=True),
                )
            )
    usage = data.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    return ProviderReply(
        text="".join(texts),
        tool_calls=calls,
        input_tokens=as_int(usage.get("input_tokens")),
        output_tokens=as_int(usage.get("output_tokens")),
        finish_reason=str(data.get("stop_reason") or ""),
        response_id=str(data.get("id") or ""),
    )


@provider(PROVIDER)
def anthropic_provider(settings: Settings) -> AnthropicProvider:
    """``anthropic:<model>``: ``ANTHROPIC_BASE_URL`` with ``ANTHROPIC_API_KEY``."""
    return AnthropicProvider(settings.anthropic.base_url, settings.anthropic.api_key)
