"""The built wheel, installed in a fresh venv beside a user's project whose module names collide with ours.

The wheel is built once per module (from an sdist of the sources, as ``python -m build`` does) and
installed without its dependencies into temporary venvs; each venv reaches the dependencies of the
venv running the tests through a ``.pth`` file that names its site-packages directory. A path in a
``.pth`` file is only added to ``sys.path``: the ``.pth`` files in that directory (the editable
install's finder among them) are not run, so nothing of this repository is importable there.

- the wheel holds ``durable_agents`` and nothing else at the top level, with its type markers, and
  the libraries of the extras only under their extras;
- a user project with its own top-level ``workflows.py``, ``activities/`` package, ``worker.py`` and
  ``starter.py`` runs, from its own directory, a workflow that starts ``AgentWorkflow`` as a child,
  whose agent calls the project's own tool; ``durable-agents run --follow`` (the console script) runs
  an agent on that worker too;
- in a venv where the extras' libraries cannot be imported, ``durable-agents-worker`` starts and runs
  an agent with the defaults, and asking for the E2B sandbox, a PostgreSQL store, MCP servers or the
  codec server is a one-line error naming the extra.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import DEADLINE_S, eventually

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "worker.py", "starter.py")
SOURCE_DIRS = ("durable_agents", "workflows", "activities", "scripts")
# The importable libraries of the extras (and what only they pull in: httpx2 comes with mcp).
EXTRA_LIBRARIES = (
    *("e2b", "psycopg", "psycopg_pool", "psycopg_binary", "mcp", "httpx2", "starlette", "uvicorn", "fastapi"),
)
HANG_GUARD_S = 4 * DEADLINE_S  # a subprocess that never ends fails the test instead of hanging it
ITEM = "A-7"
STOCK = f"{ITEM}: 7 in stock (the project's own tool)"


# --- building and installing --------------------------------------------------------------------------------


def run(argv: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD_S, **options)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built without build isolation (no index needed) from an sdist of a copy of the sources."""
    base = tmp_path_factory.mktemp("wheel")
    source, out = base / "source", base / "dist"
    source.mkdir()
    for name in SOURCES:
        shutil.copy2(ROOT / name, source / name)
    for name in SOURCE_DIRS:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    backend = "import sys; from scripts import build_backend; print(build_backend.build_sdist(sys.argv[1]))"
    sdist = out / run([sys.executable, "-c", backend, str(out)], cwd=source).stdout.strip().splitlines()[-1]
    run([sys.executable, "-m", "pip", "wheel", str(sdist), "--no-deps", "--no-build-isolation", "-w", str(out)])
    (built,) = out.glob("durable_agents-*.whl")
    return built


def make_venv(path: Path, wheel: Path, *, blocked: tuple[str, ...] = ()) -> Path:
    """A venv at ``path`` with ``wheel`` installed and this venv's libraries reachable; ``blocked`` ones not."""
    run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    python = path / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "test_dependencies.pth").write_text("".join(f"{entry}\n" for entry in ours))
    if blocked:  # as if not installed: an import of them (or of a submodule) raises ModuleNotFoundError
        (site / "sitecustomize.py").write_text(
            textwrap.dedent(f"""
            import importlib.abc, sys

            BLOCKED = {set(blocked)!r}

            class NotInstalled(importlib.abc.MetaPathFinder):
                def find_spec(self, name, path=None, target=None):
                    if name.partition(".")[0] in BLOCKED:
                        raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                    return None

            sys.meta_path.insert(0, NotInstalled())
            """)
        )
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "venv", wheel)


@pytest.fixture(scope="module")
def bare_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("bare") / "venv", wheel, blocked=EXTRA_LIBRARIES)


# --- the user's project -----------------------------------------------------------------------------------

