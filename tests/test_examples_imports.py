"""Every example imports this project only through ``durable_agents`` (and its own package).

A user copies an example into a project of their own, where ``workflows``, ``activities``,
``worker`` and ``starter`` are not ours (or are theirs): an example that imports them teaches
an import path that breaks there. Each ``.py`` under ``examples/`` is parsed with ``ast``, and
every import (at the top or inside a function) of a top-level module of this repository other
than ``durable_agents`` and the example's own package fails the test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PUBLIC = "durable_agents"


def repo_top_level() -> set[str]:
    """The names this checkout would put on ``sys.path`` from its root: packages and ``.py`` modules."""
    names = {path.stem for path in ROOT.glob("*.py")}
    names |= {path.parent.name for path in ROOT.glob("*/__init__.py")}
    return names


def own_package(path: Path) -> str:
    """``examples.embed`` for ``examples/embed/worker.py``; ``examples.one_file_app`` for a top-level example."""
    first = path.relative_to(EXAMPLES).with_suffix("").parts[0]
    return f"examples.{first}"


def imports(source: str, filename: str) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``source`` (relative imports stay in the example)."""
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            if node.module == "examples":  # ``from examples import embed``
                for alias in node.names:
                    yield node.lineno, f"examples.{alias.name}"


def violations(source: str, filename: str, own: str, top_level: set[str]) -> list[str]:
    """The imports of ``source`` that reach this repository other than through ``durable_agents`` or ``own``."""
    found = []
    for line, module in imports(source, filename):
        top = module.split(".", 1)[0]
        if top not in top_level or top == PUBLIC:
            continue
        if module == "examples" or module == own or module.startswith(own + "."):
            continue
        found.append(f"{filename}:{line}: imports {module}")
    return found


EXAMPLE_FILES = sorted(EXAMPLES.rglob("*.py"))


def test_the_examples_are_found() -> None:
    names = {path.relative_to(EXAMPLES).as_posix() for path in EXAMPLE_FILES}
    assert {"custom_tool/inventory_tools.py", "custom_provider/echo_provider.py", "embed/worker.py"} <= names
    assert {"workflows", "activities", "worker", "starter", "durable_agents", "examples"} <= repo_top_level()


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_an_example_imports_only_durable_agents(path: Path) -> None:
    found = violations(path.read_text(), str(path.relative_to(ROOT)), own_package(path), repo_top_level())
    assert not found, "an example imports this repository other than through durable_agents:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "from activities.tools import tool",
        "import workflows.types",
        "def f():\n    from activities.settings import Settings",
        "import worker",
        "from starter import main",
        "from examples.embed.workflows import ReportWorkflow",  # another example's package
        "from examples import embed",
    ],
)
def test_the_check_catches_a_private_import(source: str) -> None:
    assert violations(source, "example.py", "examples.custom_tool", repo_top_level())


@pytest.mark.parametrize(
    "source",
    [
        "from durable_agents import tool",
        "from examples.custom_tool.inventory_tools import CATALOGUE",
        "from . import inventory_tools",
        "import pydantic",
    ],
)
def test_the_check_allows_the_public_surface(source: str) -> None:
    assert not violations(source, "example.py", "examples.custom_tool", repo_top_level())
