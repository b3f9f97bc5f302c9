"""The commands a message tells a person to paste: this CLI as it was started, and a worker.

An ``AgentClient`` error that says what to do next (``start one with: ...``, ``see ... pending ID``)
names the command the way the person would type it in this process's setting.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import sys
from pathlib import Path

CONSOLE_SCRIPT = "durable-agents"
REPO_STARTER = Path(__file__).resolve().parents[2] / "starter.py"


def cli_command(words: str) -> str:
    """``words`` (e.g. ``watch RUN_ID``) as a command a user can paste: this CLI as it was started.

    ``durable-agents ...`` when the process is that console script; else the interpreter actually
    running (``python`` when that name on PATH is it, else its full path: a venv need not be
    activated) and the script as it was given (``starter.py`` when it is in the working directory).
    Called from elsewhere (a test, an embedding app), the console script when it is on PATH, else
    this checkout's ``starter.py``.
    """
    return f"{_invocation()} {words}"


@functools.cache
def _invocation() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if Path(argv0).name == CONSOLE_SCRIPT:
        return _program(CONSOLE_SCRIPT, argv0)
    if argv0.endswith(".py"):
        return f"{_python()} {shlex.quote(_shortened(argv0))}"
    on_path = shutil.which(CONSOLE_SCRIPT)
    if on_path is not None or not REPO_STARTER.exists():
        return CONSOLE_SCRIPT
    return f"{_python()} {shlex.quote(_shortened(str(REPO_STARTER)))}"


WORKER_SCRIPT = "durable-agents-worker"
WORKER_FILE = "worker.py"


def worker_command() -> str:
    """How to start a worker, as a command a user can paste; chosen the way :func:`cli_command` is.

    ``durable-agents-worker`` when this CLI is the ``durable-agents`` console script and the worker's
    script is installed beside it; ``worker.py`` (beside the script that was run) with the interpreter
    actually running when this CLI is ``starter.py``. Called from elsewhere, the worker's console
    script beside the running interpreter, else this checkout's ``worker.py``, else the bare name.
    A console script is shown by name when that name on PATH is it, else by its full path.
    """
    return _worker_invocation()


@functools.cache
def _worker_invocation() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if Path(argv0).name == CONSOLE_SCRIPT and (beside := Path(argv0).with_name(WORKER_SCRIPT)).is_file():
        return _program(WORKER_SCRIPT, str(beside))
    if argv0.endswith(".py") and (script := Path(argv0).with_name(WORKER_FILE)).is_file():
        return f"{_python()} {shlex.quote(_shortened(str(script)))}"
    installed = Path(sys.executable).with_name(WORKER_SCRIPT)
    if installed.is_file():
        return _program(WORKER_SCRIPT, str(installed))
    repo_worker = REPO_STARTER.with_name(WORKER_FILE)
    if repo_worker.is_file():
        return f"{_python()} {shlex.quote(_shortened(str(repo_worker)))}"
    return WORKER_SCRIPT


def _python() -> str:
    for name in ("python", "python3"):
        if _same_path(shutil.which(name), sys.executable):
            return name
    return shlex.quote(sys.executable)


def _program(name: str, path: str) -> str:
    """``name`` when it is on PATH as ``path``, else ``path`` itself."""
    return name if _same_path(shutil.which(name), path) else shlex.quote(os.path.abspath(path))


def _same_path(found: str | None, path: str) -> bool:
    # Not resolved: a venv's python is a symlink to the system's, which runs without the venv.
    return found is not None and os.path.abspath(found) == os.path.abspath(path)


def _shortened(script: str) -> str:
    """The script's name when it is in the working directory, else the path as given."""
    path = Path(script)
    return path.name if path.is_absolute() and path.parent == Path.cwd() else script
