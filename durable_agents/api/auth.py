"""Who a request is: its bearer token's entry, the rate limit it is under, and the client scoped to its tenant."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import HTTPException, Request

from durable_agents.agent_client import AgentClient
from durable_agents.api.fanout import Fanout
from durable_agents.api.limits import RateLimiter, retry_after
from durable_agents.api.tokens import Role, Token, TokenRegistry


@dataclass
class ApiState:
    """What every route reads (one per app): the unscoped client, the tokens and the rate limiter."""

    client: AgentClient
    tokens: TokenRegistry | None  # None: --insecure-local, every request is ``local``
    local: Token
    limiter: RateLimiter
    fanout: Fanout  # one reader per followed run in this process
    ui_url: str = ""  # the Temporal UI, for the inbox's links to runs
    namespace: str = "default"


@dataclass
class Caller:
    token: Token
    client: AgentClient  # scoped to the token's tenant (unscoped for an admin)

    def require(self, role: Role) -> None:
        if not self.token.has(role):
            raise HTTPException(403, f"this token does not have the {role} role")


def state_of(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def caller(request: Request) -> Caller:
    """The FastAPI dependency of every /v1 route: 401 without a known token, 429 over its rate."""
    api = state_of(request)
    if api.tokens is None:
        token = api.local
    else:
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        found = api.tokens.lookup(bearer.strip()) if scheme.lower() == "bearer" else None
        if found is None:
            raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        token = found
    request.state.tenant = token.tenant or ("*" if token.admin else "")
    wait = api.limiter.take(token.sha256)
    if wait > 0:
        raise HTTPException(429, "too many requests for this token", headers={"Retry-After": retry_after(wait)})
    scoped = api.client if token.admin else api.client.for_tenant(token.tenant)
    return Caller(token=token, client=scoped)
