"""The http_request tool: egress only to allow-listed hosts (re-checked on every redirect), capped bodies.

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

from activities.tools.spec import ToolContext, ToolError, tool

MAX_HTTP_BODY_BYTES = 100_000
MAX_REDIRECTS = 5
CONNECT_TIMEOUT_S = 10.0
TOTAL_TIMEOUT_S = 30.0
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
USER_AGENT = "durable-agents/0.1"
_DEFAULT_PORTS = {"http": 80, "https": 443}
# set by httpx or by us; letting the model set them would desynchronise framing or the allow-list's view of the host
_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "idempotency-key"})
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class HttpRequestArgs(BaseModel):
    # the field is ``json_body`` in Python (``json`` would shadow BaseModel.json) but ``json`` on the wire
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True, extra="forbid")

    method: str = Field(description="HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS.")
    url: str = Field(description="Absolute http:// or https:// URL; its host must be on the worker's allow-list.")
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

    @model_validator(mode="after")
    def _one_body(self) -> HttpRequestArgs:
        if self.json_body is not None and self.body is not None:
            raise ValueError("give either json or body, not both")
        return self


def _parse_entry(entry: str) -> tuple[str, int | None]:
    """``host`` -> (host, None: any port); ``host:port`` / ``[v6]:port`` -> (host, port); bad port -> -1."""
    entry = entry.strip().lower()
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
    else:  # a plain host name, or a bare IPv6 address
        host, port = entry, ""
    if not port:
        return host.rstrip("."), None
    return host.rstrip("."), int(port) if port.isdigit() else -1


def host_allowed(url: httpx.URL, allow: Iterable[str]) -> bool:
    """Whether ``url``'s host (and port) matches an ``AGENT_HTTP_ALLOW`` entry; an empty list allows nothing."""
    host = url.host.lower().rstrip(".")
    port = url.port or _DEFAULT_PORTS.get(url.scheme, -1)
    for entry in allow:
        allowed_host, allowed_port = _parse_entry(entry)
        if allowed_host == host and allowed_port in (None, port):
            return True
    return False


def _checked(raw: str | httpx.URL, allow: Iterable[str], *, via: str = "") -> httpx.URL:
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ToolError(f"invalid URL {str(raw)!r}: {exc}") from None
    if url.scheme not in _DEFAULT_PORTS or not url.host:
        raise ToolError(f"URL {str(url)!r} is not an absolute http:// or https:// URL")
    if not host_allowed(url, allow):
        where = f"{url.host}:{url.port or _DEFAULT_PORTS[url.scheme]}"
        raise ToolError(
            f"{via}host {where} is not allowed: outbound HTTP is limited to the hosts in AGENT_HTTP_ALLOW "
            f"({', '.join(allow) or 'empty: no host is allowed'}); ask the operator to add it"
        )
    return url


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
        httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=timeout) as client,
    ):
        for _hop in range(MAX_REDIRECTS + 1):
            headers = _request_headers(args, method, ctx.invocation.idempotency_key, cross_origin)
            request = client.build_request(method, url, headers=headers, json=json_body, content=content)
            response = await client.send(request, stream=True)
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
