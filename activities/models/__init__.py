"""Model providers: the public API for provider authors.

A provider implements :class:`ModelProvider` (one ``complete`` call per model
turn) and is declared with ``@provider("prefix")`` on a factory that gets the
worker's :class:`~activities.settings.Settings`; model strings ``prefix:<name>``
then reach it. Raise :class:`RetryableProviderError` for what a retry can fix
(429, 5xx, timeouts; with ``retry_after_s`` when the server said) and
:class:`FatalProviderError` for what it cannot (bad key, bad request)::

    from typing import Any

    from activities.models import FatalProviderError, ModelProvider, ProviderReply, provider
    from activities.settings import Settings
    from workflows.types import Message


    class EchoProvider:
        async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
            last = next((m.content for m in reversed(messages) if m.role == "user"), "")
            if not last:
                raise FatalProviderError("nothing to echo")
            return ProviderReply(text=f"echo: {last}", input_tokens=len(last) // 4, output_tokens=3)


    @provider("echo")
    def echo(settings: Settings) -> ModelProvider:
        return EchoProvider()

Operators load such a module with ``AGENT_PROVIDER_MODULES=my_package.echo``;
``AGENT_MODEL=echo:v1`` (or a run's ``"model": "echo:v1"``) uses it.
"""

from activities.models.base import (
    FatalProviderError,
    ModelProvider,
    ProviderError,
    ProviderReply,
    RetryableProviderError,
)
from activities.models.registry import ProviderFactory, ProviderRegistry, provider

__all__ = [
    "FatalProviderError",
    "ModelProvider",
    "ProviderError",
    "ProviderFactory",
    "ProviderRegistry",
    "ProviderReply",
    "RetryableProviderError",
    "provider",
]
