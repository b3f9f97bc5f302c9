"""Anthropic Messages API provider.

One ``POST {base_url}/v1/messages`` per turn, streamed (``message_start``, ``content_block_*``,
``message_delta``, ``message_stop`` events) when the activity streams the turn. The neutral
transcript is reshaped to what the API demands: system messages go to the
top-level ``system`` field, tool results become ``tool_result`` blocks of a user
message, and consecutive same-role messages are merged because the API
requires user/assistant alternation. Errors: see ``http_errors``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr

from activities.models.base import (
    FatalProviderError,
    ProviderError,
    ProviderReply,
    RetryableProviderError,
    TextSink,
)
from activities.models.http_errors import as_int, error_message, malformed, missing, post_json
from activities.models.http_provider import HttpProvider
from activities.models.registry import provider
from activities.models.sse import ended_early, post_sse
from activities.models.structured import OUTPUT_TOOL, tool_schema
from activities.redaction import redact
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
        output_schema: dict[str, Any] | None = None,
    ) -> ProviderReply:
        """One Messages API call; ``model`` is Anthropic's model name (no ``anthropic:`` prefix).

        ``max_tokens`` (which the API requires) is ``max_output_tokens``, or the provider's own default.
        With ``output_schema`` the model must call a tool (``tool_choice``): the ``final_output`` tool, whose
        input is the schema, or one of the run's; a ``final_output`` call is the reply's text, as JSON.
        """
        url, headers, body, secrets = self._request(model, messages, tools, max_output_tokens, output_schema)
        data = await post_json(self._client, PROVIDER, url, headers=headers, body=body, secrets=secrets)
        return parse_reply(data, secrets, output=_output_tool(output_schema))

    async def stream(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        on_text: TextSink,
        max_output_tokens: int | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> ProviderReply:
        """``complete``, streamed (``"stream": true``): ``on_text`` gets each ``text_delta``."""
        url, headers, body, secrets = self._request(model, messages, tools, max_output_tokens, output_schema)
        body["stream"] = True
        message = StreamedMessage()
        async for event, data in post_sse(self._client, PROVIDER, url, headers=headers, body=body, secrets=secrets):
            try:
                payload = json.loads(data)
            except ValueError:
                raise malformed(PROVIDER, f"stream event is not JSON: {data[:200]!r}", secrets) from None
            if not isinstance(payload, dict):
                raise malformed(PROVIDER, "stream event is not a JSON object", secrets)
            kind = str(payload.get("type") or event)
            if kind == "message_stop":
                return parse_reply(message.data(), secrets, output=_output_tool(output_schema))
            if kind == "error":
                raise stream_error(payload, secrets)
            text = message.add(kind, payload, secrets)
            if text:
                await on_text(text)
        raise ended_early(PROVIDER)

    def _request(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        max_output_tokens: int | None,
        output_schema: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, str], dict[str, Any], list[str]]:
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
        if output_schema is not None:
            input_schema, _ = tool_schema(output_schema)
            final = {"name": OUTPUT_TOOL, "description": OUTPUT_TOOL_DESCRIPTION, "input_schema": input_schema}
            body["tools"] = [*body.get("tools", []), final]
            # Forced: with tools of its own the model may call those first ("any"), else only the answer.
            body["tool_choice"] = {"type": "any"} if tools else {"type": "tool", "name": OUTPUT_TOOL}
        return f"{self.base_url}/v1/messages", headers, body, secrets


def stream_error(payload: dict[str, Any], secrets: list[str]) -> ProviderError:
    """An ``error`` event mid-stream: ``overloaded_error`` and ``api_error`` may pass, the rest will not."""
    err = payload.get("error") if isinstance(payload.get("error"), dict) else {}
    assert isinstance(err, dict)
    kind = str(err.get("type") or "")
    message = redact(f"{PROVIDER} stream error {kind}: {error_message(json.dumps(payload), secrets)}", secrets)
    if kind in ("overloaded_error", "api_error", "rate_limit_error", "timeout_error", ""):
        return RetryableProviderError(message, status=200)
    return FatalProviderError(message, status=200)


class StreamedMessage:
    """A Messages API response put together from its stream events (``message_start`` ... ``message_delta``)."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.usage: dict[str, Any] = {}

    def add(self, kind: str, payload: dict[str, Any], secrets: list[str]) -> str:
        """Take one event in; the text it adds."""
        if kind == "message_start" and isinstance(payload.get("message"), dict):
            self.message = payload["message"]
            if isinstance(self.message.get("usage"), dict):
                self.usage.update(self.message["usage"])
        elif kind == "content_block_start":
            block = payload.get("content_block")
            if not isinstance(block, dict):
                raise malformed(PROVIDER, "content_block_start without a content_block", secrets)
            self.blocks[as_int(payload.get("index"))] = dict(block)
        elif kind == "content_block_delta":
            index, delta = as_int(payload.get("index")), payload.get("delta")
            block = self.blocks.get(index)
            if block is None or not isinstance(delta, dict):
                raise malformed(PROVIDER, f"content_block_delta for no started block {index}", secrets)
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                block["text"] = str(block.get("text") or "") + delta["text"]
                return str(delta["text"]) if block.get("type") == "text" else ""
            if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                self.partial_json.setdefault(index, []).append(delta["partial_json"])
        elif kind == "message_delta":
            delta = payload.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason"):
                self.message["stop_reason"] = delta["stop_reason"]
            if isinstance(payload.get("usage"), dict):
                self.usage.update({k: v for k, v in payload["usage"].items() if v is not None})
        return ""

    def data(self) -> dict[str, Any]:
        """The whole response, as the non-streaming API would have answered it."""
        content = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.get("type") == "tool_use" and index in self.partial_json:
                raw = "".join(self.partial_json[index])
                try:
                    block["input"] = json.loads(raw) if raw.strip() else {}
                except ValueError:
                    block["input"] = {"_raw": raw}  # what the model sent, for the tool error it will read
            content.append(block)
        return {**self.message, "content": content, "usage": self.usage}


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


OUTPUT_TOOL_DESCRIPTION = "Give your final answer: call this when you are done, with the answer as its input."


@dataclass(frozen=True)
class OutputTool:
    """How a reply's ``final_output`` call is read: its input is the answer, or holds it as ``output``."""

    wrapped: bool


def _output_tool(schema: dict[str, Any] | None) -> OutputTool | None:
    return None if schema is None else OutputTool(wrapped=tool_schema(schema)[1])


def parse_reply(data: dict[str, Any], secrets: list[str], *, output: OutputTool | None = None) -> ProviderReply:
    """``ProviderReply`` from a Messages API response; raises ``malformed`` if ``content`` is not a list.

    With ``output``, a ``final_output`` call alone is the reply: its input as JSON text, without tool calls.
    Beside other calls it is dropped (the model answers again once their results are in).
    """
    content = data.get("content")
    if not isinstance(content, list):
        raise missing(PROVIDER, data, "content", secrets)
    texts: list[str] = []
    calls: list[RecordedToolCall] = []
    answer: str | None = None
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            raise missing(PROVIDER, data, f"content[{index}] object", secrets)
        if block.get("type") == "text":
            texts.append(str(block.get("text") or ""))
        elif block.get("type") == "tool_use" and output is not None and block.get("name") == OUTPUT_TOOL:
            value = block.get("input")
            if output.wrapped and isinstance(value, dict):
                value = value.get("output")
            answer = json.dumps(value, ensure_ascii=False)
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
        text=answer if answer is not None and not calls else "".join(texts),
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
