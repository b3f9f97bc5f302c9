"""Egress and policy against hostile spellings: ports, always-denied endpoints, canonical URLs, shell rules.

Everything goes through real HTTP servers on 127.0.0.1 (and, for Temporal's own
HTTP API, a real dev server); a refused request must never reach its server.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.approvals import load_policy
from activities.catalog import tool_registry
from activities.runtime import Runtime
from activities.settings import ConfigurationError, ObservabilitySettings, Settings, TemporalSettings, WorkerSettings
from activities.tools import ToolContext, ToolError
from activities.tools.urls import canonical_url, host_allowed
from tests.conftest import WorkerFactory, start_agent, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.fakes.worker_proc import DevServer, free_port
from workflows.agent import AgentWorkflow
from workflows.policy import Policy, decide, parse_run_policy
from workflows.types import RecordedToolCall, ToolInvocation

REGISTRY = tool_registry(Settings())


@dataclass
class Server:
    port: int = 0
    paths: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def server() -> Iterator[Server]:
    """Answers 200 with the path it saw; ``/to/<url>`` redirects to ``<url>``."""
    state = Server()

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            state.paths.append(self.path)
            if self.path.startswith("/to/"):
                self.send_response(302)
                self.send_header("Location", self.path[len("/to/") :])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = f"saw {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield state
    httpd.shutdown()
    httpd.server_close()


def settings_for(allow: tuple[str, ...], **changes: Any) -> Settings:
    return replace(Settings(http_allow=allow), **changes)


def validated(arguments: dict[str, Any], settings: Settings | None = None) -> tuple[dict[str, Any], str]:
    """What the model activity hands the workflow: canonical arguments, or the error the model reads."""
    call = REGISTRY.validate_call(
        RecordedToolCall(id="c1", name="http_request", arguments_json=json.dumps(arguments)),
        ["http_request"],
        settings,
    )
    return call.arguments, call.error


async def request(arguments: dict[str, Any], settings: Settings) -> str:
    """Run the tool the way its activity does, on the arguments validation produced (no precheck)."""
    args, error = validated(arguments)
    assert not error, error
    spec = REGISTRY.get("http_request")
    assert spec is not None
    invocation = ToolInvocation(
        conversation_id="conv",
        workflow_id="wf",
        step=1,
        call_id="c1",
        call_index=0,
        seq=2,
        tool="http_request",
        arguments=args,
        idempotency_key="wf/step-1/call-0",
    )
    return await spec.fn(spec.args_model.model_validate(args), ToolContext(invocation=invocation, settings=settings))


async def refused(arguments: dict[str, Any], settings: Settings, match: str) -> None:
    """Refused before any approval (validation) and again by the tool itself (connect time)."""
    _, error = validated(arguments, settings)
    assert error.startswith("Error: http_request refused: ") and error.endswith("It was not run."), error
    assert match in error, error
    with pytest.raises(ToolError, match=re.escape(match)):
        await request(arguments, settings)


# --- ports ------------------------------------------------------------------------------------------------------


async def test_an_entry_without_a_port_allows_only_80_and_443(server: Server) -> None:
    get = {"method": "GET", "url": f"{server.base}/hello"}
    await refused(get, settings_for(("127.0.0.1",)), "an entry without a port allows only ports 80 and 443")
    assert server.paths == []
    for url in ("http://127.0.0.1/", "https://127.0.0.1/", "http://127.0.0.1:443/", "https://127.0.0.1:80/"):
        assert host_allowed(httpx.URL(url), ["127.0.0.1"]), url
    assert not host_allowed(httpx.URL("http://127.0.0.1:8080/"), ["127.0.0.1"])
    # naming the port (or a range holding it) opens it
    for allow in (f"127.0.0.1:{server.port}", f"127.0.0.1:{server.port - 5}-{server.port + 5}"):
        assert await request(get, settings_for((allow,))) == "HTTP 200 OK\ncontent-type: text/plain\n\nsaw /hello"
    assert not host_allowed(httpx.URL(f"{server.base}/"), [f"127.0.0.1:{server.port + 1}-{server.port + 9}"])


# --- always denied ----------------------------------------------------------------------------------------------


def _endpoint_settings(port: int) -> dict[str, Settings]:
    """Settings in which ``port`` (on this host) is one of the worker's own endpoints."""
    allow = (f"127.0.0.1:{port}", f"localhost:{port}", f"127.0.0.2:{port}", f"{socket.gethostname()}:{port}")
    base = settings_for(allow)
    return {
        "the worker's Temporal frontend": replace(base, temporal=TemporalSettings(address=f"localhost:{port}")),
        "the worker's Temporal HTTP API": replace(base, temporal=TemporalSettings(address=f"127.0.0.1:{port - 10}")),
        "the worker's Temporal HTTP API ": replace(base, temporal=TemporalSettings(http_port=port)),
        "the Temporal Web UI": replace(base, temporal=TemporalSettings(ui_url=f"http://localhost:{port}")),
        "the worker's metrics endpoint": replace(base, observability=ObservabilitySettings(metrics_port=port)),
        "the worker's health endpoint": replace(base, worker=WorkerSettings(health_port=port)),
        "the run store (PostgreSQL)": replace(base, store_url=f"postgresql://agent:pw@localhost:{port}/agents"),
        "the run store (PostgreSQL) ": replace(base, store_url=f"host=localhost port={port} dbname=agents password=pw"),
    }


