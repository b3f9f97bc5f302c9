"""Test-only side-effecting tools for crash tests, loaded into worker subprocesses with
``AGENT_TOOL_MODULES=tests.fakes.crash_tools``.

- ``notify`` POSTs a message WITHOUT any idempotency key (the destination cannot
  dedupe), so its recovery mode is ``unknown``: a crash after the POST pauses the
  run for a human. ``CRASH_TOOLS_SLEEP_AFTER_S`` makes it linger after the POST,
  so a test can SIGKILL the worker between the side effect and the activity's completion.
- ``charge`` POSTs ``{url}/charges`` with ``X-Charge-Key: <idempotency key>``;
  recovery ``reconcile`` looks the key up with ``GET {url}/charges?key=<key>``.

Both refuse hosts outside ``AGENT_HTTP_ALLOW``, like ``http_request``.
Not imported by the test process itself, so other tests' tool lists stay unchanged.
"""

from __future__ import annotations

import asyncio
import os

import httpx
from pydantic import BaseModel, ConfigDict, Field

from activities.tools import ToolContext, ToolError, tool
from activities.tools.http import host_allowed

SLEEP_ENV = "CRASH_TOOLS_SLEEP_AFTER_S"
TIMEOUT_S = 10.0


class NotifyArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Where to POST the message (an allow-listed host).")
    message: str = Field(description="The message text.")


class ChargeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Base URL of the payment API (an allow-listed host).")
    amount: int = Field(description="Amount in cents.")


def _allowed(raw: str, ctx: ToolContext) -> httpx.URL:
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ToolError(f"invalid URL {raw!r}: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ToolError(f"URL {raw!r} is not an absolute http:// or https:// URL")
    if not host_allowed(url, ctx.settings.http_allow):
        raise ToolError(f"host {url.host} is not allowed: outbound HTTP is limited to AGENT_HTTP_ALLOW")
    return url


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=TIMEOUT_S)


@tool(
    "notify",
    description="POST a message to a URL (the destination cannot deduplicate retries).",
    args=NotifyArgs,
    side_effect=True,
    recovery="unknown",
    heartbeat_s=2,
    max_attempts=5,
)
async def notify(args: NotifyArgs, ctx: ToolContext) -> str:
    url = _allowed(args.url, ctx)
    async with _client() as client:
        response = await client.post(url, json={"message": args.message})
    # After the side effect and before the activity completes: the window a crash test kills in.
    await asyncio.sleep(float(os.environ.get(SLEEP_ENV, "0")))
    return f"HTTP {response.status_code}\n\n{response.text}"


def _charges(base: str, ctx: ToolContext) -> httpx.URL:
    return _allowed(base.rstrip("/") + "/charges", ctx)


async def _find_charge(args: ChargeArgs, ctx: ToolContext) -> str | None:
    """Did a charge with this call's key happen? Its record when it did, None when it did not."""
    url = _charges(args.url, ctx)
    async with _client() as client:
        response = await client.get(url, params={"key": ctx.invocation.idempotency_key})
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        # Neither yes nor no: fail this attempt (the activity retries) rather than guess.
        raise RuntimeError(f"charge lookup answered HTTP {response.status_code}")
    return f"charge found by lookup (reconciled)\n\n{response.text}"


@tool(
    "charge",
    description="Charge an amount through the payment API at url.",
    args=ChargeArgs,
    side_effect=True,
    recovery="reconcile",
    reconcile=_find_charge,
    heartbeat_s=2,
    max_attempts=5,
)
async def charge(args: ChargeArgs, ctx: ToolContext) -> str:
    url = _charges(args.url, ctx)
    async with _client() as client:
        response = await client.post(
            url, json={"amount": args.amount}, headers={"X-Charge-Key": ctx.invocation.idempotency_key}
        )
    return f"HTTP {response.status_code}\n\n{response.text}"
