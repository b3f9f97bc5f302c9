"""The MCP tools a run may use: listed at run start, snapshotted into the run store, validated per call.

A run's snapshot is what its model sees for the whole run (names, descriptions, input schemas, and
whether each tool is read-only), so a server that changes its tools, or is down, mid-run changes
nothing for a running run, and replay never talks to a server: history holds only the snapshot's
digest and the validated calls.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

import structlog
from pydantic import BaseModel, Field

from activities.mcp.config import Recovery
from activities.mcp.pool import McpPool, McpUnavailable
from workflows.types import MCP_PREFIX, McpTarget, RecordedToolCall, ToolCall

if TYPE_CHECKING:
    from mcp.types import Tool  # the mcp extra

MAX_NAME_CHARS = 64  # what model APIs accept as a tool name
MAX_MCP_TOOLS_PER_RUN = 128  # model APIs accept about this many tools, and every name is in the run's history
MAX_DESCRIPTION_CHARS = 4000
MAX_SCHEMA_BYTES = 64 * 1024
MAX_ARGUMENTS_BYTES = 64 * 1024
MAX_CACHED_SNAPSHOTS = 256  # of one worker (SnapshotCache)
START_SLACK_S = 15  # the activity's timeout over the call's: room to (re)start the server first
# run_config is a local activity with a 30 s timeout: listing must end before it, whatever a server's startup_timeout_s.
LIST_AT_START_TIMEOUT_S = 25
MCP_HEARTBEAT_S = 5  # a killed worker's MCP call is retried (through the ledger) within ~15 s
_INVALID = re.compile(r"[^A-Za-z0-9_-]")
log = structlog.get_logger("activities.mcp")


class McpToolDef(BaseModel):
    name: str  # as the model sees it: mcp__<server>__<tool>
    server: str
    tool: str  # as the server knows it
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    read_only: bool = False
    recovery: Recovery = "unknown"
    timeout_s: int = 60
    per_run: bool = False

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.input_schema}


class McpSnapshot(BaseModel):
    tools: list[McpToolDef] = Field(default_factory=list)

    def by_name(self) -> dict[str, McpToolDef]:
        return {tool.name: tool for tool in self.tools}

    def encode(self) -> bytes:
        return self.model_dump_json().encode()


class SnapshotCache:
    """The snapshots this worker stored or read, as tools by name, by digest (the oldest goes first past ``size``).

    ``run_config`` puts the snapshot it stores here, so that the run's model turns on this worker need
    not read it back from the run store.
    """

    def __init__(self, size: int = MAX_CACHED_SNAPSHOTS) -> None:
        self._size = size
        self._tools: dict[str, dict[str, McpToolDef]] = {}

    def get(self, digest: str) -> dict[str, McpToolDef] | None:
        return self._tools.get(digest)

    def remember(self, digest: str, snapshot: McpSnapshot) -> dict[str, McpToolDef]:
        if len(self._tools) >= self._size:
            self._tools.pop(next(iter(self._tools)))
        tools = self._tools[digest] = snapshot.by_name()
        return tools


def is_mcp_name(name: str) -> bool:
    return name.startswith(MCP_PREFIX)


def model_name(server: str, tool: str, taken: set[str]) -> str:
    """``mcp__<server>__<tool>``, made of the characters model APIs accept and at most 64 of them, unique."""
    base = name = f"{MCP_PREFIX}{server}__{_INVALID.sub('_', tool)}"
    attempt = 0
    while len(name) > MAX_NAME_CHARS or name in taken:
        # Shortened or colliding: a suffix from the tool's own name (and a counter, should even that be taken).
        digest = hashlib.sha256(f"{tool}#{attempt}".encode() if attempt else tool.encode()).hexdigest()[:8]
        name = f"{base[: MAX_NAME_CHARS - 9]}_{digest}"
        attempt += 1
    return name


def tool_def(pool: McpPool, server: str, tool: Tool, taken: set[str]) -> McpToolDef:
    config = pool.server(server)
    assert config is not None
    options = config.options(tool.name)
    hinted = bool(tool.annotations is not None and tool.annotations.read_only_hint)
    read_only = options.read_only if options.read_only is not None else hinted
    schema: dict[str, Any] = dict(tool.input_schema or {"type": "object"})
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        schema = {"type": "object", "description": "(the server's input schema is too large to show)"}
    description = (tool.description or tool.title or "").strip()[:MAX_DESCRIPTION_CHARS]
    name = model_name(server, tool.name, taken)
    taken.add(name)
    return McpToolDef(
        name=name,
        server=server,
        tool=tool.name,
        description=description or f"{tool.name} (MCP server {server})",
        input_schema=schema,
        read_only=read_only,
        recovery=config.recovery_of(tool.name),
        timeout_s=config.timeout_of(tool.name),
        per_run=config.per_run,
    )


def wanted_servers(pool: McpPool, requested: list[str] | None) -> dict[str, bool]:
    """Servers whose tools ``requested`` may name → whether a tool of it is named exactly (so it must answer)."""
    servers: dict[str, bool] = {}
    for name in pool.config.servers:
        if requested is None:
            servers[name] = False
            continue
        prefix = f"{MCP_PREFIX}{name}__"
        for pattern in requested:
            if pattern.startswith(prefix) and "*" not in pattern:
                servers[name] = True
            elif "*" in pattern and is_mcp_name(pattern):
                literal = pattern.split("*", 1)[0]  # a glob may match this server's tools if the prefixes agree
                if prefix.startswith(literal) or literal.startswith(prefix):
                    servers.setdefault(name, False)
    return servers


async def snapshot(
    pool: McpPool, requested: list[str] | None, tenant: str = ""
) -> tuple[McpSnapshot, list[str], list[str]]:
    """The run's MCP tools, its tool names in order, and notes on servers it starts without.

    ``requested`` None enables every tool of every server; otherwise exact names (``mcp__s__t``) and
    globs (``mcp__s__*``) select tools. ``McpUnavailable`` when a server whose tool is named exactly
    cannot list its tools; ``ValueError`` for an exact name no server offers.
    """
    servers = wanted_servers(pool, requested)
    listed = await asyncio.gather(
        *(asyncio.wait_for(_list(pool, server, tenant), LIST_AT_START_TIMEOUT_S) for server in servers),
        return_exceptions=True,
    )
    tools: list[McpToolDef] = []
    notes: list[str] = []
    taken: set[str] = set()
    for (server, named), result in zip(servers.items(), listed, strict=True):
        if isinstance(result, BaseException):
            if isinstance(result, TimeoutError):
                result = McpUnavailable(
                    f"MCP server {server!r} did not list its tools within {LIST_AT_START_TIMEOUT_S} s"
                )
            elif not isinstance(result, McpUnavailable):
                result = McpUnavailable(f"MCP server {server!r}: {type(result).__name__}: {result}")
            if named:
                raise result
            notes.append(f"{result}; its tools are not available to this run")
            log.warning("mcp_server_unavailable_at_run_start", server=server, error=str(result))
            continue
        tools.extend(tool_def(pool, server, tool, taken) for tool in result)
    if requested is None:
        if len(tools) > MAX_MCP_TOOLS_PER_RUN:
            notes.append(
                f"{len(tools)} MCP tools are configured; this run offers the first {MAX_MCP_TOOLS_PER_RUN} "
                "(name the ones it needs in its tools input)"
            )
            tools = tools[:MAX_MCP_TOOLS_PER_RUN]
        return McpSnapshot(tools=tools), [t.name for t in tools], notes
    by_name = {t.name: t for t in tools}
    chosen: list[str] = []
    for pattern in requested:
        if not is_mcp_name(pattern):
            continue
        if "*" in pattern:
            chosen.extend(t.name for t in tools if fnmatch.fnmatchcase(t.name, pattern))
        elif pattern in by_name:
            chosen.append(pattern)
        else:
            available = ", ".join(sorted(by_name)) or "none"
            raise ValueError(f"unknown MCP tool {pattern!r}; MCP tools on this worker: {available}")
    chosen = list(dict.fromkeys(chosen))
    if len(chosen) > MAX_MCP_TOOLS_PER_RUN:
        raise ValueError(f"{len(chosen)} MCP tools selected; a run may offer at most {MAX_MCP_TOOLS_PER_RUN}")
    return McpSnapshot(tools=[by_name[name] for name in chosen]), chosen, notes


async def _list(pool: McpPool, server: str, tenant: str) -> list[Tool]:
    config = pool.server(server)
    if config is not None and config.per_run:
        # A short-lived process of its own, stopped right after, started with the tenant's credentials (so one
        # per tenant: a listing for another tenant at the same time never shares it).
        listing = f"listing-{id(pool)}-{tenant}"
        try:
            return await pool.list_tools(server, run=listing, tenant=tenant)
        finally:
            await pool.release_run(listing)
    return await pool.list_tools(server)


def validate_call(raw: RecordedToolCall, tool: McpToolDef) -> ToolCall:
    """The model's call of an MCP tool, checked against the snapshot's schema; problems are ``error`` text."""
    flags: dict[str, Any] = {
        "side_effect": not tool.read_only,
        "timeout_s": tool.timeout_s + START_SLACK_S,
        "max_attempts": 3,
        "heartbeat_s": MCP_HEARTBEAT_S,
        "mcp": McpTarget(server=tool.server, tool=tool.tool, recovery=tool.recovery, call_timeout_s=tool.timeout_s),
    }
    size = len(raw.arguments_json.encode())
    if size > MAX_ARGUMENTS_BYTES:
        error = f"Error: arguments for {raw.name} are {size} bytes; the limit is {MAX_ARGUMENTS_BYTES}."
        return ToolCall(id=raw.id, name=raw.name, error=error, **flags)
    try:
        arguments = json.loads(raw.arguments_json or "{}")
    except json.JSONDecodeError as exc:
        return ToolCall(
            id=raw.id, name=raw.name, error=f"Error: arguments for {raw.name} are not valid JSON ({exc}).", **flags
        )
    if not isinstance(arguments, dict):
        return ToolCall(
            id=raw.id, name=raw.name, error=f"Error: arguments for {raw.name} must be a JSON object.", **flags
        )
    problem = schema_problem(arguments, tool.input_schema)
    if problem:
        return ToolCall(id=raw.id, name=raw.name, error=f"Error: invalid arguments for {raw.name}: {problem}", **flags)
    return ToolCall(id=raw.id, name=raw.name, arguments=arguments, **flags)


def schema_problem(arguments: dict[str, Any], schema: dict[str, Any]) -> str:
    """Why ``arguments`` do not satisfy ``schema`` ("" when they do, or when the server's schema is itself invalid)."""
    import jsonschema  # by the workers with MCP servers configured, not by every worker

    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError:
        return ""  # the server's problem; it validates the arguments itself
    errors = sorted(validator_class(schema).iter_errors(arguments), key=lambda e: list(e.path))[:5]
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error.path) or "(arguments)"
        parts.append(f"{where}: {error.message[:300]}")
    return "; ".join(parts)
