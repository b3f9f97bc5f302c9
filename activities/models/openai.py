"""OpenAI-compatible Chat Completions provider (OpenAI, Ollama, vLLM, llama.cpp, ...).

One ``POST {base_url}/chat/completions`` per turn, streamed (SSE ``chat.completion.chunk`` events, then
``[DONE]``) when the activity streams the turn. Tool-call
arguments travel as the raw string the model produced, in both directions, so
the transcript records exactly what the model said. Errors: see ``http_errors``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from pydantic import SecretStr

from activities.models.base import ProviderReply, TextSink
from activities.models.http_errors import as_int, error_message, malformed, missing, post_json
from activities.models.http_provider import HttpProvider
from activities.models.registry import provider
from activities.models.sse import ended_early, post_sse
from activities.models.structured import OUTPUT_TOOL
from activities.settings import Settings
from workflows.types import Message, RecordedToolCall

DEFAULT_BASE_URL = "https://api.openai.com/v1"
PROVIDER = "openai"


class OpenAIProvider(HttpProvider):
    """``ModelProvider`` over an OpenAI-compatible server.

    ``Authorization: Bearer`` is sent only when a key is configured: local
    servers need none. One ``httpx.AsyncClient`` per instance; call ``aclose()``.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: SecretStr | None = None,
        *,
        timeout_s: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url or DEFAULT_BASE_URL, api_key, timeout_s=timeout_s, transport=transport)

    async def complete(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        max_output_tokens: int | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> ProviderReply:
        """One chat completion; ``model`` is the server's model name (no ``openai:`` prefix).

        ``max_output_tokens`` goes out as ``max_completion_tokens`` to OpenAI itself (its o-series
        refuses ``max_tokens``) and as ``max_tokens`` to any other server (vLLM, Ollama, llama.cpp).
        ``output_schema`` goes out as ``response_format`` of type ``json_schema`` (not strict: a strict
        schema must close every object, which a user's schema need not).
        """
        url, headers, body, secrets = self._request(model, messages, tools, max_output_tokens, output_schema)
        data = await post_json(self._client, PROVIDER, url, headers=headers, body=body, secrets=secrets)
        return parse_reply(data, secrets)

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
        """``complete``, streamed (``stream: true``, usage in the last chunk): ``on_text`` gets each text delta."""
        url, headers, body, secrets = self._request(model, messages, tools, max_output_tokens, output_schema)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        reply = StreamedReply()
        async for _, data in post_sse(self._client, PROVIDER, url, headers=headers, body=body, secrets=secrets):
            if data.strip() == "[DONE]":
                return reply.finish(secrets)
            text = reply.add(_chunk(data, secrets), secrets)
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
        self.require_key(DEFAULT_BASE_URL, "OPENAI_API_KEY")
        secrets = self._secrets()
        headers = {"Authorization": f"Bearer {secrets[0]}"} if secrets else {}
        body: dict[str, Any] = {"model": model, "messages": [render_message(m) for m in messages]}
        if tools:
            body["tools"] = [render_tool(t) for t in tools]
        if max_output_tokens is not None:
            official = self.base_url.rstrip("/") == DEFAULT_BASE_URL
            body["max_completion_tokens" if official else "max_tokens"] = max_output_tokens
        if output_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": OUTPUT_TOOL, "schema": output_schema, "strict": False},
            }
        return f"{self.base_url}/chat/completions", headers, body, secrets


def _chunk(data: str, secrets: list[str]) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise malformed(PROVIDER, f"stream chunk is not JSON: {data[:200]!r}", secrets) from None
    if not isinstance(chunk, dict):
        raise malformed(PROVIDER, "stream chunk is not a JSON object", secrets)
    if chunk.get("error"):
        raise malformed(PROVIDER, f"stream error: {error_message(data, secrets)}", secrets)
    return chunk


