"""``ProviderRegistry``: model strings ``prefix:<name>`` → providers, through ``@provider("prefix")``.

``@provider("prefix")`` marks a factory ``(settings) -> ModelProvider``; a
registry collects the factories of the modules it loads (the built-in
``openai``, ``anthropic`` and ``scripted`` modules, then ``AGENT_PROVIDER_MODULES``).
:class:`ProviderPool` builds each provider once per worker and reuses it, so
HTTP providers keep their connection pools.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import ModuleType

from activities.models.base import FatalProviderError, ModelProvider
from activities.modules import import_extension
from activities.settings import ConfigurationError, Settings

ProviderFactory = Callable[[Settings], ModelProvider]
FACTORY_ATTRIBUTE = "__durable_agents_provider__"


def provider(prefix: str) -> Callable[[ProviderFactory], ProviderFactory]:
    """Declare ``factory(settings) -> ModelProvider`` as the provider of model strings ``prefix:<model>``.

    Example (a module named in ``AGENT_PROVIDER_MODULES``)::

        @provider("echo")
        def echo(settings: Settings) -> ModelProvider:
            return EchoProvider()

    ``AGENT_MODEL=echo:any-name`` then routes every model turn to ``EchoProvider.complete``.
    """
    if not prefix or not prefix.replace("_", "a").replace("-", "a").isalnum():
        raise ValueError(f"provider prefix {prefix!r}: use letters, digits, '_' or '-'")

    def declare(factory: ProviderFactory) -> ProviderFactory:
        setattr(factory, FACTORY_ATTRIBUTE, prefix)
        return factory

    return declare


class ProviderRegistry:
    """Provider factories by prefix. ``add`` refuses a prefix registered by another factory."""

    def __init__(self) -> None:
        self._factories: dict[str, ProviderFactory] = {}

    def add(self, prefix: str, factory: ProviderFactory) -> None:
        existing = self._factories.get(prefix)
        if existing is not None and existing is not factory:
            raise ConfigurationError(f"model provider {prefix!r} is already registered")
        self._factories[prefix] = factory

    def add_module(self, module: ModuleType) -> list[str]:
        """Add every ``@provider`` factory at the top level of ``module``; their prefixes."""
        prefixes = []
        for value in list(vars(module).values()):
            prefix = getattr(value, FACTORY_ATTRIBUTE, None)
            if isinstance(prefix, str) and callable(value):
                self.add(prefix, value)
                prefixes.append(prefix)
        return prefixes

    def load_modules(self, names: Iterable[str], *, variable: str = "AGENT_PROVIDER_MODULES") -> None:
        for name in names:
            self.add_module(import_extension(name, variable))

    def prefixes(self) -> list[str]:
        return sorted(self._factories)

    def check_model(self, model: str) -> tuple[str, str]:
        """``(prefix, name)`` of a model string this registry can serve; ``FatalProviderError`` otherwise."""
        prefix, sep, name = model.partition(":")
        if not sep or not name or prefix not in self._factories:
            raise FatalProviderError(
                f"unknown model {model!r}: expected one of "
                + ", ".join(f"{p}:<model>" for p in self.prefixes())
                + " (e.g. openai:gpt-4o-mini, scripted:demo)"
            )
        return prefix, name

    def create(self, prefix: str, settings: Settings) -> ModelProvider:
        factory = self._factories.get(prefix)
        if factory is None:
            raise FatalProviderError(f"unknown model provider {prefix!r}")
        return factory(settings)


class ProviderPool:
    """One provider instance per prefix, built at worker start (``build_all``) and reused."""

    def __init__(self, registry: ProviderRegistry, settings: Settings) -> None:
        self.registry = registry
        self._settings = settings
        self._providers: dict[str, ModelProvider] = {}

    def build_all(self) -> None:
        """Construct every registered provider now, so a broken one stops the worker, not a run."""
        for prefix in self.registry.prefixes():
            if prefix not in self._providers:
                try:
                    self._providers[prefix] = self.registry.create(prefix, self._settings)
                except Exception as exc:
                    raise ConfigurationError(f"model provider {prefix!r} failed to start: {exc}") from None

    def get(self, prefix: str) -> ModelProvider:
        if prefix not in self._providers:
            self._providers[prefix] = self.registry.create(prefix, self._settings)
        return self._providers[prefix]

    async def aclose(self) -> None:
        providers, self._providers = list(self._providers.values()), {}
        for p in providers:
            close = getattr(p, "aclose", None)
            if close is not None:
                await close()
