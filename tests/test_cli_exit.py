"""Ctrl-C ends a command even when one of its tasks does not end when cancelled.

``starter.py`` runs each command in an asyncio loop. Closing a loop cancels every task left and
waits for each to end; a task inside a call that takes its cancellation for an RPC error (and polls
on) would keep an interrupted command alive for good. ``run`` leaves such a loop unclosed on
Ctrl-C: the process exits through ``os._exit`` next.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.interrupts import as_from_a_terminal

ROOT = Path(__file__).resolve().parent.parent

# A command that leaves behind a task which swallows its cancellation and waits on, then gets Ctrl-C.
STUBBORN = """
import asyncio, importlib, os, signal
cli = importlib.import_module("durable_agents.cli.main")
from durable_agents.client import exit_process

async def stubborn() -> None:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:  # taken for something else: it waits on
        await asyncio.Event().wait()

async def command(argv, prog):
    asyncio.ensure_future(stubborn())
    await asyncio.sleep(0)
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.Event().wait()

cli.main = command
exit_process(cli.run([]))
"""

HANG_GUARD_S = 120  # not a speed bound: without the fix the process never ends


def test_ctrl_c_ends_the_command_when_a_task_ignores_its_cancellation() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", STUBBORN],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal,
    )
    try:
        out, err = proc.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the interrupted command did not end: {err[-2000:]}") from None
    assert proc.returncode == 130, (out, err)
    assert err.strip().splitlines()[-1] == "interrupted", err
    assert "Traceback" not in err, err
