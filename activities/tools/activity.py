"""One activity per registered tool (activity type = tool name), plus ``transcript_append``.

A tool activity writes the tool's full result into the transcript at the
position the workflow chose and returns only a preview, so large outputs never
enter history. If that position is already filled, an earlier attempt finished
the call: its result is returned and the tool does not run again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from temporalio import activity

from activities.runtime import Runtime
from activities.sandbox.base import SandboxError
from activities.tools.registry import ToolContext, ToolError, ToolSpec, registered
from workflows.types import Message, ToolInvocation, ToolOutcome, TranscriptEntry

PREVIEW_CHARS = 1000


def outcome_of(message: Message) -> ToolOutcome:
    size = len(message.content.encode())
    return ToolOutcome(
        ok=not message.is_error,
        preview=message.content[:PREVIEW_CHARS],
        size_bytes=size,
        truncated=len(message.content) > PREVIEW_CHARS,
    )


@contextlib.asynccontextmanager
async def _heartbeating(every_s: int) -> AsyncIterator[None]:
    """Heartbeat while the tool runs so a dead worker is noticed at heartbeat timeout."""
    if every_s <= 0:
        yield
        return

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(every_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()


def _make_tool_activity(spec: ToolSpec, runtime: Runtime) -> Callable[[ToolInvocation], Any]:
    async def run_tool(inv: ToolInvocation) -> ToolOutcome:
        store = runtime.store
        done = await store.get_message(inv.conversation_id, inv.seq)
        if done is not None:
            return outcome_of(done.message)
        text, is_error = await _execute(spec, runtime, inv)
        result = Message(role="tool", content=text, tool_call_id=inv.call_id, name=spec.name, is_error=is_error)
        stored = await store.put_message(inv.conversation_id, inv.seq, result)
        return outcome_of(stored.message)

    run_tool.__name__ = f"tool_{spec.name}"
    run_tool.__qualname__ = run_tool.__name__
    return activity.defn(name=spec.name)(run_tool)


async def _execute(spec: ToolSpec, runtime: Runtime, inv: ToolInvocation) -> tuple[str, bool]:
    """Run the tool; failures the model can act on become error text, others propagate (retry)."""
    try:
        args = spec.args_model.model_validate(inv.arguments)
        ctx = ToolContext(invocation=inv, settings=runtime.settings)
        if spec.uses_sandbox:
            if not inv.sandbox_id:
                raise ToolError("no sandbox was created for this run")
            ctx.sandbox = await runtime.sandbox_backend().connect(inv.sandbox_id)
        async with _heartbeating(spec.heartbeat_s):
            return await spec.fn(args, ctx), False
    except (ToolError, SandboxError) as exc:
        return f"Error: {exc}", True


def tool_activities(runtime: Runtime) -> list[Callable[..., Any]]:
    return [_make_tool_activity(spec, runtime) for spec in registered().values()]


class TranscriptActivities:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @activity.defn(name="transcript_append")
    async def transcript_append(self, conversation_id: str, entries: list[TranscriptEntry]) -> None:
        """Persist entries the workflow produced itself (errors, denials) when no model turn follows."""
        for entry in entries:
            await self._rt.store.put_message(conversation_id, entry.seq, entry.message)
