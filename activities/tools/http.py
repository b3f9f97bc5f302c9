"""The http_request tool: egress only to allow-listed hosts (re-checked on every redirect), capped bodies.

The URL is canonicalized when the model's call is validated (``HttpRequestArgs``),
so policy rules, approvals and idempotency keys see the URL that is requested.
Where a request may go is decided by ``activities.tools.egress``: the allow list
(an entry without a port opens only 80 and 443), and endpoints no allow list
opens (the worker's Temporal, metrics and store, cloud metadata), checked on the
URL before any approval is asked (:func:`precheck`) and again at connect time on
the resolved addresses, for the first request and every redirect.

Non-GET/HEAD requests carry ``Idempotency-Key: <invocation key>``, identical on
every retry, so that a server honouring it applies a retried POST only once.
The worker's environment (proxies, ``.netrc``) is never used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from activities.settings import Settings
from activities.tools.egress import EgressGuard, EgressRefused, GuardedTransport
from activities.tools.spec import ToolContext, ToolError, tool
from activities.tools.urls import canonical_url, host_allowed, not_allowed_message, url_host_port

__all__ = ["HttpRequestArgs", "host_allowed", "http_request", "precheck"]

MAX_HTTP_BODY_BYTES = 100_000
MAX_REDIRECTS = 5
CONNECT_TIMEOUT_S = 10.0
TOTAL_TIMEOUT_S = 30.0
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
USER_AGENT = "durable-agents/0.1"
# set by httpx or by us; letting the model set them would desynchronise framing or the allow-list's view of the host
_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "idempotency-key"})
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class HttpRequestArgs(BaseModel):
    # the field is ``json_body`` in Python (``json`` would shadow BaseModel.json) but ``json`` on the wire
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True, extra="forbid")

    method: str = Field(description="HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS.")
    url: str = Field(
        description="Absolute http:// or https:// URL without user:password@; its host (and port, unless 80 "
        "or 443) must be on the worker's allow-list."
    )
    headers: dict[str, str] | None = Field(default=None, description="Extra request headers (optional).")
    json_body: Any = Field(
        default=None, alias="json", description="A JSON value to send as the request body (optional)."
    )
    body: str | None = Field(default=None, description="A raw text request body (optional; not with json).")

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        method = value.strip().upper()
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}")
        return method

    @field_validator("url")
    @classmethod
    def _canonical(cls, value: str) -> str:
        return canonical_url(value)

    @model_validator(mode="after")
    def _one_body(self) -> HttpRequestArgs:
        if self.json_body is not None and self.body is not None:
            raise ValueError("give either json or body, not both")
        return self


def _checked(raw: str | httpx.URL, allow: Iterable[str], *, via: str = "") -> httpx.URL:
    """The canonical URL of ``raw`` when the allow list lets it through; ``ToolError`` otherwise."""
    try:
        url = httpx.URL(canonical_url(str(raw)))
    except ValueError as exc:
        raise ToolError(f"{via}{exc}") from None
    if not host_allowed(url, allow):
        raise ToolError(via + not_allowed_message(*url_host_port(url), allow))
    return url


def precheck(args: BaseModel, settings: Settings) -> str | None:
    """Why this call can never succeed, known before it runs (so no human is asked to approve it), or None."""
    assert isinstance(args, HttpRequestArgs)
    url = httpx.URL(args.url)  # already canonical
    host, port = url_host_port(url)
    if not host_allowed(url, settings.http_allow):
        return not_allowed_message(host, port, settings.http_allow)
    return EgressGuard(settings).static_refusal(host, port)


def _request_headers(args: HttpRequestArgs, method: str, idempotency_key: str, cross_origin: bool) -> dict[str, str]:
    headers = {"user-agent": USER_AGENT}
    for name, value in (args.headers or {}).items():
        lowered = name.strip().lower()
        if lowered in _RESERVED_HEADERS:
            raise ToolError(f"header {name!r} cannot be set (it is managed by the tool)")
        if cross_origin and lowered in ("authorization", "cookie"):
            continue  # like httpx: credentials meant for one origin are not sent to the one redirected to
        headers[name] = value
    if method not in ("GET", "HEAD"):
        headers["Idempotency-Key"] = idempotency_key
    return headers


async def _read_capped(response: httpx.Response) -> tuple[bytes, bool]:
    """At most ``MAX_HTTP_BODY_BYTES`` of the (decoded) body; stops reading once over, never reads it whole."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_HTTP_BODY_BYTES:
            return bytes(body[:MAX_HTTP_BODY_BYTES]), True
    return bytes(body), False


