"""What a tool is: ``@tool`` turns ``async fn(args, ctx) -> str`` into a :class:`ToolSpec`.

``@tool`` does not register anything globally: it attaches the spec to the
function, and a :class:`~activities.tools.registry.ToolRegistry` collects the
specs of the modules it loads (the built-ins, then ``AGENT_TOOL_MODULES``). The
same module can therefore be loaded into as many independent registries as a
process needs (one per worker, one per test).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from activities.memory.run_memory import RunMemory
from activities.settings import Settings
from activities.tenant_secrets import SecretUnavailable, tenant_secret
from workflows.types import ToolInvocation

SPEC_ATTRIBUTE = "__durable_agents_tool__"


class ToolError(Exception):
    """A failure the model should read and can react to (not retried)."""


@dataclass
class ToolContext:
    """What a running tool may use: its invocation (ids, idempotency key), the settings, its sandbox, the
    credentials of the run's tenant (:meth:`secret`) and the long-term memory of the run's namespace
    (``memory``: a :class:`~activities.memory.run_memory.RunMemory`, None where no store is attached)."""

    invocation: ToolInvocation
    settings: Settings
    sandbox: Any = None  # activities.sandbox.base.Sandbox when the tool uses_sandbox
    memory: RunMemory | None = None

    def secret(self, name: str) -> str:
        """The run's tenant's secret ``name`` (``AGENT_TENANT_SECRETS_DIR/<tenant>/<name>``), or the worker's own
        when the operator allows it (``AGENT_TENANT_SECRETS_FALLBACK=1``).

        The value is redacted from this tool's result and errors, log lines, history and the store, so the
        model never reads it; pass it only where it is needed (a request's header), never to a sandbox.
        Raises :class:`ToolError` (the model reads it, naming the secret) when the run's tenant has no such
        secret or ``name`` is not 1-64 letters, digits or ``_``.
        """
        try:
            return tenant_secret(self.settings, self.invocation.tenant, name)
        except SecretUnavailable as exc:
            raise ToolError(str(exc)) from None


ToolFn = Callable[[Any, ToolContext], Awaitable[str]]
# "Did it happen?": the result text when the side effect is found to have happened, None when it did not.
ReconcileFn = Callable[[Any, ToolContext], Awaitable[str | None]]
# Undo a completed side effect (given its recorded result); returns a note for the run's record.
CompensateFn = Callable[[Any, ToolContext, str], Awaitable[str]]
# Why a validated call can never succeed (e.g. a host outside the allow list), checked when the model's call is
# validated, before policy asks anyone to approve it; None when it may run.
PrecheckFn = Callable[[Any, Settings], str | None]
Recovery = Literal["idempotent_by_key", "reconcile", "unknown"]
# The argument model of one tool: ``@tool(args=A)`` accepts only a function of ``(A, ToolContext)``.
A = TypeVar("A", bound=BaseModel)


@functools.lru_cache(maxsize=1024)
def _arguments_schema(args_model: type[BaseModel]) -> dict[str, Any]:
    schema = args_model.model_json_schema()
    schema.pop("title", None)
    return schema


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
    precheck: PrecheckFn | None = None

    @property
    def ledgered(self) -> bool:
        """Side effects go through the idempotency ledger; read-only tools skip it."""
        return self.side_effect

    def json_schema(self) -> dict[str, Any]:
        # Offered to the model on every turn; generating it is ~1 ms, a copy of the cached one ~20 µs.
        return copy.deepcopy(_arguments_schema(self.args_model))

    def definition(self) -> dict[str, Any]:
        """Provider-neutral definition: name, description, JSON schema of the arguments."""
        return {"name": self.name, "description": self.description, "parameters": self.json_schema()}


def tool(
    name: str,
    *,
    description: str,
    args: type[A],
    side_effect: bool = False,
    uses_sandbox: bool = False,
    timeout_s: int = 60,
    max_attempts: int = 3,
    heartbeat_s: int = 0,
    recovery: Recovery = "unknown",
    reconcile: ReconcileFn | None = None,
    compensate: CompensateFn | None = None,
    precheck: PrecheckFn | None = None,
) -> Callable[[Callable[[A, ToolContext], Awaitable[str]]], Callable[[A, ToolContext], Awaitable[str]]]:
    """Declare ``fn(args, ctx) -> str`` as tool ``name``; the returned text goes to the model.

    ``fn``'s first parameter is typed ``args``' model: a function of another model is a type error.

    For tools with ``side_effect=True``, ``recovery`` says what a retry does when an
    earlier attempt recorded its intent but no outcome: ``idempotent_by_key`` runs
    again with the same idempotency key (the destination dedupes), ``reconcile``
    asks ``reconcile(args, ctx)`` whether it happened, and ``unknown`` (the default)
    pauses the run for a human. ``compensate`` undoes a completed call when the run
    is cancelled. ``precheck(args, settings)`` returns why a call can never succeed
    (it becomes the call's error before policy or a human sees it), or None. Raise
    :class:`ToolError` for failures the model should read.
    """
    if recovery == "reconcile" and reconcile is None:
        raise ValueError(f"tool {name!r}: recovery='reconcile' needs a reconcile function")
    if not name or not name.replace("_", "a").replace("-", "a").isalnum() or len(name) > 64:
        raise ValueError(f"tool name {name!r}: use 1-64 letters, digits, '_' or '-'")

    def declare(fn: Callable[[A, ToolContext], Awaitable[str]]) -> Callable[[A, ToolContext], Awaitable[str]]:
        spec = ToolSpec(
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
            precheck=precheck,
        )
        setattr(fn, SPEC_ATTRIBUTE, spec)
        return fn

    return declare


def spec_of(value: object) -> ToolSpec | None:
    """The spec ``@tool`` attached to ``value``, if any."""
    spec = getattr(value, SPEC_ATTRIBUTE, None)
    return spec if isinstance(spec, ToolSpec) else None
