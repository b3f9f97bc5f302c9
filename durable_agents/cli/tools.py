"""What a worker would offer: ``starter.py tools``.

Every tool a worker started with this environment would offer a run: the built-ins, those of
``AGENT_TOOL_MODULES``, and those of the ``AGENT_MCP_CONFIG`` servers (each server is started, asked
for its tools, and stopped again; all at once, each bounded by its ``startup_timeout_s``). Each tool
is shown with where it comes from, what kind it is, and what the operator's policy
(``AGENT_POLICY_FILE``) decides for a call of it with no arguments.

Needs no Temporal server. A server that cannot start or list its tools is one line on stderr
(``mcp server NAME: unavailable: REASON``), a placeholder row, and exit code 1; everything else is
still listed. A bad configuration is one line and exit code 2. Text that came from an MCP server
(descriptions, errors) is redacted of every configured secret, ``${VAR}`` values from the MCP
configuration included, before it is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import TYPE_CHECKING, Any

from activities.settings import Settings
from durable_agents.cli.common import EXIT_OK, EXIT_RUN, print_json
from workflows.types import MCP_PREFIX

if TYPE_CHECKING:
    from mcp.types import Tool  # the mcp extra

    from activities.mcp.pool import McpPool
    from activities.tools.spec import ToolSpec
    from workflows.policy import Policy

DESCRIPTION_CHARS = 60
COLUMNS = ("NAME", "SOURCE", "KIND", "POLICY", "DESCRIPTION")
BUILTIN_PACKAGE = "activities"  # the built-in tools live in activities.tools.*


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    tools = sub.add_parser(
        "tools",
        help="list the tools a worker with this environment would offer (built-in, AGENT_TOOL_MODULES, "
        "AGENT_MCP_CONFIG servers), with their policy defaults",
    )
    tools.add_argument("--json", action="store_true", help="one JSON array of tool objects")


async def cmd_tools(args: argparse.Namespace, settings: Settings) -> int:
    """List the tools; needs no Temporal server (it starts and stops the MCP servers itself).

    The MCP servers start first: while they boot (each its own process), this process loads the
    tool modules and the policy. The MCP client library and the tool catalog are imported here, not
    by ``starter.py`` itself, so no other command pays for them.
    """
    from activities.mcp.config import load_mcp_config
    from activities.redaction import redact

    config = load_mcp_config(settings)
    settings = settings.with_secrets(config.secrets)
    secrets = settings.secret_values()
    listing: asyncio.Future[tuple[dict[str, list[Tool] | None], dict[str, str]]] | None = None
    if config.servers:
        from activities.mcp.pool import McpPool

        pool = McpPool(config, tuple(secrets))
        listing = asyncio.ensure_future(_mcp_tools(pool, secrets))
    try:
        # In a thread: the imports would otherwise hold the event loop, and the servers' start with it.
        policy, rows = await asyncio.to_thread(_builtin_rows, settings)
        listed, failures = await listing if listing is not None else ({}, {})
    finally:
        if listing is not None and not listing.done():  # the policy or a tool module was refused
            listing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listing  # it stops the servers it started
    if listed:
        from activities.mcp.catalog import tool_def
        from workflows.policy import decide
    taken: set[str] = set()  # MCP names are made unique among themselves, as the worker does
    for server, tools in listed.items():
        server_config = config.servers[server]
        source = f"mcp {server} ({server_config.transport})"
        if tools is None:
            rows.append(_unavailable_row(server, source, failures[server]))
            continue
        for tool in tools:
            definition = tool_def(pool, server, tool, taken)
            side_effect = not definition.read_only
            decision = decide(policy, None, definition.name, {}, side_effect=side_effect)
            rows.append(
                {
                    "name": _printable(definition.name),
                    "source": source,
                    "kind": f"side effect ({definition.recovery})" if side_effect else "read-only",
                    "side_effect": side_effect,
                    "recovery": definition.recovery if side_effect else None,
                    "policy": decision.verdict,
                    "rule": decision.rule,
                    "description": _printable(redact(definition.description, secrets)),
                }
            )
    for server, reason in failures.items():
        print(f"mcp server {server}: unavailable: {reason}", file=sys.stderr)
    if args.json:
        print_json(rows)
    else:
        _print_table(rows)
    return EXIT_RUN if failures else EXIT_OK


def _builtin_rows(settings: Settings) -> tuple[Policy, list[dict[str, Any]]]:
    """The operator's policy, and a row for each tool of the registry (built-ins, then module tools)."""
    from activities.approvals import load_policy
    from activities.catalog import tool_registry
    from workflows.policy import Policy

    registry = tool_registry(settings)
    policy = Policy.model_validate(load_policy(settings.policy_file))
    rows = [_builtin_row(spec, policy) for spec in registry.specs()]
    rows.sort(key=lambda row: (row["source"] != "builtin", row["source"], row["name"]))
    return policy, rows


