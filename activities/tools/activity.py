"""One activity per registered tool (activity type = tool name), plus ``transcript_append``.

A tool activity writes the tool's full result into the transcript at the
position the workflow chose and returns only a preview, so large outputs never
enter history. If that position is already filled, an earlier attempt finished
the call: its result is returned and the tool does not run again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import structlog
from opentelemetry.trace import StatusCode
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import observability as telemetry
from activities.checkpoints.workspace import Workspace
from activities.heartbeat import heartbeating
from activities.redaction import redact
from activities.runtime import Runtime
from activities.sandbox.base import META_RUN, META_TENANT, SandboxError, SandboxMissing
from activities.store.base import StoreUnavailable
from activities.store_errors import store_guarded
from activities.tools.recovery import execute_once
from activities.tools.spec import ToolContext, ToolError, ToolSpec
from workflows.types import CompensationRequest, Message, ToolInvocation, ToolOutcome, TranscriptEntry

PREVIEW_CHARS = 1000
log = structlog.get_logger("activities.tools")


def outcome_of(message: Message, meta: dict[str, object] | None = None) -> ToolOutcome:
    size = len(message.content.encode())
    checkpoint = (meta or {}).get("checkpoint", "")
    return ToolOutcome(
        ok=not message.is_error,
        preview=message.content[:PREVIEW_CHARS],
        size_bytes=size,
        truncated=len(message.content) > PREVIEW_CHARS,
        checkpoint=checkpoint if isinstance(checkpoint, str) else "",
    )


@store_guarded
async def run_invocation(spec: ToolSpec, runtime: Runtime, inv: ToolInvocation) -> ToolOutcome:
    """Run one tool call (ledgered when it has side effects) and store its result at ``inv.seq``.

    Shared by the registered tools' activities and the ``mcp`` activity, which builds a spec per call.
    A run store outage fails the attempt with the retryable ``StoreUnavailable`` (``store_guarded``).
    """
    with (
        telemetry.activity_context(step=inv.step, tool=spec.name, call_id=inv.call_id),
        telemetry.tracer().start_as_current_span(
            f"execute_tool {spec.name}",
            attributes=_tool_span_attributes(spec, inv),
            record_exception=False,  # exception texts can quote arguments; the type is enough here
            set_status_on_exception=False,
        ) as span,
    ):
        log.debug("tool_started", argument_names=sorted(inv.arguments), resolution=inv.resolution or None)
        try:
            outcome = await _run_tool(spec, runtime, inv)
        except Exception as exc:
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(StatusCode.ERROR, type(exc).__name__)
            telemetry.record_tool_call(spec.name, inv.policy_verdict, "attempt_failed")
            if isinstance(exc, StoreUnavailable):  # the store logs its outage once, not once per attempt
                log.info("tool_attempt_failed", error_type=type(exc).__name__)
            else:
                log.warning("tool_attempt_failed", error_type=type(exc).__name__)
            # A failure that quotes a secret (a tool or its reconcile raising with its credential in the
            # message) fails the attempt redacted, with the same type name, so that history never holds it.
            scrubbed = _scrubbed(exc, runtime.settings.secret_values())
            if scrubbed is exc:
                raise
            raise scrubbed from None
        state = "unknown" if outcome.unknown else ("ok" if outcome.ok else "error")
        span.set_attributes({"agent.tool.outcome": state, "agent.tool.result_bytes": outcome.size_bytes})
        telemetry.record_tool_call(spec.name, inv.policy_verdict, state)
        log.info("tool_finished", outcome=state, result_bytes=outcome.size_bytes)
        return outcome


async def _run_tool(spec: ToolSpec, runtime: Runtime, inv: ToolInvocation) -> ToolOutcome:
    store = runtime.store
    # Outside the sandbox, the position is not looked up first: a read-only tool is cheaper to run again,
    # and a tool with effects asks the ledger, whose claim returns an earlier execution's outcome without
    # running it again. Either way the result is put first-writer-wins, so a retry (or a reset run) whose
    # position an earlier attempt wrote returns that entry. A sandbox tool (its workspace checkpoint is in
    # the entry's meta) and a call a human resolved look first.
    if spec.uses_sandbox or inv.resolution:
        done = await store.get_message(inv.conversation_id, inv.seq)
        if done is not None:
            # With the workspace checkpoint it left: a reset run that reuses it restores that workspace next.
            log.info("tool_result_reused", position=inv.seq)
            return outcome_of(done.message, done.meta)
    workspace = Workspace(runtime, inv) if spec.uses_sandbox and inv.checkpoints else None
    execute = functools.partial(_execute, workspace=workspace)
    if inv.resolution in ("mark_done", "fail"):
        text, is_error = await _resolve_by_hand(spec, runtime, inv)
    elif spec.ledgered:
        execution = await execute_once(spec, runtime, inv, execute)
        if execution.unknown:
            # No transcript entry yet: the human's resolution will produce it.
            return ToolOutcome(ok=False, preview=execution.text, size_bytes=0, unknown=True)
        text, is_error = execution.text, execution.is_error
    else:
        text, is_error = await execute(spec, runtime, inv)
    if inv.reviewer_note:  # the model must know the call it made is not the call that ran
        text = f"{inv.reviewer_note}\n\n{text}"
    result = Message(role="tool", content=text, tool_call_id=inv.call_id, name=spec.name, is_error=is_error)
    meta: dict[str, object] = {"run": activity.info().workflow_run_id}
    if workspace is not None and workspace.checkpoint:
        meta["checkpoint"] = workspace.checkpoint
    stored = await store.put_message(inv.conversation_id, inv.seq, result, meta)
    runtime.transcripts.remember(inv.conversation_id, stored)
    return outcome_of(stored.message, stored.meta)


def _make_tool_activity(spec: ToolSpec, runtime: Runtime) -> Callable[[ToolInvocation], Any]:
    async def run_tool(inv: ToolInvocation) -> ToolOutcome:
        return await run_invocation(spec, runtime, inv)

    run_tool.__name__ = f"tool_{spec.name}"
    run_tool.__qualname__ = run_tool.__name__
    return activity.defn(name=spec.name)(run_tool)


def _tool_span_attributes(spec: ToolSpec, inv: ToolInvocation) -> dict[str, Any]:
    """An ``execute_tool`` span (GenAI semantic conventions) with the policy decision that let it run."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": spec.name,
        "gen_ai.tool.call.id": inv.call_id,
        "gen_ai.tool.type": "function",
        "agent.idempotency_key": inv.idempotency_key,
        "agent.step": inv.step,
        "agent.tool.side_effect": spec.side_effect,
    }
    if inv.policy_verdict:  # empty for runs whose workflow code predates the field
        attributes["agent.policy.verdict"] = inv.policy_verdict
        attributes["agent.policy.rule"] = inv.policy_rule
    if inv.resolution:
        attributes["agent.tool.resolution"] = inv.resolution
    return attributes


