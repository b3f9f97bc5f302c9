"""OpenAI and Anthropic providers against the real-HTTP FakeLLMServer."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from activities.models.anthropic import AnthropicProvider
from activities.models.base import FatalProviderError, ProviderError, RetryableProviderError
from activities.models.openai import OpenAIProvider
from tests.fakes.llm_server import FakeLLMServer, Scripted
from workflows.types import Message, RecordedToolCall

KEY = "sk-test-SECRET-123"
KINDS = ["openai", "anthropic"]
USER = [Message(role="user", content="hi")]
ECHO_TOOL = {
    "name": "echo",
    "description": "Echo text back.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}

Provider = OpenAIProvider | AnthropicProvider


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as fake:
        yield fake


def make(kind: str, server: FakeLLMServer | None = None, key: str | None = KEY, url: str = "") -> Provider:
    secret = SecretStr(key) if key else None
    if kind == "openai":
        return OpenAIProvider(url or (server.openai_url if server else ""), secret, timeout_s=5)
    return AnthropicProvider(url or (server.anthropic_url if server else ""), secret, timeout_s=5)


async def fails(provider: Provider, tools: list[dict[str, Any]] | None = None) -> ProviderError:
    async with provider:
        with pytest.raises(ProviderError) as info:
            await provider.complete("m", USER, tools or [])
    return info.value


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- both providers ---------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_text_reply_and_usage(server: FakeLLMServer, kind: str) -> None:
    server.enqueue(Scripted(text="hello there", input_tokens=42, output_tokens=7))
    async with make(kind, server) as provider:
        reply = await provider.complete("some-model", USER, [])
    assert reply.text == "hello there"
    assert reply.tool_calls == []
    assert (reply.input_tokens, reply.output_tokens) == (42, 7)
    assert reply.finish_reason == {"openai": "stop", "anthropic": "end_turn"}[kind]
    assert reply.response_id
    body = server.requests[0]["body"]
    assert body["model"] == "some-model"
    assert "tools" not in body


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_tool_call_reply(server: FakeLLMServer, kind: str) -> None:
    server.enqueue(Scripted(text="calling", tool_calls=[("echo", '{"text": "hi"}'), ("echo", '{"text": "yo"}')]))
    async with make(kind, server) as provider:
        reply = await provider.complete("m", USER, [ECHO_TOOL])
    assert [c.name for c in reply.tool_calls] == ["echo", "echo"]
    assert [json.loads(c.arguments_json) for c in reply.tool_calls] == [{"text": "hi"}, {"text": "yo"}]
    assert len({c.id for c in reply.tool_calls}) == 2
    assert all(c.id.startswith("call_") for c in reply.tool_calls)
    assert reply.text == "calling"
    assert reply.finish_reason == {"openai": "tool_calls", "anthropic": "tool_use"}[kind]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_key_header_sent(server: FakeLLMServer, kind: str) -> None:
    async with make(kind, server) as provider:
        await provider.complete("m", USER, [])
    headers = server.requests[0]["headers"]
    if kind == "openai":
        assert headers["authorization"] == f"Bearer {KEY}"
        assert "x-api-key" not in headers
    else:
        assert headers["x-api-key"] == KEY
        assert headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in headers


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_no_key_header_without_key(server: FakeLLMServer, kind: str) -> None:
    async with make(kind, server, key=None) as provider:
        reply = await provider.complete("m", USER, [])
    assert reply.text == "done"
    headers = server.requests[0]["headers"]
    assert "authorization" not in headers
    assert "x-api-key" not in headers


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_429_honours_retry_after(server: FakeLLMServer, kind: str) -> None:
    server.enqueue(Scripted(status=429, text="Rate limit reached", headers={"Retry-After": "7"}))
    exc = await fails(make(kind, server))
    assert isinstance(exc, RetryableProviderError)
    assert exc.retry_after_s == 7
    assert exc.status == 429
    assert str(exc) == f"{kind} 429: Rate limit reached"


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_retry_after_ms_wins(server: FakeLLMServer, kind: str) -> None:
    server.enqueue(Scripted(status=429, headers={"retry-after-ms": "1500", "Retry-After": "2"}))
    exc = await fails(make(kind, server))
    assert isinstance(exc, RetryableProviderError)
    assert exc.retry_after_s == 1.5


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [408, 409, 500, 502, 503, 529])
async def test_transient_statuses_are_retryable(server: FakeLLMServer, kind: str, status: int) -> None:
    server.enqueue(Scripted(status=status, text="Overloaded"))
    exc = await fails(make(kind, server))
    assert isinstance(exc, RetryableProviderError)
    assert exc.status == status
    assert exc.retry_after_s is None
    assert "Overloaded" in str(exc)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_500_then_success_when_caller_retries(server: FakeLLMServer, kind: str) -> None:
    server.enqueue(Scripted(status=500, text="boom"), Scripted(text="recovered"))
    async with make(kind, server) as provider:
        with pytest.raises(RetryableProviderError):
            await provider.complete("m", USER, [])
        reply = await provider.complete("m", USER, [])
    assert reply.text == "recovered"
    assert len(server.requests) == 2


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_401_is_fatal_with_provider_message_and_no_key(server: FakeLLMServer, kind: str) -> None:
    # The server echoes the key, as some proxies do: it must still not surface.
    server.enqueue(Scripted(status=401, text=f"Incorrect API key provided: {KEY}"))
    exc = await fails(make(kind, server))
    assert isinstance(exc, FatalProviderError)
    assert exc.status == 401
    assert str(exc).startswith(f"{kind} 401: Incorrect API key provided")
    assert KEY not in str(exc)
    assert KEY not in repr(exc)
    assert KEY not in exc.message
    assert exc.__cause__ is None


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_unknown_model_404_is_fatal(server: FakeLLMServer, kind: str) -> None:
    server.enqueue(Scripted(status=404, text="The model `nope` does not exist"))
    exc = await fails(make(kind, server))
    assert isinstance(exc, FatalProviderError)
    assert str(exc) == f"{kind} 404: The model `nope` does not exist"


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [400, 403, 413, 422])
async def test_other_client_errors_are_fatal(server: FakeLLMServer, kind: str, status: int) -> None:
    server.enqueue(Scripted(status=status, text="bad request"))
    exc = await fails(make(kind, server))
    assert isinstance(exc, FatalProviderError)
    assert exc.status == status


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_non_json_error_body_is_quoted(server: FakeLLMServer, kind: str) -> None:
    server.enqueue(Scripted(status=502, raw_body="<html>Bad Gateway</html>", headers={"Content-Type": "text/html"}))
    exc = await fails(make(kind, server))
    assert isinstance(exc, RetryableProviderError)
    assert str(exc) == f"{kind} 502: <html>Bad Gateway</html>"


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("raw", ['{"choices": [{"mess', "[1, 2]", '{"object": "unexpected"}'])
async def test_malformed_200_is_retryable(server: FakeLLMServer, kind: str, raw: str) -> None:
    server.enqueue(Scripted(raw_body=raw))
    exc = await fails(make(kind, server))
    assert isinstance(exc, RetryableProviderError)
    assert "malformed" in str(exc)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_connection_refused_is_retryable(kind: str) -> None:
    base = f"http://127.0.0.1:{unused_port()}"
    exc = await fails(make(kind, url=base + ("/v1" if kind == "openai" else "")))
    assert isinstance(exc, RetryableProviderError)
    assert str(exc).startswith(f"{kind} request failed: ConnectError")
    assert KEY not in str(exc)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_timeout_is_retryable(kind: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    cls = OpenAIProvider if kind == "openai" else AnthropicProvider
    exc = await fails(cls("http://llm.invalid", SecretStr(KEY), transport=httpx.MockTransport(handler)))
    assert isinstance(exc, RetryableProviderError)
    assert str(exc) == f"{kind} request failed: ReadTimeout: timed out"


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_bad_base_url_is_fatal(kind: str) -> None:
    exc = await fails(make(kind, url="ftp://127.0.0.1/v1"))
    assert isinstance(exc, FatalProviderError)
    assert "bad base URL" in str(exc)


# --- OpenAI wire format -----------------------------------------------------------


TRANSCRIPT = [
    Message(role="system", content="Be brief."),
    Message(role="system", content="Use tools."),
    Message(role="user", content="echo twice"),
    Message(
        role="assistant",
        content="",
        tool_calls=[
            RecordedToolCall(id="call_a", name="echo", arguments_json='{"text": "one"}'),
            RecordedToolCall(id="call_b", name="echo", arguments_json='{"text": "tw'),  # invalid JSON, kept raw
        ],
    ),
    Message(role="tool", tool_call_id="call_a", name="echo", content="one"),
    Message(role="tool", tool_call_id="call_b", name="echo", content="invalid JSON arguments", is_error=True),
    Message(role="user", content="and now?"),
]


@pytest.mark.asyncio
async def test_openai_request_shape(server: FakeLLMServer) -> None:
    async with make("openai", server) as provider:
        await provider.complete("gpt-x", TRANSCRIPT, [ECHO_TOOL])
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    body = request["body"]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "echo", "description": "Echo text back.", "parameters": ECHO_TOOL["parameters"]},
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "echo twice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "echo", "arguments": '{"text": "one"}'}},
                {"id": "call_b", "type": "function", "function": {"name": "echo", "arguments": '{"text": "tw'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "one"},
        {"role": "tool", "tool_call_id": "call_b", "content": "invalid JSON arguments"},
        {"role": "user", "content": "and now?"},
    ]


@pytest.mark.asyncio
async def test_openai_keeps_invalid_arguments_raw(server: FakeLLMServer) -> None:
    server.enqueue(Scripted(tool_calls=[("echo", '{"text": "unterminated')]))
    async with make("openai", server) as provider:
        reply = await provider.complete("m", USER, [ECHO_TOOL])
    assert reply.tool_calls[0].arguments_json == '{"text": "unterminated'
    assert reply.text == ""


@pytest.mark.asyncio
async def test_openai_lenient_server_shapes(server: FakeLLMServer) -> None:
    # Local servers: arguments as an object, no call ids, no usage.
    body = {
        "id": "x1",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"function": {"name": "echo", "arguments": {"text": "hi"}}},
                        {"function": {"name": "echo", "arguments": "{}"}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
    }
    server.enqueue(Scripted(raw_body=json.dumps(body)))
    async with make("openai", server, key=None) as provider:
        reply = await provider.complete("m", USER, [ECHO_TOOL])
    assert [c.id for c in reply.tool_calls] == ["call_0", "call_1"]
    assert json.loads(reply.tool_calls[0].arguments_json) == {"text": "hi"}
    assert (reply.input_tokens, reply.output_tokens) == (0, 0)
    assert reply.response_id == "x1"


@pytest.mark.asyncio
async def test_openai_error_in_200_body_is_named(server: FakeLLMServer) -> None:
    server.enqueue(Scripted(raw_body='{"error": {"message": "upstream exploded"}}'))
    exc = await fails(make("openai", server))
    assert isinstance(exc, RetryableProviderError)
    assert "malformed" in str(exc)
    assert "upstream exploded" in str(exc)


# --- Anthropic wire format --------------------------------------------------------


@pytest.mark.asyncio
async def test_anthropic_request_shape(server: FakeLLMServer) -> None:
    async with make("anthropic", server) as provider:
        await provider.complete("claude-x", TRANSCRIPT, [ECHO_TOOL])
    request = server.requests[0]
    assert request["path"] == "/v1/messages"
    body = request["body"]
    assert body["model"] == "claude-x"
    assert body["max_tokens"] == 4096
    assert body["system"] == "Be brief.\n\nUse tools."
    assert body["tools"] == [
        {"name": "echo", "description": "Echo text back.", "input_schema": ECHO_TOOL["parameters"]}
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "echo twice"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_a", "name": "echo", "input": {"text": "one"}},
                {"type": "tool_use", "id": "call_b", "name": "echo", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "one", "is_error": False},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_b",
                    "content": "invalid JSON arguments",
                    "is_error": True,
                },
                {"type": "text", "text": "and now?"},
            ],
        },
    ]


@pytest.mark.asyncio
async def test_anthropic_merges_same_role_and_drops_empty(server: FakeLLMServer) -> None:
    messages = [
        Message(role="user", content="a"),
        Message(role="user", content="b"),
        Message(role="assistant", content=""),
        Message(role="assistant", content="c"),
        Message(role="user", content="d"),
    ]
    async with make("anthropic", server) as provider:
        await provider.complete("m", messages, [])
    body = server.requests[0]["body"]
    assert "system" not in body
    assert "tools" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
        {"role": "user", "content": [{"type": "text", "text": "d"}]},
    ]


@pytest.mark.asyncio
async def test_anthropic_tool_use_arguments_are_canonical_json(server: FakeLLMServer) -> None:
    server.enqueue(Scripted(tool_calls=[("echo", '{"z": 1, "a": [2]}'), ("echo", "not json")]))
    async with make("anthropic", server) as provider:
        reply = await provider.complete("m", USER, [ECHO_TOOL])
    assert reply.tool_calls[0].arguments_json == '{"a": [2], "z": 1}'
    assert json.loads(reply.tool_calls[1].arguments_json) == {"_raw": "not json"}


# --- the fake server itself -------------------------------------------------------


@pytest.mark.asyncio
async def test_fake_server_default_callable_and_routes() -> None:
    seen: list[dict[str, Any]] = []

    def answer(body: dict[str, Any]) -> Scripted:
        seen.append(body)
        return Scripted(text=f"echo {body['model']}")

    with FakeLLMServer(default=answer) as server:
        server.enqueue(Scripted(text="queued"))
        async with httpx.AsyncClient() as client:
            missing = await client.post(f"{server.anthropic_url}/nope", json={})
        async with make("openai", server) as provider:
            first = await provider.complete("m1", USER, [])
            second = await provider.complete("m2", USER, [])
    assert missing.status_code == 404
    assert (first.text, second.text) == ("queued", "echo m2")
    assert [b["model"] for b in seen] == ["m2"]
    assert [r["path"] for r in server.requests] == ["/nope", "/v1/chat/completions", "/v1/chat/completions"]


@pytest.mark.asyncio
@pytest.mark.parametrize(("kind", "variable"), [("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY")])
async def test_the_official_endpoint_without_a_key_fails_at_once(kind: str, variable: str) -> None:
    """No request is sent (offline it would be retried for half a minute): the missing variable is named."""
    official = "https://api.openai.com/v1" if kind == "openai" else "https://api.anthropic.com"
    exc = await fails(make(kind, key=None, url=official))
    assert isinstance(exc, FatalProviderError) and exc.message.startswith(f"{variable} is not set")


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_a_keyless_server_of_ones_own_still_works(server: FakeLLMServer, kind: str) -> None:
    server.enqueue(Scripted(text="no key needed"))
    reply = await make(kind, server, key=None).complete("m", USER, [])
    assert reply.text == "no key needed"
