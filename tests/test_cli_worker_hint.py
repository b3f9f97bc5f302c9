"""The "start one with: ..." hint names a worker command that runs, however the CLI was started.

``status`` of a run on a task queue nobody polls prints the hint; each printed command is then
run as printed (same working directory and PATH) against an address where no server listens:
a worker that starts says ``temporal_unavailable`` and exits 2, which a command that is not on
PATH, or a ``worker.py`` that is not where the hint says, cannot do.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from tests.conftest import start_agent
from tests.test_cli_bad_input import ROOT, address, cli_env, nobody

__all__ = ["address"]  # the fixture, used by name

HINT = re.compile(r"start one with: AGENT_TASK_QUEUE=(\S+) (.+?)\)")


def console_script(path: Path, body: str) -> Path:
    """An executable script like pip's console scripts, running this checkout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n{body}\n")
    path.chmod(0o755)
    return path


def runs_as_printed(command: str, cwd: Path, path: str, state_dir: Path) -> None:
    words = shlex.split(command)
    first = words[0]
    assert Path(cwd, first).is_file() if "/" in first else shutil.which(first, path=path), (command, path)
    done = subprocess.run(
        words,
        env={"PATH": path, "TEMPORAL_ADDRESS": "127.0.0.1:1", "AGENT_STATE_DIR": str(state_dir)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "temporal_unavailable" in done.stderr, (command, done.returncode, done.stderr)


async def test_the_worker_hint_is_a_command_that_starts_a_worker(
    address: str, dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    task_queue = nobody()
    handle = await start_agent(dev_env.client, task_queue, id_prefix="hint")
    venv = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    bare = "/usr/bin:/bin"  # the venv is not activated
    bin_dir = tmp_path / "bin"
    cli = console_script(
        bin_dir / "durable-agents",
        "from durable_agents.cli.main import run\nfrom durable_agents.client import exit_process\nexit_process(run())",
    )
    console_script(bin_dir / "durable-agents-worker", "from durable_agents.cli.entry import worker_main\nworker_main()")
    starter = [sys.executable, str(ROOT / "starter.py")]
    cases = [
        (starter, ROOT, venv, "python worker.py"),
        (starter, ROOT, bare, f"{sys.executable} worker.py"),
        (starter, tmp_path, venv, f"python {ROOT / 'worker.py'}"),
        ([str(cli)], tmp_path, f"{bin_dir}:{bare}", "durable-agents-worker"),
        ([str(cli)], tmp_path, bare, str(bin_dir / "durable-agents-worker")),
    ]
    try:
        for argv, cwd, path, shown in cases:
            done = await asyncio.to_thread(
                subprocess.run,
                [*argv, "status", handle.id],
                env={**cli_env(address, task_queue), "PATH": path},
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 1, (argv, done.stdout, done.stderr)
            match = HINT.search(done.stderr)
            assert match is not None, done.stderr
            assert match.group(1) == task_queue and match.group(2) == shown, (argv, cwd, path, done.stderr)
            await asyncio.to_thread(runs_as_printed, match.group(2), cwd, path, tmp_path / "state")
    finally:
        await handle.terminate("test over")
