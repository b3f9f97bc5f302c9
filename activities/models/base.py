"""What every model provider implements, and the errors it raises.

Providers raise ``RetryableProviderError`` (429, 5xx, timeouts, connection
errors; optionally with the server's ``Retry-After``) or ``FatalProviderError``
(400/401/403/404, malformed responses); the ``model`` activity maps them to
Temporal retry behaviour. Error messages never contain the API key.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import weakref
from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import Any, Protocol, cast

from pydantic import BaseModel, Field

from workflows.types import Message, RecordedToolCall


class ProviderError(Exception):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class RetryableProviderError(ProviderError):
    def __init__(self, message: str, *, status: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message, status=status)
        self.retry_after_s = retry_after_s


class FatalProviderError(ProviderError):
    """Retrying cannot help (bad request, bad key, unknown model)."""


class ProviderReply(BaseModel):
    text: str = ""
    tool_calls: list[RecordedToolCall] = Field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    response_id: str = ""


class ModelProvider(Protocol):
    """What a provider implements. It may also take the keywords ``max_output_tokens`` (see ``CappedProvider``)
    and ``output_schema`` (a run's JSON Schema for its final answer, for native structured output; a provider
    without it has the schema put in the system prompt instead: ``activities.models.structured``)."""

    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        """One model turn. ``tools`` are provider-neutral definitions
        (``{"name", "description", "parameters"}``: a JSON schema)."""
        ...


class CappedProvider(Protocol):
    """A provider that sends the model an output cap: the reply is at most ``max_output_tokens`` long.

    A tree of runs reserves every turn's worst case from its budget (``activities.store.budget``);
    the cap is what makes the output part of that bound hold. Providers whose ``complete`` takes no
    ``max_output_tokens`` keyword still work, unbounded: their turns are reserved at the cap all the
    same and settled at what they really spent.
    """

    async def complete(
        self, model: str, messages: list[Message], tools: list[dict[str, Any]], *, max_output_tokens: int
    ) -> ProviderReply: ...


# Per ``complete`` function: a signature costs ~20 µs to read, and every model turn asks.
_TAKES_OUTPUT_CAP: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def takes_output_cap(provider: object) -> bool:
    """Whether ``provider.complete`` accepts ``max_output_tokens`` (by name, or through ``**kwargs``).

    The answer is remembered per function (for a bound method, per class method), so a provider whose
    class defines ``complete`` is inspected once; a ``complete`` that cannot be weakly referenced is
    inspected every time.
    """
    method = getattr(provider, "complete", None)
    if method is None:
        return False
    function = getattr(method, "__func__", method)
    try:
        return _TAKES_OUTPUT_CAP[function]
    except (KeyError, TypeError):
        pass
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    answer = "max_output_tokens" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    with contextlib.suppress(TypeError):  # not weakly referenceable: asked again next time
        _TAKES_OUTPUT_CAP[function] = answer
    return answer


async def complete_capped(
    provider: ModelProvider,
    model: str,
    messages: list[Message],
    tools: list[dict[str, Any]],
    max_output_tokens: int,
    *,
    output_schema: dict[str, Any] | None = None,
) -> ProviderReply:
    """One model turn, with the output cap when the provider takes one.

    ``output_schema`` is passed on only when given (the caller checked that the provider takes it:
    ``activities.models.structured.takes_output_schema``).
    """
    extra: dict[str, Any] = {"output_schema": output_schema} if output_schema is not None else {}
    if takes_output_cap(provider):
        reply = await cast(Any, provider).complete(model, messages, tools, max_output_tokens=max_output_tokens, **extra)
    else:
        reply = await cast(Any, provider).complete(model, messages, tools, **extra)
    return cast(ProviderReply, reply)


TextSink = Callable[[str], Awaitable[None]]


class StreamingProvider(Protocol):
    """A provider that can also stream a turn: ``on_text`` gets the reply's text as it arrives, and the
    result is the same ``ProviderReply`` that ``complete`` would have answered (the transcript stores that).

    The ``model`` activity streams only when someone listens to the run (``activities.streaming``); any
    provider without ``stream`` is always called through ``complete``.
    """

    async def stream(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        on_text: TextSink,
        max_output_tokens: int | None = None,
    ) -> ProviderReply: ...


def can_stream(provider: object) -> bool:
    """Whether ``provider`` has a ``stream`` method (see ``StreamingProvider``)."""
    return callable(getattr(provider, "stream", None))


PROMPT_BYTES_PER_TOKEN = 3  # text averages about 4 bytes a token (CJK about 3): 3 errs on the high side
PROMPT_OVERHEAD_TOKENS = 8  # per message and per tool definition (roles, separators)


def prompt_tokens_bound(messages: list[Message], tools: list[dict[str, Any]]) -> int:
    """A conservative upper bound of the prompt tokens of a request: its size in UTF-8 bytes / 3, plus overhead."""
    size = sum(len(m.model_dump_json().encode()) for m in messages)
    size += sum(len(json.dumps(t, separators=(",", ":")).encode()) for t in tools)
    return -(-size // PROMPT_BYTES_PER_TOKEN) + PROMPT_OVERHEAD_TOKENS * (len(messages) + len(tools) + 1)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date); None if absent/unparseable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from datetime import datetime
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