PROJECT = {
    # Its own workflow, importing only from durable_agents, in a module named like ours.
    "workflows.py": """
        from datetime import timedelta

        from temporalio import workflow

        from durable_agents import AgentInput, AgentResult


        @workflow.defn
        class StockReportWorkflow:
            @workflow.run
            async def run(self, item: str) -> str:
                result = await workflow.execute_child_workflow(
                    "AgentWorkflow",
                    AgentInput(task=f"How many {item} are in stock?", tools=["stock_count"]),
                    id=f"{workflow.info().workflow_id}-agent",
                    task_queue=workflow.info().task_queue,
                    result_type=AgentResult,
                    execution_timeout=timedelta(minutes=5),
                )
                return f"{result.status}: {result.output}"
        """,
    "activities/__init__.py": "",
    # Its own tool module, in a package named like ours (AGENT_TOOL_MODULES=activities.inventory).
    "activities/inventory.py": """
        from pydantic import BaseModel

        from durable_agents import ToolContext, tool


        class StockArgs(BaseModel):
            item: str


        @tool("stock_count", description="How many of an item are in stock.", args=StockArgs)
        async def stock_count(args: StockArgs, ctx: ToolContext) -> str:
            return f"{args.item}: 7 in stock (the project's own tool)"
        """,
    # Its own worker: the plugin plus its workflow; first it says where its imports come from.
    "worker.py": """
        import asyncio
        import importlib.util
        import json
        import os
        import signal
        import sys

        from temporalio.client import Client
        from temporalio.worker import Worker

        import durable_agents
        from durable_agents import DurableAgentsPlugin, Settings, exit_process
        from workflows import StockReportWorkflow


        def origin(name):
            spec = importlib.util.find_spec(name)
            return spec.origin if spec is not None else None


        async def main():
            probe = {
                "durable_agents": durable_agents.__file__,
                "sys_path": [os.path.realpath(entry or os.curdir) for entry in sys.path],
                "workflows": origin("workflows"),
                "activities": origin("activities"),
                "tool_module": origin("activities.inventory"),
            }
            print("probe " + json.dumps(probe), flush=True)
            settings = Settings.from_env()
            plugin = DurableAgentsPlugin(settings)
            client = await Client.connect(settings.temporal.address, plugins=[plugin])
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            async with Worker(client, task_queue=settings.task_queue, workflows=[StockReportWorkflow]):
                print("project worker polling", flush=True)
                await stop.wait()


        asyncio.run(main())
        exit_process(0)
        """,
    # Its own starter.
    "starter.py": """
        import asyncio
        import sys

        from temporalio.client import Client

        from durable_agents import Settings, exit_process
        from workflows import StockReportWorkflow


        async def main(item, workflow_id):
            settings = Settings.from_env()
            client = await Client.connect(settings.temporal.address)
            return await client.execute_workflow(
                StockReportWorkflow.run, item, id=workflow_id, task_queue=settings.task_queue
            )


        print(asyncio.run(main(sys.argv[1], sys.argv[2])), flush=True)
        exit_process(0)
        """,
}


def write_project(path: Path) -> Path:
    for name, text in PROJECT.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(textwrap.dedent(text).lstrip())
    return path


def model(body: dict[str, Any]) -> Scripted:
    """The offline model: it calls ``stock_count`` when offered it, then answers with what the tool said."""
    results = [m["content"] for m in body.get("messages", []) if m.get("role") == "tool"]
    if results:
        return Scripted(text=f"The stock: {results[-1]}")
    offered = {t["function"]["name"] for t in body.get("tools", [])}
    if "stock_count" in offered:
        return Scripted(tool_calls=[("stock_count", json.dumps({"item": ITEM}))])
    return Scripted(text="Nothing to look up.")


def environment(venv: Path, tmp_path: Path, address: str, llm: FakeLLMServer, **extra: str) -> dict[str, str]:
    """What a user's shell would hold: the venv first on ``PATH``, the agents' settings; nothing of the repo."""
    env = {
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "TEMPORAL_ADDRESS": address,
        "AGENT_TASK_QUEUE": f"wheel-{uuid.uuid4().hex[:8]}",
        "AGENT_MODEL": "openai:test-model",
        "OPENAI_BASE_URL": llm.openai_url,
        "OPENAI_API_KEY": "sk-wheel-test",
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_LOG_LEVEL": "INFO",
    }
    env.update(extra)
    return env


