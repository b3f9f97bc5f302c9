"""The console scripts: ``durable-agents`` (``python starter.py``) and ``durable-agents-worker`` (``python worker.py``).

Both are short- or long-lived client processes of the Temporal core runtime, so both end the way
``starter.py`` does: flush, then leave without interpreter teardown (:func:`durable_agents.client.exit_process`),
which the runtime's threads can crash at finalization. ``--help`` and ``--version`` leave the same way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

EXIT_INTERRUPTED = 130


def main() -> None:
    """``durable-agents ARGS``: the command line of ``starter.py``; never returns."""
    _leave(_cli)


def worker_main() -> None:
    """``durable-agents-worker``: ``worker.py``'s worker, until SIGTERM/SIGINT; never returns."""
    _leave(_worker)


def _cli() -> int:
    from durable_agents.cli.main import run

    return run(prog="durable-agents")


def _worker() -> int:
    import asyncio

    from worker import main as serve

    return asyncio.run(serve())


def _leave(body: Callable[[], int]) -> None:
    try:
        from durable_agents.client import exit_process
    except KeyboardInterrupt:  # Ctrl-C while the imports load: nothing was started yet
        print("interrupted", file=sys.stderr)
        os._exit(EXIT_INTERRUPTED)
    try:
        code = body()
    except SystemExit as done:  # argparse's --help / --version
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, int | None):
            print(done.code, file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    exit_process(code)
