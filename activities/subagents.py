"""Sub-agent definitions: the operator's file (``AGENT_SUBAGENTS_FILE``) and a run's own, resolved at run start.

The file is a JSON object ``{"name": {"description": ..., "model": ..., "tools": [...],
"system_prompt": ..., "limits": {...}, "policy": {...}, "share_sandbox": false}}``, validated
at worker start (a bad file stops the worker with one line) and snapshotted into each run by
``run_config``.

A run's resolved definitions are stored once, as a blob of the run store (``store``), and go
down the tree by digest: the workflow keeps only what it needs of them (``slim``: description,
limits, policy, share_sandbox), and each child's ``run_config`` reads its own system prompt,
model and tools, and its own sub-agents, from the blob (``load``). A child start therefore
weighs the same whatever the definitions weigh.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from activities.settings import ConfigurationError, bad_file
from activities.store.base import RunStore
from workflows.policy import parse_run_policy
from workflows.types import MAX_SUBAGENTS, MCP_PREFIX, SubagentDef, SubagentName

_DEFINITIONS: TypeAdapter[dict[SubagentName, SubagentDef]] = TypeAdapter(dict[SubagentName, SubagentDef])


def problem(name: str, definition: SubagentDef, tools: Collection[str], reserved: Collection[str]) -> str:
    """Why ``definition`` cannot be offered by this worker, or ``""``."""
    if name in tools or name in reserved:
        return f"sub-agent {name!r} has the name of a tool"
    # MCP tools (mcp__server__tool, globs too) are resolved against the servers when the sub-agent's run starts.
    unknown = sorted(t for t in set(definition.tools or []) - set(tools) if not t.startswith(MCP_PREFIX))
    if unknown:
        return f"sub-agent {name!r} names unknown tools {unknown}"
    try:
        parse_run_policy(definition.policy)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        return f"sub-agent {name!r}: policy.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return ""


def load_subagents(path: str, tools: Collection[str], reserved: Collection[str]) -> dict[str, SubagentDef]:
    """The operator's sub-agents (none when no file is configured); ``ConfigurationError`` naming the file."""
    if not path:
        return {}
    try:
        raw = json.loads(Path(path).read_text())
        if isinstance(raw, dict) and len(raw) > MAX_SUBAGENTS:
            raise ValueError(f"at most {MAX_SUBAGENTS} sub-agents may be defined")
        found = _DEFINITIONS.validate_python(raw)
    except (OSError, ValueError) as exc:  # ValidationError is a ValueError
        raise bad_file("AGENT_SUBAGENTS_FILE", path, exc) from None
    for name, definition in found.items():
        why = problem(name, definition, tools, reserved)
        if why:
            raise ConfigurationError(f"AGENT_SUBAGENTS_FILE={path}: {why}")
    return found


def resolve(
    operator: Mapping[str, SubagentDef],
    requested: dict[str, SubagentDef] | list[str] | None,
    tools: Collection[str],
    reserved: Collection[str],
) -> dict[str, SubagentDef]:
    """A run's sub-agents; ``ValueError`` (for the run's caller) when its request cannot be met."""
    if requested is None:
        return dict(operator)
    if isinstance(requested, list):
        unknown = sorted(set(requested) - set(operator))
        if unknown:
            raise ValueError(f"unknown sub-agents {unknown}; defined: {sorted(operator)}")
        return {name: operator[name] for name in dict.fromkeys(requested)}
    resolved = {**operator, **requested}
    for name, definition in requested.items():
        why = problem(name, definition, tools, reserved)
        if why:
            raise ValueError(why)
    return resolved


async def store(run_store: RunStore, definitions: Mapping[str, SubagentDef]) -> str:
    """Store a run's resolved definitions once; their digest (sorted JSON, so equal sets share a blob)."""
    return await run_store.put_blob(_DEFINITIONS.dump_json(dict(sorted(definitions.items()))))


async def load(run_store: RunStore, digest: str) -> dict[str, SubagentDef]:
    """The definitions stored under ``digest``; ``ValueError`` when the store has none there."""
    data = await run_store.get_blob(digest)
    if data is None:
        raise ValueError(f"the sub-agent definitions {digest} are not in the run store")
    return _DEFINITIONS.validate_json(data)


def slim(definitions: Mapping[str, SubagentDef]) -> dict[str, SubagentDef]:
    """What a run's workflow keeps of each definition: no system prompt, model, tools or output schema (they
    are in the blob)."""
    return {
        name: definition.model_copy(update={"system_prompt": "", "model": "", "tools": None, "output_schema": None})
        for name, definition in definitions.items()
    }
