"""Configuration is read once (``Settings``), validated at worker start, and a bad value is one line, exit 2."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel
from temporalio.worker import FixedSizeSlotSupplier, Worker, WorkerTuner

from activities.catalog import provider_registry, tool_registry
from activities.runtime import Runtime
from activities.settings import ConfigurationError, ExtensionSettings, Settings, WorkerSettings
from activities.tools import ToolContext, ToolRegistry, tool
from activities.tools.spec import spec_of

ROOT = Path(__file__).resolve().parent.parent


class NoArgs(BaseModel):
    pass


@tool("model", description="collides with the runtime's model activity", args=NoArgs)
async def model_named_tool(args: NoArgs, ctx: ToolContext) -> str:
    return ""


@tool("read_file", description="a second read_file", args=NoArgs)
async def second_read_file(args: NoArgs, ctx: ToolContext) -> str:
    return ""


def settings_for(tmp_path: Path, **changes: object) -> Settings:
    base = Settings(store_url=str(tmp_path / "store.sqlite3"), state_dir=tmp_path / "agent")
    return Settings(**{**base.__dict__, **changes})


def test_bad_variables_name_themselves() -> None:
    for env, variable in (
        ({"AGENT_LOG_LEVEL": "LOUD"}, "AGENT_LOG_LEVEL"),
        ({"AGENT_SANDBOX": "nonsense"}, "AGENT_SANDBOX"),
        ({"AGENT_REAP_INTERVAL_S": "-1"}, "AGENT_REAP_INTERVAL_S"),
        ({"AGENT_METRICS_PORT": "99999"}, "AGENT_METRICS_PORT"),
        ({"AGENT_SANDBOX_TIMEOUT_S": "nan"}, "AGENT_SANDBOX_TIMEOUT_S"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"AGENT_MAX_CACHED_WORKFLOWS": "-1"}, "AGENT_MAX_CACHED_WORKFLOWS"),
        ({"AGENT_MAX_CONCURRENT_ACTIVITIES": "0"}, "AGENT_MAX_CONCURRENT_ACTIVITIES"),
        ({"AGENT_MAX_CONCURRENT_WORKFLOW_TASKS": "1"}, "AGENT_MAX_CONCURRENT_WORKFLOW_TASKS"),
        ({"AGENT_MAX_CONCURRENT_WORKFLOW_TASKS": "many"}, "AGENT_MAX_CONCURRENT_WORKFLOW_TASKS"),
        ({"AGENT_HEALTH_PORT": "70000"}, "AGENT_HEALTH_PORT"),
        ({"AGENT_REQUIRE_SHARED_STORE": "maybe"}, "AGENT_REQUIRE_SHARED_STORE"),
        ({"AGENT_HEAP_TRIM_INTERVAL_S": "-1"}, "AGENT_HEAP_TRIM_INTERVAL_S"),
        ({"AGENT_HEAP_TRIM_INTERVAL_S": "often"}, "AGENT_HEAP_TRIM_INTERVAL_S"),
    ):
        with pytest.raises(ConfigurationError, match=variable):
            Settings.from_env(env)


def test_settings_are_read_from_the_given_environment_only() -> None:
    settings = Settings.from_env(
        {"AGENT_TOOL_MODULES": "a.b, c", "AGENT_PROVIDER_MODULES": "p", "AGENT_TASK_QUEUE": "q", "MY_KEY": "v"}
    )
    assert settings.extensions == ExtensionSettings(tool_modules=("a.b", "c"), provider_modules=("p",))
    assert settings.task_queue == "q" and settings.variable("MY_KEY") == "v" and settings.variable("NOPE") == ""
    assert settings.model == "scripted:demo" and settings.sandbox.backend == "local"
    assert "MY_KEY" not in repr(settings)
    assert Settings.from_env({"E2B_API_KEY": "e2b_x"}).sandbox.backend == "e2b"


def test_worker_tuning_defaults_come_from_the_benchmarks_and_variables_override_them() -> None:
    sdk = inspect.signature(Worker.__init__).parameters
    # Half the SDK's cache: bench/results/scale_waiting*.json (10,000 waiting runs: 236 MB, not 307 MB).
    assert WorkerSettings().max_cached_workflows == 500 == sdk["max_cached_workflows"].default // 2
    fixed = WorkerTuner.create_fixed()  # the slots the SDK gives each kind when none is configured
    activity_slots = fixed._get_activity_task_slot_supplier()
    workflow_slots = fixed._get_workflow_task_slot_supplier()
    assert isinstance(activity_slots, FixedSizeSlotSupplier) and isinstance(workflow_slots, FixedSizeSlotSupplier)
    assert WorkerSettings().max_concurrent_activities == activity_slots.num_slots
    assert WorkerSettings().max_concurrent_workflow_tasks == workflow_slots.num_slots
    assert Settings.from_env({}).worker == WorkerSettings()
    tuned = Settings.from_env(
        {
            "AGENT_MAX_CACHED_WORKFLOWS": "0",
            "AGENT_MAX_CONCURRENT_ACTIVITIES": "12",
            "AGENT_MAX_CONCURRENT_WORKFLOW_TASKS": "4",
            "AGENT_HEALTH_PORT": "8081",
            "AGENT_REQUIRE_SHARED_STORE": "1",
            "AGENT_HEAP_TRIM_INTERVAL_S": "0",
        }
    ).worker
    assert tuned.options() == {
        "max_cached_workflows": 0,
        "max_concurrent_activities": 12,
        "max_concurrent_workflow_tasks": 4,
        # A session's interruptible model call learns of its cancellation at its next heartbeat, sent within 1 s.
        "max_heartbeat_throttle_interval": timedelta(seconds=1),
    }
    assert tuned.health_port == 8081 and tuned.require_shared_store
    assert tuned.heap_trim_interval_s == 0 and Settings.from_env({}).worker.heap_trim_interval_s == 10


def test_a_shared_store_is_required_only_when_asked() -> None:
    assert Settings.from_env({}).shared_store_problem() == ""
    assert Settings.from_env({"AGENT_REQUIRE_SHARED_STORE": "0"}).shared_store_problem() == ""
    for url in ("/var/lib/agent/store.sqlite3", "sqlite:///var/lib/agent/store.sqlite3"):
        problem = Settings.from_env({"AGENT_REQUIRE_SHARED_STORE": "1", "AGENT_STORE_URL": url}).shared_store_problem()
        assert "AGENT_REQUIRE_SHARED_STORE=1" in problem and f"AGENT_STORE_URL={url}" in problem
    # A libpq conninfo names PostgreSQL as a postgresql:// URL does (issue 21: it used to be a SQLite path).
    for url in ("postgresql://agent@db/agent_store", "postgres://agent@db/agent_store", "host=db dbname=agent"):
        assert (
            Settings.from_env({"AGENT_REQUIRE_SHARED_STORE": "1", "AGENT_STORE_URL": url}).shared_store_problem() == ""
        )


def test_store_passwords_are_secrets_wherever_they_are_written() -> None:
    for url, password in (
        ("postgresql://agent:pw-userinfo@db:5432/agents", "pw-userinfo"),
        ("postgresql://agent@db:5432/agents?sslmode=require&password=pw-query", "pw-query"),
        ("host=db user=agent password=pw-conninfo dbname=agents", "pw-conninfo"),
    ):
        assert password in Settings.from_env({"AGENT_STORE_URL": url}).secret_values()


@pytest.mark.parametrize(
    "url",
    [
        "{tmp}/host=db password=pw-in-a-file-name.sqlite3",
        "host=db dbname=agents pasword=x password=pw-in-a-file-name",  # a typo: libpq refuses it
        "sqlite:///{tmp}/password=pw-in-a-file-name",
    ],
    ids=["path-with-password", "bad-conninfo", "sqlite-url-with-password"],
)
def test_a_sqlite_path_holding_a_password_stops_the_worker_and_creates_no_file(tmp_path: Path, url: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    done = run_worker_process(tmp_path, AGENT_STORE_URL=url.format(tmp=work))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "AGENT_STORE_URL looks like PostgreSQL connection settings" in lines[0], done.stderr
    assert "pw-in-a-file-name" not in done.stderr + done.stdout, "the password is never echoed"
    assert list(work.iterdir()) == [] and not (ROOT / url).exists(), "no SQLite file was created"


def test_bad_files_and_models_stop_the_runtime_at_start(tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai:x": {"input": -1, "output": 1}}))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"rules": [{"tool": "*", "decision": "maybe"}]}))
    cases = [
        (settings_for(tmp_path, prices_file=str(tmp_path / "missing.json")), "AGENT_PRICES"),
        (settings_for(tmp_path, prices_file=str(prices)), "AGENT_PRICES"),
        (settings_for(tmp_path, policy_file=str(policy)), "AGENT_POLICY_FILE"),
        (settings_for(tmp_path, model="gpt-4o"), "AGENT_MODEL: unknown model 'gpt-4o'"),
        (settings_for(tmp_path, model="nope:v1"), "AGENT_MODEL: unknown model 'nope:v1'"),
        (
            settings_for(tmp_path, extensions=ExtensionSettings(tool_modules=("no_such_tools",))),
            "AGENT_TOOL_MODULES: cannot import 'no_such_tools'",
        ),
        (
            settings_for(tmp_path, extensions=ExtensionSettings(provider_modules=("tests.fakes.broken_provider",))),
            "model provider 'broken' failed to start: BROKEN_ENDPOINT is not set",
        ),
    ]
    for settings, message in cases:
        with pytest.raises(ConfigurationError, match=message) as raised:
            Runtime.from_settings(settings)
        assert "\n" not in str(raised.value)


def test_a_priced_model_turn_cannot_fail_on_prices(tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai:house": {"input": 1.0, "output": 2.0}}))
    runtime = Runtime.from_settings(settings_for(tmp_path, prices_file=str(prices)))
    assert runtime.prices.cost_usd("openai:house", 1_000_000, 1_000_000) == 3.0
    assert runtime.prices.cost_usd("openai:unpriced", 10, 10) == 0.0
    prices.unlink()  # the file is read once, at start: a run never depends on it again
    assert runtime.prices.cost_usd("openai:house", 1_000_000, 0) == 1.0


def test_registries_are_independent_objects() -> None:
    settings = Settings()
    first, second = tool_registry(settings), tool_registry(settings)
    assert first is not second and first.names() == second.names()
    assert set(first.names()) == {
        "ask_human",
        "http_request",
        "memory_delete",
        "memory_save",
        "memory_search",
        "read_file",
        "run_python",
        "run_shell",
        "write_file",
    }
    spec = spec_of(second_read_file)
    assert spec is not None
    extra = ToolRegistry()
    extra.add(spec)
    assert "read_file" in extra and len(extra) == 1
    assert "always_fails" not in first, "tools of test modules never leak into a fresh registry"
    assert provider_registry(settings).prefixes() == ["anthropic", "openai", "scripted"]


def test_reserved_and_duplicate_tool_names_are_refused() -> None:
    registry = tool_registry(Settings())
    reserved = spec_of(model_named_tool)
    duplicate = spec_of(second_read_file)
    assert reserved is not None and duplicate is not None
    with pytest.raises(ConfigurationError, match="tool name 'model' is reserved by the runtime"):
        registry.add(reserved)
    with pytest.raises(ConfigurationError, match="tool 'read_file' is already registered"):
        registry.add(duplicate)


def run_worker_process(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "AGENT_STATE_DIR": str(tmp_path / "agent"),
        "TEMPORAL_ADDRESS": "127.0.0.1:1",  # never reached: configuration is checked first
        **env,
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "worker.py")],
        env=full_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"AGENT_TOOL_MODULES": "tests.fakes.no_such_module"}, "AGENT_TOOL_MODULES: cannot import"),
        ({"AGENT_PROVIDER_MODULES": "no_such_provider"}, "AGENT_PROVIDER_MODULES: cannot import"),
        ({"AGENT_MODEL": "nope:v1"}, "unknown model 'nope:v1'"),
        ({"AGENT_PRICES": "/nonexistent/prices.json"}, "AGENT_PRICES"),
        ({"AGENT_LOG_LEVEL": "LOUD"}, "AGENT_LOG_LEVEL"),
        ({"AGENT_SANDBOX": "nonsense"}, "AGENT_SANDBOX"),
        (
            {"AGENT_STORE_URL": "/dev/null/store.sqlite3"},
            "AGENT_STORE_URL=/dev/null/store.sqlite3: the run store cannot",
        ),
        ({"AGENT_STORE_URL": "postgresql://agent:pw@127.0.0.1:1/agents"}, "AGENT_STORE_URL=postgresql://agent:***@"),
        ({"AGENT_SANDBOX": "e2b"}, "AGENT_SANDBOX=e2b: AGENT_SANDBOX=e2b needs E2B_API_KEY"),
        ({"AGENT_REQUIRE_SHARED_STORE": "1"}, "AGENT_REQUIRE_SHARED_STORE=1 but AGENT_STORE_URL="),
        ({"AGENT_REQUIRE_SHARED_STORE": "yes"}, "is a SQLite run store"),
        # A PostgreSQL URL passes the requirement; then the store itself must open.
        (
            {"AGENT_REQUIRE_SHARED_STORE": "1", "AGENT_STORE_URL": "postgresql://agent:pw@127.0.0.1:1/agents"},
            "AGENT_STORE_URL=postgresql://agent:***@",
        ),
        ({"AGENT_HEALTH_PORT": "0"}, "AGENT_HEALTH_PORT='0' must be between 1 and 65535"),
        ({"AGENT_MAX_CONCURRENT_ACTIVITIES": "-5"}, "AGENT_MAX_CONCURRENT_ACTIVITIES='-5' must be between"),
        (
            {"AGENT_PAYLOAD_KEYS": "k1:c2hvcnQ="},
            "AGENT_PAYLOAD_KEYS: entry 1 (key id 'k1'): the key is 5 bytes, not 32",
        ),
        ({"AGENT_PAYLOAD_KEYS": ""}, "AGENT_PAYLOAD_KEYS: no keys"),
    ],
)
def test_worker_stops_at_start_with_one_line(tmp_path: Path, env: dict[str, str], needle: str) -> None:
    done = run_worker_process(tmp_path, **env)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads(lines[0])["event"] == "bad_configuration"
    assert "c2hvcnQ=" not in done.stderr, "key material never reaches the log"
