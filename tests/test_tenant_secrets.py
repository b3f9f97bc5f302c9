"""Tenant-scoped credentials: ``ctx.secret("NAME")`` and ``${secret:NAME}`` of a per-run MCP server.

Each tenant's runs get their own tenant's value, and no value ever reaches history, the worker's log,
the run store's files, the model or a sandbox (issue 25). Runs go through the real dev server, a
``worker.py`` process (its real log pipeline) or an in-process worker, the real bubblewrap sandbox and a
real HTTP server standing in for the API the tool calls.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.mcp.config import for_tenant, load_mcp_config
from activities.redaction import REDACTED, redact
from activities.runtime import Runtime
from activities.settings import ConfigurationError, ExtensionSettings, Settings
from activities.tenant_secrets import SecretUnavailable
from activities.tools import ToolContext, ToolError
from durable_agents.logs import Redactor
from tests.conftest import WorkerFactory, require_bwrap, start_agent, with_settings
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.fakes.tenant_secret_tools import fingerprint
from tests.fakes.worker_proc import WorkerProc, worker_env, write_policy
from tests.test_mcp import ROOT, mcp_runtime, offered, tool_messages
from tests.waiting import eventually
from workflows.agent import AgentWorkflow
from workflows.types import AgentInput, SubagentDef, ToolInvocation

TOOLS = "tests.fakes.tenant_secret_tools"
MARKER = "tnt-marker"  # every test token starts with it, so a sandbox can look for any of them by it alone


def token(tenant: str) -> str:
    return f"{MARKER}-{tenant}-{uuid.uuid4().hex}"


def k8s_secret(directory: Path, values: dict[str, str]) -> None:
    """``values`` as a Kubernetes Secret volume lays them out: ``NAME -> ..data/NAME``, ``..data -> ..<stamp>``."""
    stamp = directory / "..2026_12_02_10_00_00.000000001"
    stamp.mkdir(parents=True)
    for name, value in values.items():
        (stamp / name).write_text(value + "\n")
        (directory / name).symlink_to(f"..data/{name}")
    (directory / "..data").symlink_to(stamp.name)


def context(settings: Settings, tenant: str) -> ToolContext:
    invocation = ToolInvocation(
        conversation_id="c",
        workflow_id="w",
        step=1,
        call_id="k",
        call_index=0,
        seq=2,
        tool="t",
        arguments={},
        idempotency_key="i",
        tenant=tenant,
    )
    return ToolContext(invocation=invocation, settings=settings)


def refusal(ctx: ToolContext, name: str) -> str:
    with pytest.raises(ToolError) as caught:
        ctx.secret(name)
    return str(caught.value)


# --- resolution rules (real files, the code a tool calls) ---------------------------------------------


def test_a_tenant_gets_its_own_file_and_never_a_file_outside_its_directory(tmp_path: Path) -> None:
    base = tmp_path / "secrets"
    a, b = token("acme"), token("globex")
    k8s_secret(base / "acme", {"API_TOKEN": a})
    (base / "globex").mkdir()
    (base / "globex" / "API_TOKEN").write_text(b)  # no newline: taken as it is
    (base / "globex" / "BIG").write_text("x" * (64 * 1024 + 1))
    (base / "globex" / "TINY").write_text("ab\n")
    (base / "globex" / "THEIRS").symlink_to("../acme/API_TOKEN")  # a link into another tenant's directory
    os.mkfifo(base / "globex" / "PIPE")  # opened without blocking, then refused
    (base / "evil").symlink_to("acme")  # a tenant directory that is another tenant's
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "API_TOKEN").write_text("outside-value")
    (base / "linked").symlink_to(outside)  # a tenant directory outside the secrets directory
    settings = Settings(tenant_secrets_dir=str(base))

    assert context(settings, "acme").secret("API_TOKEN") == a, "one trailing newline is dropped"
    assert context(settings, "globex").secret("API_TOKEN") == b
    for tenant in ("evil", "linked"):
        assert "is not configured for tenant" in refusal(context(settings, tenant), "API_TOKEN"), tenant
    theirs = refusal(context(settings, "globex"), "THEIRS")
    assert "links outside its tenant's directory" in theirs and str(base) not in theirs and a not in theirs
    assert "larger than 65536 bytes" in refusal(context(settings, "globex"), "BIG")
    assert "too short to redact" in refusal(context(settings, "globex"), "TINY")
    assert "not a regular file" in refusal(context(settings, "globex"), "PIPE")

    missing = refusal(context(settings, "acme"), "OTHER_TOKEN")
    assert missing == "secret 'OTHER_TOKEN' is not configured for tenant 'acme'", missing
    for bad in ("../x", "A/B", "", "1ABC", "A" * 65, "API_TOKEN\0", "API_TOKEN\n", "..", "with space"):
        assert "is not valid" in refusal(context(settings, "acme"), bad), bad
    for tenant in ("", ".", "..", "a/b", "/", "x\0y"):  # no tenant, or not one safe path component
        message = refusal(context(settings, tenant), "API_TOKEN")
        assert "is not configured" in message and str(base) not in message, (tenant, message)


def test_a_value_read_is_redacted_by_a_redactor_that_was_configured_without_it(tmp_path: Path) -> None:
    value = token("initech")
    (tmp_path / "initech").mkdir()
    (tmp_path / "initech" / "API_TOKEN").write_text(value)
    logs = Redactor([])  # a worker with no secret of its own configured
    assert logs(None, "info", {"event": "x", "v": value})["v"] == value, "not learned yet"
    assert context(Settings(tenant_secrets_dir=str(tmp_path)), "initech").secret("API_TOKEN") == value
    assert logs(None, "info", {"event": "x", "v": f"got {value}"})["v"] == f"got {REDACTED}"
    assert redact(f"[{value}]", []) == f"[{REDACTED}]"


def test_the_workers_own_secret_only_with_the_fallback_and_never_a_runtime_setting(tmp_path: Path) -> None:
    base = tmp_path / "secrets"
    (base / "acme").mkdir(parents=True)
    (base / "acme" / "API_TOKEN").write_text("acme-own-token\n")
    env = {
        "AGENT_TENANT_SECRETS_DIR": str(base),
        "API_TOKEN": "worker-own-token",
        "OPENAI_API_KEY": "sk-worker-key-1234",
        "AGENT_APPROVAL_KEY": "approval-key-5678",
    }
    off = Settings.from_env(env)
    on = Settings.from_env({**env, "AGENT_TENANT_SECRETS_FALLBACK": "1"})
    assert off.tenant_secrets_dir == str(base) and not off.tenant_secrets_fallback and on.tenant_secrets_fallback

    assert "is not configured for tenant 'globex'" in refusal(context(off, "globex"), "API_TOKEN")
    assert "is not configured for this run (it has no tenant)" in refusal(context(off, ""), "API_TOKEN")
    assert context(on, "globex").secret("API_TOKEN") == "worker-own-token"
    assert context(on, "").secret("API_TOKEN") == "worker-own-token"
    assert context(on, "acme").secret("API_TOKEN") == "acme-own-token", "the tenant's own comes first"
    for setting in ("OPENAI_API_KEY", "AGENT_APPROVAL_KEY"):
        message = refusal(context(on, "globex"), setting)
        assert "is not configured" in message and env[setting] not in message, setting
    with pytest.raises(ConfigurationError, match="AGENT_TENANT_SECRETS_FALLBACK"):
        Settings.from_env({"AGENT_TENANT_SECRETS_FALLBACK": "maybe"})


def make_dirs(*paths: Path) -> list[str]:
    for path in paths:
        path.mkdir(parents=True)
    return [str(path) for path in paths]


async def test_a_secrets_directory_a_local_sandbox_can_see_stops_the_worker(settings: Settings, tmp_path: Path) -> None:
    require_bwrap()
    workspaces = make_dirs(settings.state_dir / "sandboxes" / "tenants", tmp_path / "fine")[0]
    for directory, problem in (
        ("/usr/share", "lies under /usr, which every local sandbox sees"),
        (workspaces, "which every local sandbox sees"),
        (str(tmp_path / "absent"), "not a directory"),
    ):
        runtime = Runtime.from_settings(replace(settings, tenant_secrets_dir=directory))
        try:
            with pytest.raises(ConfigurationError, match="AGENT_TENANT_SECRETS_DIR") as caught:
                await runtime.check()
        finally:
            await runtime.aclose()
        assert problem in str(caught.value), caught.value
    runtime = Runtime.from_settings(replace(settings, tenant_secrets_dir=str(tmp_path / "fine")))
    try:
        await runtime.check()
    finally:
        await runtime.aclose()


# --- two tenants' runs on a worker.py process ------------------------------------------------------------


def sandbox_probe(secrets_dir: Path) -> str:
    """What a command in the sandbox can find: its environment, the secrets directory, any file naming a token."""
    return (
        f"env; tr '\\0' '\\n' < /proc/1/environ; ls -la {secrets_dir} 2>&1; ls {secrets_dir}/acme 2>&1; "
        f"grep -rl {MARKER} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr 2>/dev/null; echo probe-done"
    )


def plan(sink_url: str, secrets_dir: Path) -> list[Scripted]:
    """One run's model replies: use the token, misbehave with it every way, probe the sandbox, finish."""
    calls = [
        ("call_api", json.dumps({"url": sink_url})),
        ("leak_secret", json.dumps({"how": "return"})),
        ("leak_secret", json.dumps({"how": "tool_error"})),
        ("leak_secret", json.dumps({"how": "log"})),
        ("leak_secret", json.dumps({"how": "exception"})),
        ("secret_fingerprint", json.dumps({"name": "MISSING_TOKEN"})),
        ("secret_fingerprint", json.dumps({"name": "../x"})),
        ("run_shell", json.dumps({"command": sandbox_probe(secrets_dir)})),
    ]
    return [Scripted(tool_calls=calls), Scripted(text="done")]