class StreamedReply:
    """A chat.completion put together from its ``chat.completion.chunk`` deltas."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.arguments: dict[int, list[str]] = {}
        self.finish_reason = ""
        self.response_id = ""
        self.usage: dict[str, Any] = {}

    def add(self, chunk: dict[str, Any], secrets: list[str]) -> str:
        """Take one chunk in; the text it adds."""
        self.response_id = self.response_id or str(chunk.get("id") or "")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise malformed(PROVIDER, "stream chunk choices is not a list", secrets)
        added = ""
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            text = content_text(delta.get("content"))
            if text:
                self.text.append(text)
                added += text
            for raw in delta.get("tool_calls") or []:
                if not isinstance(raw, dict):
                    raise malformed(PROVIDER, "stream tool_calls entry is not an object", secrets)
                index = as_int(raw.get("index", len(self.calls)))
                call = self.calls.setdefault(index, {"function": {}})
                if raw.get("id"):
                    call["id"] = raw["id"]
                function = raw.get("function")
                if isinstance(function, dict):
                    if function.get("name"):
                        call["function"]["name"] = call["function"].get("name", "") + str(function["name"])
                    if isinstance(function.get("arguments"), str):
                        self.arguments.setdefault(index, []).append(function["arguments"])
        return added

    def finish(self, secrets: list[str]) -> ProviderReply:
        """The ``ProviderReply`` ``complete`` would have answered for the same completion."""
        calls = []
        for position, index in enumerate(sorted(self.calls)):
            raw = self.calls[index]
            function = dict(raw["function"])
            function["arguments"] = "".join(self.arguments.get(index, [])) if index in self.arguments else None
            calls.append(parse_tool_call(raw, function, position))
        return ProviderReply(
            text="".join(self.text),
            tool_calls=calls,
            input_tokens=as_int(self.usage.get("prompt_tokens")),
            output_tokens=as_int(self.usage.get("completion_tokens")),
            finish_reason=self.finish_reason,
            response_id=self.response_id,
        )


def render_message(message: Message) -> dict[str, Any]:
    """A transcript message in Chat Completions form."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
                for c in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def render_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A provider-neutral tool definition as a Chat Completions function tool."""
    return {
        "type": "function",
        "function": {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
        },
    }


def parse_reply(data: dict[str, Any], secrets: list[str]) -> ProviderReply:
    """``ProviderReply`` from a chat.completion object; raises ``malformed`` if it has no usable choice."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise missing(PROVIDER, data, "choices", secrets)
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise missing(PROVIDER, data, "choices[0].message", secrets)
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise missing(PROVIDER, data, "tool_calls list", secrets)
    calls = []
    for index, raw in enumerate(raw_calls):
        function = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(function, dict):
            raise missing(PROVIDER, data, f"tool_calls[{index}].function", secrets)
        calls.append(parse_tool_call(raw, function, index))
    usage = data.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    return ProviderReply(
        text=content_text(message.get("content")),
        tool_calls=calls,
        input_tokens=as_int(usage.get("prompt_tokens")),
        output_tokens=as_int(usage.get("completion_tokens")),
        finish_reason=str(choices[0].get("finish_reason") or ""),
        response_id=str(data.get("id") or ""),
    )


def parse_tool_call(raw: dict[str, Any], function: dict[str, Any], index: int) -> RecordedToolCall:
    """Keeps ``arguments`` verbatim; some servers send an object instead of a string, so it is re-encoded."""
    arguments = function.get("arguments")
    if arguments is None:
        arguments_json = "{}"  # a server that omits arguments means "no arguments"
    elif isinstance(arguments, str):
        arguments_json = arguments
    else:
        arguments_json = json.dumps(arguments)
    # Local servers sometimes omit ids; a position-based one keeps replays deterministic.
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"call_{index}"
    return RecordedToolCall(id=call_id, name=str(function.get("name") or ""), arguments_json=arguments_json)


def content_text(content: object) -> str:
    """Message content as text; accepts the list-of-parts form some compatible servers return."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


@provider(PROVIDER)
def openai_provider(settings: Settings) -> OpenAIProvider:
    """``openai:<model>``: ``OPENAI_BASE_URL`` (any OpenAI-compatible server) with ``OPENAI_API_KEY``."""
    return OpenAIProvider(settings.openai.base_url, settings.openai.api_key)
