"""Every README snippet and every command it shows runs here, in order, the way a reader follows it.

Each fenced block of README.md is marked by an HTML comment right above it (``<!-- test: NAME -->``, invisible
on GitHub) naming how it is checked:

- the ``bash`` blocks of a walkthrough run line by line in one "shell" (a temporary project directory, its
  environment, its background jobs) against the session's dev server (``dev_env``) and a fake LLM server that
  plays the model for each task the README shows; every command's result is checked (``EXPECTED``);
- the ``python`` blocks run too: ``# my_tools.py`` is written into the project and imported by the worker the
  next block starts; the embedding block runs as a script (its own worker and workflow);
- long-running commands (``make demo``, ``make test``, ``make server``) are checked to be Makefile targets, and
  what the README says ``make demo`` does is checked against a run of ``scripts/demo.py``;
- ``pip install .`` is checked with ``pip install --dry-run``.

A README block without a known marker, a marker without its block, or a command without an expectation fails.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import WorkerFactory, require_bwrap
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually
from workflows.types import StatusView

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
MAX_README_BYTES = 15_000
# This repository's own top-level modules: a README snippet imports none of them but durable_agents.
PROJECT_MODULES = {"workflows", "activities", "durable_agents", "worker", "starter", "scripts", "examples", "tests"}
WALKTHROUGH = ("real-model", "first-tool", "first-tool-run", "approve", "embed")
MARKERS = {"install", "two-commands", "sessions", *WALKTHROUGH}
TWO_TO_THE_100 = str(2**100)


@dataclass(frozen=True)
class Block:
    marker: str
    lang: str
    text: str
    line: int


def readme_blocks() -> list[Block]:
    blocks: list[Block] = []
    lines = README.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = re.fullmatch(r"```(\w*)", lines[index])
        if not opening:
            index += 1
            continue
        end = lines.index("```", index + 1)
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = re.fullmatch(r"<!-- test: ([\w-]+) -->", before.strip())
        text = "\n".join(lines[index + 1 : end])
        blocks.append(Block(marker.group(1) if marker else "", opening.group(1), text, index))
        index = end + 1
    return blocks


def block(marker: str) -> Block:
    (found,) = [b for b in readme_blocks() if b.marker == marker]
    return found


def commands(text: str) -> list[list[str]]:
    """The command lines of a bash block, split as the shell would (comments dropped)."""
    return [words for line in text.splitlines() if (words := shlex.split(line, comments=True))]


# --- the README as a document ---------------------------------------------------------------------------


def test_the_readme_is_at_most_15_kb() -> None:
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes; move detail into docs/"


def test_every_block_is_marked_and_every_marker_has_its_block() -> None:
    blocks = readme_blocks()
    unmarked = [b.line + 1 for b in blocks if b.marker not in MARKERS]
    assert not unmarked, f"README blocks without a known <!-- test: NAME --> marker at lines {unmarked}"
    assert sorted(b.marker for b in blocks) == sorted(MARKERS)


def test_every_snippet_imports_only_durable_agents_of_this_project() -> None:
    python = [b for b in readme_blocks() if b.lang == "python"]
    assert python
    for snippet in python:
        imported = set()
        for node in ast.walk(ast.parse(snippet.text)):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
        assert "durable_agents" in imported, snippet.marker
        assert imported & PROJECT_MODULES == {"durable_agents"}, f"{snippet.marker}: {imported & PROJECT_MODULES}"


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([\w-]+):", text, flags=re.MULTILINE))


def test_every_make_command_is_a_makefile_target() -> None:
    shown = {words[1] for b in readme_blocks() if b.lang == "bash" for words in commands(b.text) if words[0] == "make"}
    assert {"demo", "test", "server"} <= shown
    assert shown <= makefile_targets(), shown - makefile_targets()


def test_the_install_command_resolves() -> None:
    assert commands(block("install").text) == [["pip", "install", "."]]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation", "--no-index", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Would install durable-agents" in done.stdout


# --- what `make demo` does -------------------------------------------------------------------------------

# What the README says the demo does, and what the demo's own output shows for it.
DEMO_STEPS = {
    "writes a Python file and runs it in the sandbox": ("write_file", "run_python"),
    "GETs the stock level from the API": ("http_request GET",),
    "asks to POST a reservation": ("approval_requested", "http_request"),
    "the demo's approver answers it with\n`durable-agents pending` and `durable-agents approve`": (
        "[demo approver] approving",
    ),
    "the POST goes out with\nits `Idempotency-Key`": ("idempotency_key",),
    "prints the answer, the\nrun id and its UI link": ("finished: completed", "/namespaces/default/workflows/demo-"),
    "starts a session and sends it two\nmessages with the `send` update": (
        "[you] message 1: Check the stock level at http://127.0.0.1:",
        "[you] message 2: Check it again",
        "status: idle, 2 messages, 2 replied",
        "session closed: completed",
    ),
    "its reply compares what it sees now with the first": (
        "[agent] reply 1:\n    Done. Here is what I found:\n"
        '    - the HTTP request returned HTTP 200 OK: {"service": "inventory"',
        "[agent] reply 2:\n    Message 2: here is what I see now:\n    - the HTTP request returned HTTP 200 OK:",
        "    - unchanged since message 1\n",
    ),
}


def test_the_readme_says_what_make_demo_does(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    require_bwrap()
    section = README.read_text(encoding="utf-8").split("## Two commands", 1)[1].split("\n## ", 1)[0]
    for claim in DEMO_STEPS:
        assert claim in section, f"the README no longer says: {claim!r}"
    assert "scripts/demo.py" in section and "demo: venv bytecode bwrap server" in (ROOT / "Makefile").read_text()
    env = {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PYTHONPATH": str(ROOT),
        "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "AGENT_STATE_DIR": str(tmp_path / "agent"),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")], env=env, capture_output=True, text=True, timeout=240
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for claim, shown in DEMO_STEPS.items():
        for text in shown:
            assert text in output, f"the demo did not show {text!r} for the README's {claim!r}:\n{output}"


# --- the walkthrough -------------------------------------------------------------------------------------


def readme_model(body: dict[str, Any]) -> Scripted:
    """The fake LLM's part in the walkthrough: what a model would do with each task the README shows."""
    messages = body["messages"]
    offered = {tool["function"]["name"] for tool in body.get("tools", [])}
    task = next((m["content"] for m in messages if m["role"] == "user"), "")
    if messages[-1]["role"] == "tool":
        return Scripted(text=f"Answer: {messages[-1]['content']}")
    if "2**100" in task and "run_python" in offered:
        return Scripted(tool_calls=[("run_python", json.dumps({"code": "print(2**100)"}))])
    if "A-1001" in task and "stock_lookup" in offered:
        return Scripted(tool_calls=[("stock_lookup", json.dumps({"sku": "A-1001"}))])
    if "Reserve" in task and "reserve" in offered:
        return Scripted(tool_calls=[("reserve", json.dumps({"sku": "A-1001"}))])
    if "Summarise Temporal" in task:
        return Scripted(text="Temporal runs code durably.")
    return Scripted(text=f"no script for {task!r}")