async def _execute(
    spec: ToolSpec, runtime: Runtime, inv: ToolInvocation, *, workspace: Workspace | None = None
) -> tuple[str, bool]:
    """Run the tool, its text redacted of every configured secret before it is stored or returned."""
    text, is_error = await _execute_raw(spec, runtime, inv, workspace)
    return redact(text, runtime.settings.secret_values()), is_error


def _scrubbed(exc: Exception, secrets: list[str]) -> Exception:
    """``exc`` itself, or an ``ApplicationError`` of its type name and its redacted message when it or an
    exception it was raised from quotes a secret (Temporal records the whole chain in history)."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in chain and len(chain) < 20:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if all(redact(str(e), secrets) == str(e) for e in chain):
        return exc
    if isinstance(exc, ApplicationError):
        return ApplicationError(redact(exc.message, secrets), type=exc.type, non_retryable=exc.non_retryable)
    return ApplicationError(redact(str(exc), secrets), type=type(exc).__name__)


async def _execute_raw(
    spec: ToolSpec, runtime: Runtime, inv: ToolInvocation, workspace: Workspace | None
) -> tuple[str, bool]:
    """Run the tool; failures the model can act on become error text, others propagate (retry)."""
    ctx = ToolContext(invocation=inv, settings=runtime.settings, memory=runtime.memory_of(inv.tenant, inv.user))
    try:
        args = spec.args_model.model_validate(inv.arguments)
        note = ""
        if spec.uses_sandbox:
            if not inv.sandbox_id:
                raise ToolError("no sandbox was created for this run")
            connection = await runtime.sandbox_backend().connect_or_recreate(
                inv.sandbox_id, metadata={META_RUN: inv.conversation_id, META_TENANT: inv.tenant}
            )
            ctx.sandbox = connection.sandbox
            if workspace is not None:  # the workspace is made to match the run's last checkpoint first
                note = await workspace.prepare(connection.sandbox, recreated=connection.recreated)
            else:  # a call scheduled by workflow code without checkpoints: the model is told what was lost
                note = connection.note()
        async with heartbeating(0 if spec.ledgered else spec.heartbeat_s):
            text = await spec.fn(args, ctx)
        if workspace is not None:
            text += await workspace.checkpoint_after(ctx.sandbox)
        return (f"{note}\n{text}" if note else text), False
    except (ToolError, SandboxError) as exc:
        after = ""
        if workspace is not None and ctx.sandbox is not None and not isinstance(exc, SandboxMissing):
            # A failed tool may still have changed files (a command that wrote, then failed). Its note is
            # dropped (the model reads the error), unless it says the run's checkpoints stopped.
            note = await workspace.checkpoint_after(ctx.sandbox)
            after = note if workspace.stopped else ""
        return f"Error: {exc}{after}", True


async def _resolve_by_hand(spec: ToolSpec, runtime: Runtime, inv: ToolInvocation) -> tuple[str, bool]:
    """Record a human's answer to an unknown outcome in the ledger and as the tool result."""
    who = inv.resolution_note or "a reviewer"
    if inv.resolution == "mark_done":
        text, is_error = f"{spec.name} was confirmed done by {who} after its outcome was unknown.", False
    else:
        text, is_error = f"Error: {spec.name} was marked failed by {who} after its outcome was unknown.", True
    await runtime.store.finish(inv.idempotency_key, "human", "done", text, is_error, note=f"resolved: {inv.resolution}")
    return text, is_error


