"""The built-in tools and providers, and the operator's modules, loaded into fresh registries."""

from __future__ import annotations

from activities.models import anthropic, openai, scripted
from activities.models.registry import ProviderRegistry
from activities.settings import Settings
from activities.tools import builtins, http, human, memory
from activities.tools.registry import ToolRegistry


def tool_registry(settings: Settings) -> ToolRegistry:
    """Built-in tools plus ``AGENT_TOOL_MODULES``; ``ConfigurationError`` for a bad module or name."""
    registry = ToolRegistry()
    for module in (builtins, http, human, memory):
        registry.add_module(module)
    registry.load_modules(settings.extensions.tool_modules)
    return registry


def provider_registry(settings: Settings) -> ProviderRegistry:
    """Built-in providers (openai, anthropic, scripted) plus ``AGENT_PROVIDER_MODULES``."""
    registry = ProviderRegistry()
    for module in (openai, anthropic, scripted):
        registry.add_module(module)
    registry.load_modules(settings.extensions.provider_modules)
    return registry
