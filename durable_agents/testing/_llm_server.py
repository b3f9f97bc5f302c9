"""A real HTTP server on 127.0.0.1 that speaks the OpenAI Chat Completions and
Anthropic Messages wire formats, for tests and benchmarks.

Replies are scripted: ``enqueue`` adds ``Scripted`` replies (FIFO); when the
queue is empty, ``default`` answers (a ``Scripted``, or a callable given the
parsed request body). Every request is recorded in ``requests``.

    with FakeLLMServer() as server:
        server.enqueue(Scripted(tool_calls=[("echo", '{"text": "hi"}')]), Scripted(text="done"))
        provider = OpenAIProvider(server.openai_url, None)

Routes: ``POST /v1/chat/completions`` (OpenAI) and ``POST /v1/messages``
(Anthropic); anything else is a 404 that consumes no scripted reply.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from durable_agents.testing._dedupe_server import QuietServer

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


@dataclass
class Scripted:
    """One scripted reply.

    ``tool_calls`` are ``(tool name, raw arguments string)``; the string may be
    invalid JSON (OpenAI format sends it verbatim; Anthropic, which can only send
    objects, gets ``{"_raw": raw}`` unless it decodes to an object). A non-200
    ``status`` renders a provider-style error body with ``text`` as its message.
    ``raw_body`` replaces the rendered body (or a stream's events) verbatim. ``headers`` are always sent.
    ``delay_s`` makes the server wait that long before answering (a slow model);
    ``stop()`` cuts the wait short and drops the connection without an answer.
    A request with ``"stream": true`` is answered in the provider's SSE wire format (OpenAI
    ``chat.completion.chunk`` events and ``data: [DONE]``, usage last when ``stream_options.include_usage``;
    Anthropic ``message_start`` ... ``message_stop``), the text in pieces of ``chunk_chars``, each followed by
    a pause of ``piece_delay_s`` (a model writing at a given speed; none by default). A streamed request's
    entry gets ``text_sent_at``: the ``time.time()`` each text piece went out, in order (``first_text_at``
    is the first one's ``time.monotonic()``), so a reader's latency per piece can be measured.
    ``hold`` makes the server send the first piece and then wait for that event before the rest (a test
    sees a delta while the turn is still open); a reply with no text (or not streamed) waits for it
    before anything is sent; ``cut_after`` drops the connection after that many events (a model failing
    mid-stream). What is sent is recorded with the request (``requests[i]["reply"]``) before any hold.
    ``honest_usage`` reports usage as a real server would: input tokens from the size of the
    request (its JSON bytes / 4), output tokens ``output_tokens`` cut at the request's own cap
    (``max_tokens`` or ``max_completion_tokens``, when it sends one). The reported usage is
    recorded with the request (``requests[i]["usage"]``: ``(input, output)``).
    """

    text: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: str | None = None
    input_tokens: int = 10
    output_tokens: int = 5
    delay_s: float = 0.0
    honest_usage: bool = False
    chunk_chars: int = 4
    hold: threading.Event | None = None
    cut_after: int = 0
    piece_delay_s: float = 0.0

    def usage(self, body: dict[str, Any]) -> tuple[int, int]:
        if not self.honest_usage:
            return self.input_tokens, self.output_tokens
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        output = min(self.output_tokens, cap) if isinstance(cap, int) and cap > 0 else self.output_tokens
        return len(json.dumps(body).encode()) // 4, output


Default = Scripted | Callable[[dict[str, Any]], Scripted]


class FakeLLMServer:
    """Scripted LLM server on an ephemeral 127.0.0.1 port; thread-safe."""

    def __init__(self, default: Default | None = None) -> None:
        self.default: Default = default if default is not None else Scripted(text="done")
        self.requests: list[dict[str, Any]] = []
        self._queue: deque[Scripted] = deque()
        self._lock = threading.Lock()
        self._counter = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> FakeLLMServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = QuietServer(("127.0.0.1", 0), _handler_for(self))
        httpd.daemon_threads = True
        self._httpd = httpd
        # A short poll interval keeps stop() (which waits for one poll) from slowing every test down.
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-llm-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()  # wakes handlers sleeping on a reply's delay_s
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("FakeLLMServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- scripting ------------------------------------------------------------------

    def enqueue(self, *replies: Scripted) -> None:
        with self._lock:
            self._queue.extend(replies)

    def _record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)

    def _next(self, body: dict[str, Any]) -> Scripted:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        default = self.default
        return default if isinstance(default, Scripted) else default(body)

    def _next_id(self) -> int:
        with self._lock:
            self._counter += 1
            return self._counter

    # --- rendering ------------------------------------------------------------------

    def render(self, path: str, body: dict[str, Any], reply: Scripted) -> str:
        """The response body for ``reply`` in the wire format of ``path``."""
        if reply.raw_body is not None:
            return reply.raw_body
        if reply.status != 200:
            return _error_body(path, reply.status, reply.text or "error")
        if path == OPENAI_PATH:
            return json.dumps(self._openai(body, reply))
        return json.dumps(self._anthropic(body, reply))

    def _openai(self, body: dict[str, Any], reply: Scripted) -> dict[str, Any]:
        input_tokens, output_tokens = reply.usage(body)
        n = self._next_id()
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["content"] = reply.text or None
            message["tool_calls"] = [
                {"id": f"call_{self._next_id()}", "type": "function", "function": {"name": name, "arguments": raw}}
                for name, raw in reply.tool_calls
            ]
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}
            ],
            "usage": {
                "prompt_tokens": input_tokens,
                "completion_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
            },
        }

    def _anthropic(self, body: dict[str, Any], reply: Scripted) -> dict[str, Any]:
        input_tokens, output_tokens = reply.usage(body)
        n = self._next_id()
        content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
        for name, raw in reply.tool_calls:
            content.append({"type": "tool_use", "id": f"call_{self._next_id()}", "name": name, "input": _as_input(raw)})
        return {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", ""),
            "content": content,
            "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]


def openai_events(server: FakeLLMServer, body: dict[str, Any], reply: Scripted) -> list[str]:
    """The SSE ``data:`` payloads of a streamed chat completion (OpenAI's chunk shapes)."""
    input_tokens, output_tokens = reply.usage(body)
    n = server._next_id()
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        data: dict[str, Any] = {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            data["usage"] = None
        return json.dumps(data)

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in _pieces(reply.text, reply.chunk_chars)]
    for index, (name, raw) in enumerate(reply.tool_calls):
        first = {"index": index, "id": f"call_{server._next_id()}", "type": "function"}
        events.append(chunk({"tool_calls": [{**first, "function": {"name": name, "arguments": ""}}]}))
        events += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in _pieces(raw, reply.chunk_chars * 2)
        ]
    events.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
    if include_usage:
        usage = {"prompt_tokens": input_tokens, "completion_tokens": output_tokens}
        usage["total_tokens"] = input_tokens + output_tokens
        events.append(
            json.dumps(
                {
                    "id": f"chatcmpl-{n}",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": body.get("model", ""),
                    "choices": [],
                    "usage": usage,
                }
            )
        )
    return [f"data: {e}\n\n" for e in events] + ["data: [DONE]\n\n"]


def anthropic_events(server: FakeLLMServer, body: dict[str, Any], reply: Scripted) -> list[str]:
    """The SSE events of a streamed Messages API response (Anthropic's event shapes)."""
    input_tokens, output_tokens = reply.usage(body)
    n = server._next_id()

    def event(name: str, data: dict[str, Any]) -> str:
        return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

    message = {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", ""),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    events = [event("message_start", {"message": message}), event("ping", {})]
    index = 0
    if reply.text:
        events.append(event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}))
        events += [
            event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}})
            for piece in _pieces(reply.text, reply.chunk_chars)
        ]
        events.append(event("content_block_stop", {"index": 0}))
        index = 1
    for name, raw in reply.tool_calls:
        block = {"type": "tool_use", "id": f"call_{server._next_id()}", "name": name, "input": {}}
        events.append(event("content_block_start", {"index": index, "content_block": block}))
        events += [
            event("content_block_delta", {"index": index, "delta": {"type": "input_json_delta", "partial_json": p}})
            for p in _pieces(json.dumps(_as_input(raw)), reply.chunk_chars * 2)
        ]
        events.append(event("content_block_stop", {"index": index}))
        index += 1
    stop = "tool_use" if reply.tool_calls else "end_turn"
    delta = {"stop_reason": stop, "stop_sequence": None}
    events.append(event("message_delta", {"delta": delta, "usage": {"output_tokens": output_tokens}}))
    events.append(event("message_stop", {}))
    return events