async def test_the_workers_own_endpoints_are_denied_even_when_allow_listed(server: Server) -> None:
    for what, settings in _endpoint_settings(server.port).items():
        # the same host, however it is spelled: loopback, another loopback address, a resolved host name
        for host in ("127.0.0.1", "localhost", "127.0.0.2", "[::ffff:127.0.0.1]"):
            get = {"method": "GET", "url": f"http://{host}:{server.port}/api/v1/namespaces/default/workflows"}
            if host == "[::ffff:127.0.0.1]":
                settings = replace(settings, http_allow=(*settings.http_allow, f"[::ffff:127.0.0.1]:{server.port}"))
            await refused(get, settings, f"is {what.strip()}: always denied")
    assert server.paths == []


async def test_a_redirect_to_the_workers_own_endpoint_is_refused(server: Server) -> None:
    metrics = free_port()
    settings = settings_for(
        (f"127.0.0.1:{server.port}", f"localhost:{metrics}"),
        observability=ObservabilitySettings(metrics_port=metrics),
    )
    url = f"{server.base}/to/http://localhost:{metrics}/metrics"
    with pytest.raises(ToolError, match=rf"redirect to http://localhost:{metrics}/metrics refused: .*metrics endpoint"):
        await request({"method": "GET", "url": url}, settings)
    assert server.paths == [f"/to/http://localhost:{metrics}/metrics"]


async def test_a_host_name_is_checked_on_the_addresses_it_resolves_to(server: Server) -> None:
    name = socket.gethostname()
    addresses = {info[4][0] for info in socket.getaddrinfo(name, None)}
    assert addresses, f"this host's name {name!r} must resolve (it does on every Linux host)"
    settings = _endpoint_settings(server.port)["the worker's metrics endpoint"]
    # nothing about the name says "local": only resolving it does, at connect time
    _, error = validated({"method": "GET", "url": f"http://{name}:{server.port}/metrics"}, settings)
    assert error == ""
    with pytest.raises(ToolError, match=rf"{re.escape(name)} \(.+\):{server.port} is the worker's metrics endpoint"):
        await request({"method": "GET", "url": f"http://{name}:{server.port}/metrics"}, settings)
    assert server.paths == []


