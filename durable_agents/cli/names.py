"""Names a run asks for, checked before it starts: ``--model``'s provider prefix and ``--tools``' names.

A misspelt name is refused here, as a usage error (exit 2) with a "did you mean", instead of after a
workflow was created. The names are checked against what a worker with this environment would
offer: the built-in providers and tools first, and only for a name that is not one of them, the
operator's ``AGENT_PROVIDER_MODULES`` / ``AGENT_TOOL_MODULES`` (so a run that names only built-ins
never imports operator modules). MCP tools (``mcp__SERVER__TOOL``, globs included) are the worker's
to check: their servers are listed there.
"""

from __future__ import annotations

from collections.abc import Sequence

from activities.settings import Settings
from durable_agents.cli.common import EXIT_USAGE, CliError, cli_command, did_you_mean
from workflows.types import MCP_PREFIX

SHOWN = 12  # names listed in a refusal; more are counted


def check_model(model: str, settings: Settings) -> None:
    """``model`` (``PROVIDER:NAME``; empty: the worker's default) names a provider this environment has."""
    if not model:
        return
    prefix, sep, name = model.partition(":")
    well_formed = bool(sep and name)
    if well_formed and prefix in _providers(None):
        return
    prefixes = _providers(settings)
    if well_formed and prefix in prefixes:
        return
    shape = "" if well_formed else f": expected PROVIDER:MODEL, e.g. {sorted(prefixes)[0]}:NAME"
    raise CliError(
        f"--model {model!r}: unknown model provider {prefix!r}{did_you_mean(prefix, prefixes)}{shape}; "
        f"this environment's providers: {', '.join(sorted(prefixes))} (built-in and AGENT_PROVIDER_MODULES)",
        code=EXIT_USAGE,
    )


def check_tools(tools: Sequence[str] | None, settings: Settings) -> None:
    """Every non-MCP name of ``tools`` is a tool this environment offers (built-in or AGENT_TOOL_MODULES)."""
    wanted = [name for name in tools or () if not name.startswith(MCP_PREFIX)]
    if all(name in _tools(None) for name in wanted):
        return
    known = _tools(settings)
    unknown = [name for name in dict.fromkeys(wanted) if name not in known]
    if not unknown:
        return
    named = ", ".join(f"{name!r}{did_you_mean(name, known)}" for name in unknown)
    shown = ", ".join(sorted(known)[:SHOWN]) + (f" and {len(known) - SHOWN} more" if len(known) > SHOWN else "")
    raise CliError(
        f"--tools: unknown tool{'s' if len(unknown) > 1 else ''} {named}; this environment offers {shown} "
        f"(MCP tools are {MCP_PREFIX}SERVER__TOOL; see {cli_command('tools')})",
        code=EXIT_USAGE,
    )


# Imported here, not at the top: only a run that names a model or tools loads the registries.


def _providers(settings: Settings | None) -> set[str]:
    """The provider prefixes: the built-ins (``settings`` None), or with the operator's modules too."""
    from activities.catalog import provider_registry

    return set(provider_registry(settings if settings is not None else Settings()).prefixes())


def _tools(settings: Settings | None) -> set[str]:
    """The tool names: the built-ins (``settings`` None), or with the operator's modules too."""
    from activities.catalog import tool_registry

    return set(tool_registry(settings if settings is not None else Settings()).names())
