"""The workers' workflow sandbox: Temporal's, with the payload visitor's context asks answered in process.

Before the worker encodes a workflow task's commands (and decodes an activation's payloads) it asks the
workflow instance, once per payload, which serialization context and external-store context that payload
belongs to. Temporal's sandbox answers each ask by ``exec``-ing a code string inside
``importer.applied()``, which swaps ``sys.modules`` and ``builtins.__import__`` in and out: about a
third of the workflow side's CPU per step in a run whose steps each carry an activity with a few
payloads (profiled with py-spy; 6.1 → 3.8 ms of replay CPU per turn without it).

The answer itself needs none of that. It reads the run's ``Info`` and its pending-command maps and
builds frozen dataclasses from ``temporalio.converter``, a module the sandbox passes through, so the
objects are the same inside and out; it imports nothing and runs no workflow code. So this runner's
instances call the sandboxed instance's method directly and keep the ``exec`` path for everything
else: activations (where workflow code runs) still go through the sandbox unchanged, as do asks about
Nexus operations (whose answer imports a module) and any instance whose inner runner is not the
SDK's own.

The sandbox's instance class is private (``temporalio.worker.workflow_sandbox._runner._Instance``);
if a Temporal release moves or reshapes it, this runner is the SDK's runner unchanged
(:data:`DIRECT_CONTEXT` is then ``False``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from temporalio.api.enums.v1 import CommandType
from temporalio.worker import UnsandboxedWorkflowRunner, WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

__all__ = ["DIRECT_CONTEXT", "DirectContextSandboxedWorkflowRunner"]

_IN_SANDBOX = "__temporal_in_sandbox"
# The one ask whose answer imports (``temporalio.nexus.system``'s operation registry).
_EXEC_PATH_COMMANDS = frozenset({CommandType.COMMAND_TYPE_SCHEDULE_NEXUS_OPERATION})


def _direct_instance_class() -> Callable[..., WorkflowInstance] | None:
    """A subclass of the sandbox's private instance class with the direct asks, or ``None`` when the
    SDK's layout is not the one this was written against."""
    try:
        from temporalio.worker.workflow_sandbox import _runner
    except ImportError:  # pragma: no cover - depends on the installed SDK
        return None
    base: Any = getattr(_runner, "_Instance", None)
    needed = ("get_serialization_context", "get_external_store_context", "_run_code")
    if base is None or not all(hasattr(base, name) for name in needed):
        return None

    class _DirectContextInstance(base):  # type: ignore[misc]
        def _direct(self, command_info: Any) -> Any:
            """The sandboxed instance, when an ask about this command may skip the ``exec`` path."""
            if self.runner_class is not UnsandboxedWorkflowRunner:
                return None
            if command_info is not None and command_info.command_type in _EXEC_PATH_COMMANDS:
                return None
            return self.globals_and_locals.get(_IN_SANDBOX)

        def get_serialization_context(self, command_info: Any) -> Any:
            in_sandbox = self._direct(command_info)
            if in_sandbox is None:
                return super().get_serialization_context(command_info)
            return in_sandbox.get_serialization_context(command_info)

        def get_external_store_context(self, command_info: Any) -> Any:
            in_sandbox = self._direct(command_info)
            if in_sandbox is None:
                return super().get_external_store_context(command_info)
            return in_sandbox.get_external_store_context(command_info)

    return _DirectContextInstance


_INSTANCE_CLASS = _direct_instance_class()

DIRECT_CONTEXT: bool = _INSTANCE_CLASS is not None
"""Whether this runner answers context asks directly (``False``: the installed SDK's sandbox layout is
unknown, and the runner behaves exactly as :class:`~temporalio.worker.workflow_sandbox.SandboxedWorkflowRunner`)."""


@dataclasses.dataclass(frozen=True)
class DirectContextSandboxedWorkflowRunner(SandboxedWorkflowRunner):
    """:class:`~temporalio.worker.workflow_sandbox.SandboxedWorkflowRunner` with the same restrictions and
    the same isolation of workflow code, whose instances answer the worker's per-payload serialization
    and external-store context asks without re-entering the sandbox (module docstring)."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        if _INSTANCE_CLASS is None:
            return super().create_instance(det)
        instance: WorkflowInstance = _INSTANCE_CLASS(det, self.runner_class, self.restrictions)
        return instance