async def test_cloud_metadata_addresses_are_denied_even_when_allow_listed(server: Server) -> None:
    spellings = (
        "169.254.169.254",
        "2852039166",  # 169.254.169.254 as one number
        "0xa9.254.0xa9.254",
        "[::ffff:169.254.169.254]",
        "[fd00:ec2::254]",
        "[fe80::1]",
    )
    settings = settings_for((*spellings, f"127.0.0.1:{server.port}"))
    for host in spellings:
        await refused({"method": "GET", "url": f"http://{host}/latest/meta-data/"}, settings, "metadata address")
    # after a redirect too: the allowed server sends the client on to the metadata service
    with pytest.raises(ToolError, match=r"redirect to http://169\.254\.169\.254/latest/meta-data/ refused: .*metadata"):
        await request({"method": "GET", "url": f"{server.base}/to/http://169.254.169.254/latest/meta-data/"}, settings)
    assert server.paths == ["/to/http://169.254.169.254/latest/meta-data/"]


@pytest.fixture(scope="module")
def http_dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """A real dev server whose HTTP API is on its frontend port + 10, as Temporal's default configuration has it."""
    tmp = tmp_path_factory.mktemp("egress-dev")
    for _ in range(20):
        dev = DevServer(tmp / "temporal.db", tmp / "temporal.log")
        dev.http_port = dev.port + TEN
        if _free(dev.http_port):
            break
    dev.start()
    yield dev
    dev.kill()


TEN = 10


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_temporals_own_http_api_is_denied(http_dev_server: DevServer) -> None:
    dev = http_dev_server
    listing = f"http://127.0.0.1:{dev.http_port}/api/v1/namespaces/default/workflows"
    async with httpx.AsyncClient() as client:  # the attack of the issue: this lists every run, with its task
        assert (await client.get(listing)).status_code == 200
    worker = Settings(temporal=TemporalSettings(address=dev.address))
    # AGENT_HTTP_ALLOW=127.0.0.1 no longer opens the API's port at all ...
    await refused(
        {"method": "GET", "url": listing}, replace(worker, http_allow=("127.0.0.1",)), "only ports 80 and 443"
    )
    # ... and naming it does not either: the frontend's HTTP port is always denied (port + 10, or TEMPORAL_HTTP_PORT)
    named = replace(worker, http_allow=(f"127.0.0.1:{dev.http_port}", f"127.0.0.1:{dev.port}"))
    await refused({"method": "GET", "url": listing}, named, "is the worker's Temporal HTTP API: always denied")
    frontend = {"method": "POST", "url": f"http://localhost:{dev.port}/", "body": "x"}
    await refused(frontend, replace(named, http_allow=(f"localhost:{dev.port}",)), "is the worker's Temporal frontend")
    assert Settings.from_env({"TEMPORAL_HTTP_PORT": str(dev.http_port)}).temporal.http_port == dev.http_port
    with pytest.raises(ConfigurationError, match="TEMPORAL_HTTP_PORT"):
        Settings.from_env({"TEMPORAL_HTTP_PORT": "http"})


# --- canonical URLs ---------------------------------------------------------------------------------------------

DENY_ADMIN = Policy.model_validate(
    {
        "rules": [
            {
                "name": "no-admin",
                "tool": "http_request",
                "when": {"url": "^http://[^/]+/admin(/|$)"},
                "decision": "deny",
            }
        ]
    }
)


def test_policy_sees_the_canonical_url() -> None:
    for url in (
        "http://api.test/./admin",
        "http://api.test/x/../admin",
        "http://api.test/%61dmin",
        "http://api.test/%2e%2e/%61%64%6D%69%6E/",
        "HTTP://API.TEST:80/admin",
        "http://api.test/x\\..\\admin",
        "http://API.test./admin#fragment",
    ):
        args, error = validated({"method": "POST", "url": url})
        assert not error, error
        assert args["url"] in ("http://api.test/admin", "http://api.test/admin/"), (url, args["url"])
        verdict = decide(DENY_ADMIN, None, "http_request", args, side_effect=True)
        assert (verdict.verdict, verdict.rule) == ("deny", "no-admin"), url
    # a port that is not the scheme's default is kept
    args, _ = validated({"method": "GET", "url": "HTTPS://api.test:8443/x/../admin"})
    assert args["url"] == "https://api.test:8443/admin"
    # canonical twice is canonical once
    for url in ("http://[::FFFF:7F00:1]:8080/a/%7e/b?q=%7e%2f", "http://0x7f.1/", "http://bücher.test/ä"):
        once = canonical_url(url)
        assert canonical_url(once) == once and str(httpx.URL(once)) == once


