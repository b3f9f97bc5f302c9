"""The optional dependencies (``pip install 'durable-agents[e2b,postgres,mcp,server]'``) and the one-line error
a feature gives when its extra is not installed.

A feature imports its library lazily, at the point of use, after :func:`require`: importing
``durable_agents`` and running a worker with the defaults (the local sandbox, the SQLite run store,
no MCP servers) needs none of them.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from activities.settings import ConfigurationError

PACKAGE = "durable-agents"


class MissingExtra(ConfigurationError):
    """A configured feature needs an optional dependency that is not installed; the message names the extra."""


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, extra: str, feature: str) -> ModuleType:
    """``module`` imported, or :class:`MissingExtra`: ``FEATURE needs the EXTRA extra: pip install '...[EXTRA]'``.

    ``feature`` names what the operator configured, e.g. ``AGENT_SANDBOX=e2b (the E2B sandbox)``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and module.split(".")[0] != exc.name.split(".")[0]:
            raise  # the library is there, but something it imports is broken: that is not a missing extra
        raise MissingExtra(f"{feature} needs the {extra} extra: pip install '{PACKAGE}[{extra}]'") from None
