"""The command line of ``starter.py``, one module per command group.

main        the parser, the settings, the connection, error handling, exit codes
common      CliError, the argument parser class, JSON output, reading a run without waiting in silence
run         ``run``: start a run, then wait, or follow its progress and approvals
watch       ``watch``: a run's progress events, and their rendering
runs        ``status`` / ``list`` / ``cancel``
approvals   ``approve`` / ``reject`` / ``resolve`` / ``pending``, and ``run``'s approval options
review      reviewing approvals while following a run (``run --follow``)
sandboxes   ``sandboxes reap``
"""

from durable_agents.cli.main import main, run

__all__ = ["main", "run"]