def _render(response: httpx.Response, body: bytes, truncated: bool) -> str:
    lines = [f"HTTP {response.status_code} {response.reason_phrase}".rstrip()]
    if content_type := response.headers.get("content-type"):
        lines.append(f"content-type: {content_type}")
    text = "\n".join(lines) + "\n\n" + body.decode(response.charset_encoding or "utf-8", errors="replace")
    if truncated:
        length = response.headers.get("content-length", "")
        # Content-Length counts encoded bytes; only quote it when the body is not compressed
        if length.isdigit() and "content-encoding" not in response.headers:
            total = length
        else:
            total = f"more than {MAX_HTTP_BODY_BYTES}"
        text += f"\n(body truncated at {MAX_HTTP_BODY_BYTES} bytes of {total})"
    return text


@tool(
    "http_request",
    description=(
        "Make an HTTP request to an allow-listed host and return the status, content-type and body "
        f"(truncated at {MAX_HTTP_BODY_BYTES} bytes). Error statuses are returned, not raised."
    ),
    args=HttpRequestArgs,
    side_effect=True,  # non-GET requests change things elsewhere; the approval policy decides per method
    precheck=precheck,
    uses_sandbox=False,
    timeout_s=60,
    max_attempts=5,
    heartbeat_s=5,
    # Every attempt sends the same Idempotency-Key, so the destination dedupes a re-send.
    recovery="idempotent_by_key",
)
async def http_request(args: HttpRequestArgs, ctx: ToolContext) -> str:
    allow = ctx.settings.http_allow
    url = _checked(args.url, allow)
    method, json_body = args.method, args.json_body
    content = args.body.encode() if args.body is not None else None
    cross_origin = False
    timeout = httpx.Timeout(TOTAL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    # timeouts and connection errors propagate as plain exceptions: the activity retries them
    async with (
        asyncio.timeout(TOTAL_TIMEOUT_S),
        httpx.AsyncClient(
            transport=GuardedTransport(EgressGuard(ctx.settings)), follow_redirects=False, timeout=timeout
        ) as client,
    ):
        for _hop in range(MAX_REDIRECTS + 1):
            headers = _request_headers(args, method, ctx.invocation.idempotency_key, cross_origin)
            request = client.build_request(method, url, headers=headers, json=json_body, content=content)
            try:
                response = await client.send(request, stream=True)
            except EgressRefused as exc:
                raise ToolError(f"{'redirect to ' if _hop else ''}{url} refused: {exc}") from None
            try:
                location = response.headers.get("location")
                if response.status_code not in _REDIRECT_STATUSES or not location:
                    body, truncated = (b"", False) if method == "HEAD" else await _read_capped(response)
                    return _render(response, body, truncated)
            finally:
                await response.aclose()
            try:
                target = url.join(location)
            except httpx.InvalidURL as exc:
                raise ToolError(f"redirect from {url} to an invalid location {location!r}: {exc}") from None
            target = _checked(target, allow, via=f"redirect from {url} refused: ")
            status = response.status_code
            if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
                # what browsers (and httpx) do: the redirected request becomes a GET without a body
                method, json_body, content = "GET", None, None
            cross_origin = cross_origin or (target.scheme, target.host, target.port) != (url.scheme, url.host, url.port)
            url = target
    raise ToolError(f"stopped after {MAX_REDIRECTS} redirects (last: {url})")