def test_urls_with_credentials_are_refused() -> None:
    for url in ("http://user@api.test/admin", "http://user:pw@api.test/", "http://a\\b@api.test/"):
        _, error = validated({"method": "GET", "url": url})
        assert "URLs with credentials (user:password@host) are refused" in error, url
    for url in ("ftp://api.test/", "//api.test/", "http://%6cocalhost/", "http://api.test:0/", "http://1.2.3.4.5/"):
        _, error = validated({"method": "GET", "url": url})
        assert error.startswith("Error: invalid arguments for http_request: url:"), (url, error)


async def test_the_canonical_url_is_the_one_requested(server: Server) -> None:
    settings = settings_for((f"127.0.0.1:{server.port}",))
    for path, seen in (
        ("/x/../%61dmin/./y", "/admin/y"),
        ("/%2e%2e/admin", "/admin"),
        ("/a\\..\\b?q=%7e", "/b?q=~"),
    ):
        text = await request({"method": "GET", "url": f"HTTP://127.0.0.1:{server.port}{path}"}, settings)
        assert text.endswith(f"saw {seen}") and server.paths[-1] == seen, (path, server.paths)


# --- shell and python policy ------------------------------------------------------------------------------------


def test_argument_patterns_on_shell_and_python_are_refused_at_load(tmp_path: Path) -> None:
    for rule in (
        {"tool": "run_shell", "when": {"command": "rm\\s+-rf"}, "decision": "deny"},
        {"tool": "run_*", "when": {"code": "shutil\\.rmtree"}, "decision": "ask"},
        {"tool": "*", "when": {"command": "curl"}, "decision": "deny"},
    ):
        with pytest.raises(ValidationError, match="a regular expression cannot police"):
            Policy.model_validate({"rules": [rule]})
        with pytest.raises(ValidationError, match="a regular expression cannot police"):
            parse_run_policy({"rules": [rule]})  # what `starter.py run --policy FILE` checks
        path = tmp_path / "policy.json"
        path.write_text(json.dumps({"rules": [rule]}))
        with pytest.raises(ConfigurationError, match=r"AGENT_POLICY_FILE=.*policy\.json: rules\.0: .*cannot police"):
            load_policy(str(path))
    # tool-level rules, other tools' patterns and allow lists stay valid
    Policy.model_validate(
        {
            "rules": [
                {"tool": "run_shell", "decision": "ask"},
                {"tool": "*", "when": {"path": "^secrets/"}, "decision": "deny"},
                {"tool": "run_python", "allow_only": {"code": ["print\\(\\d+\\)"]}, "decision": "deny"},
            ]
        }
    )


