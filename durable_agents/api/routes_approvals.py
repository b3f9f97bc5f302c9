"""``/v1/approvals``: the tenant's pending approvals and questions, and deciding them.

The reviewer a decision is recorded under is the token's ``reviewer``, never the body's: a body
that names another reviewer is refused (400), so a client cannot act under someone else's name and
a mistake is loud rather than silently re-attributed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from durable_agents.agent_client import PendingItem
from durable_agents.api.auth import Caller, caller

router = APIRouter(prefix="/v1")
Auth = Annotated[Caller, Depends(caller)]
Id = Annotated[str, Path(min_length=1, max_length=1000)]


class Approvals(BaseModel):
    approvals: list[PendingItem]
    next_page_token: str = ""


class DecideBody(BaseModel):
    """``approve`` (with ``arguments``: approve the call with these arguments instead), ``reject``
    (``reason`` reaches the model), ``answer`` (``text`` answers a question)."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject", "answer"]
    comment: str = Field(default="", max_length=4000)
    reason: str = Field(default="", max_length=4000)
    arguments: dict[str, Any] | None = None
    text: str = Field(default="", max_length=100_000)
    # Accepted only when it is the token's own reviewer name (a client that always sends it still works).
    reviewer: str | None = Field(default=None, max_length=200)


class Decided(BaseModel):
    workflow_id: str
    approval_id: str
    reviewer: str
    message: str  # what took effect, in one line


@router.get("/approvals", response_model=Approvals)
async def list_approvals(
    who: Auth,
    run: Annotated[str | None, Query(min_length=1, max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    page_token: Annotated[str, Query(max_length=4000)] = "",
) -> Approvals:
    items, token = await who.client.pending(run, limit=limit, page_token=page_token)
    return Approvals(approvals=items, next_page_token=token)


@router.post("/approvals/{workflow_id}/{approval_id}", response_model=Decided)
async def decide(workflow_id: Id, approval_id: Id, body: DecideBody, who: Auth) -> Decided:
    who.require("reviewer")
    reviewer = who.token.reviewer
    if not reviewer:
        raise HTTPException(403, "this token has no reviewer name to record decisions under")
    if body.reviewer is not None and body.reviewer != reviewer:
        raise HTTPException(400, f"decisions of this token are recorded as {reviewer!r}; the body cannot name another")
    if body.decision == "answer" and not body.text:
        raise HTTPException(400, "an answer needs text")
    message = await who.client.decide(
        workflow_id,
        approval_id,
        body.decision,
        reviewer=reviewer,
        comment=body.comment,
        reason=body.reason,
        arguments=body.arguments,
        text=body.text,
    )
    return Decided(workflow_id=workflow_id, approval_id=approval_id, reviewer=reviewer, message=message)
