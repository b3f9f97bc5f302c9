"""The import graph shows the layers: no cycles, workflows stay pure, activities never reach the CLI,
the model layer (providers) reaches no tool, MCP or store module, and the sandbox layer reaches no
model, tool, runtime, checkpoint or store module.

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


def import_chain(graph: dict[str, set[str]], start: str, forbidden: tuple[str, ...]) -> list[str]:
    """The shortest chain of imports from ``start`` to a module of one of the ``forbidden`` packages ([] if none)."""
    parents: dict[str, str] = {start: ""}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node]):
            if nxt in parents:
                continue
            parents[nxt] = node
            if in_package(nxt, forbidden):
                chain = [nxt]
                while parents[chain[-1]]:
                    chain.append(parents[chain[-1]])
                return chain[::-1]
            queue.append(nxt)
    return []


def in_package(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def layer_offenders(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    """One import chain for each module of ``layer`` that reaches a ``forbidden`` package, directly or not."""
    graph = import_graph()
    chains = (import_chain(graph, module, forbidden) for module in sorted(graph) if in_package(module, (layer,)))
    return [" -> ".join(chain) for chain in chains if chain]


def test_the_chain_finder_follows_imports_to_the_first_forbidden_module() -> None:
    graph = {"a": {"b"}, "b": {"c.x"}, "c.x": set(), "cc": set(), "d": {"cc"}}
    assert import_chain(graph, "a", ("c",)) == ["a", "b", "c.x"]
    assert import_chain(graph, "d", ("c",)) == []  # "cc" is not in package "c"
    assert import_chain(graph, "c.x", ("a",)) == []


# The sandbox layer sits below the model, tool and checkpoint layers: a backend is handed what it needs,
# never the Runtime (which holds the providers and the tool registry).
SANDBOX_MUST_NOT_REACH = (
    "activities.models",
    "activities.tools",
    "activities.mcp",
    "activities.runtime",
    "activities.checkpoints",
    "activities.store",
)


def test_the_sandbox_layer_never_reaches_the_model_tool_or_checkpoint_layers() -> None:
    offenders = layer_offenders("activities.sandbox", SANDBOX_MUST_NOT_REACH)
    assert not offenders, offenders


# The model layer is the providers (``ModelProvider``, the registry, prices): it knows nothing of tools, MCP,
# sandboxes or the run store. The activities that put a turn together (``model``: activities/model_turn.py;
# ``run_config``: activities/run_config.py) sit above it.
MODELS_MUST_NOT_REACH = (
    "activities.tools",
    "activities.mcp",
    "activities.subagents",
    "activities.runtime",
    "activities.sandbox",
    "activities.store",
)


def test_the_model_layer_never_reaches_the_tool_registry_mcp_or_the_run_store() -> None:
    offenders = layer_offenders("activities.models", MODELS_MUST_NOT_REACH)
    assert not offenders, offenders