def test_allow_only_allows_exactly_the_listed_commands() -> None:
    policy = Policy.model_validate(
        {
            "rules": [
                {
                    "name": "read-only-shell",
                    "tool": "run_shell",
                    "allow_only": {"command": ["ls( -[la]+)?( [\\w./-]+)*", "git (status|diff|log)"]},
                    "decision": "deny",
                },
                {
                    "name": "pay",
                    "tool": "http_request",
                    "allow_only": {"url": ["https://pay\\.test/quote"]},
                    "decision": "ask",
                },
            ]
        }
    )

    def shell(command: str | None) -> tuple[str, str]:
        args = {} if command is None else {"command": command}
        decision = decide(policy, None, "run_shell", args, side_effect=False, sandboxed=True)
        return decision.verdict, decision.rule

    assert shell("ls -la src/") == ("allow", "read-only-shell")
    assert shell("git status") == ("allow", "read-only-shell")
    for dodge in ("ls; rm -rf /", "ls && rm -r -f .", "ls $(rm -fr x)", "git status\nrm -rf .", "LS", "rm -rf /", None):
        assert shell(dodge) == ("deny", "read-only-shell"), dodge
    post = {"method": "POST", "url": "https://pay.test/charge"}
    assert decide(policy, None, "http_request", post, side_effect=True).verdict == "ask"
    assert (
        decide(policy, None, "http_request", {**post, "url": "https://pay.test/quote"}, side_effect=True).verdict
        == "allow"
    )
    # a run's allow list tightens: what it does not list falls to its decision, what it lists stays as it was
    run = parse_run_policy(
        {"rules": [{"tool": "run_python", "allow_only": {"code": ["print\\(1\\)"]}, "decision": "deny"}]}
    )
    assert (
        decide(Policy(), run, "run_python", {"code": "print(1)"}, side_effect=False, sandboxed=True).verdict == "allow"
    )
    assert (
        decide(Policy(), run, "run_python", {"code": "import os"}, side_effect=False, sandboxed=True).verdict == "deny"
    )
    with pytest.raises(ValidationError, match="allow_only needs decision ask or deny"):
        Policy.model_validate(
            {"rules": [{"tool": "run_shell", "allow_only": {"command": ["ls"]}, "decision": "allow"}]}
        )
    with pytest.raises(ValidationError, match="invalid regular expression"):
        Policy.model_validate({"rules": [{"tool": "run_shell", "allow_only": {"command": ["("]}, "decision": "deny"}]})


# --- the workflow: refused before anyone is asked; default rules named for what they are -----------------------


async def test_a_post_to_a_host_outside_the_allow_list_is_refused_without_asking(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, server: Server
) -> None:
    post = {"method": "POST", "url": "https://payments.example/charge", "json": {"amount": 100}}
    llm.enqueue(
        Scripted(
            tool_calls=[
                ("http_request", json.dumps(post)),
                ("run_python", json.dumps({"code": "print(6 * 7)"})),
                ("http_request", json.dumps({"method": "GET", "url": f"{server.base}/stock"})),
            ]
        ),
        Scripted(text="done"),
    )
    rt = with_settings(runtime, http_allow=(f"127.0.0.1:{server.port}",))
    async with run_worker(dev_env.client, rt) as tq:
        handle = await start_agent(dev_env.client, tq, task="charge the card", tools=["http_request", "run_python"])
        result = asyncio.ensure_future(handle.result())
        while not result.done():  # the run never waits for a human
            view = await handle.query(AgentWorkflow.status)
            assert view.pending_approvals == [] and view.state != "waiting_approval", view
            await asyncio.sleep(0.05)
        assert (await result).status == "completed"
    results = [m["content"] for m in llm.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert results[0].startswith("Error: http_request refused: host payments.example:443 is not allowed")
    assert "AGENT_HTTP_ALLOW" in results[0] and results[0].endswith("It was not run.")
    assert "42" in results[1] and results[2].endswith("saw /stock")
    rules = {}
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            if attributes.activity_type.name in ("http_request", "run_python"):
                [invocation] = pydantic_data_converter.payload_converter.from_payloads(
                    attributes.input.payloads, [ToolInvocation]
                )
                rules[invocation.tool] = (invocation.policy_verdict, invocation.policy_rule)
    assert rules == {"run_python": ("allow", "default:sandboxed"), "http_request": ("allow", "builtin:http-read")}


def test_default_rules_are_named_for_what_they_are() -> None:
    op = Policy()
    for tool in ("write_file", "read_file", "run_python", "run_shell"):
        decision = decide(op, None, tool, {}, side_effect=False, sandboxed=True)
        assert (decision.verdict, decision.rule) == ("allow", "default:sandboxed"), tool
    assert decide(op, None, "lookup", {}, side_effect=False).rule == "default:read-only"
    assert decide(op, None, "reserve", {}, side_effect=True).rule == "default:side-effect"
    get = decide(op, None, "http_request", {"method": "GET", "url": "http://h/"}, side_effect=True)
    assert (get.verdict, get.rule) == ("allow", "builtin:http-read")