class Process:
    """A long-running child (a worker), its output in a log file."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def printed(self, marker: str) -> str:
        def seen() -> bool:
            if self.proc.poll() is not None:  # not an AssertionError: eventually() would keep waiting
                raise RuntimeError(f"exited {self.proc.returncode}:\n{self.text()}")
            return marker in self.text()

        await eventually(seen, f"{marker!r} in {self.log}")
        return self.text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=HANG_GUARD_S)


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:  # a failed test still ends its workers
        if process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait()


async def child(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A short-lived child (a starter, the CLI), run off the event loop."""
    return await asyncio.to_thread(
        subprocess.run, argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


def probe_of(log: str) -> dict[str, Any]:
    line = next(line for line in log.splitlines() if line.startswith("probe "))
    probe: dict[str, Any] = json.loads(line.removeprefix("probe "))
    return probe


# --- the tests ---------------------------------------------------------------------------------------------


def test_the_wheel_holds_durable_agents_alone(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(name.rpartition("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{info}/METADATA").decode()
        top_level = archive.read(f"{info}/top_level.txt").decode().split()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert {name.split("/")[0] for name in names} == {"durable_agents", info}
    assert top_level == ["durable_agents"]
    for moved in ("workflows/agent.py", "activities/runtime.py", "worker.py", "starter.py"):
        assert f"durable_agents/{moved}" in names
    for package in ("", "workflows/", "activities/"):
        assert f"durable_agents/{package}py.typed" in names
    for page in ("index.html", "inbox.js", "inbox.css"):  # the approval inbox starter.py serve serves
        assert f"durable_agents/api/inbox/{page}" in names
    assert "durable-agents = durable_agents.cli.entry:main" in entry_points
    assert "durable-agents-worker = durable_agents.cli.entry:worker_main" in entry_points
    requires = [
        line.removeprefix("Requires-Dist: ") for line in metadata.splitlines() if line.startswith("Requires-Dist")
    ]
    extras = {"e2b": "e2b", "psycopg": "postgres", "psycopg-pool": "postgres", "mcp": "mcp"}
    extras.update(starlette="server", uvicorn="server", fastapi="server")
    for library, extra in extras.items():
        (line,) = [r for r in requires if re.match(r"[\w.-]+", r).group() == library]  # type: ignore[union-attr]
        assert line.endswith(f'; extra == "{extra}"'), line
    assert 'durable-agents[all]; extra == "dev"' in requires


def in_checkout(sys_path: list[str]) -> list[str]:
    """The entries inside this checkout, but for the test venv's site-packages that lends the dependencies
    (``.venv`` is inside the checkout in a fresh clone)."""
    lent = {os.path.realpath(p) for p in (sysconfig.get_path("purelib"), sysconfig.get_path("platlib"))}
    return [e for e in sys_path if f"{e}/".startswith(f"{ROOT}/") and os.path.realpath(e) not in lent]


async def test_a_user_project_with_colliding_names_runs_an_agent_from_the_wheel(
    venv: Path, dev_env: WorkflowEnvironment, llm: FakeLLMServer, tmp_path: Path, processes: list[Process]
) -> None:
    llm.default = model
    project = write_project(tmp_path / "project")
    address = dev_env.client.service_client.config.target_host
    env = environment(venv, tmp_path, address, llm, AGENT_TOOL_MODULES="activities.inventory")
    python = str(venv / "bin" / "python")

    worker = Process([python, "worker.py"], env, project, tmp_path / "worker.log")
    processes.append(worker)
    probe = probe_of(await worker.printed("project worker polling"))
    assert Path(probe["durable_agents"]).is_relative_to(venv), probe
    assert not in_checkout(probe["sys_path"]), probe  # nor in it
    assert probe["workflows"] == str(project / "workflows.py")
    assert probe["activities"] == str(project / "activities" / "__init__.py")
    assert probe["tool_module"] == str(project / "activities" / "inventory.py")

    workflow_id = f"report-{uuid.uuid4().hex[:8]}"
    started = await child([python, "starter.py", ITEM, workflow_id], env, project)
    assert started.returncode == 0, f"{started.stderr}\nworker:\n{worker.text()}"
    assert started.stdout == f"completed: The stock: {STOCK}\n"
    agent = dev_env.client.get_workflow_handle(f"{workflow_id}-agent")
    assert (await agent.describe()).workflow_type == "AgentWorkflow"

    # The console script, from the project's directory, on the project's worker (which offers its tool).
    cli = await child([str(venv / "bin" / "durable-agents"), "run", f"How many {ITEM}?", "--follow"], env, project)
    assert cli.returncode == 0, f"{cli.stdout}\n{cli.stderr}\nworker:\n{worker.text()}"
    assert f"The stock: {STOCK}" in cli.stdout, cli.stdout
    assert worker.stop() == 0, worker.text()


async def test_without_the_extras_the_defaults_run_and_each_feature_names_its_extra(
    bare_venv: Path, dev_env: WorkflowEnvironment, llm: FakeLLMServer, tmp_path: Path, processes: list[Process]
) -> None:
    llm.default = model
    address = dev_env.client.service_client.config.target_host
    env = environment(bare_venv, tmp_path, address, llm)
    bin_dir = bare_venv / "bin"
    hidden = await child([str(bin_dir / "python"), "-c", PROBE_HIDDEN], env, tmp_path)
    assert hidden.stdout.split() == ["hidden"] * len(EXTRA_LIBRARIES), hidden.stderr
    # Every public name resolves (each loads its home module) without the extras.
    exports = "import durable_agents as d; print(len([getattr(d, name) for name in d.__all__]))"
    loaded = await child([str(bin_dir / "python"), "-c", exports], env, tmp_path)
    assert loaded.returncode == 0 and int(loaded.stdout) > 20, loaded.stderr

    worker = Process([str(bin_dir / "durable-agents-worker")], env, tmp_path, tmp_path / "worker.log")
    processes.append(worker)
    await worker.printed("worker_started")
    cli = await child([str(bin_dir / "durable-agents"), "run", "Say hello.", "--follow"], env, tmp_path)
    assert cli.returncode == 0, f"{cli.stdout}\n{cli.stderr}\nworker:\n{worker.text()}"
    assert "Nothing to look up." in cli.stdout, cli.stdout
    assert worker.stop() == 0, worker.text()

    servers = tmp_path / "mcp.json"
    servers.write_text(json.dumps({"mcpServers": {"time": {"command": "mcp-server-time"}}}))
    refused = {
        "e2b": {"AGENT_SANDBOX": "e2b"},
        "postgres": {"AGENT_STORE_URL": "postgresql://agents:secret@127.0.0.1:9/agents"},
        "mcp": {"AGENT_MCP_CONFIG": str(servers)},
    }
    for extra, variables in refused.items():
        failed = await child([str(bin_dir / "durable-agents-worker")], {**env, **variables}, tmp_path)
        assert failed.returncode == 2, (extra, failed.stdout, failed.stderr)
        (line,) = (failed.stdout + failed.stderr).splitlines()  # one line: the worker's bad_configuration
        logged = json.loads(line)
        assert logged["event"] == "bad_configuration", line
        assert logged["error"].startswith(next(iter(variables))), line  # it names the setting ...
        assert logged["error"].endswith(f" needs the {extra} extra: pip install 'durable-agents[{extra}]'"), line
    keys = {"AGENT_PAYLOAD_KEYS": f"k1:{base64.b64encode(bytes(32)).decode()}"}
    codec = await child([str(bin_dir / "durable-agents"), "codec-server"], {**env, **keys}, tmp_path)
    assert codec.returncode == 2, (codec.stdout, codec.stderr)
    assert codec.stderr == ("error: the codec server needs the server extra: pip install 'durable-agents[server]'\n"), (
        codec.stderr
    )
    api = await child([str(bin_dir / "durable-agents"), "serve", "--insecure-local"], env, tmp_path)
    assert api.returncode == 2, (api.stdout, api.stderr)
    assert api.stderr == "error: the HTTP API needs the server extra: pip install 'durable-agents[server]'\n", (
        api.stderr
    )


PROBE_HIDDEN = f"""
import importlib
for name in {EXTRA_LIBRARIES!r}:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        print("hidden")
    else:
        print("importable:", name)
"""
