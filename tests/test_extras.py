"""``activities.extras``: the one-line error naming the extra a configured feature needs.

The features' own refusals (E2B, PostgreSQL, MCP, the codec server) without their libraries run
against the installed wheel: tests/test_wheel.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from activities.extras import MissingExtra, available, require
from activities.settings import ConfigurationError


def test_an_installed_library_is_returned() -> None:
    assert require("json", "none", "decoding") is json
    assert available("json")


def test_a_missing_library_names_the_extra(tmp_path: Path) -> None:
    with pytest.raises(MissingExtra) as raised:
        require("no_such_library_here", "e2b", "AGENT_SANDBOX=e2b (the E2B sandbox)")
    assert str(raised.value) == (
        "AGENT_SANDBOX=e2b (the E2B sandbox) needs the e2b extra: pip install 'durable-agents[e2b]'"
    )
    assert isinstance(raised.value, ConfigurationError)  # the worker and the CLI report it in one line, exit 2
    assert not available("no_such_library_here")
    assert not available("no_such_library_here.sub")


def test_a_library_whose_own_import_fails_is_not_a_missing_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_library.py").write_text("import a_dependency_that_is_not_there\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_there") as raised:
        require("broken_library", "mcp", "AGENT_MCP_CONFIG (MCP servers)")
    assert not isinstance(raised.value, MissingExtra)