Check = Callable[[subprocess.CompletedProcess[str]], bool]


def says(*needles: str) -> Check:
    return lambda done: done.returncode == 0 and all(n in done.stdout for n in needles)


# Every foreground command the walkthrough runs, by its first words, and what it must show. A command the
# README adds without an entry here fails the walkthrough (someone has to say what it should do).
EXPECTED: dict[str, Check] = {
    'durable-agents run "What is 2**100? Use Python."': says(TWO_TO_THE_100, "completed"),
    'durable-agents run "How many A-1001 are in stock?"': says("A-1001: 42 in stock", "completed"),
    'durable-agents run "Reserve one A-1001."': says("order-1"),
    "durable-agents pending order-1": says("reserve", "A-1001"),  # shown once the model asked
    "durable-agents approve order-1": says("approved"),
    "durable-agents watch order-1": says("approved by alice", "reserve ok", "finished: completed"),
    "durable-agents status order-1": says("completed", "reserved one A-1001"),
    "python embed.py": says("Temporal runs code durably."),
}


RETRIED = {"durable-agents pending order-1"}


@dataclass
class Shell:
    """One reader's terminal: a project directory, its environment and its background jobs."""

    cwd: Path
    env: dict[str, str]
    jobs: list[subprocess.Popen[str]] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)

    def assign(self, words: list[str]) -> tuple[dict[str, str], list[str]]:
        env = dict(self.env)
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            # The checkout under test stays importable after the reader's PYTHONPATH, as an install makes it.
            env[name] = f"{value}{os.pathsep}{ROOT}" if name == "PYTHONPATH" else value
        return env, words

    async def run(self, line: list[str]) -> None:
        words = list(line)
        if words[0] == "make":
            assert words[1] in makefile_targets()  # `make server`: the session's dev server plays it
            return
        if words[0] == "export":
            self.env, _ = self.assign(words[1:])
            return
        if words == ["kill", "%1"]:
            job = self.jobs.pop(0)
            job.terminate()
            await asyncio.to_thread(job.wait, 60)
            return
        env, words = self.assign(words)
        background = words[-1] == "&"
        words = [w for w in words if w != "&"]
        assert words[0] in ("durable-agents", "durable-agents-worker", "python"), words
        argv = [str(BIN / words[0]) if words[0] != "python" else sys.executable, *words[1:]]
        if background:  # started, not waited for: like `cmd &`
            job = subprocess.Popen(argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, text=True)  # noqa: ASYNC220
            self.jobs.append(job)
            return
        shown = shlex.join(words)
        (key,) = [k for k in EXPECTED if shown.startswith(shlex.join(shlex.split(k)))]
        check = EXPECTED[key]

        def attempt() -> subprocess.CompletedProcess[str]:
            done = subprocess.run(
                argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180
            )
            assert "Traceback" not in done.stderr, done.stderr
            assert check(done), f"`{shown}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            return done

        if key in RETRIED:  # a read the reader repeats until the run got there
            await eventually(lambda: asyncio.to_thread(attempt), f"`{shown}` to show what the README says")
        else:
            await asyncio.to_thread(attempt)
        self.ran.append(key)

    def stop(self) -> None:
        for job in self.jobs:
            job.terminate()
        for job in self.jobs:
            try:
                job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.kill()


