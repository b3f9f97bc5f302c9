"""Schedules: an agent task, or a message to a session, on a cron, as real Temporal Schedules.

``ScheduleMethods`` is mixed into ``AgentClient``: ``schedule_create``, ``schedule_list``,
``schedule_pause``, ``schedule_unpause``, ``schedule_delete`` and ``schedule_trigger``. A schedule named
``nightly`` of tenant ``acme`` is the Temporal Schedule ``agent-schedule-nightly@acme`` (it shows in the UI's
Schedules page; one without a tenant is ``agent-schedule-nightly``, see ``_schedule_checks``); its runs are
``agent-schedule-nightly@acme-<time>`` (Temporal appends the firing's time). A task schedule starts
an ``AgentWorkflow`` with its task at each firing; a session schedule starts a ``ScheduledMessageWorkflow``
that sends its message to the session (starting or waking it, ``workflows/scheduled_message.py``).

Every schedule skips a firing while its previous run is open (``ScheduleOverlapPolicy.SKIP``), so it never
has two runs at once: a run waiting for an approval over the next firing time makes that firing a
skipped one (``ScheduleInfo.skipped_overlap``), ``schedule_trigger`` included. A session schedule's run
is open only until the session has taken the message.

Tenants: a schedule carries its tenant in its id, its memo and the input of its action. Names are per
tenant: two tenants may each have a ``nightly``, and neither can tell the other has one. A client scoped to
a tenant creates schedules of that tenant only and sees, pauses, triggers and deletes only those: any other
is ``ScheduleNotFound``, as a missing one is. An unscoped client finds a name among every tenant's
schedules and asks for ``tenant=`` when several tenants use it. Example::

    agents = AgentClient(await Client.connect("localhost:7233", plugins=[DurableAgentsPlugin()]))
    info = await agents.schedule_create("standup", cron="0 9 * * 1-5", task="Summarise yesterday's tickets")
    print(info.next_runs[0])
    await agents.schedule_pause("standup", note="holidays")
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionResult,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.agent_client._schedule_checks import (
    TENANT_MARK,
    InvalidSchedule,
    ScheduleExists,
    ScheduleNotFound,
    check_cron,
    check_name,
    legacy_id,
    name_of_id,
    schedule_id,
)
from workflows.agent import AgentWorkflow
from workflows.schedule_types import SCHEDULE_ID_PREFIX, ScheduledMessage
from workflows.scheduled_message import ScheduledMessageWorkflow
from workflows.session_types import MAX_MESSAGE_CHARS, SessionSpec
from workflows.types import MAX_NAME_CHARS, AgentInput

MEMO_KEY = "agent_schedule"  # the memo entry that marks a Temporal Schedule as one of ours, with its details
MAX_NOTE_CHARS = 1000
MAX_LISTED = 1000  # schedules ``schedule_list`` reads (each one is described: one call per schedule)
PREVIEW_CHARS = 200  # of a task or a message in ``ScheduleInfo``
NEXT_RUNS = 5
ScheduleKind = Literal["task", "session"]


class ScheduleRun(BaseModel):
    """A run a schedule started (or is running)."""

    workflow_id: str
    run_id: str = ""
    scheduled_at: str = ""  # ISO 8601: the firing time the run is for
    started_at: str = ""


class ScheduleInfo(BaseModel):
    """One schedule as ``schedule_create`` / ``schedule_list`` answer it."""

    name: str
    schedule_id: str  # the Temporal Schedule's id (``agent-schedule-<name>@<tenant>``, see ``schedule_id``)
    kind: ScheduleKind
    cron: str
    paused: bool = False
    note: str = ""  # the last pause/unpause note
    tenant: str = ""
    model: str = ""
    task: str = ""  # a task schedule's task (its first PREVIEW_CHARS characters)
    session: str = ""  # a session schedule's session id
    message: str = ""  # a session schedule's message (its first PREVIEW_CHARS characters)
    next_runs: list[str] = Field(default_factory=list)  # ISO 8601, the next cron times (listed while paused too)
    recent_runs: list[ScheduleRun] = Field(default_factory=list)  # newest last, as Temporal keeps them
    running: list[ScheduleRun] = Field(default_factory=list)  # at most one: the overlap policy skips
    actions: int = 0  # runs started so far
    skipped_overlap: int = 0  # firings skipped because the previous run was still open
    created_at: str = ""


class ScheduleMethods:
    """The schedule methods of ``AgentClient`` (mixed in; they use its ``client``, ``task_queue`` and ``tenant``)."""

    client: Client
    task_queue: str
    tenant: str | None

    async def schedule_create(
        self,
        name: str,
        *,
        cron: str,
        task: str | None = None,
        session: str | None = None,
        message: str | None = None,
        model: str | None = None,
        tenant: str | None = None,
        inp: AgentInput | None = None,
        note: str = "",
        paused: bool = False,
    ) -> ScheduleInfo:
        """Create schedule ``name``: ``task`` (an agent run each time) or ``session`` + ``message`` (a message
        to that session each time, starting it when missing). ``inp`` gives the rest of the run's (or the
        session's start) input; ``model`` / ``tenant`` override its fields. ``InvalidSchedule`` for a bad
        name, cron or action, ``ScheduleExists`` when the tenant has a schedule of that name (another
        tenant's schedule of the same name is another schedule: names are per tenant)."""
        check_name(name)
        cron = check_cron(cron)
        if len(note) > MAX_NOTE_CHARS:
            raise InvalidSchedule(f"the note is {len(note):,} characters; at most {MAX_NOTE_CHARS:,}")
        owner = self._owner(tenant if tenant is not None else (inp.tenant if inp is not None else None))
        sid = schedule_id(name, owner)
        # One made under the id without a tenant is still this tenant's: a second one would make the name ambiguous.
        if owner and await self._at(legacy_id(name), owner) is not None:
            raise ScheduleExists(f"a schedule named {name!r} exists already")
        kind, action, details = self._action(sid, name, owner, task, session, message, model, inp)
        memo = {MEMO_KEY: {"name": name, "kind": kind, "cron": cron, "tenant": owner, **details}}
        schedule = Schedule(
            action=action,
            spec=ScheduleSpec(cron_expressions=[cron]),
            policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
            state=ScheduleState(note=note or f"created by durable-agents ({kind})", paused=paused),
        )
        try:
            handle = await self.client.create_schedule(sid, schedule, memo=memo)
        except ScheduleAlreadyRunningError:
            raise ScheduleExists(f"a schedule named {name!r} exists already") from None
        except RPCError as err:
            if err.status == RPCStatusCode.INVALID_ARGUMENT:
                raise InvalidSchedule(f"Temporal refused schedule {name!r}: {' '.join(err.message.split())}") from None
            raise
        return await self._info(await handle.describe())

    async def schedule_list(self) -> list[ScheduleInfo]:
        """The schedules this client may see (its tenant's; every one for an unscoped client), by name."""
        infos: list[ScheduleInfo] = []
        listed = 0
        async for entry in await self.client.list_schedules():
            if not entry.id.startswith(SCHEDULE_ID_PREFIX):
                continue
            listed += 1
            if listed > MAX_LISTED:
                break
            memo = _details(await entry.memo())
            if memo is None or not self._sees(memo):
                continue
            try:
                infos.append(await self._info(await self.client.get_schedule_handle(entry.id).describe()))
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:  # deleted since it was listed
                    raise
        return sorted(infos, key=lambda info: info.name)

    async def schedule_describe(self, name: str, *, tenant: str | None = None) -> ScheduleInfo:
        """Schedule ``name`` now; ``ScheduleNotFound`` when there is none this client may see.

        ``tenant``: the tenant whose schedule it is. A scoped client always looks among its own tenant's
        (another ``tenant`` is ``InvalidSchedule``); an unscoped one without ``tenant`` looks among every
        tenant's and refuses (``InvalidSchedule``) a name that several tenants use. The same for the
        methods below.
        """
        return await self._info((await self._owned(name, tenant))[1])

    async def schedule_pause(self, name: str, note: str = "", *, tenant: str | None = None) -> None:
        """Stop firing (a run already started goes on) until ``schedule_unpause``."""
        handle, _ = await self._owned(name, tenant)
        await handle.pause(note=_note(note, "paused"))

    async def schedule_unpause(self, name: str, note: str = "", *, tenant: str | None = None) -> None:
        """Fire again at the cron's times."""
        handle, _ = await self._owned(name, tenant)
        await handle.unpause(note=_note(note, "unpaused"))

    async def schedule_delete(self, name: str, *, tenant: str | None = None) -> None:
        """Delete the schedule (its runs, open or closed, are not touched)."""
        handle, _ = await self._owned(name, tenant)
        await handle.delete()

    async def schedule_trigger(self, name: str, *, tenant: str | None = None) -> None:
        """Fire now, under the overlap policy: skipped while the schedule's previous run is open."""
        handle, _ = await self._owned(name, tenant)
        await handle.trigger()

    def _owner(self, asked: str | None) -> str:
        """The tenant a new schedule is for: the client's own when it is scoped (another one is refused)."""
        if asked is not None and len(asked) > MAX_NAME_CHARS:
            raise InvalidSchedule(f"the tenant name is over {MAX_NAME_CHARS} characters")
        if self.tenant is None:
            return asked or ""
        if asked and asked != self.tenant:
            raise InvalidSchedule(f"this client is scoped to tenant {self.tenant!r}; it cannot schedule for {asked!r}")
        return self.tenant

    def _sees(self, memo: Mapping[str, Any]) -> bool:
        return self.tenant is None or memo.get("tenant", "") == self.tenant

    async def _owned(self, name: str, tenant: str | None) -> tuple[ScheduleHandle, ScheduleDescription]:
        """Schedule ``name`` of ``tenant`` (see ``schedule_describe``), or ``ScheduleNotFound``."""
        check_name(name)
        if self.tenant is not None and tenant is not None and tenant != self.tenant:
            raise InvalidSchedule(f"this client is scoped to tenant {self.tenant!r}; it cannot see {tenant!r}'s")
        owner = self.tenant if self.tenant is not None else tenant
        if owner is not None:
            # Both ids are read directly (not listed), so a schedule just created is found at once.
            found = await self._at(schedule_id(name, owner), owner)
            if found is None and owner:
                found = await self._at(legacy_id(name), owner)
            if found is None:
                raise ScheduleNotFound(f"no schedule named {name!r}")
            return found
        candidates = [found] if (found := await self._at(legacy_id(name), None)) is not None else []
        # A tenant's ids are only known by listing (which lags a creation or a deletion by a moment): every
        # id of this name is ``legacy_id(name) + TENANT_MARK + ...``, as a name never holds the mark.
        prefix = legacy_id(name) + TENANT_MARK
        async for entry in await self.client.list_schedules():
            if entry.id.startswith(prefix) and (found := await self._at(entry.id, None)) is not None:
                candidates.append(found)
        if not candidates:
            raise ScheduleNotFound(f"no schedule named {name!r}")
        if len(candidates) > 1:
            tenants = ", ".join(
                sorted([repr(str((_details(await d.memo()) or {}).get("tenant", ""))) for _, d in candidates])
            )
            raise InvalidSchedule(
                f"{len(candidates)} schedules are named {name!r}, of tenants {tenants}: name the tenant (--tenant)"
            )
        return candidates[0]

    async def _at(self, sid: str, tenant: str | None) -> tuple[ScheduleHandle, ScheduleDescription] | None:
        """The schedule of id ``sid`` when it is one of ours, of ``tenant`` (None: of any); None otherwise."""
        handle = self.client.get_schedule_handle(sid)
        try:
            desc = await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        memo = _details(await desc.memo())
        if memo is None or (tenant is not None and memo.get("tenant", "") != tenant):
            return None
        return handle, desc

    def _action(
        self,
        sid: str,
        name: str,
        tenant: str,
        task: str | None,
        session: str | None,
        message: str | None,
        model: str | None,
        inp: AgentInput | None,
    ) -> tuple[ScheduleKind, ScheduleActionStartWorkflow, dict[str, str]]:
        if inp is not None and (inp.fork is not None or inp.carry is not None or inp.depth):
            raise InvalidSchedule("a scheduled run's input cannot fork, carry or be a sub-agent's")
        given = inp.model_dump(exclude_unset=True) if inp is not None else {}
        changes: dict[str, Any] = {"tenant": tenant}
        if model is not None:
            changes["model"] = model
        if session is None and message is None:
            if task is not None:
                changes["task"] = task
            if given.get("session") is not None or not str(changes.get("task", given.get("task", ""))).strip():
                raise InvalidSchedule(
                    "a schedule needs a task (--task) or a session and a message (--session, --message)"
                )
            run = _validated({**given, **changes})
            action = ScheduleActionStartWorkflow(AgentWorkflow.run, run, id=sid, task_queue=self.task_queue)
            return "task", action, {"model": run.model}
        if task is not None or session is None or message is None:
            raise InvalidSchedule("a session schedule needs --session and --message, and no --task")
        if not message.strip() or len(message) > MAX_MESSAGE_CHARS:
            raise InvalidSchedule(f"the message must be 1 to {MAX_MESSAGE_CHARS:,} characters, not blank")
        if not session.strip() or len(session) > 1000 or session != session.strip():
            raise InvalidSchedule("the session id must be 1 to 1000 characters, without surrounding spaces")
        start = _validated({"session": SessionSpec().model_dump(), **given, **changes})
        sent = ScheduledMessage(
            schedule=name, session_id=session, text=message, tenant=tenant, task_queue=self.task_queue, start=start
        )
        action = ScheduleActionStartWorkflow(ScheduledMessageWorkflow.run, sent, id=sid, task_queue=self.task_queue)
        return "session", action, {"model": start.model, "session": session}

    async def _info(self, desc: ScheduleDescription) -> ScheduleInfo:
        memo = _details(await desc.memo()) or {}
        info = ScheduleInfo(
            name=str(memo.get("name", name_of_id(desc.id))),
            schedule_id=desc.id,
            kind="session" if memo.get("kind") == "session" else "task",
            cron=str(memo.get("cron", "")),
            paused=desc.schedule.state.paused,
            note=desc.schedule.state.note or "",
            tenant=str(memo.get("tenant", "")),
            model=str(memo.get("model", "")),
            session=str(memo.get("session", "")),
            next_runs=[_iso(at) for at in desc.info.next_action_times[:NEXT_RUNS]],
            recent_runs=[_run(result) for result in desc.info.recent_actions],
            running=[
                ScheduleRun(workflow_id=run.workflow_id, run_id=run.first_execution_run_id)
                for run in desc.info.running_actions
                if isinstance(run, ScheduleActionExecutionStartWorkflow)
            ],
            actions=desc.info.num_actions,
            skipped_overlap=desc.info.num_actions_skipped_overlap,
            created_at=_iso(desc.info.created_at),
        )
        action = desc.schedule.action
        if isinstance(action, ScheduleActionStartWorkflow) and len(action.args) == 1:
            await self._previews(info, action)
        return info

    async def _previews(self, info: ScheduleInfo, action: ScheduleActionStartWorkflow) -> None:
        """The task or message, from the action's input (decoded: it is encrypted when payload keys are set)."""
        kind: type[AgentInput | ScheduledMessage] = ScheduledMessage if info.kind == "session" else AgentInput
        try:
            [value] = await self.client.data_converter.decode(list(action.args), [kind])
        except Exception:  # undecodable here (no key ring, another version): shown without its text
            return
        if isinstance(value, ScheduledMessage):
            info.message = value.text[:PREVIEW_CHARS]
        elif isinstance(value, AgentInput):
            info.task = value.task[:PREVIEW_CHARS]


def _validated(fields: dict[str, Any]) -> AgentInput:
    try:
        return AgentInput.model_validate(fields)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "input"
        raise InvalidSchedule(f"bad run input: {where}: {first['msg']}") from None


def _details(memo: Mapping[str, Any]) -> Mapping[str, Any] | None:
    value = memo.get(MEMO_KEY)
    return value if isinstance(value, Mapping) else None


def _note(note: str, default: str) -> str:
    if len(note) > MAX_NOTE_CHARS:
        raise InvalidSchedule(f"the note is {len(note):,} characters; at most {MAX_NOTE_CHARS:,}")
    return note or default


def _iso(at: datetime | None) -> str:
    return at.isoformat() if at is not None else ""


def _run(result: ScheduleActionResult) -> ScheduleRun:
    action = result.action
    workflow_id, run_id = "", ""
    if isinstance(action, ScheduleActionExecutionStartWorkflow):
        workflow_id, run_id = action.workflow_id, action.first_execution_run_id
    return ScheduleRun(
        workflow_id=workflow_id,
        run_id=run_id,
        scheduled_at=_iso(result.scheduled_at),
        started_at=_iso(result.started_at),
    )


__all__ = [
    "InvalidSchedule",
    "ScheduleExists",
    "ScheduleInfo",
    "ScheduleMethods",
    "ScheduleNotFound",
    "ScheduleRun",
    "check_cron",
    "check_name",
    "schedule_id",
]
