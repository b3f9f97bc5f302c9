"""A provider module whose factory raises (``AGENT_PROVIDER_MODULES=tests.fakes.broken_provider``)."""

from __future__ import annotations

from activities.models import ModelProvider, provider
from activities.settings import Settings


@provider("broken")
def broken(settings: Settings) -> ModelProvider:
    raise RuntimeError(f"BROKEN_ENDPOINT is not set (got {settings.variable('BROKEN_ENDPOINT')!r})")