async def _mcp_tools(pool: McpPool, secrets: list[str]) -> tuple[dict[str, list[Tool] | None], dict[str, str]]:
    """Each server's tools (None when it could not list them), and why not, one line each; every server stopped.

    The servers start and list at once; the pool bounds each start, and each page of tools, by the
    server's ``startup_timeout_s``.
    """
    from activities.redaction import redact

    servers = list(pool.config.servers)
    try:
        results = await asyncio.gather(*(pool.list_tools(server) for server in servers), return_exceptions=True)
    finally:
        await pool.aclose()
    listed: dict[str, list[Tool] | None] = {}
    failures: dict[str, str] = {}
    for server, result in zip(servers, results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result  # Ctrl-C and the like
            listed[server] = None
            failures[server] = _one_line(redact(str(result) or type(result).__name__, secrets))
        else:
            listed[server] = result
    return listed, failures


def _builtin_row(spec: ToolSpec, policy: Policy) -> dict[str, Any]:
    from workflows.policy import decide

    module = spec.fn.__module__
    source = "builtin" if module.startswith(f"{BUILTIN_PACKAGE}.") else f"module {module}"
    decision = decide(policy, None, spec.name, {}, side_effect=spec.side_effect, sandboxed=spec.uses_sandbox)
    kinds = [k for k, on in (("side effect", spec.side_effect), ("sandbox", spec.uses_sandbox)) if on]
    return {
        "name": spec.name,
        "source": source,
        "kind": ", ".join(kinds) or "read-only",
        "side_effect": spec.side_effect,
        "recovery": spec.recovery if spec.side_effect else None,
        "policy": decision.verdict,
        "rule": decision.rule,
        "description": spec.description.strip(),
    }


def _unavailable_row(server: str, source: str, reason: str) -> dict[str, Any]:
    """A server whose tools could not be listed: one row for all of them, marked unavailable."""
    return {
        "name": f"{MCP_PREFIX}{server}__*",
        "source": source,
        "kind": "unavailable",
        "side_effect": None,
        "recovery": None,
        "policy": None,
        "rule": None,
        "description": f"unavailable: {reason}",
    }


def _print_table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("no tools")
        return
    table = [
        (
            row["name"],
            row["source"],
            row["kind"],
            f"{row['policy']} ({row['rule']})" if row["policy"] else "-",
            _short(row["description"]),
        )
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in [COLUMNS, *table]) for i in range(len(COLUMNS) - 1)]
    for cells in [COLUMNS, *table]:
        print("  ".join([*(cell.ljust(width) for cell, width in zip(cells, widths, strict=False)), cells[-1]]))


def _short(description: str) -> str:
    first = (description.strip().splitlines() or [""])[0].strip()
    return first if len(first) <= DESCRIPTION_CHARS else first[: DESCRIPTION_CHARS - 3].rstrip() + "..."


def _printable(text: str) -> str:
    """Server-supplied text without control characters (no terminal escapes), newlines kept."""
    return "".join(c if c.isprintable() or c == "\n" else " " for c in text)


def _one_line(text: str) -> str:
    return " ".join(_printable(text).split())
