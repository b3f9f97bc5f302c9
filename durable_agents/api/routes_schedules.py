"""``/v1/schedules``: the caller's tenant's schedules: create, list, describe, pause, unpause, trigger, delete.

Every route acts through the caller's tenant-scoped ``AgentClient``. Schedule names are per tenant: a
tenant's schedule ``daily`` and another tenant's ``daily`` are two schedules, so another tenant's schedule
is ``ScheduleNotFound`` here (404, the same answer as a name no schedule has) and creating a name another
tenant uses makes one of the caller's own (never 409). An admin token's client is unscoped: it names the
tenant with ``?tenant=`` when several tenants use a name (400 otherwise).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from durable_agents.agent_client import ScheduleInfo
from durable_agents.api.auth import Caller, caller
from durable_agents.api.routes_runs import checked_input
from workflows.schedule_types import MAX_SCHEDULE_NAME_CHARS
from workflows.session_types import MAX_MESSAGE_CHARS, SessionSpec
from workflows.types import MAX_NAME_CHARS, MAX_TASK_CHARS, AgentInput

router = APIRouter(prefix="/v1")
Auth = Annotated[Caller, Depends(caller)]
# The name's own rules (letters, digits, ".", "_", "-") are AgentClient's, answered as a one-line 400.
Name = Annotated[str, Path(min_length=1, max_length=MAX_SCHEDULE_NAME_CHARS)]
# Whose schedule: only an admin token needs it (a scoped token's own tenant is the only one it may name).
Tenant = Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_CHARS)]


class CreateSchedule(BaseModel):
    """``POST /v1/schedules``: ``task`` (an agent run at each firing) or ``session`` + ``message`` (a message
    to that session at each firing). ``input`` is the rest of the run's (or the session's start) input; its
    runtime-only fields and another tenant than the token's are refused, as ``POST /v1/runs`` refuses them."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=MAX_SCHEDULE_NAME_CHARS)
    cron: str = Field(min_length=1, max_length=200)
    task: str | None = Field(default=None, max_length=MAX_TASK_CHARS)
    session: str | None = Field(default=None, max_length=1000)
    message: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)
    model: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    # AgentInput fields (validated with the schedule's task or session, so ``input`` need not repeat them).
    input: dict[str, Any] | None = None
    note: str = Field(default="", max_length=1000)
    paused: bool = False


class ScheduleList(BaseModel):
    schedules: list[ScheduleInfo]


class NoteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str = Field(default="", max_length=1000)


class Deleted(BaseModel):
    name: str
    deleted: bool = True


@router.post("/schedules", response_model=ScheduleInfo, status_code=201)
async def create_schedule(body: CreateSchedule, who: Auth) -> ScheduleInfo:
    """Create a schedule of the token's tenant (an admin's: of ``input.tenant``, or of none)."""
    who.require("starter")
    inp = checked_input(_input(body), who) if body.input is not None else None
    return await who.client.schedule_create(
        body.name,
        cron=body.cron,
        task=body.task,
        session=body.session,
        message=body.message,
        model=body.model,
        inp=inp,
        note=body.note,
        paused=body.paused,
    )


def _input(body: CreateSchedule) -> AgentInput:
    """``body.input`` as the runs' ``AgentInput`` (400 with its first problem in one line)."""
    fields = dict(body.input or {})
    if body.task is not None:
        fields["task"] = body.task
    elif body.session is not None and "session" not in fields:
        fields["session"] = SessionSpec().model_dump()
    try:
        return AgentInput.model_validate(fields)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "input"
        raise HTTPException(400, f"bad run input: {where}: {first['msg']}") from None


@router.get("/schedules", response_model=ScheduleList)
async def list_schedules(who: Auth) -> ScheduleList:
    """The token's tenant's schedules, by name (every tenant's for an admin token)."""
    return ScheduleList(schedules=await who.client.schedule_list())


@router.get("/schedules/{name}", response_model=ScheduleInfo)
async def describe_schedule(name: Name, who: Auth, tenant: Tenant = None) -> ScheduleInfo:
    return await who.client.schedule_describe(name, tenant=tenant)


@router.post("/schedules/{name}/pause", response_model=ScheduleInfo)
async def pause_schedule(name: Name, who: Auth, body: NoteBody | None = None, tenant: Tenant = None) -> ScheduleInfo:
    """Stop firing until unpaused (a run already started goes on); answers the schedule after."""
    who.require("starter")
    await who.client.schedule_pause(name, note=body.note if body else "", tenant=tenant)
    return await who.client.schedule_describe(name, tenant=tenant)


@router.post("/schedules/{name}/unpause", response_model=ScheduleInfo)
async def unpause_schedule(name: Name, who: Auth, body: NoteBody | None = None, tenant: Tenant = None) -> ScheduleInfo:
    who.require("starter")
    await who.client.schedule_unpause(name, note=body.note if body else "", tenant=tenant)
    return await who.client.schedule_describe(name, tenant=tenant)


@router.post("/schedules/{name}/trigger", response_model=ScheduleInfo)
async def trigger_schedule(name: Name, who: Auth, tenant: Tenant = None) -> ScheduleInfo:
    """Fire now (skipped while the schedule's previous run is open). The answer may not list the new run
    yet: Temporal starts it a moment later (``running`` and ``recent_runs`` show it then)."""
    who.require("starter")
    await who.client.schedule_trigger(name, tenant=tenant)
    return await who.client.schedule_describe(name, tenant=tenant)


@router.delete("/schedules/{name}", response_model=Deleted)
async def delete_schedule(name: Name, who: Auth, tenant: Tenant = None) -> Deleted:
    """Delete the schedule; the runs it started, open or closed, are not touched."""
    who.require("starter")
    await who.client.schedule_delete(name, tenant=tenant)
    return Deleted(name=name)
