"""Command line for agent runs: run / watch / status / pending / approve / reject / resolve / cancel / list.

    python starter.py run "Summarise https://example.com" --follow [--approver alice] [--policy FILE]
    python starter.py watch RUN_ID [--json] [--from N]
    python starter.py status RUN_ID [--json]
    python starter.py pending [RUN_ID] [--json]
    python starter.py approve RUN_ID [APPROVAL_ID] --reviewer alice [--comment TEXT]
    python starter.py reject RUN_ID [APPROVAL_ID] --reviewer alice --reason TEXT
    python starter.py resolve RUN_ID [APPROVAL_ID] --as retry|mark_done|fail --reviewer alice
    python starter.py cancel RUN_ID
    python starter.py list
    python starter.py sandboxes reap [--min-age S]

``run --follow`` prints the run's progress events as they happen (the run's
durable progress stream, as ``watch`` does) and asks for each approval the run
waits for when it runs on a terminal, and otherwise prints the exact commands
that decide it. With ``AGENT_APPROVAL_KEY`` set, decisions are signed. The
commands live in ``durable_agents/cli/`` (one module per command group).

Every failure is one line on stderr and a non-zero exit: 2 for bad arguments, a
bad configuration or an unreachable server, 1 for a run that does not exist or
did not complete.
"""

import asyncio

from durable_agents.cli import main
from durable_agents.client import exit_process

if __name__ == "__main__":
    exit_process(asyncio.run(main()))
