"""The scale bench's instant model and tools, loaded by name like an operator's modules.

``AGENT_PROVIDER_MODULES=bench.fixtures_scale`` (or ``ExtensionSettings(provider_modules=...)``)
adds the provider ``bench``; ``AGENT_TOOL_MODULES=bench.fixtures_scale`` adds two tools:

- ``bench_blob`` (read-only, allowed by the default policy): returns ``kb`` KB of text at once;
- ``bench_effect`` (``side_effect=True``, so the default policy asks a human first): appends
  ``<workflow id> <idempotency key> <time.time()>`` to ``$AGENT_STATE_DIR/effects.log`` as its
  first act, which is the signal ``bench.scale waiting`` times an approval by.

``bench:instant`` answers without HTTP, from the task text alone: ``turns=N kb=K`` makes N
turns that each call ``bench_blob`` with K, then a final answer (N + 1 model turns, N tool
calls); a task containing ``effect`` calls ``bench_effect`` once, then answers.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from activities.models import FatalProviderError, ModelProvider, ProviderReply, provider
from activities.settings import Settings
from activities.tools import ToolContext, tool
from workflows.types import Message, RecordedToolCall

BLOB_TOOL, EFFECT_TOOL = "bench_blob", "bench_effect"
EFFECTS_LOG = "effects.log"
_PARAM = re.compile(r"\b(turns|kb)=(\d+)\b")
_LINE = "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvw\n"


def blob(kb: int) -> str:
    """``kb`` KB of text (the same text for the floor's tool activity)."""
    size = kb * 1024
    return (_LINE * (size // len(_LINE) + 1))[:size]


class InstantProvider:
    """A model that answers at once (no HTTP), deterministically, from the transcript."""

    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        if model != "instant":
            raise FatalProviderError(f"bench: unknown model {model!r} (available: instant)", status=404)
        task = next((m.content for m in messages if m.role == "user"), "")
        turn = sum(1 for m in messages if m.role == "assistant")
        params = {k: int(v) for k, v in _PARAM.findall(task)}
        if "effect" in task:
            if turn == 0:
                call = RecordedToolCall(id="bench_0", name=EFFECT_TOOL, arguments_json=json.dumps({"n": 1}))
                return ProviderReply(text="", tool_calls=[call], input_tokens=10, output_tokens=5)
            return ProviderReply(text="effect done", input_tokens=10, output_tokens=2, finish_reason="stop")
        turns, kb = params.get("turns", 1), params.get("kb", 10)
        if turn < turns:
            args = json.dumps({"kb": kb})
            call = RecordedToolCall(id=f"bench_{turn}", name=BLOB_TOOL, arguments_json=args)
            return ProviderReply(text="", tool_calls=[call], input_tokens=10, output_tokens=5)
        return ProviderReply(text=f"done after {turn} turns", input_tokens=10, output_tokens=4, finish_reason="stop")


@provider("bench")
def bench_provider(settings: Settings) -> ModelProvider:
    return InstantProvider()


class BlobArgs(BaseModel):
    kb: int = Field(default=10, ge=0, le=1024, description="KB of text to return")


class EffectArgs(BaseModel):
    n: int = Field(default=1, ge=0, le=10**6)


@tool(BLOB_TOOL, description="Return kb KB of text (read-only).", args=BlobArgs)
async def bench_blob(args: BlobArgs, ctx: ToolContext) -> str:
    return blob(args.kb)


@tool(
    EFFECT_TOOL,
    description="A side effect the bench times.",
    args=EffectArgs,
    side_effect=True,
    recovery="idempotent_by_key",
)
async def bench_effect(args: EffectArgs, ctx: ToolContext) -> str:
    now = time.time()
    path = Path(ctx.settings.state_dir) / EFFECTS_LOG
    with path.open("a") as f:  # one short O_APPEND write per call: lines never interleave
        f.write(f"{ctx.invocation.workflow_id} {ctx.invocation.idempotency_key} {now:.6f}\n")
    return f"effect {args.n} at {now:.6f}"
