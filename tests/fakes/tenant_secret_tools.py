"""Tools that use the run's tenant's credentials (``AGENT_TOOL_MODULES=tests.fakes.tenant_secret_tools``).

``call_api`` sends ``API_TOKEN`` as a bearer token to a URL (the test's HTTP server) and answers with a
fingerprint of it (a sha256 prefix, not the token); ``secret_fingerprint`` only fingerprints a named
secret; ``leak_secret`` misbehaves with one: returns it, raises it in a tool error or another exception,
or logs it, so the tests can show none of these reaches history, the store or a log line.
"""

from __future__ import annotations

import asyncio
import hashlib
import urllib.request
from typing import Literal

import structlog
from pydantic import BaseModel

from activities.tools import ToolContext, ToolError, tool

log = structlog.get_logger("tests.tenant_secret_tools")


def fingerprint(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class CallArgs(BaseModel):
    url: str


def _get(url: str, token: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


@tool("call_api", description="Call the API at url with the tenant's API_TOKEN.", args=CallArgs)
async def call_api(args: CallArgs, ctx: ToolContext) -> str:
    token = ctx.secret("API_TOKEN")
    status = await asyncio.to_thread(_get, args.url, token)
    return f"status {status}; token fingerprint {fingerprint(token)}"


class NameArgs(BaseModel):
    name: str


@tool("secret_fingerprint", description="The fingerprint of the tenant's secret name.", args=NameArgs)
async def secret_fingerprint(args: NameArgs, ctx: ToolContext) -> str:
    return f"fingerprint {fingerprint(ctx.secret(args.name))}"


class LeakArgs(BaseModel):
    name: str = "API_TOKEN"
    how: Literal["return", "tool_error", "exception", "log"]


@tool("leak_secret", description="Misbehave with a secret.", args=LeakArgs, max_attempts=1)
async def leak_secret(args: LeakArgs, ctx: ToolContext) -> str:
    value = ctx.secret(args.name)
    if args.how == "tool_error":
        raise ToolError(f"the API refused token {value}")
    if args.how == "exception":
        raise RuntimeError(f"crashed holding {value}")
    if args.how == "log":
        log.warning("about_to_use_secret", value=value)
        return "logged it"
    return f"the token is {value}"


async def _refund(args: CallArgs, ctx: ToolContext, result: str) -> str:
    token = ctx.secret("API_TOKEN")  # the run's tenant's, in the compensation too
    await asyncio.to_thread(_get, f"{args.url}?refund=1", token)
    return f"refunded with {token}"  # a careless note: redacted before it reaches the run's history


@tool(
    "charge",
    description="Charge through the API (compensated by a refund).",
    args=CallArgs,
    side_effect=True,
    recovery="idempotent_by_key",
    compensate=_refund,
)
async def charge(args: CallArgs, ctx: ToolContext) -> str:
    await asyncio.to_thread(_get, args.url, ctx.secret("API_TOKEN"))
    return "charged"
