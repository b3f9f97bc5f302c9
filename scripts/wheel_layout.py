"""What the built wheel holds: everything under ``durable_agents``, nothing else at the top level.

The repository keeps its top-level layout (``workflows/``, ``activities/``, ``worker.py``,
``starter.py``) and its code imports ``workflows.x`` / ``activities.x``; an editable install
(``pip install -e .``) maps exactly that. Installed from a wheel, those top-level names would
collide with a user's own Temporal application laid out the way Temporal's samples are (its
``workflows.py``, its ``activities/``), so the wheel holds them as ``durable_agents.workflows``,
``durable_agents.activities``, ``durable_agents.worker`` and ``durable_agents.starter``, and
:func:`rewrite_source` turns every absolute import of them (and every string that names one of
their modules: ``durable_agents``' lazy export table, logger names) into the prefixed name.

``setup.py`` calls :func:`setup_arguments`; ``scripts/build_backend.py`` (the PEP 517 backend)
chooses the repository layout for the editable hooks and the wheel layout for every other build.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from setuptools import find_packages
from setuptools.command.build_py import build_py

PREFIX = "durable_agents"
OWN_PACKAGES = ("workflows", "activities")  # moved under PREFIX with every subpackage
OWN_MODULES = ("worker", "starter")  # top-level modules, moved to PREFIX.worker / PREFIX.starter
OWN = OWN_PACKAGES + OWN_MODULES
# A string constant that is a module name of ours: the whole string, a dotted identifier rooted at a package.
_MODULE_STRING = re.compile(rf"(?:{'|'.join(OWN_PACKAGES)})(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
ROOT = Path(__file__).resolve().parent.parent

# Set by the build backend's editable hooks: the build then maps the repository layout as it is.
editable = False


class RewriteError(ValueError):
    """An import form the rewriter cannot translate faithfully (``import workflows.x`` without ``as``)."""


def _is_own(name: str) -> bool:
    return name.split(".")[0] in OWN


def rewrite_source(source: str, filename: str = "<module>") -> str:
    """``source`` with every absolute import of an own module (and every string naming one) under ``PREFIX``.

    ``from workflows.x import y`` → ``from durable_agents.workflows.x import y``; ``import activities`` →
    ``import durable_agents.activities as activities``; ``import activities.x as y`` →
    ``import durable_agents.activities.x as y``; ``"workflows.types"`` → ``"durable_agents.workflows.types"``.
    Relative imports, comments, docstrings and formatting are left as they are. ``import workflows.x``
    without ``as`` raises :class:`RewriteError` (the prefixed form would bind another name).
    Idempotent: a rewritten source is returned unchanged.
    """
    data = source.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(line: int, col: int) -> int:  # ast columns are UTF-8 byte offsets
        return starts[line - 1] + col

    edits: list[tuple[int, int, str]] = []
    tree = ast.parse(source, filename)
    in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _is_own(node.module):
            begin = offset(node.lineno, node.col_offset)
            found = re.match(rb"from\s+", data[begin:])
            if found is None or not data[begin + found.end() :].startswith(node.module.encode()):
                raise RewriteError(f"{filename}:{node.lineno}: cannot find the module name of this import")
            at = begin + found.end()
            edits.append((at, at, f"{PREFIX}."))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if not _is_own(alias.name):
                    continue
                if alias.asname is None and "." in alias.name:
                    raise RewriteError(
                        f"{filename}:{node.lineno}: `import {alias.name}` has no faithful prefixed form; "
                        f"write `import {alias.name} as NAME` or `from ... import ...`"
                    )
                bound = alias.asname or alias.name
                span = (
                    offset(alias.lineno, alias.col_offset),
                    offset(alias.end_lineno or 0, alias.end_col_offset or 0),
                )
                edits.append((*span, f"{PREFIX}.{alias.name} as {bound}"))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in in_fstrings
            and _MODULE_STRING.fullmatch(node.value)
        ):
            begin = offset(node.lineno, node.col_offset)
            end = offset(node.end_lineno or 0, node.end_col_offset or 0)
            quote = '"' if data[begin:end].lstrip(b"rRuU").startswith(b'"') else "'"
            edits.append((begin, end, f"{quote}{PREFIX}.{node.value}{quote}"))
    for begin, end, text in sorted(edits, reverse=True):
        data = data[:begin] + text.encode() + data[end:]
    return data.decode()


def wheel_packages() -> list[str]:
    """Every package of the wheel: ``durable_agents`` and the own packages, renamed under it."""
    own = find_packages(str(ROOT), include=[f"{name}*" for name in OWN_PACKAGES])
    return sorted([*find_packages(str(ROOT), include=[f"{PREFIX}*"]), *(f"{PREFIX}.{name}" for name in own)])


class BuildPy(build_py):
    """``build_py`` for the wheel layout: the top-level modules placed in ``durable_agents`` and every module's
    imports rewritten (:func:`rewrite_source`). An editable build maps the repository as it is."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules: list[tuple[str, str, str]] = super().find_package_modules(package, package_dir)  # type: ignore[no-untyped-call]
        if package == PREFIX and not editable:
            modules.extend((PREFIX, name, f"{name}.py") for name in OWN_MODULES)  # beside setup.py
        return modules

    def build_module(self, module: str, module_file: str, package: str | list[str]) -> tuple[str, bool]:
        outfile, copied = super().build_module(module, module_file, package)  # type: ignore[no-untyped-call]
        if not editable:
            path = Path(outfile)
            text = path.read_text()
            rewritten = rewrite_source(text, module_file)
            if rewritten != text:
                path.write_text(rewritten)
        return outfile, copied


def setup_arguments() -> dict[str, Any]:
    """``setup()``'s package arguments for the layout being built (see the module docstring)."""
    typed = ["py.typed"]
    inbox = {f"{PREFIX}.api": ["inbox/*.html", "inbox/*.js", "inbox/*.css"]}  # the approval inbox's page
    if editable:
        return {
            "packages": find_packages(str(ROOT), include=[f"{name}*" for name in (*OWN_PACKAGES, PREFIX)]),
            "py_modules": list(OWN_MODULES),
            "package_data": {**{name: typed for name in (*OWN_PACKAGES, PREFIX)}, **inbox},
            "cmdclass": {"build_py": BuildPy},
        }
    return {
        "packages": wheel_packages(),
        "package_dir": {f"{PREFIX}.{name}": name for name in OWN_PACKAGES},
        "package_data": {PREFIX: typed, **{f"{PREFIX}.{name}": typed for name in OWN_PACKAGES}, **inbox},
        "cmdclass": {"build_py": BuildPy},
    }
