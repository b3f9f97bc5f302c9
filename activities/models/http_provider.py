"""What the HTTP providers share: one pooled ``httpx.AsyncClient`` and the key kept secret."""

from __future__ import annotations

from typing import Self

import httpx
from pydantic import SecretStr

from activities.models.base import FatalProviderError


class HttpProvider:
    """Base of the HTTP model providers: owns the client; ``secrets()`` feeds error redaction."""

    def __init__(
        self,
        base_url: str,
        api_key: SecretStr | None,
        *,
        timeout_s: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), transport=transport)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def require_key(self, official_base_url: str, variable: str) -> None:
        """Refuse at once, naming ``variable``, to call the provider's own cloud without a key.

        Keyless use stays possible against any other base URL (a local OpenAI-compatible
        server, a gateway that adds the key): only the official endpoint always needs one.
        """
        if self._api_key is None and self.base_url.rstrip("/") == official_base_url.rstrip("/"):
            raise FatalProviderError(
                f"{variable} is not set: {self.base_url} needs an API key "
                "(or point the base URL at a server that needs none)"
            )

    def _secrets(self) -> list[str]:
        key = self._api_key.get_secret_value() if self._api_key is not None else ""
        return [key] if key else []
