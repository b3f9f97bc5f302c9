"""What every model provider implements, and the errors it raises.

Providers raise ``RetryableProviderError`` (429, 5xx, timeouts, connection
errors; optionally with the server's ``Retry-After``) or ``FatalProviderError``
(400/401/403/404, malformed responses); the ``model`` activity maps them to
Temporal retry behaviour. Error messages never contain the API key.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any, Protocol

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
    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        """One model turn. ``tools`` are provider-neutral definitions
        (``{"name", "description", "parameters"}``: a JSON schema)."""
        ...


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
