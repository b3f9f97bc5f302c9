"""The public surface: ``from durable_agents import ...``, its types under mypy, its console scripts.

- every name in ``durable_agents.__all__`` is the very object of its old import path;
- ``import durable_agents`` loads no heavy module (the workflow sandbox re-imports user modules that import it);
- ``@tool`` is typed over its argument model: a function of another model is a mypy error;
- ``[project.scripts]`` name importable callables; ``durable-agents --version`` / ``--help`` and
  ``durable-agents-worker`` (with a bad configuration) run through them and exit with their documented code.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest
from mypy import api as mypy_api
from temporalio.testing import WorkflowEnvironment

import durable_agents
from tests.fakes.worker_proc import ROOT, free_port, wait_until

OLD_PATHS = {
    "DurableAgentsPlugin": "durable_agents.plugin",
    "Settings": "activities.settings",
    "ConfigurationError": "activities.settings",
    "AgentInput": "workflows.types",
    "AgentResult": "workflows.types",
    "Limits": "workflows.types",
    "Message": "workflows.types",
    "StatusView": "workflows.types",
    "SubagentDef": "workflows.types",
    "tool": "activities.tools",
    "ToolContext": "activities.tools",
    "ToolError": "activities.tools",
    "provider": "activities.models",
    "ModelProvider": "activities.models",
    "ProviderReply": "activities.models",
    "RetryableProviderError": "activities.models",
    "FatalProviderError": "activities.models",
    "exit_process": "durable_agents.client",
    "AgentClient": "durable_agents.agent_client",
    "AgentClientError": "durable_agents.agent_client",
    "RunNotFound": "durable_agents.agent_client",
    "EventCursor": "durable_agents.agent_client",
    "RunEvent": "durable_agents.agent_client",
}


def python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args`` with this checkout first on the path and nothing else inherited but ``PATH``."""
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_every_public_name_is_the_object_of_its_old_path() -> None:
    assert set(OLD_PATHS) <= set(durable_agents.__all__)
    for name, module in OLD_PATHS.items():
        assert getattr(durable_agents, name) is getattr(importlib.import_module(module), name), name
    for name in durable_agents.__all__:
        assert getattr(durable_agents, name) is not None, name
    assert set(durable_agents.__all__) <= set(dir(durable_agents))
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        _ = durable_agents.Nope


def test_every_client_error_is_an_agent_client_error() -> None:
    errors = [getattr(durable_agents, name) for name in durable_agents.__all__]
    errors = [e for e in errors if isinstance(e, type) and issubclass(e, Exception) and e.__module__.startswith(
        "durable_agents.agent_client")]  # fmt: skip
    assert {e.__name__ for e in errors} >= {"RunNotFound", "DecisionRefused", "NoAnswer", "RunExists", "RunNotOpen"}
    assert all(issubclass(e, durable_agents.AgentClientError) for e in errors), errors


def test_the_package_is_typed_and_ships_its_marker() -> None:
    for package in ("durable_agents", "workflows", "activities"):
        assert (ROOT / package / "py.typed").is_file(), package
    # that the built wheel carries them: tests/test_wheel.py


def test_importing_the_package_loads_nothing_heavy() -> None:
    probe = python(
        "import json, sys; import durable_agents; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('durable_agents', 'activities', 'workflows', 'rich', 'mcp', 'structlog', 'temporalio', 'pydantic'))))"
    )
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == ["durable_agents"]


MYPY_CHECKED = """
from pydantic import BaseModel

from durable_agents import AgentInput, Limits, ToolContext, tool


class LookupArgs(BaseModel):
    sku: str


class OtherArgs(BaseModel):
    count: int


@tool("lookup", description="Look an article up.", args=LookupArgs)
async def lookup(args: LookupArgs, ctx: ToolContext) -> str:
    return args.sku


@tool("wrong", description="Takes another model than args=.", args=LookupArgs)  # line 19: the error
async def wrong(args: OtherArgs, ctx: ToolContext) -> str:
    return str(args.count)


task: str = AgentInput(task="t").task
limit: str = Limits()  # line 25: a real type, not Any


def token(ctx: ToolContext) -> int:
    return ctx.secret("API_TOKEN")  # line 29: the tenant's secret is a str, not Any
"""