async def test_each_tenant_gets_its_own_token_and_no_token_is_left_anywhere(
    dev_env: WorkflowEnvironment, tmp_path: Path, llm: FakeLLMServer
) -> None:
    require_bwrap()
    secrets_dir = tmp_path / "tenant-secrets"
    tokens = {"acme": token("acme"), "globex": token("globex")}
    k8s_secret(secrets_dir / "acme", {"API_TOKEN": tokens["acme"]})
    (secrets_dir / "globex").mkdir()
    (secrets_dir / "globex" / "API_TOKEN").write_text(tokens["globex"] + "\n")
    state_dir = tmp_path / "state"
    task_queue = f"tenant-secrets-{uuid.uuid4().hex[:8]}"
    env = worker_env(
        address=dev_env.client.service_client.config.target_host,
        task_queue=task_queue,
        llm_url=f"{llm.openai_url}",
        state_dir=state_dir,
        policy_file=write_policy(tmp_path / "policy.json"),
        AGENT_TOOL_MODULES=TOOLS,
        AGENT_TENANT_SECRETS_DIR=str(secrets_dir),
        AGENT_LOG_LEVEL="DEBUG",
    )
    worker = WorkerProc(env, tmp_path / "worker.log")
    histories: dict[str, str] = {}
    answers: dict[str, list[str]] = {}
    try:
        await worker.async_wait_ready(60)
        with HttpSink() as sink:
            url = f"{sink.url}/v1/things"
            for index, tenant in enumerate(tokens):
                llm.enqueue(*plan(url, secrets_dir))
                handle = await dev_env.client.start_workflow(
                    "AgentWorkflow",
                    AgentInput(task=f"use the API for {tenant}", tenant=tenant),
                    id=f"tenant-secrets-{tenant}-{uuid.uuid4().hex[:8]}",
                    task_queue=task_queue,
                )
                result = await handle.result()
                assert result["status"] == "completed", (result, worker.tail())
                histories[tenant] = (await handle.fetch_history()).to_json()
                answers[tenant] = tool_messages(llm, 2 * index + 1)
            received = [r.headers.get("authorization") for r in sink.received]
    finally:
        code = worker.stop()
    assert code == 0, worker.tail()

    # Each run sent its own tenant's token to the API, and its result names that token's fingerprint only.
    assert received == [f"Bearer {tokens['acme']}", f"Bearer {tokens['globex']}"], received
    for tenant, value in tokens.items():
        api, returned, tool_error, logged, crashed, missing, bad_name, probe = answers[tenant]
        assert api == f"status 200; token fingerprint {fingerprint(value)}", api
        assert returned == f"the token is {REDACTED}", returned
        assert tool_error == f"Error: the API refused token {REDACTED}", tool_error
        assert logged == "logged it"
        assert REDACTED in crashed and "RuntimeError" in crashed, crashed
        assert missing == f"Error: secret 'MISSING_TOKEN' is not configured for tenant '{tenant}'", missing
        assert bad_name.startswith("Error: secret name '../x' is not valid"), bad_name
        # The sandbox: an empty environment, no secrets directory, no file holding a token.
        assert "probe-done" in probe and probe.count("No such file or directory") == 2, probe
        assert MARKER not in probe, probe

    log = (tmp_path / "worker.log").read_text()
    assert "about_to_use_secret" in log and REDACTED in log
    store_files = sorted(state_dir.glob("store.sqlite3*"))
    assert any(p.name.endswith("-wal") for p in store_files) or store_files, store_files
    stored = b"".join(p.read_bytes() for p in store_files)
    model_saw = json.dumps([r["body"] for r in llm.requests])
    for value in tokens.values():
        for where, text in (*histories.items(), ("worker log", log), ("model requests", model_saw)):
            assert value not in text, f"a token reached {where}"
        assert value.encode() not in stored, "a token reached the run store's files"


