"""``/v1/runs`` and ``/v1/sessions``: start, list, status, cancel, transcript, events, fork, rewind,
session messages.

Every route acts through the caller's tenant-scoped ``AgentClient``: a run of another tenant is
``RunNotFound`` there, so it is 404 here, the same answer as a run that does not exist.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from durable_agents.agent_client import RunRef, RunSummary
from durable_agents.api import sse
from durable_agents.api.auth import Caller, caller, state_of
from workflows.session_types import SendResult, SessionSpec
from workflows.types import MAX_NAME_CHARS, MAX_TASK_CHARS, AgentInput, StatusView

router = APIRouter(prefix="/v1")
Auth = Annotated[Caller, Depends(caller)]
RunId = Annotated[str, Path(min_length=1, max_length=1000)]
NEW_ID = r"^[A-Za-z0-9._:@/-]+$"  # the characters a caller may choose for a new run's id
# Set only by the runtime itself (continue-as-new, a parent for its sub-agents, a fork or rewind):
# a caller that could set them would skip a limit or read another run's state.
INTERNAL_FIELDS = ("carry", "budget", "parent_conversation", "subagents_ref", "as_subagent", "checkpoint", "fork")


class StartRun(AgentInput):
    """``POST /v1/runs``: an ``AgentInput`` plus the workflow id to use (default: one is made up)."""

    workflow_id: str | None = Field(default=None, min_length=1, max_length=200, pattern=NEW_ID)


class RunList(BaseModel):
    runs: list[RunSummary]
    next_page_token: str = ""


class CancelBody(BaseModel):
    reason: str = Field(default="", max_length=1000)


class Cancelled(BaseModel):
    workflow_id: str
    cancelled: bool = True


class MessageBody(BaseModel):
    """``POST /v1/sessions/{id}/messages``; ``start`` is the session's input when it has to be created."""

    text: str = Field(min_length=1, max_length=100_000)
    message_id: str = Field(default="", max_length=200)  # the same id again is the same message (a retry)
    start: AgentInput | None = None


class ForkBody(BaseModel):
    """``POST /v1/runs/{id}/fork``: keep the source's first ``step`` steps (default: all it completed),
    then ``task`` (a new instruction), on ``model``; ``workflow_id`` is the new run's (default: made up)."""

    model_config = ConfigDict(extra="forbid")

    step: int | None = Field(default=None, ge=0)
    task: str | None = Field(default=None, max_length=MAX_TASK_CHARS)
    workflow_id: str | None = Field(default=None, min_length=1, max_length=200, pattern=NEW_ID)
    model: str = Field(default="", max_length=MAX_NAME_CHARS)


class RewindBody(BaseModel):
    """``POST /v1/runs/{id}/rewind``: reset the run to the end of step ``step`` (its model asked again)."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0)
    reason: str = Field(default="", max_length=1000)


class Transcript(BaseModel):
    workflow_id: str
    messages: list[dict[str, Any]]


def checked_input(inp: AgentInput, who: Caller) -> AgentInput:
    """The input as given, unless it sets a runtime-only field or names another tenant (400)."""
    internal = [name for name in INTERNAL_FIELDS if name in inp.model_fields_set]
    if internal or inp.depth:
        raise HTTPException(400, f"set by the runtime, not by a caller: {', '.join(internal or ['depth'])}")
    if not who.token.admin and inp.tenant and inp.tenant != who.token.tenant:
        raise HTTPException(400, f"this token starts runs for tenant {who.token.tenant!r} only")
    return inp


@router.post("/runs", response_model=RunRef, status_code=201)
async def start_run(body: StartRun, who: Auth) -> RunRef:
    who.require("starter")
    inp = AgentInput.model_validate(body.model_dump(exclude={"workflow_id"}, exclude_unset=True))
    checked_input(inp, who)
    if not inp.task and inp.session is None:
        raise HTTPException(400, "a run needs a task (or a session)")
    return await who.client.start(inp, workflow_id=body.workflow_id or f"agent-{uuid.uuid4().hex[:12]}")


@router.get("/runs", response_model=RunList)
async def list_runs(
    who: Auth,
    state: Annotated[str | None, Query(max_length=40)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    page_token: Annotated[str, Query(max_length=4000)] = "",
) -> RunList:
    runs, token = await who.client.list(state=state, limit=limit, page_token=page_token)
    return RunList(runs=runs, next_page_token=token)


@router.get("/runs/{workflow_id}", response_model=StatusView)
async def run_status(workflow_id: RunId, who: Auth) -> StatusView:
    return await who.client.status(workflow_id)


@router.post("/runs/{workflow_id}/cancel", response_model=Cancelled)
async def cancel_run(workflow_id: RunId, who: Auth, body: CancelBody | None = None) -> Cancelled:
    who.require("starter")
    await who.client.cancel(workflow_id, reason=body.reason if body else "")
    return Cancelled(workflow_id=workflow_id)


@router.post("/runs/{workflow_id}/fork", response_model=RunRef, status_code=201)
async def fork_run(workflow_id: RunId, body: ForkBody, who: Auth) -> RunRef:
    """A new run from the source's first steps (the source is only read). 409 when the source has fewer
    complete steps, 400 when that step's workspace was not checkpointed, 409 when the new id is taken."""
    who.require("starter")
    return await who.client.fork(workflow_id, step=body.step, task=body.task, new_id=body.workflow_id, model=body.model)


@router.post("/runs/{workflow_id}/rewind", response_model=RunRef)
async def rewind_run(workflow_id: RunId, body: RewindBody, who: Auth) -> RunRef:
    """Reset the run's latest execution to the end of step ``step``; answers the run it continues as. 409
    when it has no step after ``step`` (or ran it before a continue-as-new)."""
    who.require("starter")
    return await who.client.rewind(workflow_id, step=body.step, reason=body.reason)


@router.get("/runs/{workflow_id}/transcript", response_model=Transcript)
async def run_transcript(workflow_id: RunId, who: Auth) -> Transcript:
    return Transcript(workflow_id=workflow_id, messages=await who.client.transcript(workflow_id))


@router.get("/runs/{workflow_id}/events", response_class=StreamingResponse)
async def run_events(
    workflow_id: RunId,
    who: Auth,
    request: Request,
    last_event_id: Annotated[str | None, Header(max_length=40)] = None,
    after: Annotated[str | None, Query(max_length=40)] = None,
) -> StreamingResponse:
    """Server-Sent Events; resume with ``Last-Event-ID`` (or ``?after=``) set to the last ``id`` seen."""
    try:
        cursor = sse.cursor_of(last_event_id, after)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    await who.client.run(workflow_id)  # RunNotFound (404) for another tenant's run, before any byte is sent
    api = state_of(request)
    return StreamingResponse(
        sse.stream(api.fanout.events(workflow_id, cursor), sse.disconnected(request.receive)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.post("/sessions/{session_id}/messages", response_model=SendResult)
async def send_message(session_id: RunId, body: MessageBody, who: Auth) -> SendResult:
    """Send a session a message; a session that does not exist yet is started with ``start`` (or defaults)."""
    who.require("starter")
    start = checked_input(body.start, who) if body.start is not None else AgentInput(session=SessionSpec())
    if start.session is None:
        start = start.model_copy(update={"session": SessionSpec()})
    return await who.client.send(
        session_id,
        body.text,
        message_id=body.message_id or uuid.uuid4().hex,
        sender=who.token.reviewer or who.token.tenant,
        start=start,
    )