def tool_activities(runtime: Runtime) -> list[Callable[..., Any]]:
    return [_make_tool_activity(spec, runtime) for spec in runtime.tools.specs()]


class CompensationActivities:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @activity.defn(name="compensate")
    @store_guarded
    async def compensate(self, req: CompensationRequest) -> str:
        """Undo one completed side effect with its tool's compensation, given its recorded result."""
        spec = self._rt.tools.get(req.tool)
        if spec is None or spec.compensate is None:
            raise ApplicationError(f"{req.tool} declares no compensation", type="NotCompensable", non_retryable=True)
        entries = [e for e in await self._rt.store.ledger(req.workflow_id) if e.key == req.idempotency_key]
        result = entries[0].result if entries else ""
        invocation = ToolInvocation(
            conversation_id=req.conversation_id,
            workflow_id=req.workflow_id,
            step=0,
            call_id="",
            call_index=0,
            seq=-1,
            tool=req.tool,
            arguments=req.arguments,
            idempotency_key=req.idempotency_key,
            tenant=req.tenant,
            user=req.user,
        )
        args = spec.args_model.model_validate(req.arguments)
        # The note goes into the run's history: redacted like a tool's result, a failure like a tool's.
        try:
            note = await spec.compensate(args, ToolContext(invocation=invocation, settings=self._rt.settings), result)
        except Exception as exc:
            scrubbed = _scrubbed(exc, self._rt.settings.secret_values())
            if scrubbed is exc:
                raise
            raise scrubbed from None
        return redact(note, self._rt.settings.secret_values())


class TranscriptActivities:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @activity.defn(name="transcript_append")
    @store_guarded
    async def transcript_append(self, conversation_id: str, entries: list[TranscriptEntry]) -> None:
        """Persist entries the workflow produced itself (errors, denials) when no model turn follows."""
        run_id = activity.info().workflow_run_id
        for entry in entries:
            await self._rt.store.put_message(conversation_id, entry.seq, entry.message, {"run": run_id})