# --- ${secret:NAME} of a per-run MCP server -------------------------------------------------------------


def leaky(per_run: bool) -> dict[str, object]:
    return {
        "command": sys.executable,
        "args": ["-m", "tests.fakes.mcp_leaky"],
        "cwd": str(ROOT),
        "env": {"LEAKY_SECRET": "${secret:API_TOKEN}"},
        "per_run": per_run,
    }


async def test_a_per_run_mcp_server_starts_with_its_runs_tenant_secret(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    secrets_dir = tmp_path / "tenant-secrets"
    tokens = {"acme": token("acme"), "globex": token("globex")}
    for tenant, value in tokens.items():
        (secrets_dir / tenant).mkdir(parents=True)
        (secrets_dir / tenant / "API_TOKEN").write_text(value + "\n")
    runtime = mcp_runtime(replace(settings, tenant_secrets_dir=str(secrets_dir)), tmp_path, {"leaky": leaky(True)})
    histories: dict[str, str] = {}
    answers: dict[str, list[str]] = {}
    transcripts: list[str] = []
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            for index, tenant in enumerate(tokens):
                llm.enqueue(
                    Scripted(
                        tool_calls=[
                            ("mcp__leaky__fingerprint", "{}"),
                            ("mcp__leaky__leak", json.dumps({"how": "split"})),
                        ]
                    ),
                    Scripted(text="done"),
                )
                handle = await start_agent(dev_env.client, tq, id_prefix="mcp-tenant", tenant=tenant)
                result = await handle.result()
                assert result.status == "completed", result.output
                histories[tenant] = (await handle.fetch_history()).to_json()
                answers[tenant] = tool_messages(llm, 2 * index + 1)
                stored = await runtime.store.transcript(f"{handle.id}/{handle.first_execution_run_id}")
                transcripts.append(json.dumps([m.model_dump() for m in stored]))
            # A tenant without the secret: the server does not start for its run, which goes on without its tools.
            llm.enqueue(Scripted(text="no tools"))
            handle = await start_agent(dev_env.client, tq, id_prefix="mcp-tenant", tenant="initech")
            lacking = await handle.result()
            status = await handle.query(AgentWorkflow.status)
    finally:
        await runtime.aclose()
    assert lacking.status == "completed" and not [t for t in offered(llm, 4) if t.startswith("mcp__")]
    assert [n for n in status.notes if "secret 'API_TOKEN' is not configured for tenant 'initech'" in n], status.notes
    for tenant, value in tokens.items():
        printed, leaked = answers[tenant]
        assert printed == fingerprint(value), (tenant, printed)
        assert leaked == f"key: {REDACTED}\n{REDACTED}", leaked
        assert len(json.loads(transcripts[0])) >= 4, "the transcript holds the tool results"
        for text in (*histories.values(), *transcripts, json.dumps([r["body"] for r in llm.requests])):
            assert value not in text


def test_a_per_run_http_servers_headers_carry_each_tenants_secret_and_are_learned_whole(tmp_path: Path) -> None:
    secrets_dir = tmp_path / "tenant-secrets"
    tokens = {"acme": token("acme"), "globex": token("globex")}
    for tenant, value in tokens.items():
        (secrets_dir / tenant).mkdir(parents=True)
        (secrets_dir / tenant / "API_TOKEN").write_text(value + "\n")
    path = tmp_path / "mcp.json"
    remote = {
        "type": "http",
        "url": "http://127.0.0.1:9/mcp",
        "headers": {"Authorization": "Bearer ${secret:API_TOKEN}", "X-Client": "agents"},
        "per_run": True,
    }
    path.write_text(json.dumps({"mcpServers": {"remote": remote}}))
    settings = Settings(mcp_config=str(path), environ={}, tenant_secrets_dir=str(secrets_dir))
    server = load_mcp_config(settings).servers["remote"]
    assert server.headers["Authorization"] == "Bearer ${secret:API_TOKEN}"  # resolved per run, not at load
    logs = Redactor([])
    for tenant, value in tokens.items():
        resolved, used = for_tenant(server, settings, tenant)
        assert resolved.headers == {"Authorization": f"Bearer {value}", "X-Client": "agents"}
        assert value in used and f"Bearer {value}" in used
        assert logs(None, "info", {"event": "x", "h": f"Bearer {value}"})["h"] == REDACTED
    with pytest.raises(SecretUnavailable, match="API_TOKEN"):
        for_tenant(server, settings, "initech")


def test_a_shared_mcp_server_refuses_a_tenant_secret_at_load(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    environ = {"PATH": os.environ.get("PATH", "")}
    settings = Settings(mcp_config=str(path), environ=environ)
    path.write_text(json.dumps({"mcpServers": {"leaky": leaky(False)}}))
    with pytest.raises(ConfigurationError) as caught:
        load_mcp_config(settings)
    assert "mcpServers.leaky.env.LEAKY_SECRET" in str(caught.value) and "per_run" in str(caught.value)
    bad = {**leaky(True), "env": {"LEAKY_SECRET": "${secret:../x}"}}
    path.write_text(json.dumps({"mcpServers": {"leaky": bad}}))
    with pytest.raises(ConfigurationError, match=r"secret name '\.\./x' is not valid"):
        load_mcp_config(settings)
    in_args = {**leaky(True), "args": ["-m", "tests.fakes.mcp_leaky", "${secret:API_TOKEN}"]}
    path.write_text(json.dumps({"mcpServers": {"leaky": in_args}}))
    with pytest.raises(ConfigurationError, match="only allowed in 'env' and 'headers'"):
        load_mcp_config(settings)
    path.write_text(json.dumps({"mcpServers": {"leaky": leaky(True)}}))
    assert load_mcp_config(settings).servers["leaky"].env == {"LEAKY_SECRET": "${secret:API_TOKEN}"}


# --- a compensation runs for the run's tenant ------------------------------------------------------------


async def test_a_compensation_uses_its_runs_tenant_secret_and_its_note_is_redacted(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, tmp_path: Path
) -> None:
    value = token("acme")
    (tmp_path / "secrets" / "acme").mkdir(parents=True)
    (tmp_path / "secrets" / "acme" / "API_TOKEN").write_text(value + "\n")
    policy = write_policy(tmp_path / "policy.json")
    rt = with_settings(
        runtime,
        policy_file=str(policy),
        extensions=ExtensionSettings(tool_modules=(TOOLS,)),
        tenant_secrets_dir=str(tmp_path / "secrets"),
    )
    try:
        with HttpSink() as sink:
            llm.enqueue(
                Scripted(tool_calls=[("charge", json.dumps({"url": f"{sink.url}/charges/1"}))]),
                Scripted(text="never seen", delay_s=5),
            )
            async with run_worker(dev_env.client, rt) as tq:
                handle = await start_agent(dev_env.client, tq, id_prefix="tenant-comp", tenant="acme")
                await eventually(lambda: len(llm.requests) == 2, "the turn after the charge")
                await handle.cancel()
                result = await handle.result()
                history = (await handle.fetch_history()).to_json()
            received = [(r.path, r.headers.get("authorization")) for r in sink.received]
    finally:
        await rt.aclose()
    assert result.status == "cancelled", result.output
    assert f"compensated: refunded with {REDACTED}" in result.output, result.output
    assert received == [("/charges/1", f"Bearer {value}"), ("/charges/1?refund=1", f"Bearer {value}")], received
    assert value not in history and value not in result.output


async def test_a_subagent_gets_its_parents_tenant_secret(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer, tmp_path: Path
) -> None:
    tokens = {"acme": token("acme"), "globex": token("globex")}
    for tenant, value in tokens.items():
        (tmp_path / "secrets" / tenant).mkdir(parents=True)
        (tmp_path / "secrets" / tenant / "API_TOKEN").write_text(value)
    rt = with_settings(
        runtime, extensions=ExtensionSettings(tool_modules=(TOOLS,)), tenant_secrets_dir=str(tmp_path / "secrets")
    )
    llm.enqueue(
        Scripted(tool_calls=[("helper", json.dumps({"task": "fingerprint the token"}))]),  # the parent
        Scripted(tool_calls=[("secret_fingerprint", json.dumps({"name": "API_TOKEN"}))]),  # the child
        Scripted(text="child done"),
        Scripted(text="parent done"),
    )
    helper = SubagentDef(description="Helps.", tools=["secret_fingerprint"])
    try:
        async with run_worker(dev_env.client, rt) as tq:
            handle = await start_agent(
                dev_env.client, tq, id_prefix="tenant-sub", tenant="globex", subagents={"helper": helper}
            )
            result = await handle.result()
    finally:
        await rt.aclose()
    assert result.status == "completed", result.output
    assert tool_messages(llm, 2) == [f"fingerprint {fingerprint(tokens['globex'])}"], "the child ran for globex"
