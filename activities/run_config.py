"""The ``run_config`` local activity: a run's model, tools, MCP snapshot, sub-agents and policy, resolved at its start.

The workflow calls it once per run (a child's too); what it returns goes into the run's history, so
every later step replays against the same configuration whatever the worker's changes since.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.mcp import catalog as mcp_catalog
from activities.mcp.pool import McpUnavailable
from activities.models.base import FatalProviderError
from activities.models.structured import schema_problem
from activities.runtime import Runtime
from activities.sessions import open_session
from activities.store_errors import store_guarded
from activities.subagents import load as load_definitions
from activities.subagents import resolve, slim
from activities.subagents import store as store_definitions
from activities.tenant_quota import reserve as reserve_tenant_run
from activities.tools.registry import RESERVED_NAMES
from workflows.session_types import SessionOpenRequest, SessionOpenResult
from workflows.types import DEFAULT_SYSTEM_PROMPT, RunConfig, RunConfigRequest, SubagentDef


@dataclass(frozen=True)
class _McpChoice:
    digest: str = ""
    names: list[str] = field(default_factory=list)
    per_run: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class RunConfigActivities:
    """``run_config``; the MCP snapshots it stores go into ``snapshots`` (shared with the ``model`` activity)."""

    def __init__(self, runtime: Runtime, snapshots: mcp_catalog.SnapshotCache | None = None) -> None:
        self._rt = runtime
        self._snapshots = snapshots if snapshots is not None else mcp_catalog.SnapshotCache()

    @activity.defn(name="run_config")
    @store_guarded
    async def run_config(self, req: RunConfigRequest) -> RunConfig:
        """Resolve the run's model and tool list against this worker's configuration.

        MCP tools are listed from their servers here, once, and their definitions stored in the run
        store as the run's snapshot (history gets its digest).
        """
        try:
            own, requested_subagents = await self._own_definition(req)
        except ValueError as exc:
            raise ApplicationError(f"subagents: {exc}", type="InvalidInput", non_retryable=True) from None
        model = req.model or (own.model if own is not None else "") or self._rt.settings.model
        try:
            self._rt.providers.registry.check_model(model)
        except FatalProviderError as exc:
            raise ApplicationError(exc.message, type="InvalidInput", non_retryable=True) from None
        unpriced = self._rt.prices.unpriced_note(model)
        if unpriced and req.explicit_cost_cap and not self._rt.settings.allow_unpriced:
            raise ApplicationError(
                f"limits.max_cost_usd: model {model} has no price, so the cap could never stop the run: add it to "
                "AGENT_PRICES, drop max_cost_usd, or let the operator set AGENT_ALLOW_UNPRICED=1",
                type="InvalidInput",
                non_retryable=True,
            )
        known = self._rt.tools.names()
        wanted = req.tools if req.tools is not None or own is None else own.tools
        requested = None if wanted is None else list(dict.fromkeys(wanted))
        unknown = sorted({t for t in requested or [] if not mcp_catalog.is_mcp_name(t)} - set(known))
        if unknown:
            raise ApplicationError(
                f"unknown tools {unknown}; registered tools: {known}", type="InvalidInput", non_retryable=True
            )
        mcp = await self._mcp_snapshot(requested, req.tenant)
        try:
            subagents = resolve(self._rt.subagents, requested_subagents, known, RESERVED_NAMES)
        except ValueError as exc:
            raise ApplicationError(f"subagents: {exc}", type="InvalidInput", non_retryable=True) from None
        if requested is None:
            tools = [*known, *mcp.names]
        else:  # the run's order; globs expand in place
            expanded = {pattern: [n for n in mcp.names if fnmatch.fnmatchcase(n, pattern)] for pattern in requested}
            tools = list(dict.fromkeys(n for p in requested for n in (expanded[p] if "*" in p else [p])))
        # Stored once; a child whose set is its parent's (the usual case) names the parent's blob again.
        ref = req.subagents_ref if req.subagents_ref and requested_subagents == subagents else ""
        if subagents and not ref:
            ref = await store_definitions(self._rt.store, subagents)
        output_schema_ref = await self._output_schema(req.output_schema, own)
        settings = self._rt.settings
        own_prompt = own.system_prompt if own is not None else ""
        session = await self._open_session(req.session, own_prompt) if req.session is not None else None
        # Last: a run refused for its inputs above never takes one of its tenant's places.
        tenant_slot = req.open_run and await reserve_tenant_run(self._rt, req.tenant, activity.info().workflow_id or "")
        return RunConfig(
            subagents=slim(subagents),
            subagents_ref=ref,
            system_prompt=own_prompt,
            model=model,
            tools=tools,
            policy=self._rt.policy,
            signing_required=settings.approval_key is not None,
            search_attributes=self._rt.search_attributes_ready,
            mcp_snapshot=mcp.digest,
            mcp_per_run=mcp.per_run,
            max_subagent_calls=settings.max_subagent_calls_per_turn,
            max_depth=settings.max_depth,
            notes=[unpriced, *mcp.notes] if unpriced else mcp.notes,
            cost_tracked=not unpriced,
            fail_workflow_on_error=settings.fail_workflow_on_error,
            tenant_slot=tenant_slot,
            output_schema_ref=output_schema_ref,
            session=session,
        )

    async def _open_session(self, req: SessionOpenRequest, own_prompt: str) -> SessionOpenResult:
        """The session's conversation, made (with the run's system prompt at position 0) or found; a refusal
        names the session, as ``session_open``'s did."""
        prompt = req.system_prompt or own_prompt or DEFAULT_SYSTEM_PROMPT
        try:
            return await open_session(self._rt, req.model_copy(update={"system_prompt": prompt}))
        except ApplicationError as exc:
            raise ApplicationError(f"session: {exc.message}", type=exc.type, non_retryable=exc.non_retryable) from None

    async def _output_schema(self, requested: dict[str, Any] | None, own: SubagentDef | None) -> str:
        """The digest of the run's output schema in the run store ("" for none); a bad schema refuses the run.

        A sub-agent's is its definition's unless its input has one of its own.
        """
        schema = requested if requested is not None else (own.output_schema if own is not None else None)
        if schema is None:
            return ""
        problem = schema_problem(schema)
        if problem:
            raise ApplicationError(f"output_schema: {problem}", type="InvalidInput", non_retryable=True)
        return await self._rt.store.put_blob(json.dumps(schema, sort_keys=True, separators=(",", ":")).encode())

    async def _own_definition(
        self, req: RunConfigRequest
    ) -> tuple[SubagentDef | None, dict[str, SubagentDef] | list[str] | None]:
        """A sub-agent's own definition and the sub-agents it may call, from the tree's blob (else the request's)."""
        if not req.subagents_ref:
            return None, req.subagents
        definitions = await load_definitions(self._rt.store, req.subagents_ref)
        own = definitions.get(req.as_subagent) if req.as_subagent else None
        if req.as_subagent and own is None:
            raise ValueError(f"unknown sub-agent {req.as_subagent!r} in {req.subagents_ref}")
        return own, definitions

    async def _mcp_snapshot(self, requested: list[str] | None, tenant: str) -> _McpChoice:
        if not self._rt.mcp.config:
            names = [t for t in requested or [] if mcp_catalog.is_mcp_name(t)]
            if names:
                raise ApplicationError(
                    f"unknown tools {names}: no MCP servers are configured on this worker (AGENT_MCP_CONFIG)",
                    type="InvalidInput",
                    non_retryable=True,
                )
            return _McpChoice()
        try:
            snapshot, names, notes = await mcp_catalog.snapshot(self._rt.mcp, requested, tenant)
        except ValueError as exc:
            raise ApplicationError(str(exc), type="InvalidInput", non_retryable=True) from None
        except McpUnavailable as exc:  # a named tool's server: retried, then the run fails saying why
            raise ApplicationError(str(exc), type="McpUnavailable") from None
        if not snapshot.tools:
            return _McpChoice(notes=notes)
        digest = await self._rt.store.put_blob(snapshot.encode())
        self._snapshots.remember(digest, snapshot)
        per_run = sorted({t.server for t in snapshot.tools if t.per_run})
        return _McpChoice(digest=digest, names=names, per_run=per_run, notes=notes)
