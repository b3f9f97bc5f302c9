"""Temporal goes away while ``run --follow`` and ``watch`` follow a run: one line, exit 2, how to reattach.

The test has a dev server of its own (``DevServer``, so killing it harms no other test), a
``worker.py`` subprocess on it, and a run that waits for an approval. ``run --follow`` and
``watch`` follow it as ``starter.py`` processes; the server is SIGKILLed. Each command then
prints exactly one line on stderr (none of the SDK's retry warnings, on either stream), exits 2,
and the line holds the reattach command (``watch RUN --from N``) that Ctrl-C would print. Once
the server is back on the same database, that command follows the run again.
"""

from __future__ import annotations

import asyncio
import queue
import re
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.fakes.worker_proc import DevServer, WorkerProc, worker_env, write_policy
from tests.test_cli_bad_input import ROOT, Started, clean, cli_env, starter
from tests.waiting import eventually

ASK_EVERYTHING = {"rules": [{"tool": "*", "decision": "ask"}]}
LOST = re.compile(r"^error: lost the connection to Temporal at (\S+) \(.*\); run (\S+) goes on; .*reattach with: (.+)$")
EXIT_DEADLINE_S = 180  # the SDK retries a failing call for a while before it gives up


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DevServer]:
    dev = DevServer(tmp_path / "temporal.sqlite", tmp_path / "temporal.log").start()
    yield dev
    dev.kill()


@pytest.fixture
def worker(server: DevServer, llm: FakeLLMServer, tmp_path: Path) -> Iterator[tuple[WorkerProc, str]]:
    task_queue = f"lost-{uuid.uuid4().hex[:8]}"
    env = worker_env(
        address=server.address,
        task_queue=task_queue,
        llm_url=llm.openai_url,
        state_dir=tmp_path / "state",
        policy_file=write_policy(tmp_path / "policy.json", ASK_EVERYTHING),
    )
    proc = WorkerProc(env, tmp_path / "worker.log").wait_ready(timeout=60)
    yield proc, task_queue
    proc.kill()


def ended(started: Started) -> subprocess.CompletedProcess[str]:
    """The process's exit code and all it printed, once it exits by itself."""
    code = started.proc.wait(timeout=EXIT_DEADLINE_S)
    for lines, source in ((started.stdout, started.out), (started.stderr, started.err)):
        try:
            while (line := source.get(timeout=10)) is not None:
                lines.append(line)
        except queue.Empty:
            pass
    return subprocess.CompletedProcess(started.proc.args, code, "".join(started.stdout), "".join(started.stderr))


async def test_losing_temporal_while_following_is_one_line_and_the_reattach_command(
    server: DevServer, worker: tuple[WorkerProc, str], llm: FakeLLMServer, tmp_path: Path
) -> None:
    _, task_queue = worker
    llm.default = lambda body: (
        Scripted(text="read")
        if any(m["role"] == "tool" for m in body["messages"])
        else Scripted(tool_calls=[("read_file", '{"path": "notes.txt"}')])
    )
    env = cli_env(server.address, task_queue)
    workflow_id = f"lost-{uuid.uuid4().hex[:8]}"
    following = Started(env, "run", "read my notes", "--id", workflow_id, "--follow")
    watching: Started | None = None
    try:
        await asyncio.to_thread(following.expect, "stdout", "approval_requested", 60)
        watching = Started(env, "watch", workflow_id)
        await asyncio.to_thread(watching.expect, "stdout", "approval_requested", 60)
        server.kill()
        results = await asyncio.gather(asyncio.to_thread(ended, following), asyncio.to_thread(ended, watching))
    finally:
        for process in (following, watching):
            if process is not None:
                process.kill()

    commands = []
    for done in results:
        clean(done)
        assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr  # no SDK warning lines
        match = LOST.match(lines[0])
        assert match is not None, lines[0]
        assert match.group(1) == server.address and match.group(2) == workflow_id, lines[0]
        command = match.group(3)
        assert re.search(rf"starter\.py watch {workflow_id} --from \d+$", command), command
        for noise in ("WARN", "retried", "temporalio_client"):
            assert noise not in done.stdout, done.stdout
        commands.append(command)

    # The reattach command works once the server is back (same database, same port): approved, the run
    # goes on, and the reattached watch shows it to the end (from the offset after what was shown).
    server.start()
    words = shlex.split(commands[0])
    assert str(ROOT / "starter.py").endswith(words[words.index("watch") - 1]), commands[0]
    again = Started(env, *words[words.index("watch") :])
    try:

        async def approved() -> bool:  # once the worker polls the restarted server again
            done = await asyncio.to_thread(starter, env, "approve", workflow_id, "--reviewer", "tess", timeout=120)
            assert done.returncode in (0, 1), done.stderr
            return done.returncode == 0

        await eventually(approved, "the approval is accepted after the restart", within_s=180)
        resumed = await asyncio.to_thread(ended, again)
    finally:
        again.kill()
    clean(resumed)
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    assert "approval_requested" not in resumed.stdout and "finished" in resumed.stdout, resumed.stdout
