"""A run's sandbox that vanished between steps is recreated once, and the model is told what was lost."""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from activities.runtime import Runtime
from activities.sandbox.base import RECREATED_NOTE
from activities.tools.activity import tool_activities
from tests.conftest import require_bwrap
from workflows.types import ToolInvocation


def invocation(seq: int, command: str) -> ToolInvocation:
    return ToolInvocation(
        conversation_id="wf-recreate/run-1",
        workflow_id="wf-recreate",
        step=seq,
        call_id=f"call_{seq}",
        call_index=0,
        seq=seq,
        tool="run_shell",
        arguments={"command": command},
        idempotency_key=f"ik_recreate_{seq}",
        sandbox_id="sbx-recreate",
    )


async def test_vanished_sandbox_is_recreated_and_the_model_is_told(runtime: Runtime) -> None:
    require_bwrap()
    (run_shell,) = [fn for fn in tool_activities(runtime) if fn.__name__ == "tool_run_shell"]
    backend = runtime.sandbox_backend()
    await backend.create("sbx-recreate", metadata={})
    env = ActivityEnvironment()

    first = await env.run(run_shell, invocation(2, "echo kept > notes.txt && cat notes.txt"))
    assert first.ok and "kept" in first.preview and RECREATED_NOTE not in first.preview

    await backend.kill("sbx-recreate")  # e.g. expired, reaped, or the run moved to another host
    second = await env.run(run_shell, invocation(3, "cat notes.txt || echo missing"))
    assert second.preview.startswith(RECREATED_NOTE)
    assert "missing" in second.preview

    third = await env.run(run_shell, invocation(4, "echo again"))
    assert RECREATED_NOTE not in third.preview  # only the step that found it gone says so
