"""HTTP transport and error mapping shared by the HTTP model providers.

``post_json`` sends one JSON request and returns the decoded JSON object, or
raises a ``ProviderError``:

* 408, 409, 429 and 5xx (incl. Anthropic's 529 "overloaded") -> ``RetryableProviderError``
  with ``retry_after_s`` from ``retry-after-ms`` or ``Retry-After``;
* every other non-2xx status -> ``FatalProviderError``;
* timeouts and transport failures (connection refused, reset, ...) -> ``RetryableProviderError``;
* a bad base URL (unsupported scheme, invalid URL) -> ``FatalProviderError``;
* a 2xx whose body is not a JSON object -> ``RetryableProviderError`` ("malformed response ...").

Messages are short (``openai 401: Incorrect API key provided``), carry the
provider's own error text, never contain request headers, and have every
secret redacted.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from activities.models.base import FatalProviderError, ProviderError, RetryableProviderError, parse_retry_after
from activities.redaction import clip, redact

RETRYABLE_STATUSES = frozenset({408, 409, 429})
MAX_DETAIL_CHARS = 500


def is_retryable_status(status: int) -> bool:
    """True for statuses where the same request may succeed later."""
    return status in RETRYABLE_STATUSES or status >= 500


def retry_after_seconds(headers: httpx.Headers) -> float | None:
    """Server-requested delay: ``retry-after-ms`` (OpenAI, more precise) wins over ``Retry-After``."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    return parse_retry_after(headers.get("retry-after"))


def error_message(text: str, secrets: list[str]) -> str:
    """The provider's own error text from a response body, redacted and then cut to ``MAX_DETAIL_CHARS``.

    ``error.message`` covers OpenAI and Anthropic; ``error`` as a string and a
    top-level ``message`` cover common OpenAI-compatible servers (Ollama, vLLM).
    Falls back to the start of the body.
    """
    return clip(_error_text(text), MAX_DETAIL_CHARS, secrets) or "(empty body)"


def _error_text(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"]:
            return str(err["message"])
        if isinstance(err, str) and err:
            return err
        if isinstance(data.get("message"), str) and data["message"]:
            return str(data["message"])
    return text.strip()


def status_error(provider: str, response: httpx.Response, secrets: list[str]) -> ProviderError:
    """The error to raise for a non-2xx ``response``."""
    status = response.status_code
    message = redact(f"{provider} {status}: {error_message(response.text, secrets)}", secrets)
    if is_retryable_status(status):
        return RetryableProviderError(message, status=status, retry_after_s=retry_after_seconds(response.headers))
    return FatalProviderError(message, status=status)


def malformed(provider: str, detail: str, secrets: list[str]) -> RetryableProviderError:
    """A 2xx reply we cannot use.

    Retryable because proxies and overloaded gateways sometimes truncate or
    replace bodies; the activity's retry limit bounds a server that is
    deterministically wrong.
    """
    message = f"malformed response from provider: {provider}: {clip(detail, MAX_DETAIL_CHARS, secrets)}"
    return RetryableProviderError(message, status=200)


async def post_json(
    client: httpx.AsyncClient,
    provider: str,
    url: str,
    *,
    headers: dict[str, str],
    body: dict[str, Any],
    secrets: list[str],
) -> dict[str, Any]:
    """POST ``body`` as JSON and return the decoded JSON object of a 2xx reply, else raise (see module doc)."""
    # ``from None`` everywhere: Temporal serialises exception causes into history,
    # and an unredacted cause is exactly what must not end up there.
    try:
        response = await client.post(url, json=body, headers=headers)
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise FatalProviderError(redact(f"{provider}: bad base URL: {exc}", secrets)) from None
    except httpx.RequestError as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise RetryableProviderError(redact(f"{provider} request failed: {detail}", secrets)) from None
    if not 200 <= response.status_code < 300:
        raise status_error(provider, response, secrets)
    try:
        data = response.json()
    except ValueError:
        raise malformed(provider, f"body is not JSON: {clip(response.text, 200, secrets)!r}", secrets) from None
    if not isinstance(data, dict):
        raise malformed(provider, f"expected a JSON object, got {type(data).__name__}", secrets)
    return data


def as_int(value: object) -> int:
    """A token count from a usage object; missing or non-numeric counts as 0."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    return 0


def missing(provider: str, data: dict[str, Any], what: str, secrets: list[str]) -> RetryableProviderError:
    """``malformed`` for a JSON object lacking ``what``; names an embedded error if the server sent one."""
    err = data.get("error")
    if err:
        return malformed(provider, f"no {what}; error: {error_message(json.dumps(data), secrets)}", secrets)
    return malformed(provider, f"no {what} in {clip(json.dumps(data), 200, secrets)}", secrets)
