"""Command line for agent runs: run / watch / status / pending / approve / reject / resolve / cancel / list.

    python starter.py run "Summarise https://example.com" --follow [--approver alice] [--policy FILE]
    python starter.py run --task-file task.md --wait        # or --task-file - (stdin)
    python starter.py watch RUN_ID [--json] [--from N]
    python starter.py status RUN_ID [--json]
    python starter.py pending [RUN_ID] [--json]
    python starter.py approve RUN_ID [APPROVAL_ID] --reviewer alice [--comment TEXT]
    python starter.py reject RUN_ID [APPROVAL_ID] --reviewer alice --reason TEXT
    python starter.py resolve RUN_ID [APPROVAL_ID] --as retry|mark_done|fail --reviewer alice
    python starter.py cancel RUN_ID
    python starter.py list
    python starter.py chat [SESSION_ID] [--reviewer alice]             # a conversation with a session
    python starter.py sandboxes reap [--min-age S]
    python starter.py codec-server [--port 8081] [--host 127.0.0.1]   # decrypts for the Temporal UI and CLI

``run --follow`` prints the run's progress events as they happen (the run's
durable progress stream, as ``watch`` does) and asks for each approval the run
waits for when it runs on a terminal, and otherwise prints the exact commands
that decide it. With ``AGENT_APPROVAL_KEY`` set, decisions are signed. The
commands live in ``durable_agents/cli/`` (one module per command group).

Every failure is one line on stderr, never a traceback. Exit codes: 0 done; 1 a
run-level failure (no such run, the run did not complete, it refused the
request, no worker answered); 2 bad usage or input, a bad configuration or no
Temporal server; 130 interrupted (the run goes on; the line says how to
reattach). See ``durable_agents/cli/main.py``.
"""

import os
import sys

if __name__ == "__main__":
    try:
        from durable_agents.cli.main import run
        from durable_agents.client import exit_process
    except KeyboardInterrupt:  # Ctrl-C while the imports load: nothing was started yet
        print("interrupted", file=sys.stderr)
        os._exit(130)
    exit_process(run())