async def test_the_readme_walkthrough_runs(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    require_bwrap()
    project = tmp_path / "project"  # the reader's own directory: state goes to ./.agent there
    project.mkdir()
    with FakeLLMServer(default=readme_model) as llm:
        shell = Shell(
            cwd=project,
            env={
                "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                "HOME": os.environ.get("HOME", str(tmp_path)),
                "PYTHONPATH": str(ROOT),
                "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
                "AGENT_TASK_QUEUE": f"readme-{os.getpid()}",
                "OPENAI_BASE_URL": llm.openai_url,  # "the model" the README's key would reach
                "AGENT_LOG_LEVEL": "WARNING",
            },
        )
        try:
            for marker in WALKTHROUGH:
                snippet = block(marker)
                if snippet.lang == "python":
                    name = re.match(r"# (\w+\.py)\n", snippet.text)
                    (project / (name.group(1) if name else f"{marker}.py")).write_text(snippet.text, encoding="utf-8")
                    if name is None:  # a script: run it as the reader would
                        await shell.run(["python", f"{marker}.py"])
                    continue
                for line in commands(snippet.text):
                    await shell.run(line)
        finally:
            shell.stop()
    assert sorted(shell.ran) == sorted(EXPECTED), "every expectation was used by a README command"
    # The model was really given the tools' results.
    tool_results = [m["content"] for r in llm.requests for m in r["body"]["messages"] if m["role"] == "tool"]
    assert any("A-1001: 42 in stock" in text for text in tool_results), tool_results


@pytest.mark.parametrize("marker", ["real-model", "first-tool-run", "approve"])
def test_every_cli_command_the_readme_shows_parses(marker: str) -> None:
    """Flags the README shows are the CLI's own: ``--help`` of each command lists every flag it uses."""
    for words in commands(block(marker).text):
        words = [w for w in words if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w) and w != "&"]
        if words[0] != "durable-agents":
            continue
        done = subprocess.run(
            [str(BIN / "durable-agents"), words[1], "--help"],
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        for flag in (w for w in words[2:] if w.startswith("--")):
            assert flag in done.stdout, f"`durable-agents {words[1]}` has no {flag}"


# --- the Temporal CLI commands of a session ----------------------------------------------------------------


async def test_the_readme_session_commands_run(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    """The three ``temporal`` commands of "Sessions", as shown (the id and task queue made unique here)."""
    llm.enqueue(Scripted(text="2**100 is " + TWO_TO_THE_100), Scripted(text="2**101 is " + str(2**101)))
    lines = commands(block("sessions").text)
    assert [words[:3] for words in lines] == [
        ["temporal", "workflow", "start"],
        ["temporal", "workflow", "update"],
        ["temporal", "workflow", "signal"],
    ]
    session_id = f"chat-{uuid.uuid4().hex[:8]}"
    address = dev_env.client.service_client.config.target_host
    async with run_worker(dev_env.client, runtime) as tq:
        handle = dev_env.client.get_workflow_handle(session_id)

        async def replied(seq: int) -> StatusView | None:
            view: StatusView = await handle.query("status", result_type=StatusView)
            return view if view.replied >= seq and view.state == "idle" else None

        for number, words in enumerate(lines, 1):
            words = [session_id if w == "chat-1" else tq if w == "agents" else w for w in words]
            argv = [str(BIN / "temporal"), *words[1:], "--address", address]
            done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"{shlex.join(words)}:\n{done.stdout}\n{done.stderr}"
            if number == 2:
                assert "accepted:true" in done.stdout and "seq:1" in done.stdout, done.stdout
                await eventually(lambda: replied(1), "the reply to message 1")
        view = await eventually(lambda: replied(2), "the reply to message 2")
    assert view.session and view.messages == 2 and view.output == "2**101 is " + str(2**101)
    # The model saw the whole conversation at message 2's turn.
    last = [r["body"]["messages"] for r in llm.requests if r["path"].endswith("/chat/completions")][-1]
    said = [(m["role"], m["content"]) for m in last if m["role"] in ("user", "assistant")]
    assert said == [
        ("user", "What is 2**100? Use Python."),
        ("assistant", "2**100 is " + TWO_TO_THE_100),
        ("user", "And 2**101?"),
    ]
