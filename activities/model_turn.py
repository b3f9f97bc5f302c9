"""The ``model`` activity: one model turn.

The workflow passes only a transcript position; this activity reads the
transcript from the run store, calls the provider, stores the reply at that
position (first writer wins) and returns a compact ``ModelTurn``. A retry whose
earlier attempt already stored a reply returns it without calling the model again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from datetime import timedelta
from typing import Any, cast

import structlog
from opentelemetry.trace import Span, SpanKind
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import observability as telemetry
from activities.heartbeat import heartbeating
from activities.mcp import catalog as mcp_catalog
from activities.models import structured
from activities.models.base import (
    FatalProviderError,
    ProviderReply,
    RetryableProviderError,
    StreamingProvider,
    can_stream,
    complete_capped,
    prompt_tokens_bound,
)
from activities.redaction import redact
from activities.runtime import Runtime
from activities.store.base import StoredMessage
from activities.store_errors import store_guarded
from activities.streaming.base import RETAIN_S
from activities.streaming.publisher import DeltaPublisher
from activities.tools.registry import subagent_call, subagent_definition
from workflows.types import (
    Message,
    ModelRequest,
    ModelTurn,
    RecordedToolCall,
    ToolCall,
    TreeBudget,
    Usage,
)

MAX_TEXT_IN_HISTORY = 32 * 1024
BUDGET_POLL_S = 0.2  # how often a turn waiting for the tree's budget asks again
MODEL_HEARTBEAT_S = 5.0  # the workflow sets a 20 s heartbeat timeout on model calls
INTERRUPTIBLE_HEARTBEAT_S = 1.0  # a cancel arrives with a heartbeat's answer (ModelRequest.interruptible)
SCHEMAS_CACHED = 256  # output schemas kept in memory by digest (the run store has them all)
log = structlog.get_logger("activities.model")


class ModelActivities:
    def __init__(self, runtime: Runtime, snapshots: mcp_catalog.SnapshotCache | None = None) -> None:
        self._rt = runtime
        self._snapshots = snapshots if snapshots is not None else mcp_catalog.SnapshotCache()
        self._schemas: dict[str, dict[str, Any]] = {}

    async def _blob(self, digest: str, what: str) -> bytes:
        """A blob the run's history names by digest; ``SnapshotMissing`` when the run store lost it."""
        data = await self._rt.store.get_blob(digest)
        if data is None:
            raise ApplicationError(f"the run's {what} {digest} is not in the run store", type="SnapshotMissing")
        return data

    async def _output_schema(self, digest: str) -> dict[str, Any] | None:
        """The run's output schema (``RunConfig.output_schema_ref``), or None when it has none."""
        if not digest:
            return None
        schema = self._schemas.get(digest)
        if schema is None:
            data = await self._blob(digest, "output schema")
            schema = json.loads(data)
            if len(self._schemas) >= SCHEMAS_CACHED:
                self._schemas.pop(next(iter(self._schemas)))
            self._schemas[digest] = schema
        return schema

    async def _mcp_tools(self, digest: str) -> dict[str, mcp_catalog.McpToolDef]:
        """The run's MCP snapshot by name (cached; the store has it for any worker that runs the run)."""
        if not digest:
            return {}
        tools = self._snapshots.get(digest)
        if tools is None:
            data = await self._blob(digest, "MCP tool snapshot")
            tools = self._snapshots.remember(digest, mcp_catalog.McpSnapshot.model_validate_json(data))
        return tools

    @activity.defn(name="model")
    @store_guarded
    async def model(self, req: ModelRequest) -> ModelTurn:
        with telemetry.activity_context(step=req.turn, turn=req.turn, model=req.model):
            store = self._rt.store
            info = activity.info()
            run_id = info.workflow_run_id or ""
            # A first attempt that appends nothing calls the model without looking for a stored reply first
            # (one store round trip less per turn): its put is first-writer-wins, and the entry it returns
            # says whether another run wrote there first (a reset run, which then goes on in a branch).
            look_first = info.attempt > 1 or bool(req.append) or req.interruptible or req.budget is not None
            found = await store.get_message(req.conversation_id, req.transcript_len) if look_first else None
            branch = await self._branch_after_reset(req, run_id, found)
            if branch:
                req = req.model_copy(update={"conversation_id": branch})
            for entry in req.append:
                self._rt.transcripts.remember(
                    req.conversation_id,
                    await store.put_message(req.conversation_id, entry.seq, entry.message, {"run": run_id}),
                )

            mcp_tools = await self._mcp_tools(req.mcp_snapshot)
            schema = await self._output_schema(req.output_schema_ref)
            # The turn's own position, written by an earlier attempt of this run (appends are all before it,
            # so only a new branch can have changed what is there).
            stored = await store.get_message(req.conversation_id, req.transcript_len) if branch else found
            budget, turn_key = req.budget, f"{req.conversation_id}/{req.transcript_len}"
            if stored is None:
                transcript = await self._rt.transcripts.messages(req.conversation_id, req.transcript_len)
                definitions = self._definitions(req, mcp_tools)
                if budget is not None:
                    await self._reserve(budget, turn_key, *self._worst_case(req, transcript, definitions))
                try:
                    reply_message, meta = await self._call_provider(req, transcript, definitions, schema)
                except BaseException:
                    if budget is not None:
                        await store.budget_release(budget.root, turn_key)
                    raise
                meta["run"] = run_id
                if req.mcp_snapshot:
                    meta["mcp_snapshot"] = req.mcp_snapshot  # keeps the snapshot alive for garbage collection
                if req.subagents_ref:
                    meta["subagents"] = req.subagents_ref  # keeps the definitions alive for the run's children
                if req.output_schema_ref:
                    meta["output_schema"] = req.output_schema_ref  # keeps the schema alive while the run is kept
                stored = await store.put_message(req.conversation_id, req.transcript_len, reply_message, meta)
                if not look_first and (branch := await self._branch_after_reset(req, run_id, stored)):
                    req = req.model_copy(update={"conversation_id": branch})
                    stored = await store.put_message(branch, req.transcript_len, reply_message, meta)
            else:
                log.info("model_turn_reused", position=req.transcript_len)
            self._rt.transcripts.remember(req.conversation_id, stored)
            turn = self._turn(req, stored.message, stored.meta, mcp_tools, schema)
            if branch:
                turn.conversation_id = branch
            if budget is not None:  # again when reused: the attempt that stored it may have died before this
                await store.budget_settle(budget.root, turn_key, turn.usage.total_tokens, turn.usage.cost_usd)
            return turn

    async def _branch_after_reset(self, req: ModelRequest, run_id: str, found: StoredMessage | None) -> str:
        """A new transcript branch when another run already wrote where this turn writes ("" otherwise).

        Within one run and across continue-as-new, a position is first written by the run that gets
        there. Finding one written by another run means this run was reset to an earlier step (by
        ``starter.py rewind`` or ``temporal workflow reset``): the old future stays where it is, and
        this run goes on in a copy of the transcript up to here, so its model is asked again.
        Identical tool calls then get their recorded outcomes from the ledger (same idempotency keys).
        """
        store = self._rt.store
        writer = found.meta.get("run", "") if found is not None else ""
        if not writer or writer == run_id:  # entries stored before runs were recorded never branch
            return ""
        # Run ids are time-ordered UUIDs: their first characters repeat between runs, a hash of them does not.
        branch = f"{req.conversation_id}~{hashlib.sha256(run_id.encode()).hexdigest()[:10]}"
        # The entries this turn appends (results the workflow made itself) go to the branch too.
        upto = min([entry.seq for entry in req.append] + [req.transcript_len])
        copied = await store.copy_messages(req.conversation_id, branch, upto)
        log.info("transcript_branched", source=req.conversation_id, branch=branch, copied=copied, written_by=writer)
        return branch

    def _worst_case(
        self, req: ModelRequest, transcript: list[Message], definitions: list[dict[str, Any]]
    ) -> tuple[int, float]:
        """The most this turn can spend: its prompt's upper bound plus the output cap sent with it."""
        prompt = prompt_tokens_bound(transcript, definitions)
        output = self._rt.settings.max_output_tokens
        return prompt + output, self._rt.prices.cost_usd(req.model, prompt, output)

    async def _reserve(self, budget: TreeBudget, turn_key: str, tokens: int, cost_usd: float) -> None:
        """Wait until the tree's budget lets this turn call the model; ``BudgetExhausted`` once it is spent."""
        async with heartbeating(MODEL_HEARTBEAT_S):
            while True:
                verdict = await self._rt.store.budget_reserve(
                    budget.root, turn_key, budget.max_tokens, budget.max_cost_usd, tokens, cost_usd
                )
                if verdict == "granted":
                    return
                if verdict == "exhausted":
                    spent = await self._rt.store.budget_spent(budget.root)
                    raise ApplicationError(
                        f"{spent.tokens} tokens and ${spent.cost_usd:.4f} spent across the tree "
                        f"(max_tokens={budget.max_tokens}, max_cost_usd={budget.max_cost_usd})",
                        type="BudgetExhausted",
                        non_retryable=True,
                    )
                await asyncio.sleep(BUDGET_POLL_S)

    def _definitions(self, req: ModelRequest, mcp_tools: dict[str, mcp_catalog.McpToolDef]) -> list[dict[str, Any]]:
        definitions = [
            mcp_tools[name].definition() if name in mcp_tools else self._rt.tools.definitions([name])[0]
            for name in req.tools
            if name in mcp_tools or name in self._rt.tools
        ]
        return definitions + [subagent_definition(name, text) for name, text in req.subagents.items()]

    async def _call_provider(
        self,
        req: ModelRequest,
        transcript: list[Message],
        definitions: list[dict[str, Any]],
        schema: dict[str, Any] | None,
    ) -> tuple[Message, dict[str, object]]:
        try:
            provider_name, model_name = self._rt.providers.registry.check_model(req.model)
        except FatalProviderError as exc:  # a worker without this run's provider: no retry can help
            raise ApplicationError(exc.message, type="ModelRejected", non_retryable=True) from None
        secrets = self._rt.settings.secret_values()
        log.debug("model_request", messages=len(transcript), tools=req.tools)
        # GenAI semantic conventions; no prompt or completion content is ever put on the span.
        with telemetry.tracer().start_as_current_span(
            f"chat {model_name}",
            kind=SpanKind.CLIENT,
            attributes=telemetry.gen_ai_chat_attributes(provider_name, model_name, req.conversation_id),
        ) as span:
            provider = self._rt.providers.get(provider_name)
            publisher = await self._publisher(req, provider, secrets)
            span.set_attribute("agent.streamed", publisher is not None)
            try:
                async with heartbeating(INTERRUPTIBLE_HEARTBEAT_S if req.interruptible else MODEL_HEARTBEAT_S):
                    if publisher is not None:
                        stream = cast(StreamingProvider, provider).stream
                        messages, native = _shaped(stream, transcript, schema)
                        reply = await cast(Any, stream)(
                            model_name,
                            messages,
                            definitions,
                            on_text=publisher.text,
                            max_output_tokens=self._rt.settings.max_output_tokens,
                            **({"output_schema": native} if native is not None else {}),
                        )
                    else:
                        messages, native = _shaped(getattr(provider, "complete", None), transcript, schema)
                        reply = await complete_capped(
                            provider,
                            model_name,
                            messages,
                            definitions,
                            self._rt.settings.max_output_tokens,
                            output_schema=native,
                        )
            except (RetryableProviderError, FatalProviderError) as exc:
                if publisher is not None:
                    publisher.abandon()
                raise self._provider_error(exc, span, secrets) from None
            except BaseException:
                if publisher is not None:
                    publisher.abandon()
                raise
            message = _redacted_reply(reply, secrets)
            if publisher is not None:
                await publisher.finish(message.content)
                log.info("model_streamed", rows=publisher.rows, attempt=publisher.attempt)
            usage = Usage(
                input_tokens=reply.input_tokens,
                output_tokens=reply.output_tokens,
                cost_usd=self._rt.prices.cost_usd(req.model, reply.input_tokens, reply.output_tokens),
            )
            span.set_attributes(
                {
                    "gen_ai.response.id": reply.response_id,
                    "gen_ai.response.finish_reasons": [reply.finish_reason] if reply.finish_reason else [],
                    "gen_ai.usage.input_tokens": reply.input_tokens,
                    "gen_ai.usage.output_tokens": reply.output_tokens,
                    "agent.cost_usd": usage.cost_usd,
                    "agent.tool_calls": len(reply.tool_calls),
                }
            )
        telemetry.record_model_usage(provider_name, model_name, reply.input_tokens, reply.output_tokens, usage.cost_usd)
        log.info(
            "model_answered",
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cost_usd=usage.cost_usd,
            finish_reason=reply.finish_reason,
            tool_calls=[call.name for call in reply.tool_calls],
        )
        meta: dict[str, object] = {
            "usage": usage.model_dump(),
            "finish_reason": reply.finish_reason,
            "response_id": reply.response_id,
        }
        return message, meta

    async def _publisher(self, req: ModelRequest, provider: object, secrets: list[str]) -> DeltaPublisher | None:
        """A publisher of this turn's text when the provider streams and someone listens to the run, else None.

        Asked once, at the start of the turn: a reader that comes later gets the whole reply.
        """
        if not can_stream(provider):
            return None
        info = activity.info()
        workflow_id = info.workflow_id or ""
        if not workflow_id:
            return None
        try:
            channel = self._rt.deltas
            if not await channel.listening(workflow_id):
                return None
            await channel.prune(workflow_id, req.turn, time.time() - RETAIN_S)
        except Exception as exc:  # no stream then: the whole reply still comes
            log.warning("stream_channel_unavailable", error=type(exc).__name__)
            return None
        return DeltaPublisher(channel, workflow_id, req.turn, info.attempt, secrets)

    @staticmethod
    def _provider_error(
        exc: RetryableProviderError | FatalProviderError, span: Span, secrets: list[str]
    ) -> ApplicationError:
        message = redact(exc.message, secrets)
        if isinstance(exc, RetryableProviderError):
            span.set_attribute("error.type", "ModelUnavailable")
            log.warning("model_unavailable", error=message, status=exc.status)
            delay = timedelta(seconds=exc.retry_after_s) if exc.retry_after_s is not None else None
            return ApplicationError(message, type="ModelUnavailable", next_retry_delay=delay)
        span.set_attribute("error.type", "ModelRejected")
        log.warning("model_rejected", error=message, status=exc.status)
        return ApplicationError(message, type="ModelRejected", non_retryable=True)

    def _turn(
        self,
        req: ModelRequest,
        message: Message,
        meta: dict[str, object],
        mcp_tools: dict[str, mcp_catalog.McpToolDef],
        schema: dict[str, Any] | None,
    ) -> ModelTurn:
        text = message.content
        # A final answer is checked here, on what the store holds: a retry of the turn answers the same.
        output_json, output_errors = (
            structured.check_output(text, schema) if schema is not None and not message.tool_calls else (None, [])
        )
        return ModelTurn(
            output_json=output_json,
            output_errors=output_errors,
            text=text[:MAX_TEXT_IN_HISTORY],
            text_truncated=len(text) > MAX_TEXT_IN_HISTORY,
            tool_calls=[self._validated(req, call, mcp_tools) for call in message.tool_calls],
            usage=Usage.model_validate(meta.get("usage", {})),
            finish_reason=str(meta.get("finish_reason", "")),
            response_id=str(meta.get("response_id", "")),
            model=req.model,
            message_seq=req.transcript_len,
        )

    def _validated(
        self, req: ModelRequest, call: RecordedToolCall, mcp_tools: dict[str, mcp_catalog.McpToolDef]
    ) -> ToolCall:
        if call.name in req.subagents and call.name not in self._rt.tools:
            return subagent_call(call)
        if call.name in mcp_tools and call.name in req.tools:
            return mcp_catalog.validate_call(call, mcp_tools[call.name])
        return self._rt.tools.validate_call(call, req.tools, self._rt.settings)


def _shaped(
    method: object, transcript: list[Message], schema: dict[str, Any] | None
) -> tuple[list[Message], dict[str, Any] | None]:
    """The messages to send and the schema to pass natively: a provider ``method`` without an
    ``output_schema`` keyword gets the schema in its system prompt instead."""
    if schema is None:
        return transcript, None
    if structured.takes_output_schema(method):
        return transcript, schema
    return structured.with_instruction(transcript, schema), None


def _redacted_reply(reply: ProviderReply, secrets: list[str]) -> Message:
    """The reply as a transcript message, with any configured secret the model echoed redacted.

    A model can repeat a key it saw (in an error, a tool result, a prompt injection); the reply goes
    to the run store and its text and tool calls to history, so nothing of it may carry a secret.
    """
    calls = [
        call.model_copy(
            update={"name": redact(call.name, secrets), "arguments_json": redact(call.arguments_json, secrets)}
        )
        for call in reply.tool_calls
    ]
    return Message(role="assistant", content=redact(reply.text, secrets), tool_calls=calls)