def _as_input(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": raw}


def _error_body(path: str, status: int, message: str) -> str:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    if path == ANTHROPIC_PATH:
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}})
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


def _handler_for(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, so benchmarks measure the agent, not TCP setup
        disable_nagle_algorithm = True  # headers and body go out in two writes; Nagle would add ~40 ms

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {"_unparsed": raw.decode("utf-8", "replace")}
            path = self.path.split("?", 1)[0]
            headers = {k.lower(): v for k, v in self.headers.items()}
            entry: dict[str, Any] = {"path": path, "headers": headers, "body": body}
            server._record(entry)
            if path not in (OPENAI_PATH, ANTHROPIC_PATH):
                self._send(404, _error_body(path, 404, f"no route for POST {path}"), {})
                return
            try:
                parsed = body if isinstance(body, dict) else {}
                reply = server._next(parsed)
                streamed = parsed.get("stream") is True and reply.status == 200
                if streamed and reply.raw_body is not None:
                    events, payload = [reply.raw_body], ""  # a stream's body verbatim (a broken server)
                elif streamed:
                    events = (openai_events if path == OPENAI_PATH else anthropic_events)(server, parsed, reply)
                    payload = ""
                else:
                    payload = server.render(path, parsed, reply)
                entry["usage"] = reply.usage(parsed)
                entry["reply"] = payload or "".join(events)  # what is sent (kept before a ``hold``)
            except Exception as exc:  # a broken test callable should fail the call, not hang it
                self._send(500, _error_body(path, 500, f"fake server error: {exc!r}"), {})
                return
            if reply.delay_s > 0 and server._stopping.wait(reply.delay_s):
                self.close_connection = True  # stopped while waiting: no answer
                return
            if streamed and reply.text:
                self._stream(events, reply, entry)
                return
            while reply.hold is not None and not reply.hold.wait(0.05):
                if server._stopping.is_set():
                    self.close_connection = True
                    return
            if streamed:
                self._stream(events, reply, entry)
            else:
                self._send(reply.status, payload, reply.headers)

        def _stream(self, events: list[str], reply: Scripted, entry: dict[str, Any]) -> None:
            """Write the events one by one (the end of the body is the connection's close); the request's
            entry gets ``first_text_at``, the ``time.monotonic()`` its first text went out, and ``text_sent_at``,
            the ``time.time()`` of each text event written."""
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.end_headers()
            texts = 0
            sent_at: list[float] = entry.setdefault("text_sent_at", [])
            try:
                for sent, event in enumerate(events, start=1):
                    self.wfile.write(event.encode("utf-8"))
                    self.wfile.flush()
                    text = '"text_delta"' in event or ('"content": "' in event and '"content": ""' not in event)
                    if text:
                        sent_at.append(time.time())
                    if reply.cut_after and sent >= reply.cut_after:
                        return  # the connection drops mid-stream
                    if text:
                        texts += 1
                        entry.setdefault("first_text_at", time.monotonic())
                        if texts == 1 and reply.hold is not None:
                            while not reply.hold.wait(0.05):
                                if server._stopping.is_set():
                                    return
                        if reply.piece_delay_s > 0 and server._stopping.wait(reply.piece_delay_s):
                            return  # stopped while the model "writes"
            except (BrokenPipeError, ConnectionResetError):
                return

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            server._record({"path": path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": {}})
            self._send(404, _error_body(path, 404, f"no route for GET {path}"), {})

        def _send(self, status: int, payload: str, headers: dict[str, str]) -> None:
            data = payload.encode("utf-8")
            self.send_response(status)
            if not any(k.lower() == "content-type" for k in headers):
                self.send_header("Content-Type", "application/json")
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
