"""Import the operator's extension modules (``AGENT_TOOL_MODULES``, ``AGENT_PROVIDER_MODULES``)."""

from __future__ import annotations

import importlib
from types import ModuleType

from activities.settings import ConfigurationError


def import_extension(name: str, variable: str) -> ModuleType:
    """Import module ``name`` named in ``variable``; any failure is a one-line ``ConfigurationError``."""
    try:
        return importlib.import_module(name)
    except Exception as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigurationError(f"{variable}: cannot import {name!r}: {type(exc).__name__}: {detail}") from None
