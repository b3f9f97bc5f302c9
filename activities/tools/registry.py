"""``ToolRegistry``: the tools one worker offers, and trusted validation of the model's calls.

A registry is an object owned by the composition root (``DurableAgentsPlugin``):
the built-ins and the operator's ``AGENT_TOOL_MODULES`` are loaded into it once,
at worker start. It gives the model its JSON schemas, gives the workflow each
call's execution settings (via ``ToolCall``) and validates raw model arguments
before anything runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from types import ModuleType

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from activities.modules import import_extension
from activities.settings import ConfigurationError, Settings
from activities.tools.spec import ToolSpec, spec_of
from workflows.types import ASK_HUMAN, MAX_TASK_CHARS, MCP_PREFIX, RecordedToolCall, ToolCall

HUMAN_MODULE = "activities.tools.human"  # where the built-in ask_human is declared

MAX_ARGUMENTS_BYTES = 64 * 1024
# Activity types the runtime registers itself; a tool's activity type is its name, so these are taken.
RESERVED_NAMES = frozenset(
    {
        "model",
        "run_config",
        "compensate",
        "verify_decision",
        "check_edited_call",
        "transcript_append",
        "sandbox_create",
        "sandbox_kill",
        "mcp",
        "mcp_release",
        "fork_prepare",
        "tree_run_reserve",
        "final_output",  # the forced answer tool of structured output (activities.models.structured)
    }
)
RESERVED_PREFIX = MCP_PREFIX  # the tools of the operator's MCP servers


class ToolRegistry:
    """Tools by name. ``add`` refuses reserved and duplicate names; lookups never import anything."""

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: ToolSpec) -> ToolSpec:
        if spec.name in RESERVED_NAMES:
            raise ConfigurationError(
                f"tool name {spec.name!r} is reserved by the runtime (reserved: {', '.join(sorted(RESERVED_NAMES))})"
            )
        if spec.name.startswith(RESERVED_PREFIX):
            raise ConfigurationError(
                f"tool name {spec.name!r}: names starting {RESERVED_PREFIX!r} are kept for MCP servers' tools"
            )
        existing = self._specs.get(spec.name)
        if existing is not None and existing.fn is not spec.fn:
            raise ConfigurationError(f"tool {spec.name!r} is already registered (by {_origin(existing)})")
        self._specs[spec.name] = spec
        return spec

    def add_module(self, module: ModuleType) -> list[str]:
        """Add every ``@tool`` function defined or imported at the top level of ``module``; their names."""
        names = []
        for value in list(vars(module).values()):
            spec = spec_of(value)
            if spec is not None:
                names.append(self.add(spec).name)
        return names

    def load_modules(self, names: Iterable[str], *, variable: str = "AGENT_TOOL_MODULES") -> None:
        """Import each module and add its tools; an import failure is a one-line ``ConfigurationError``."""
        for name in names:
            self.add_module(import_extension(name, variable))

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def specs(self) -> list[ToolSpec]:
        return [self._specs[name] for name in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def definitions(self, names: Iterable[str]) -> list[dict[str, object]]:
        """Provider-neutral definitions of the enabled tools this registry knows, in the given order."""
        return [self._specs[name].definition() for name in names if name in self._specs]

    def validate_call(self, raw: RecordedToolCall, enabled: list[str], settings: Settings | None = None) -> ToolCall:
        """Turn a raw model tool call into a ``ToolCall``; problems become ``error`` text for the model.

        With the worker's ``settings``, the tool's ``precheck`` also runs: a call that can never succeed (an
        ``http_request`` to a host outside the allow list) is an error here, so policy never asks a human
        to approve it.
        """
        spec = self._specs.get(raw.name)
        if spec is None or raw.name not in enabled:
            return ToolCall(
                id=raw.id,
                name=raw.name,
                error=f"Error: unknown tool {raw.name!r}. Available tools: {', '.join(sorted(enabled)) or 'none'}.",
            )
        flags = {
            "side_effect": spec.side_effect,
            "uses_sandbox": spec.uses_sandbox,
            "timeout_s": spec.timeout_s,
            "max_attempts": spec.max_attempts,
            "heartbeat_s": spec.heartbeat_s,
            "compensable": spec.compensate is not None,
        }
        size = len(raw.arguments_json.encode())
        if size > MAX_ARGUMENTS_BYTES:
            return ToolCall(
                id=raw.id,
                name=raw.name,
                error=f"Error: arguments for {raw.name} are {size} bytes; "
                f"the limit is {MAX_ARGUMENTS_BYTES}. Split the work into smaller calls.",
                **flags,
            )
        try:
            parsed = json.loads(raw.arguments_json or "{}")
        except json.JSONDecodeError as exc:
            return ToolCall(
                id=raw.id,
                name=raw.name,
                error=f"Error: arguments for {raw.name} are not valid JSON ({exc}).",
                **flags,
            )
        if not isinstance(parsed, dict):
            return ToolCall(
                id=raw.id, name=raw.name, error=f"Error: arguments for {raw.name} must be a JSON object.", **flags
            )
        try:
            model = spec.args_model.model_validate(parsed)
        except ValidationError as exc:
            return ToolCall(
                id=raw.id,
                name=raw.name,
                error=f"Error: invalid arguments for {raw.name}: {_format_validation_error(exc)}",
                **flags,
            )
        refusal = _precheck(spec, model, settings) if settings is not None else None
        if refusal:
            return ToolCall(
                id=raw.id, name=raw.name, error=f"Error: {raw.name} refused: {refusal}. It was not run.", **flags
            )
        human = raw.name == ASK_HUMAN and spec.fn.__module__ == HUMAN_MODULE  # the workflow answers it
        return ToolCall(id=raw.id, name=raw.name, arguments=model.model_dump(mode="json"), human=human, **flags)


class SubagentArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS, description="What the sub-agent should do")


def subagent_definition(name: str, description: str) -> dict[str, object]:
    """A sub-agent as the model sees it: a tool of its name taking ``{"task": str}``."""
    return {"name": name, "description": description, "parameters": SubagentArgs.model_json_schema()}


def subagent_call(raw: RecordedToolCall) -> ToolCall:
    """A call to a sub-agent, validated like a tool call: problems become ``error`` text for the model."""
    size = len(raw.arguments_json.encode())
    if size > MAX_ARGUMENTS_BYTES:
        error = f"Error: arguments for {raw.name} are {size} bytes; the limit is {MAX_ARGUMENTS_BYTES}."
        return ToolCall(id=raw.id, name=raw.name, error=error, subagent=True)
    try:
        args = SubagentArgs.model_validate_json(raw.arguments_json or "{}")
    except ValidationError as exc:
        error = f"Error: invalid arguments for {raw.name}: {_format_validation_error(exc)}"
        return ToolCall(id=raw.id, name=raw.name, error=error, subagent=True)
    return ToolCall(id=raw.id, name=raw.name, arguments=args.model_dump(), subagent=True)


def _precheck(spec: ToolSpec, args: object, settings: Settings) -> str | None:
    if spec.precheck is None:
        return None
    try:
        return spec.precheck(args, settings)
    except Exception as exc:  # a broken check refuses the call rather than letting it through unchecked
        return f"its arguments could not be checked ({type(exc).__name__}: {exc})"


def _origin(spec: ToolSpec) -> str:
    return f"{getattr(spec.fn, '__module__', '?')}.{getattr(spec.fn, '__qualname__', '?')}"


def _format_validation_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"]) or "(arguments)"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)
