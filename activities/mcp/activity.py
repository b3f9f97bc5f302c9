"""The ``mcp`` activity: one MCP tool call, through the same ledger and transcript path as every tool.

Read-only tools (``readOnlyHint``, or the operator's ``read_only``) run directly. Every other MCP
tool is a side effect: its intent is claimed in the idempotency ledger before the request is sent,
and its idempotency key travels in the request's ``_meta`` (``io.durable-agents/idempotency-key``)
on every attempt. When the connection dies or the call times out after the request went out, the
attempt fails and the next one finds intent without outcome: ``unknown`` asks a human what
happened, ``idempotent_by_key`` sends the same request with the same key again. A server that
cannot be started (nothing was sent) is a tool error the model reads.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.mcp.catalog import MCP_HEARTBEAT_S
from activities.mcp.pool import McpCallLost, McpUnavailable
from activities.mcp.results import result_text
from activities.redaction import clip
from activities.runtime import Runtime
from activities.tools.activity import run_invocation
from activities.tools.spec import ToolContext, ToolError, ToolSpec
from workflows.types import McpTarget, ToolInvocation, ToolOutcome

IDEMPOTENCY_META_KEY = "io.durable-agents/idempotency-key"


class McpArguments(BaseModel):
    """Arguments as the model gave them (already checked against the tool's JSON schema)."""

    model_config = ConfigDict(extra="allow")


class McpActivities:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @activity.defn(name="mcp")
    async def mcp(self, inv: ToolInvocation) -> ToolOutcome:
        """Call the MCP tool ``inv.mcp`` and store its result at ``inv.seq`` (a preview goes to history)."""
        if inv.mcp is None:
            raise ApplicationError("an mcp invocation needs its target", type="InvalidInput", non_retryable=True)
        return await run_invocation(self._spec(inv, inv.mcp), self._rt, inv)

    @activity.defn(name="mcp_release")
    async def mcp_release(self, conversation_id: str) -> int:
        """Stop this worker's per-run MCP servers of a finished run; how many were running."""
        return await self._rt.mcp.release_run(conversation_id)

    def _spec(self, inv: ToolInvocation, target: McpTarget) -> ToolSpec:
        pool, settings = self._rt.mcp, self._rt.settings

        async def call(args: McpArguments, ctx: ToolContext) -> str:
            from mcp.shared.exceptions import MCPError  # the mcp extra: a configured server's call

            server = pool.server(target.server)
            if server is None:
                raise ToolError(f"MCP server {target.server!r} is not configured on this worker")
            meta = {IDEMPOTENCY_META_KEY: inv.idempotency_key} if inv.side_effect else None
            try:
                result = await pool.call(
                    target.server,
                    target.tool,
                    args.model_dump(),
                    timeout_s=float(target.call_timeout_s),
                    meta=meta,
                    run=inv.conversation_id,
                    tenant=inv.tenant,
                    check_alive=inv.side_effect,
                )
            except McpUnavailable as exc:
                raise ToolError(str(exc)) from None
            except McpCallLost as exc:
                if not inv.side_effect:
                    raise ToolError(f"{exc}; it was read-only, so nothing changed") from None
                # It may have run. Fail the attempt: the retry goes through the ledger's recovery.
                raise ApplicationError(clip(str(exc), 500, settings.secret_values()), type="McpCallLost") from None
            except MCPError as exc:
                raise ToolError(f"MCP server {target.server!r} refused the call: {exc.error.message}") from None
            text = await result_text(result, self._rt.store.put_blob, server.max_result_chars, settings.secret_values())
            if result.is_error:
                raise ToolError(f"{target.server}.{target.tool} failed: {text}" if text else "the tool failed")
            return text

        spec_fn: Any = call
        return ToolSpec(
            name=inv.tool,
            description=f"MCP tool {target.server}.{target.tool}",
            args_model=McpArguments,
            fn=spec_fn,
            side_effect=inv.side_effect,
            timeout_s=target.call_timeout_s,
            heartbeat_s=MCP_HEARTBEAT_S,
            recovery=target.recovery,
        )
