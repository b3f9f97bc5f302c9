"""The import graph shows the layers: no cycles, workflows stay pure, activities never reach the CLI.

Every import counts, including those inside functions: a lazy import that closes a
cycle is still a cycle (it only moves the failure to the first call).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("workflows", "activities", "durable_agents", "examples", "scripts")
ENTRY_POINTS = ("worker.py", "starter.py")
# pydantic_core is pydantic's own engine (its error types); re2 (google-re2) is the one exception beyond:
# a deterministic C extension, passed through the workflow sandbox, so that policy patterns match in
# linear time (workflows/patterns.py).
WORKFLOW_ALLOWED = {"temporalio", "pydantic", "pydantic_core", "re2", "workflows"}
SETTINGS_MODULE = "activities.settings"


def project_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    for entry in ENTRY_POINTS:
        modules[entry.removesuffix(".py")] = ROOT / entry
    return modules


def imported_names(path: Path, module: str) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            for alias in node.names:
                yield f"{target}.{alias.name}"  # `from pkg import submodule`


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = set()
        for name in imported_names(path, module):
            if name in modules and name != module:
                edges.add(name)
        # `from pkg.sub import X` names pkg.sub.X too; keep only real modules, never the importing one.
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_workflows_import_only_the_standard_library_temporalio_pydantic_and_the_contract() -> None:
    stdlib = set(sys.stdlib_module_names)
    offenders = []
    for path in sorted((ROOT / "workflows").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for name in imported_names(path, module):
            top = name.split(".")[0]
            if top not in stdlib and top not in WORKFLOW_ALLOWED and top != "__future__":
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, offenders


def test_activities_never_import_the_cli_or_the_plugin() -> None:
    graph = import_graph()
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("activities")
        for target in targets
        if target.startswith("durable_agents") or target in ("worker", "starter")
    )
    assert not offenders, offenders


def test_only_settings_reads_the_environment() -> None:
    offenders = []
    for module, path in project_modules().items():
        if module == SETTINGS_MODULE or module.startswith("examples"):
            continue
        text = path.read_text()
        for needle in ("os.environ", "os.getenv", "getenv("):
            if needle in text:
                offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert not offenders, offenders
