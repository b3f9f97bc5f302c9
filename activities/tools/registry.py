"""The tool registry: a tool is an async function with a pydantic argument model.

``@tool(...)`` registers it; the registry gives the model its JSON schema, gives
the workflow its execution settings (via ``ToolCall``), and validates raw model
arguments in trusted code before anything runs.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from activities.config import Settings
from workflows.types import RecordedToolCall, ToolCall, ToolInvocation

MAX_ARGUMENTS_BYTES = 64 * 1024


class ToolError(Exception):
    """A failure the model should read and can react to (not retried)."""


@dataclass
class ToolContext:
    invocation: ToolInvocation
    settings: Settings
    sandbox: Any = None  # activities.sandbox.base.Sandbox when the tool uses_sandbox


ArgsT = TypeVar("ArgsT", bound=BaseModel)
ToolFn = Callable[[Any, ToolContext], Awaitable[str]]
# "Did it happen?": the result text when the side effect is found to have happened, None when it did not.
ReconcileFn = Callable[[Any, ToolContext], Awaitable[str | None]]
# Undo a completed side effect (given its recorded result); returns a note for the run's record.
CompensateFn = Callable[[Any, ToolContext, str], Awaitable[str]]
Recovery = Literal["idempotent_by_key", "reconcile", "unknown"]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args_model: type[BaseModel]
    fn: ToolFn
    side_effect: bool = False
    uses_sandbox: bool = False
    timeout_s: int = 60
    max_attempts: int = 3
    heartbeat_s: int = 0
    recovery: Recovery = "unknown"
    reconcile: ReconcileFn | None = None
    compensate: CompensateFn | None = None

    @property
    def ledgered(self) -> bool:
        """Side effects go through the idempotency ledger; read-only tools skip it."""
        return self.side_effect

    def json_schema(self) -> dict[str, Any]:
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        return schema

    def definition(self) -> dict[str, Any]:
        """Provider-neutral definition: name, description, JSON schema of the arguments."""
        return {"name": self.name, "description": self.description, "parameters": self.json_schema()}


_REGISTRY: dict[str, ToolSpec] = {}


def tool(
    name: str,
    *,
    description: str,
    args: type[BaseModel],
    side_effect: bool = False,
    uses_sandbox: bool = False,
    timeout_s: int = 60,
    max_attempts: int = 3,
    heartbeat_s: int = 0,
    recovery: Recovery = "unknown",
    reconcile: ReconcileFn | None = None,
    compensate: CompensateFn | None = None,
) -> Callable[[ToolFn], ToolFn]:
    """Register ``fn(args, ctx) -> str`` as tool ``name``; the returned text goes to the model.

    For tools with ``side_effect=True``, ``recovery`` says what a retry does when an
    earlier attempt recorded its intent but no outcome: ``idempotent_by_key`` runs
    again with the same idempotency key (the destination dedupes), ``reconcile``
    asks ``reconcile(args, ctx)`` whether it happened, and ``unknown`` (the default)
    pauses the run for a human. ``compensate`` undoes a completed call when the run
    is cancelled.
    """
    if recovery == "reconcile" and reconcile is None:
        raise ValueError(f"tool {name!r}: recovery='reconcile' needs a reconcile function")

    def register(fn: ToolFn) -> ToolFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"tool {name!r} is already registered")
        _REGISTRY[name] = ToolSpec(
            name=name,
            description=description,
            args_model=args,
            fn=fn,
            side_effect=side_effect,
            uses_sandbox=uses_sandbox,
            timeout_s=timeout_s,
            max_attempts=max_attempts,
            heartbeat_s=heartbeat_s,
            recovery=recovery,
            reconcile=reconcile,
            compensate=compensate,
        )
        return fn

    return register


def registered() -> dict[str, ToolSpec]:
    """All registered tools by name: the built-ins plus modules named in ``AGENT_TOOL_MODULES``."""
    import activities.tools.builtins  # noqa: F401  (registers on import)

    load_tool_modules(os.environ.get("AGENT_TOOL_MODULES", ""))
    return dict(_REGISTRY)


def load_tool_modules(names: str) -> None:
    """Import each comma-separated module so its ``@tool`` functions register (operator's own tools)."""
    for name in (n.strip() for n in names.split(",")):
        if name:
            importlib.import_module(name)


def get(name: str) -> ToolSpec | None:
    return registered().get(name)


def _format_validation_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"]) or "(arguments)"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def validate_call(raw: RecordedToolCall, enabled: list[str]) -> ToolCall:
    """Turn a raw model tool call into a ``ToolCall``; problems become ``error`` text for the model."""
    spec = registered().get(raw.name)
    if spec is None or raw.name not in enabled:
        return ToolCall(
            id=raw.id,
            name=raw.name,
            error=f"Error: unknown tool {raw.name!r}. Available tools: {', '.join(sorted(enabled)) or 'none'}.",
        )
    settings = {
        "side_effect": spec.side_effect,
        "uses_sandbox": spec.uses_sandbox,
        "timeout_s": spec.timeout_s,
        "max_attempts": spec.max_attempts,
        "heartbeat_s": spec.heartbeat_s,
        "compensable": spec.compensate is not None,
    }
    if len(raw.arguments_json.encode()) > MAX_ARGUMENTS_BYTES:
        return ToolCall(
            id=raw.id,
            name=raw.name,
            error=f"Error: arguments for {raw.name} are {len(raw.arguments_json.encode())} bytes; "
            f"the limit is {MAX_ARGUMENTS_BYTES}. Split the work into smaller calls.",
            **settings,
        )
    try:
        parsed = json.loads(raw.arguments_json or "{}")
    except json.JSONDecodeError as exc:
        return ToolCall(
            id=raw.id, name=raw.name, error=f"Error: arguments for {raw.name} are not valid JSON ({exc}).", **settings
        )
    if not isinstance(parsed, dict):
        return ToolCall(
            id=raw.id, name=raw.name, error=f"Error: arguments for {raw.name} must be a JSON object.", **settings
        )
    try:
        model = spec.args_model.model_validate(parsed)
    except ValidationError as exc:
        return ToolCall(
            id=raw.id,
            name=raw.name,
            error=f"Error: invalid arguments for {raw.name}: {_format_validation_error(exc)}",
            **settings,
        )
    return ToolCall(id=raw.id, name=raw.name, arguments=model.model_dump(mode="json"), **settings)
