"""The approvals side of ``AgentWorkflow``: its signals and update, sub-agents' reports, and refusals.

Mixed into :class:`workflows.agent.AgentWorkflow`, which holds the state named below (set in its
``__init__``) and its ``_emit``. ``approve``, ``reject`` and ``resolve`` (signals) and ``decide`` (an
update) share one semantics, :meth:`ApprovalHandlers._decide`; ``child_approvals`` is a sub-agent's
report of what waits in its part of the tree. Whatever cannot be decoded or is not allowed is refused:
counted and listed in the status view, logged and streamed within bounds (:meth:`ApprovalHandlers._refuse`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.approvals import ALREADY_DECIDED, ApprovalBook, Outcome, Problem, Verdict
    from workflows.identity import signed_extras
    from workflows.inputs import NO_PAYLOAD, decode, one_payload, quote, safe
    from workflows.policy import Decision
    from workflows.progress import PUBLISH_SIGNAL, EventKind
    from workflows.types import (
        MAX_CHILD_APPROVALS,
        AnswerSignal,
        ApproveSignal,
        ChildApprovalsSignal,
        DecideRequest,
        DecideResult,
        DecisionRecord,
        EditCheck,
        EditChecked,
        ForgetApprovalsSignal,
        PendingApproval,
        RejectSignal,
        RememberedApproval,
        ResolveSignal,
        SignatureCheck,
        ToolCall,
    )

# What arrives from outside (signals, the update) is handed over raw and decoded by
# ``workflows.inputs.decode`` (see ``workflows.agent``); callers still see the contract's models.
if TYPE_CHECKING:
    ApproveInput = ApproveSignal | RawValue
    RejectInput = RejectSignal | RawValue
    ResolveInput = ResolveSignal | RawValue
    DecideInput = DecideRequest | RawValue
    ChildApprovalsInput = ChildApprovalsSignal | RawValue
    AnswerInput = AnswerSignal | RawValue
    ForgetInput = ForgetApprovalsSignal | RawValue
else:
    ApproveInput = RejectInput = ResolveInput = DecideInput = ChildApprovalsInput = RawValue
    AnswerInput = ForgetInput = RawValue

# Refusals are all counted and the last 20 listed in the status view; the progress stream gets
# the first REFUSAL_EVENTS of them, then one summary every REFUSAL_EVENT_EVERY, so that a flood
# of junk signals cannot push a run's own events out of the stream.
REFUSAL_EVENTS = 20
REFUSAL_EVENT_EVERY = 100
REFUSAL_LINES_PER_TASK = 5  # log lines of refusals one activation writes at most (the status counts them all)

# A decision signal can arrive in the same workflow task as the model turn that opens its approval (a
# reviewer who saw the approval in a query answered before that task was completed, then the worker was
# lost): the SDK runs signal handlers before it resolves the turn's activity, so the approval is not open
# yet. Such a decision is refused as unknown and kept; if the approval opens in that same task, it is
# decided again then. A decision for an approval that opens in a later task is never taken.
EARLY_DECISION_PATCH = "early-decision-signal-v1"
EARLY_KEPT = 20

# The run's housekeeping activities (signature checks here; transcript, compensation, cleanup in the loop).
HOUSEKEEPING_TIMEOUT = timedelta(seconds=30)
HOUSEKEEPING_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=5)


class ApprovalHandlers:
    """Signal and update handlers of ``AgentWorkflow``, over the state its ``__init__`` sets."""

    _book: ApprovalBook
    _refusal_lines: int  # refusal log lines this activation wrote (see ``_refuse``)
    _child_ids: set[str]  # the children started (only they may report approvals)
    _live_children: set[str]  # started and not ended
    _child_pending: dict[str, tuple[int, list[PendingApproval]]]  # what each child reported waiting
    _reported: list[tuple[str, str]]  # what this run last told its own parent
    _report_seq: int
    _reports: set[asyncio.Future[None]]
    _child_reports_on: bool  # started by an AgentWorkflow: reports to its parent
    _early: list[tuple[datetime, DecideRequest]]  # unknown-id signal decisions, with the task time they came at
    _early_tasks: set[asyncio.Task[DecideResult]]

    def _emit(self, kind: EventKind, text: str, tool: str = "", **data: object) -> None:
        raise NotImplementedError  # AgentWorkflow's: one progress event

    # --- approvals: three signals and one update, one semantics ------------------------
    # Anyone who can signal the run can send anything: each handler takes the raw payload,
    # refuses what does not decode (one log line, counted in the status view) and bounds what
    # it keeps.

    @workflow.signal(name="approve")
    @one_payload
    async def approve(self, raw: ApproveInput = NO_PAYLOAD, *extra: Any) -> None:
        decision = decode(raw, ApproveSignal, extra)
        if isinstance(decision, str):
            self._refuse("malformed", f"refused approve signal: {decision}")
            return
        await self._decide(DecideRequest(decision="approve", **decision.model_dump()), source="signal")

    @workflow.signal(name="reject")
    @one_payload
    async def reject(self, raw: RejectInput = NO_PAYLOAD, *extra: Any) -> None:
        decision = decode(raw, RejectSignal, extra)
        if isinstance(decision, str):
            self._refuse("malformed", f"refused reject signal: {decision}")
            return
        fields = decision.model_dump()
        fields["comment"] = fields.pop("reason")
        await self._decide(DecideRequest(decision="reject", **fields), source="signal")

    @workflow.signal(name="resolve")
    @one_payload
    async def resolve(self, raw: ResolveInput = NO_PAYLOAD, *extra: Any) -> None:
        decision = decode(raw, ResolveSignal, extra)
        if isinstance(decision, str):
            self._refuse("malformed", f"refused resolve signal: {decision}")
            return
        fields = decision.model_dump()
        await self._decide(DecideRequest(decision=fields.pop("resolution"), **fields), source="signal")

    @workflow.signal(name="answer")
    @one_payload
    async def answer(self, raw: AnswerInput = NO_PAYLOAD, *extra: Any) -> None:
        decision = decode(raw, AnswerSignal, extra)
        if isinstance(decision, str):
            self._refuse("malformed", f"refused answer signal: {decision}")
            return
        fields = decision.model_dump()
        await self._decide(
            DecideRequest(decision="answer", approval_id=fields.pop("question_id"), **fields), source="signal"
        )

    @workflow.signal(name="forget_approvals")
    @one_payload
    def forget_approvals(self, raw: ForgetInput = NO_PAYLOAD, *extra: Any) -> None:
        request = decode(raw, ForgetApprovalsSignal, extra)
        if isinstance(request, str):
            self._refuse("malformed", f"refused forget_approvals signal: {request}")
            return
        forgotten = self._book.forget()
        who = quote(request.reviewer) if request.reviewer else "someone"
        self._book.audit(
            DecisionRecord(
                approval_id="", kind="remembered", decision="forgotten", reviewer=request.reviewer,
                at=workflow.now().isoformat(), comment=f"{forgotten} remembered approval(s) forgotten",
            )
        )  # fmt: skip
        self._emit("approval_decided", f"{who} cleared {forgotten} remembered approval(s)")

    @workflow.signal(name="child_approvals")
    @one_payload
    def child_approvals(self, raw: ChildApprovalsInput = NO_PAYLOAD, *extra: Any) -> None:
        """A sub-agent says what waits in its part of the tree: a hint for people, never a decision's basis.

        A signal names no sender, so anyone may send this one, naming any live child (child ids
        are predictable). Nothing here is trusted for a decision: ``approve`` / ``reject`` ask
        the run that owns an approval for its own entry (``durable_agents.cli.owners``), and
        ``pending`` asks every run of the tree (the sub-agents a run started are in its status,
        ``subagents``, from its own state). What this run keeps is bounded and shown as relayed:

        - a report naming any run outside the child's own subtree is refused and counted
          (``foreign_approval``): a genuine child never reports one;
        - the newest report to arrive wins. ``seq`` is not trusted to order them: a forged
          ``seq`` of 10**9 used to make the parent drop every later genuine report; now a
          forged report stands only until the child's next one.

        Asking the children from here instead (a doorbell signal, then an activity querying
        the child) would add commands to every parent's history for a view the readers that
        act on it can get themselves, and could still not prove who rang.
        """
        report = decode(raw, ChildApprovalsSignal, extra)
        if isinstance(report, str):
            self._refuse("malformed", f"refused child_approvals signal: {report}")
            return
        child_id = report.child_id
        if child_id not in self._child_ids:
            self._refuse("unknown_child", f"refused child_approvals signal: {quote(child_id)} is no child")
            return
        if child_id not in self._live_children:
            return  # it ended: nothing of it waits any more (a last report may arrive after the end)
        owners = [a.workflow_id or child_id for a in report.approvals]
        foreign = [o for o in owners if o != child_id and not o.startswith(f"{child_id}/")]
        if foreign:
            self._refuse(
                "foreign_approval",
                f"refused child_approvals signal from {quote(child_id)}: {len(foreign)} of its "
                f"{len(owners)} approvals name runs outside its subtree, e.g. {quote(foreign[0])}",
            )
            return
        approvals = [a.model_copy(update={"workflow_id": o}) for a, o in zip(report.approvals, owners, strict=True)]
        self._child_pending[child_id] = (report.seq, approvals)
        self._emit("approval_requested", f"sub-agent {child_id} reports {len(approvals)} waiting approval(s)")

    def _child_started(self, child_id: str) -> None:
        self._child_ids.add(child_id)
        self._live_children.add(child_id)

    def _child_ended(self, child_id: str) -> None:
        self._live_children.discard(child_id)
        if self._child_pending.pop(child_id, None) is not None:
            self._emit("approval_decided", f"sub-agent {child_id} ended; nothing of it waits any more")

    def _pending_in_tree(self) -> list[PendingApproval]:
        """This run's pending approvals (its own book: ``workflow_id`` empty), then what its sub-agents
        reported (each naming the run that waits for it: relayed, to be checked with that run)."""
        found = self._book.views()
        theirs = [a for child_id in sorted(self._child_pending) for a in self._child_pending[child_id][1]]
        return found + theirs[:MAX_CHILD_APPROVALS]

    def _report_to_parent(self, pending: list[PendingApproval]) -> None:
        """A sub-agent tells its parent when what waits in its part of the tree changed."""
        parent = workflow.info().parent
        if parent is None or not self._child_reports_on:
            return
        keys = [(a.workflow_id, a.approval_id) for a in pending]
        if keys == self._reported:
            return
        self._reported = keys
        self._report_seq += 1
        me = workflow.info().workflow_id
        report = ChildApprovalsSignal(
            child_id=me,
            seq=self._report_seq,
            approvals=[
                a.model_copy(update={"workflow_id": a.workflow_id or me, "args": _bounded_args(a.args)})
                for a in pending[:MAX_CHILD_APPROVALS]
            ],
        )
        task = asyncio.ensure_future(_signal_parent(parent.workflow_id, report))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    @workflow.signal(dynamic=True)
    def _unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        # Without this, the SDK would keep every signal of an unknown name in memory for good.
        if name == PUBLISH_SIGNAL:  # sent before the stream's handler was registered
            self._refuse_publish()
            return
        self._refuse(
            "unknown_signal",
            f"refused signal {quote(name)}: this run has only approve, reject, resolve, answer, "
            "forget_approvals, message and close",
        )

    @one_payload
    def _refuse_publish(self, raw: RawValue = NO_PAYLOAD, *extra: Any) -> None:
        self._refuse("stream_publish", "refused a progress stream publish from outside the run")

    @workflow.update(name="decide")
    @one_payload
    async def decide_update(self, raw: DecideInput = NO_PAYLOAD, *extra: Any) -> DecideResult:
        request = decode(raw, DecideRequest, extra)
        if isinstance(request, str):  # the validator refuses these; it is skipped only on replay
            raise ApplicationError(f"malformed decide request: {request}", type="DecisionRefused", non_retryable=True)
        return await self._decide(request, source="update")

    @decide_update.validator
    @one_payload
    def _validate_decide(self, raw: DecideInput = NO_PAYLOAD, *extra: Any) -> None:
        # Refused updates never reach history (so they cannot be counted); the caller gets the reason at once,
        # as a non-retryable failure: asking again cannot change the answer. A decision for an approval that
        # was already decided is not refused here: the handler answers it ``accepted: false`` (a reviewer who
        # lost a race, or a retried request, gets an answer rather than an error).
        request = decode(raw, DecideRequest, extra)
        if isinstance(request, str):
            workflow.logger.warning("refused decide update: %s", request)
            raise ApplicationError(f"malformed decide request: {request}", type="DecisionRefused", non_retryable=True)
        problem = self._book.problem(
            request.approval_id, request.decision, request.reviewer, request.signature, workflow.now()
        )
        problem = problem or self._content_problem(request)
        if problem is not None and problem.kind != ALREADY_DECIDED:
            workflow.logger.warning(
                "refused %s by %s via update: %s", request.decision, quote(request.reviewer), problem.text
            )
            raise ApplicationError(problem.text, type="DecisionRefused", non_retryable=True)

    async def _decide(self, request: DecideRequest, *, source: str) -> DecideResult:
        aid = request.approval_id
        book = self._book
        problem = book.problem(aid, request.decision, request.reviewer, request.signature, workflow.now())
        problem = problem or self._content_problem(request)
        edited: dict[str, Any] | None = None
        if problem is None and request.arguments is not None:
            edited, problem = await self._checked_edit(aid, request.arguments)
        if problem is None and book.signing_required:
            problem = await self._signature_problem(request, edited)
        # The book may have changed while an activity checked the edit or the signature.
        problem = problem or book.problem(aid, request.decision, request.reviewer, request.signature, workflow.now())
        if problem is not None:
            self._refuse(
                problem.kind,
                f"refused {request.decision} by {quote(request.reviewer)} via {source}: {problem.text}",
                approval_id=aid,
            )
            if problem.kind == "unknown_approval" and source == "signal":
                self._keep_early(request)
            if source == "update" and problem.kind != ALREADY_DECIDED:
                raise ApplicationError(problem.text, type="DecisionRefused", non_retryable=True)
            return DecideResult(accepted=False, message=problem.text)
        pending = book.pending[aid]
        reviewer = request.reviewer
        if request.decision == "approve":
            reached = book.count_approval(aid, reviewer, edited)
            counted = book.pending[aid]
            edited, reviewer = counted.edited_args, ", ".join(counted.approved_by)
            if not reached:
                progress = f"{len(counted.approved_by)}/{counted.approvals_required}"
                text = f"{aid} approved by {request.reviewer} ({progress}); waiting for more reviewers"
                self._audit(pending, "counted", request, edits=edited, comment=request.comment)
                self._emit(
                    "approval_counted", text, pending.tool, approval_id=aid,
                    approved=len(counted.approved_by), required=counted.approvals_required,
                )  # fmt: skip
                return DecideResult(accepted=True, message=text)
        outcome: Outcome = _OUTCOMES[request.decision]
        note = request.text if request.decision == "answer" else request.comment
        remembered = self._remember(pending, request, edited) if request.remember else ""
        book.record(aid, Verdict(outcome, reviewer, note, arguments=edited))
        self._audit(pending, outcome, request, edits=edited, comment=note, remember=remembered)
        workflow.logger.info("approval %s %s by %s via %s", aid, outcome, reviewer, source)
        text = f"{aid} {outcome} by {reviewer}"
        if edited is not None:
            text += " with edited arguments"
        if remembered:
            text += f"; {remembered}"
        kind: EventKind = "question_answered" if request.decision == "answer" else "approval_decided"
        self._emit(kind, text, pending.tool, approval_id=aid, outcome=outcome)
        return DecideResult(accepted=True, message=text)

    def _keep_early(self, request: DecideRequest) -> None:
        if workflow.patched(EARLY_DECISION_PATCH):
            self._early = [*self._early[-(EARLY_KEPT - 1) :], (workflow.now(), request)]

    def _take_early(self, approval_id: str) -> None:
        """Decide again what was kept for ``approval_id`` in this same task (``ApprovalBook.on_open``)."""
        now = workflow.now()
        taken = [request for at, request in self._early if at == now and request.approval_id == approval_id]
        self._early = [(at, request) for at, request in self._early if at == now and request.approval_id != approval_id]
        for request in taken:
            workflow.logger.info(
                "approval %s: deciding the %s that came in the task that opened it", approval_id, request.decision
            )
            task = asyncio.create_task(self._decide(request, source="signal"))
            self._early_tasks.add(task)
            task.add_done_callback(self._early_tasks.discard)

    def _content_problem(self, request: DecideRequest) -> Problem | None:
        """What the decision carries that its approval cannot take (checked once the approval is known)."""
        pending = self._book.pending.get(request.approval_id)
        if pending is None:
            return None
        if request.decision == "answer":
            return self._book.answer_problem(request.approval_id, request.text)
        if request.arguments is not None and (request.decision != "approve" or pending.kind != "tool_call"):
            return Problem("not_editable", "only an approve of a tool call can carry edited arguments")
        if request.remember and (request.decision != "approve" or pending.kind != "tool_call"):
            return Problem("not_rememberable", "only an approve of a tool call can be remembered")
        return None

    async def _checked_edit(self, aid: str, arguments: dict[str, Any]) -> tuple[dict[str, Any] | None, Problem | None]:
        """The edited arguments as the tool validates them, or why the edit is refused (the call stays pending)."""
        call = self._book.calls.get(aid)
        if call is None or call.mcp is not None:
            return None, Problem("not_editable", f"the call of approval {aid} cannot be edited")
        checked = await workflow.execute_local_activity(
            "check_edited_call",
            EditCheck(tool=call.name, arguments=arguments),
            result_type=EditChecked,
            start_to_close_timeout=HOUSEKEEPING_TIMEOUT,
            retry_policy=HOUSEKEEPING_RETRY,
        )
        if checked.error:
            return None, Problem("invalid_edit", checked.error)
        decision = self._policy_of(call.model_copy(update={"arguments": checked.arguments}))
        if decision.verdict == "deny":
            return None, Problem("edit_denied", f"policy denies the edited call (rule {decision.rule})")
        pending = self._book.pending[aid]
        if decision.approvals > pending.approvals_required:  # the edited call may need more reviewers
            self._book.pending[aid] = pending.model_copy(update={"approvals_required": decision.approvals})
        return checked.arguments, None

    def _remember(self, pending: PendingApproval, request: DecideRequest, edited: dict[str, Any] | None) -> str:
        """Remember the approval for later calls; the text says what was remembered or why it was not."""
        if request.remember == "tool" and not self._book.remember_tool_allowed.get(pending.approval_id, True):
            reason = f"remember tool refused: rule {pending.rule} does not let every {pending.tool} call be approved"
            self._refuse("remember_refused", f"{pending.approval_id}: {reason}", approval_id=pending.approval_id)
            return reason
        self._book.remember(
            RememberedApproval(
                tool=pending.tool,
                scope="tool" if request.remember == "tool" else "call",
                args=None if request.remember == "tool" else (edited if edited is not None else pending.args),
                reviewer=request.reviewer,
                approval_id=pending.approval_id,
                at=workflow.now().isoformat(),
            )
        )
        what = f"every later {pending.tool} call" if request.remember == "tool" else "identical calls"
        return f"remembered for {what}"

    def _audit(
        self,
        pending: PendingApproval,
        decision: str,
        request: DecideRequest,
        *,
        edits: dict[str, Any] | None = None,
        comment: str = "",
        remember: str = "",
    ) -> None:
        self._book.audit(
            DecisionRecord(
                approval_id=pending.approval_id,
                kind=pending.kind,
                tool=pending.tool,
                decision=decision,
                reviewer=request.reviewer,
                at=workflow.now().isoformat(),
                comment=comment,
                edits=edits,
                remember=remember,
                step=pending.step,
            )
        )

    def _policy_of(self, call: ToolCall) -> Decision:
        raise NotImplementedError  # AgentWorkflow's: the run's policy for one call

    def _refuse(self, kind: str, message: str, approval_id: str = "", event: EventKind = "decision_refused") -> None:
        """List and count the refusal; log it and tell the progress stream, both throttled.

        A constant cost whatever the flood: the server hands every signal that arrived meanwhile
        to one activation (a thousand, under load), which must finish within the SDK's 2 s
        deadlock limit. Logging each refusal was what broke it on a busy machine: every log line
        is a write that lets go of the GIL, and taking it back waits for the worker's other
        threads, so 500 lines cost seconds however little CPU they took. So the first
        ``REFUSAL_EVENTS`` refusals of a run get a line (and an event) each, then one line every
        ``REFUSAL_EVENT_EVERY`` (a count of the run's refusals, not of how the server batched
        them), and one activation writes at most ``REFUSAL_LINES_PER_TASK`` of those lines.
        """
        self._book.refuse(kind, message)
        total = self._book.refused_total
        data = {"approval_id": approval_id, "reason": kind} if approval_id else {"reason": kind}
        if total <= REFUSAL_EVENTS:
            self._log_refusal(message)
            self._emit(event, message, **data)
        elif total % REFUSAL_EVENT_EVERY == 0:
            summary = f"{total} signals and decisions refused so far (status counts each by reason); latest: {message}"
            self._log_refusal(summary)
            self._emit(event, summary, **data)

    def _log_refusal(self, line: str) -> None:
        if self._refusal_lines == 0:  # the first of this activation: count again from the next one on
            asyncio.get_running_loop().call_soon(self._reset_refusal_lines)
        self._refusal_lines += 1
        if self._refusal_lines <= REFUSAL_LINES_PER_TASK:
            workflow.logger.warning(line)

    def _reset_refusal_lines(self) -> None:
        self._refusal_lines = 0

    async def _signature_problem(self, request: DecideRequest, edited: dict[str, Any] | None) -> Problem | None:
        approval = self._book.pending[request.approval_id]
        check = SignatureCheck(
            approval_id=request.approval_id,
            decision=request.decision,
            reviewer=request.reviewer,
            expires_at=signed_expiry(request.signed_expires_at, approval.expires_at),
            signature=request.signature,
            # An edit is signed as the reviewer sent it; the tool's validation may only normalise it.
            covers=signed_extras(
                request.arguments if edited is not None else None, text=request.text, remember=request.remember
            ),
        )
        valid = await workflow.execute_local_activity(
            "verify_decision",
            check,
            result_type=bool,
            start_to_close_timeout=HOUSEKEEPING_TIMEOUT,
            retry_policy=HOUSEKEEPING_RETRY,
        )
        return None if valid else Problem("bad_signature", "the decision's signature does not verify")


SIGNED_EXPIRY_SLACK = timedelta(minutes=10)


def signed_expiry(signed: str, kept: str) -> str:
    """The expires_at to check a signature over: the one the signer says it signed when that is within
    ``SIGNED_EXPIRY_SLACK`` of the run's own (see ``workflows.types.SignedExpiry``), else the run's.

    The slack gives a signature no more reach than the approval's own id does: the id is a hash of the
    exact call, so a second ask of the same id within the slack asks for the same call again.
    """
    if not signed or signed == kept:
        return kept
    try:
        apart = abs(datetime.fromisoformat(signed) - datetime.fromisoformat(kept))
    except (ValueError, TypeError):  # unparsable, or one of them without a timezone
        return kept
    return signed if apart <= SIGNED_EXPIRY_SLACK else kept


REPORTED_ARGS_CHARS = 4000  # of one approval's arguments in a report to the parent (signals are size-limited)


def _bounded_args(args: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(args, sort_keys=True, default=str)
    if len(text) <= REPORTED_ARGS_CHARS:
        return args
    return {"_preview": safe(text, REPORTED_ARGS_CHARS), "_note": "arguments cut; see the sub-agent's own status"}


async def _signal_parent(parent_id: str, report: ChildApprovalsSignal) -> None:
    try:
        await workflow.get_external_workflow_handle(parent_id).signal("child_approvals", report)
    except Exception as err:  # the parent is gone: nobody to tell
        workflow.logger.warning("could not tell parent %s about pending approvals: %s", parent_id, err)


_OUTCOMES: dict[str, Outcome] = {
    "approve": "approved",
    "reject": "rejected",
    "retry": "retry",
    "mark_done": "mark_done",
    "fail": "fail",
    "answer": "answered",
}
