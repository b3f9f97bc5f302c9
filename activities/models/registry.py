"""Model strings → providers: ``openai:<model>``, ``anthropic:<model>``, ``scripted:<script>``."""

from __future__ import annotations

from activities.config import Settings
from activities.models.base import FatalProviderError, ModelProvider

PROVIDERS = ("openai", "anthropic", "scripted")


def split_model(model: str) -> tuple[str, str]:
    """``"openai:gpt-4o"`` → ``("openai", "gpt-4o")``; ``FatalProviderError`` when malformed."""
    provider, sep, name = model.partition(":")
    if not sep or not name or provider not in PROVIDERS:
        raise FatalProviderError(
            f"unknown model {model!r}: expected one of "
            + ", ".join(f"{p}:<model>" for p in PROVIDERS)
            + " (e.g. openai:gpt-4o-mini, scripted:demo)"
        )
    return provider, name


class ProviderPool:
    """One provider instance per kind, created on first use and reused (connection pooling)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._providers: dict[str, ModelProvider] = {}

    def get(self, provider: str) -> ModelProvider:
        if provider not in self._providers:
            self._providers[provider] = self._make(provider)
        return self._providers[provider]

    def _make(self, provider: str) -> ModelProvider:
        s = self._settings
        if provider == "openai":
            from activities.models.openai import OpenAIProvider

            return OpenAIProvider(s.openai_base_url, s.openai_api_key)
        if provider == "anthropic":
            from activities.models.anthropic import AnthropicProvider

            return AnthropicProvider(s.anthropic_base_url, s.anthropic_api_key)
        from activities.models.scripted import ScriptedProvider

        return ScriptedProvider()

    async def aclose(self) -> None:
        for p in self._providers.values():
            close = getattr(p, "aclose", None)
            if close is not None:
                await close()