def test_tool_is_typed_over_its_argument_model(tmp_path: Path) -> None:
    source = tmp_path / "user_tools.py"
    source.write_text(MYPY_CHECKED.lstrip("\n"))
    out, err, status = mypy_api.run(
        [
            "--strict",
            "--no-error-summary",
            "--show-error-codes",
            "--cache-dir",
            str(ROOT / ".mypy_cache"),  # `make lint` has just checked the same modules: reuse its cache
            "--config-file",
            str(ROOT / "pyproject.toml"),
            str(source),
        ]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1, (out, err)
    assert len(errors) == 3, out
    # (Paths as mypy's cache recorded the module: a run from another tmp_path may show that one's.)
    assert "user_tools.py:19: error:" in errors[0] and "[arg-type]" in errors[0], out  # the decorator's call
    assert '"Callable[[OtherArgs, ToolContext]' in errors[0] and "LookupArgs" in errors[0], out
    assert "user_tools.py:25: error:" in errors[1] and "[assignment]" in errors[1] and '"Limits"' in errors[1], out
    assert "user_tools.py:29: error:" in errors[2] and "[return-value]" in errors[2] and '"str"' in errors[2], out


# --- console scripts ---------------------------------------------------------------------------------------


def test_console_scripts_name_importable_entry_functions() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {
        "durable-agents": "durable_agents.cli.entry:main",
        "durable-agents-worker": "durable_agents.cli.entry:worker_main",
    }
    for target in scripts.values():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), target


ENTRY = "import sys; sys.argv[0] = {name!r}; from durable_agents.cli.entry import {function}; {function}()"


def test_durable_agents_version_and_help() -> None:
    from durable_agents.version import package_version

    version = python(ENTRY.format(name="durable-agents", function="main"), "--version")
    assert (version.returncode, version.stdout, version.stderr) == (0, f"durable-agents {package_version()}\n", "")
    assert package_version() == durable_agents.__version__ != "0+unknown"
    helped = python(ENTRY.format(name="durable-agents", function="main"), "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: durable-agents "), helped.stdout
    bad = python(ENTRY.format(name="durable-agents", function="main"), "no-such-command")
    assert bad.returncode == 2 and bad.stderr.startswith("error: durable-agents: "), bad.stderr


def test_durable_agents_without_a_server_always_exits_2() -> None:
    # A short-lived client process that connected to nothing: ended by exit_process, never by a crash at exit.
    address = f"127.0.0.1:{free_port()}"
    for _ in range(5):
        listed = python(ENTRY.format(name="durable-agents", function="main"), "list", TEMPORAL_ADDRESS=address)
        assert listed.returncode == 2, (listed.returncode, listed.stderr)
        assert listed.stderr.startswith("error: cannot reach Temporal at "), listed.stderr


def test_durable_agents_worker_with_a_bad_configuration_exits_2(tmp_path: Path) -> None:
    worker = python(
        ENTRY.format(name="durable-agents-worker", function="worker_main"),
        TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}",
        AGENT_STATE_DIR=str(tmp_path / "state"),
        AGENT_MODEL="nope:v1",
    )
    assert worker.returncode == 2, worker.stderr
    lines = [json.loads(line) for line in worker.stderr.splitlines() if line.strip()]
    assert [line["event"] for line in lines] == ["bad_configuration"], worker.stderr
    assert "'nope:v1'" in lines[0]["error"]


def test_durable_agents_worker_serves_until_sigterm(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    """The worker entry runs ``worker.py``'s worker: it polls, and SIGTERM stops it with exit 0."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "AGENT_TASK_QUEUE": f"entry-{uuid.uuid4().hex[:8]}",
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_MODEL": "scripted:demo",
    }
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-c", ENTRY.format(name="durable-agents-worker", function="worker_main")],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:

        def started() -> bool:
            assert worker.poll() is None, log_path.read_text()
            return b'"worker_started"' in log_path.read_bytes()

        wait_until(started, 60, "durable-agents-worker to start")
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    assert code == 0, log_path.read_text()
