"""Ctrl-C for the command-line processes a test starts, whatever started the test run.

A non-interactive shell starts a background job (``make test &``, a CI step run in the background)
with SIGINT and SIGQUIT ignored, and an ignored signal stays ignored across ``exec``: a
``starter.py`` started from such a run would never see the Ctrl-C a test sends it. Tests that
interrupt a command give it the terminal's defaults first, as a user's shell does.
"""

from __future__ import annotations

import signal


def as_from_a_terminal() -> None:
    """Restore SIGINT and SIGQUIT to their defaults (a ``preexec_fn``, or before ``exec`` in a fork)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
