"""The built-in tools, called through the registry against a real sandbox and a real local HTTP server."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from activities.catalog import tool_registry
from activities.sandbox.local.backend import LocalLimits, LocalSandbox, LocalSandboxBackend, clear_probe_cache
from activities.settings import Settings
from activities.tools import ToolContext, ToolError
from activities.tools.http import MAX_HTTP_BODY_BYTES, HttpRequestArgs
from workflows.types import RecordedToolCall, ToolInvocation

REGISTRY = tool_registry(Settings())  # the built-ins only

BIG = 300_000


def require_bwrap() -> None:
    if shutil.which("bwrap") is None:
        pytest.fail(
            "bubblewrap (bwrap) is required for the sandbox tests: install it with `apt-get install bubblewrap`"
        )


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    port: int
    requests: list[Seen] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server(port=0)

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            state.requests.append(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if self.path == "/hello":
                self._reply(200, b"hello world", "text/plain; charset=utf-8")
            elif self.path == "/big":
                self._reply(200, b"a" * BIG, "text/plain")
            elif self.path == "/missing":
                self._reply(404, b"no such thing", "text/plain")
            elif self.path == "/echo":
                self._reply(201, json.dumps({"got": body.decode()}).encode(), "application/json")
            elif self.path.startswith("/to/"):
                self.send_response(302)
                self.send_header("Location", self.path[len("/to/") :].replace("PORT", str(state.port)))
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._reply(500, b"unexpected", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[LocalSandbox]:
    require_bwrap()
    backend = LocalSandboxBackend(tmp_path / "sandboxes", LocalLimits(timeout_s=20))
    box = await backend.create("tools-run", metadata={})
    yield box
    await box.kill()


def ctx_for(
    tool: str, *, allow: tuple[str, ...] = (), sandbox: Any = None, key: str = "wf-1/step-3/call-0"
) -> ToolContext:
    invocation = ToolInvocation(
        conversation_id="conv-1",
        workflow_id="wf-1",
        step=3,
        call_id="call-0",
        call_index=0,
        seq=7,
        tool=tool,
        arguments={},
        idempotency_key=key,
        sandbox_id="tools-run",
    )
    return ToolContext(invocation=invocation, settings=Settings(http_allow=allow), sandbox=sandbox)


async def call(name: str, arguments: dict[str, Any], ctx: ToolContext) -> str:
    """Validate like the workflow does (raw JSON -> canonical dump) and then run the tool function."""
    validated = REGISTRY.validate_call(
        RecordedToolCall(id="c1", name=name, arguments_json=json.dumps(arguments)), enabled=[name]
    )
    assert not validated.error, validated.error
    spec = REGISTRY.get(name)
    assert spec is not None
    return await spec.fn(spec.args_model.model_validate(validated.arguments), ctx)


@pytest.mark.asyncio
async def test_get_allowed_host(server: Server) -> None:
    ctx = ctx_for("http_request", allow=(f"127.0.0.1:{server.port}",))
    text = await call("http_request", {"method": "get", "url": server.base + "/hello"}, ctx)
    assert text == "HTTP 200 OK\ncontent-type: text/plain; charset=utf-8\n\nhello world"
    assert server.requests[0].method == "GET" and "idempotency-key" not in server.requests[0].headers
    # a port range names the port too; error statuses are results, not errors
    text = await call(
        "http_request",
        {"method": "GET", "url": server.base + "/missing"},
        ctx_for("http_request", allow=(f"127.0.0.1:{server.port - 1}-{server.port + 1}",)),
    )
    assert text.startswith("HTTP 404 Not Found\n") and text.endswith("no such thing")
    head = await call("http_request", {"method": "HEAD", "url": server.base + "/hello"}, ctx)
    assert head == "HTTP 200 OK\ncontent-type: text/plain; charset=utf-8\n\n"


@pytest.mark.asyncio
async def test_host_not_allowed_is_refused_without_a_request(server: Server) -> None:
    for allow in (
        (),
        ("example.com",),
        (f"127.0.0.1:{server.port + 1}",),
        (f"localhost:{server.port}",),
        ("127.0.0.1",),  # no port: 80 and 443 only
    ):
        with pytest.raises(ToolError, match=r"127\.0\.0\.1.*AGENT_HTTP_ALLOW"):
            await call(
                "http_request", {"method": "GET", "url": server.base + "/hello"}, ctx_for("http_request", allow=allow)
            )
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/x", "/relative"):
        validated = REGISTRY.validate_call(
            RecordedToolCall(id="c", name="http_request", arguments_json=json.dumps({"method": "GET", "url": url})),
            ["http_request"],
        )
        assert "not an absolute http:// or https:// URL" in validated.error
    assert server.requests == []


@pytest.mark.asyncio
async def test_redirects_are_rechecked(server: Server) -> None:
    ctx = ctx_for("http_request", allow=(f"127.0.0.1:{server.port}",))
    # to the same allowed host: followed
    text = await call("http_request", {"method": "GET", "url": server.base + "/to//hello"}, ctx)
    assert text.endswith("hello world") and [r.path for r in server.requests] == ["/to//hello", "/hello"]
    server.requests.clear()
    # to a host name that is not on the list (same server, so a followed hop would show up): refused
    with pytest.raises(ToolError, match=r"redirect .* refused: host localhost:\d+ is not allowed.*AGENT_HTTP_ALLOW"):
        await call("http_request", {"method": "GET", "url": server.base + "/to/http://localhost:PORT/hello"}, ctx)
    assert [r.path for r in server.requests] == ["/to/http://localhost:PORT/hello"]


@pytest.mark.asyncio
async def test_post_carries_the_invocation_idempotency_key(server: Server) -> None:
    ctx = ctx_for("http_request", allow=(f"127.0.0.1:{server.port}",), key="wf-9/step-2/call-1")
    args = {"method": "POST", "url": server.base + "/echo", "json": {"n": 1}}
    first = await call("http_request", args, ctx)
    second = await call("http_request", args, ctx)  # a retry of the same invocation
    assert first == second and first.startswith("HTTP 201 Created\ncontent-type: application/json\n\n")
    assert [r.headers["idempotency-key"] for r in server.requests] == ["wf-9/step-2/call-1"] * 2
    assert json.loads(server.requests[0].body) == {"n": 1}
    await call("http_request", {"method": "PUT", "url": server.base + "/echo", "body": "raw"}, ctx)
    assert server.requests[-1].body == b"raw" and server.requests[-1].headers["idempotency-key"] == "wf-9/step-2/call-1"


@pytest.mark.asyncio
async def test_large_body_is_truncated(server: Server) -> None:
    text = await call(
        "http_request",
        {"method": "GET", "url": server.base + "/big"},
        ctx_for("http_request", allow=(f"127.0.0.1:{server.port}",)),
    )
    assert text.endswith(f"\n(body truncated at {MAX_HTTP_BODY_BYTES} bytes of {BIG})")
    body = text.split("\n\n", 1)[1].rsplit("\n(body truncated", 1)[0]
    assert body == "a" * MAX_HTTP_BODY_BYTES


@pytest.mark.asyncio
async def test_invalid_http_arguments_reach_the_model() -> None:
    for bad in (
        {"method": "TRACE", "url": "http://x"},
        {"url": "http://x"},
        {"method": "POST", "url": "http://x", "json": 1, "body": "b"},
    ):
        validated = REGISTRY.validate_call(
            RecordedToolCall(id="c", name="http_request", arguments_json=json.dumps(bad)), ["http_request"]
        )
        assert validated.error.startswith("Error: invalid arguments for http_request")
    with pytest.raises(ToolError, match="cannot be set"):
        await call(
            "http_request",
            {"method": "GET", "url": "http://127.0.0.1/", "headers": {"Host": "evil"}},
            ctx_for("http_request", allow=("127.0.0.1",)),
        )


def test_http_request_schema() -> None:
    spec = REGISTRY.get("http_request")
    assert spec is not None
    schema = spec.json_schema()
    assert list(schema["properties"]) == ["method", "url", "headers", "json", "body"]
    assert schema["required"] == ["method", "url"]
    assert all(prop.get("description") for prop in schema["properties"].values())
    dumped = HttpRequestArgs.model_validate({"method": "post", "url": "http://h", "json": [1]}).model_dump(mode="json")
    assert dumped["json"] == [1] and dumped["method"] == "POST" and "json_body" not in dumped
    assert spec.side_effect and not spec.uses_sandbox and spec.max_attempts == 5 and spec.timeout_s == 60


def test_tool_settings() -> None:
    tools = {spec.name: spec for spec in REGISTRY.specs()}
    for name in ("run_python", "run_shell"):
        spec = tools[name]
        assert (spec.side_effect, spec.uses_sandbox, spec.timeout_s, spec.max_attempts, spec.heartbeat_s) == (
            False,
            True,
            120,
            2,
            0,
        )
    for name in ("write_file", "read_file"):
        assert tools[name].uses_sandbox
    for name in ("run_python", "run_shell", "write_file", "read_file", "http_request"):
        properties = tools[name].json_schema()["properties"].values()
        assert all(p.get("description") for p in properties), name


@pytest.mark.asyncio
async def test_write_then_read_file(sandbox: LocalSandbox) -> None:
    ctx = ctx_for("write_file", sandbox=sandbox)
    assert (
        await call("write_file", {"path": "notes/a.txt", "content": "héllo\n"}, ctx) == "wrote 7 bytes to notes/a.txt"
    )
    assert await call("read_file", {"path": "notes/a.txt"}, ctx) == "héllo\n"
    with pytest.raises(ToolError, match="outside the workspace"):
        await call("read_file", {"path": "/etc/passwd"}, ctx)
    with pytest.raises(ToolError, match="escapes the workspace"):
        await call("write_file", {"path": "../escape.txt", "content": "x"}, ctx)
    with pytest.raises(ToolError, match="no such file"):
        await call("read_file", {"path": "nope.txt"}, ctx)


@pytest.mark.asyncio
async def test_run_shell_and_python(sandbox: LocalSandbox) -> None:
    ctx = ctx_for("run_shell", sandbox=sandbox)
    assert await call("run_shell", {"command": "echo hi"}, ctx) == "exit_code: 0\nstdout:\nhi\n\nstderr: (empty)"
    await call("write_file", {"path": "data.txt", "content": "21"}, ctx)
    out = await call("run_python", {"code": "print(int(open('data.txt').read()) * 2)\nimport sys; sys.exit(3)"}, ctx)
    assert out == "exit_code: 3\nstdout:\n42\n\nstderr: (empty)"
    failing = await call("run_python", {"code": "raise ValueError('boom')"}, ctx)
    assert "ValueError: boom" in failing and "exit_code: 1" in failing


@pytest.mark.asyncio
async def test_a_sandbox_that_cannot_isolate_is_an_error_the_model_reads(
    sandbox: LocalSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No retry can install bubblewrap: the tool reports it instead of failing the activity."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    clear_probe_cache()
    try:
        with pytest.raises(ToolError, match="bubblewrap"):
            await call("run_shell", {"command": "true"}, ctx_for("run_shell", sandbox=sandbox))
    finally:
        monkeypatch.undo()
        clear_probe_cache()
