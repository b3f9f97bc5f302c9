"""The wheel's import rewriter (scripts/wheel_layout.py): own modules move under ``durable_agents``, nothing else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from scripts.wheel_layout import OWN, PREFIX, RewriteError, rewrite_source, setup_arguments, wheel_packages

ROOT = Path(__file__).resolve().parent.parent


def test_imports_of_own_modules_get_the_prefix() -> None:
    source = (
        "from workflows.types import AgentInput\n"
        "from activities import tools\n"
        "from worker import main as serve\n"
        "import activities\n"
        "import workflows, json\n"
        "import activities.store.budget as budget\n"
        "from workflows.types import (\n    Limits,\n    Message,\n)\n"
        "if True:\n    from starter import run\n"
    )
    assert rewrite_source(source) == (
        "from durable_agents.workflows.types import AgentInput\n"
        "from durable_agents.activities import tools\n"
        "from durable_agents.worker import main as serve\n"
        "import durable_agents.activities as activities\n"
        "import durable_agents.workflows as workflows, json\n"
        "import durable_agents.activities.store.budget as budget\n"
        "from durable_agents.workflows.types import (\n    Limits,\n    Message,\n)\n"
        "if True:\n    from durable_agents.starter import run\n"
    )


def test_strings_naming_own_modules_get_the_prefix() -> None:
    source = (
        "HOMES = {'Settings': 'activities.settings', \"AgentInput\": \"workflows.types\"}\n"
        'PACKAGE = "activities"\n'
        "importlib.import_module('activities.tools.builtins')\n"
    )
    assert rewrite_source(source) == (
        "HOMES = {'Settings': 'durable_agents.activities.settings', "
        '"AgentInput": "durable_agents.workflows.types"}\n'
        'PACKAGE = "durable_agents.activities"\n'
        "importlib.import_module('durable_agents.activities.tools.builtins')\n"
    )


def test_everything_else_is_left_as_it_is() -> None:
    source = (
        '"""Docs: from workflows.types import AgentInput."""\n'
        "# from activities import tools\n"
        "from . import sibling\n"
        "from .types import Limits\n"
        "from durable_agents.workflows.types import AgentInput\n"
        "from workflowsx import y\n"
        "import activity\n"
        "log = get_logger('worker')\n"  # a plain word, not a module path
        "name = f'activities.{x}'\n"
        "text = 'see activities.tools'\n"
        "other = 'activities-x'\n"
    )
    assert rewrite_source(source) == source


def test_columns_count_characters_after_non_ascii_text() -> None:
    source = "x = 'é→ü'; import activities; y = 'workflows.types'\n"
    assert rewrite_source(source) == (
        "x = 'é→ü'; import durable_agents.activities as activities; y = 'durable_agents.workflows.types'\n"
    )


def test_rewriting_twice_changes_nothing() -> None:
    source = "import activities\nfrom workflows.types import Message\nX = 'activities.tools'\n"
    once = rewrite_source(source)
    assert once != source
    assert rewrite_source(once) == once


def test_an_unprefixable_import_is_refused() -> None:
    with pytest.raises(RewriteError, match=r"import workflows\.agent"):
        rewrite_source("import workflows.agent\n")


def test_every_module_of_the_repository_rewrites_to_prefixed_imports_only() -> None:
    files = [ROOT / "worker.py", ROOT / "starter.py"]
    for package in ("workflows", "activities", "durable_agents"):
        files.extend(sorted((ROOT / package).rglob("*.py")))
    rewritten = 0
    for path in files:
        source = path.read_text()
        result = rewrite_source(source, str(path))
        rewritten += result != source
        for node in ast.walk(ast.parse(result)):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert (node.module or "").split(".")[0] not in OWN, (path, node.lineno)
            elif isinstance(node, ast.Import):
                assert all(alias.name.split(".")[0] not in OWN for alias in node.names), (path, node.lineno)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):  # a module name left unprefixed
                assert not re.fullmatch(r"(workflows|activities)(\.\w+)*", node.value), (path, node.lineno)
    assert rewritten > len(files) // 2  # most modules import another


def test_the_wheel_layout_holds_every_package_under_the_prefix() -> None:
    arguments = setup_arguments()
    packages = wheel_packages()
    assert arguments["packages"] == packages
    assert all(name == PREFIX or name.startswith(f"{PREFIX}.") for name in packages)
    for package in ("workflows", "activities", "activities.sandbox", "activities.tools", "cli"):
        assert f"{PREFIX}.{package}" in packages
    assert arguments["package_dir"] == {f"{PREFIX}.workflows": "workflows", f"{PREFIX}.activities": "activities"}
    assert "py_modules" not in arguments
