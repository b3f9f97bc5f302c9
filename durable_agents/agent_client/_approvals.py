"""The approvals half of ``AgentClient``: what runs wait for, and deciding it (signed when a key is set).

Each entry is as the run that waits for it lists it: every run of a tree is asked for its own
(``_owners``); what a parent relays from its sub-agents is never shown, signed or sent as such.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from temporalio.client import (
    RPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError

import durable_agents.agent_client._listing as _listing
from durable_agents.agent_client._base import RunReader
from durable_agents.agent_client._decisions import decide_request, send_decision, signature_of
from durable_agents.agent_client._errors import (
    AgentClientError,
    DecisionRefused,
    InvalidRequest,
    RunNotOpen,
)
from durable_agents.agent_client._owners import owned, tree, unconfirmed
from durable_agents.agent_client._reading import (
    QUERY_TIMEOUT,
    bounded,
    no_worker_line,
    poller_count,
    raise_if_cancelled,
    start_worker_hint,
)
from durable_agents.agent_client._types import (
    Decision,
    PendingItem,
    PendingPage,
)
from workflows.approvals import DECISIONS
from workflows.progress import PENDING_APPROVALS
from workflows.types import DecisionKind, PendingApproval, StatusView

Resolution = Literal["retry", "mark_done", "fail"]


class Approvals(RunReader):
    """Pending approvals and decisions (see :class:`AgentClient`)."""

    # --- approvals ----------------------------------------------------------------------

    async def pending(
        self, workflow_id: str | None = None, *, limit: int = 100, page_token: str = ""
    ) -> tuple[list[PendingItem], str]:
        """Pending approvals and questions of one run (and its sub-agents) or of all open runs;
        the second value is the next page's token ("" when there is none).

        Each entry is as the run that waits for it lists it (``workflow_id``: the run to decide it on);
        what a parent relays from its sub-agents is never trusted as such.

        >>> items, token = await agents.pending()
        >>> for item in items: print(item.workflow_id, item.approval_id, item.tool, item.args)
        >>> more, _ = await agents.pending(page_token=token) if token else ([], "")
        """
        page = await self.pending_page(workflow_id, limit=limit, page_token=page_token)
        return page.items, page.next_page_token

    async def pending_page(
        self, workflow_id: str | None = None, *, limit: int = 100, page_token: str = "", note_fallback: bool = True
    ) -> PendingPage:
        """:meth:`pending` with what a front end says about the rest (more runs waiting, runs unanswered).

        Warnings (a run no worker answers for, a queue nobody polls, a namespace without the
        ``AgentPendingApprovals`` attribute unless ``note_fallback`` is false) go to ``warn``.
        """
        page = PendingPage(items=[])
        if workflow_id:
            page.state, view = await self.running_view(workflow_id)
            views: list[tuple[str, StatusView | None]] = [(workflow_id, view)]
        else:
            offset = _offset(page_token)
            views, page.more = await self._waiting_views(limit, offset, note_fallback=note_fallback)
            page.unanswered = sum(1 for _, view in views if view is None)
            if page.more:
                page.next_page_token = str(offset + limit)
        found: dict[tuple[str, str], PendingItem] = {}
        asked: set[str] = set()
        for wid, view in views:
            if view is None or wid in asked:  # a sub-agent the search attribute listed too: once
                continue
            runs = await tree(self.client, wid, view, self.warn)
            asked.update(run_id for run_id, _ in runs)
            mine = owned(runs, wid)
            for key, entry in mine.items():
                found.setdefault(key, _item(entry.workflow_id, entry.approval, entry.via))
            for warning in unconfirmed(runs, mine):
                self.warn(warning)
        page.items = list(found.values())
        return page

    async def _waiting_views(
        self, limit: int, offset: int, *, note_fallback: bool
    ) -> tuple[list[tuple[str, StatusView | None]], int]:
        """The status of ``limit`` runs that wait (after the first ``offset``), and how many more wait.

        Runs on a task queue no worker polls are not asked, but counted. Without the search attribute
        every running run is asked (the only way to tell) and the first ``limit`` that wait are kept.
        """
        waiting = await _listing.waiting_runs(self.client, limit, self.tenant, offset)
        runs = waiting.runs
        if not waiting.by_attribute:
            if note_fallback:
                self.warn(
                    f"note: the namespace has no {PENDING_APPROVALS.name} search attribute, so every running run "
                    f"({len(runs)}) is asked (register the Agent* attributes: see docs/operations.md)"
                )
            if self.tenant is not None:
                runs = [wf for wf, mine in zip(runs, await self._visible(runs), strict=True) if mine]
        queues = sorted({wf.task_queue for wf in runs})
        counts = await asyncio.gather(*(poller_count(self.client, queue) for queue in queues))
        pollers = dict(zip(queues, counts, strict=True))
        asked = [wf for wf in runs if pollers[wf.task_queue] != 0]
        for queue in queues:
            if pollers[queue] == 0:
                count = sum(1 for wf in runs if wf.task_queue == queue)
                what = "wait(s) for approvals" if waiting.by_attribute else "may wait for approvals"
                self.warn(
                    f"warning: {count} run(s) on task queue {queue} {what}, but {no_worker_line(queue)} "
                    f"to show them ({start_worker_hint(queue)})"
                )
        views_found = await bounded(
            (_listing.listed_view(self.client, wf, self.warn) for wf in asked), _listing.QUERY_CONCURRENCY
        )
        views = [(wf.id, view) for wf, view in zip(asked, views_found, strict=True)]
        if waiting.by_attribute:
            return views, max(waiting.total - offset - len(runs), 0)
        waits: list[tuple[str, StatusView | None]] = [
            (wid, view) for wid, view in views if view and view.pending_approvals
        ]
        unanswered: list[tuple[str, StatusView | None]] = [(wid, view) for wid, view in views if view is None]
        return waits[offset : offset + limit] + unanswered, max(len(waits) - offset - limit, 0)

    async def _visible(self, runs: list[Any]) -> list[bool]:
        async def mine(wf: Any) -> bool:
            try:
                return await self._is_mine(await self.client.get_workflow_handle(wf.id).describe())
            except (RPCError, RPCTimeoutOrCancelledError):
                raise_if_cancelled()
                return False

        return await bounded((mine(wf) for wf in runs), _listing.QUERY_CONCURRENCY)

    async def find_approval(
        self, workflow_id: str, approval_id: str = "", *, decision: DecisionKind = "approve"
    ) -> PendingItem | None:
        """The pending entry ``approval_id`` of the run's tree, as its owner lists it (``approval_id`` ""
        : the one entry that takes ``decision``); None when no run of the tree waits for that id.

        ``RunNotOpen`` when the run is not running, ``DecisionRefused`` when the run lists the id as
        a sub-agent's that does not (a forged or out-of-date report), ``AgentClientError`` when no
        entry, or more than one, takes ``decision`` and no id was given.
        """
        # A decision waits longer than a glance at the status: a worker that just restarted replays the run
        # first. With no worker polling at all, the answer still comes at once.
        state, view = await self.running_view(workflow_id, query_timeout=QUERY_TIMEOUT)
        if view is None:
            raise RunNotOpen(f"run {workflow_id} is not running ({state}); there is nothing to {decision}", state=state)
        # Each run of the tree is asked for its own approvals: what a parent relays is never signed.
        runs = await tree(self.client, workflow_id, view, self.warn)
        pending = {key[1]: entry for key, entry in reversed(owned(runs, workflow_id).items())}
        takes = {aid: e for aid, e in pending.items() if decision in DECISIONS.get(e.approval.kind, ())}
        if not approval_id:
            if not takes:
                raise AgentClientError(
                    f"run {workflow_id} has no pending approvals" + (" to " + decision if pending else "")
                )
            if len(takes) > 1:
                raise AgentClientError(
                    f"run {workflow_id} has {len(takes)} pending approvals; name one of: {', '.join(takes)}"
                )
            approval_id = next(iter(takes))
        found = pending.get(approval_id)
        if found is not None:
            return _item(found.workflow_id, found.approval, found.via)
        relayed = {a.approval_id: a.workflow_id for a in view.pending_approvals if a.workflow_id}
        if approval_id in relayed:
            raise DecisionRefused(
                f"refused: run {relayed[approval_id]} does not wait for approval {approval_id} (run {workflow_id} "
                "lists it as that run's: a forged or out-of-date report); nothing was signed or sent"
            )
        return None

    async def decide(
        self,
        workflow_id: str,
        approval_id: str,
        decision: Decision,
        *,
        reviewer: str,
        comment: str = "",
        reason: str = "",
        arguments: dict[str, Any] | None = None,
        text: str = "",
        remember: str = "",
        edit: dict[str, Any] | None = None,
        resolution: Resolution | None = None,
        approval: PendingItem | None = None,
    ) -> str:
        """Decide an approval (``arguments``: approve an edited call; ``text``: answer a question).
        Answers what took effect in one line; ``DecisionRefused`` when the run refused it.

        The decision goes to the run of ``workflow_id``'s tree that waits for ``approval_id`` (``""``:
        the one entry that takes it). ``edit``: top-level keys set over the call's arguments (or an
        earlier reviewer's edit) instead of whole ``arguments``. ``decision="resolve"`` answers an
        unknown outcome as ``resolution`` (``retry``, ``mark_done`` or ``fail``). ``approval``: the
        entry as :meth:`find_approval` answered it (else it is looked up). Signed with ``approval_key``.

        >>> await agents.decide("readme-1", "ap_3f2a", "approve", reviewer="alice")
        >>> await agents.decide("readme-1", "ap_3f2a", "reject", reviewer="alice", reason="wrong account")
        >>> await agents.decide("readme-1", "q_1", "answer", reviewer="alice", text="use staging")
        """
        kind = _kind(decision, resolution)
        note = comment or reason
        reviewer = reviewer.strip()
        if not reviewer:
            raise InvalidRequest("the reviewer must name who decides")
        if kind == "reject" and not note.strip():
            raise InvalidRequest("a rejection needs a reason (the model is told why)")
        decide_request(  # bad input is refused before asking anything
            approval_id or "ap_0", kind, reviewer, note, "", text=text, arguments=arguments or edit, remember=remember
        )
        if approval is None:
            approval = await self.find_approval(workflow_id, approval_id, decision=kind)
        elif self.tenant is not None:  # an entry the caller made: its run must be this tenant's too
            await self.run(approval.workflow_id or workflow_id)
        owner = approval.workflow_id if approval is not None else workflow_id
        approval_id = approval.approval_id if approval is not None else approval_id
        if edit is not None and arguments is None:
            base = approval.edited_args if approval is not None and approval.edited_args is not None else None
            arguments = {**(base if base is not None else approval.args if approval is not None else {}), **edit}
        signature = signature_of(
            self.approval_key,
            approval_id,
            kind,
            reviewer,
            approval.expires_at if approval is not None else "",
            arguments=arguments,
            text=text,
            remember=remember,
        )
        request = decide_request(
            approval_id, kind, reviewer, note, signature, text=text, arguments=arguments, remember=remember
        )
        return await send_decision(self.client, owner, request)


def _item(owner: str, approval: PendingApproval, via: str = "") -> PendingItem:
    return PendingItem.model_validate({**approval.model_dump(), "workflow_id": owner, "via": via})


def _kind(decision: Decision, resolution: Resolution | None) -> DecisionKind:
    if decision == "resolve":
        if resolution is None:
            raise InvalidRequest("resolve needs a resolution: retry, mark_done or fail")
        return resolution
    return decision


def _offset(page_token: str) -> int:
    if not page_token:
        return 0
    if not page_token.isdigit() or len(page_token) > 12:
        raise InvalidRequest(f"not a page token: {page_token[:40]!r}")
    return int(page_token)
