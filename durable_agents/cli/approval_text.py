"""How the approval commands show an approval: one header line, then the call (``workflows.call_view``).

A question (``ask_human``) shows its text and options instead of the call; an approval a quorum
decides shows who approved it so far (``approved 1/2 by alice``) and the call as they approved it.
"""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime
from typing import Any

from durable_agents.cli.common import cli_command
from durable_agents.cli.owners import Owned
from workflows.call_view import args_digest, call_head, call_lines, visible
from workflows.identity import canonical_json
from workflows.types import DecisionRecord, PendingApproval, RememberedApproval


def time_left(expires_at: str, now: datetime | None = None) -> str:
    """``23h59m``, ``4m10s``, ``2d03h`` or ``expired``."""
    try:
        expiry = datetime.fromisoformat(expires_at)
    except ValueError:
        return "?"
    if expiry.tzinfo is None:
        expiry = expiry.replace(tzinfo=UTC)
    seconds = int((expiry - (now or datetime.now(UTC))).total_seconds())
    if seconds <= 0:
        return "expired"
    hours, rest = divmod(seconds, 3600)
    if hours >= 48:
        return f"{hours // 24}d{hours % 24:02d}h"
    if hours:
        return f"{hours}h{rest // 60:02d}m"
    return f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{rest}s"


def who_decides(approval: PendingApproval) -> str:
    return ", ".join(approval.reviewers) or "anyone"


def question_lines(approval: PendingApproval) -> list[str]:
    """A question as a person reads it before answering: its text, then its options (numbered)."""
    lines = [f"asks: {line}" if i == 0 else f"      {line}" for i, line in enumerate(_visible_lines(approval.question))]
    if approval.options:
        offered = "  ".join(f"{i}) {visible(option)}" for i, option in enumerate(approval.options, 1))
        free = "free text allowed" if approval.allow_free_text else "only these: free text not allowed"
        lines.append(f"options: {offered}  ({free})")
    else:
        lines.append("options: none (answer in free text)")
    return lines


def _visible_lines(text: str) -> list[str]:
    return [visible(line) for line in text.splitlines()] or [""]


def what_waits(approval: PendingApproval) -> list[str]:
    """The lines under an approval's header: the question, or the call (as approved so far) and its quorum."""
    if approval.kind == "question":
        return question_lines(approval)
    lines: list[str] = []
    if approval.approvals_required > 1:
        who = ", ".join(approval.approved_by) or "nobody yet"
        lines.append(f"approved {len(approval.approved_by)}/{approval.approvals_required} by {who}")
    if approval.edited_args is not None:
        lines.append("the call as edited by the approvals so far (the model asked for another):")
        return lines + call_lines(approval.tool, approval.edited_args)
    return lines + call_lines(approval.tool, approval.args)


def approval_summary(approval: PendingApproval) -> list[str]:
    """For ``status``: id, rule, who may decide, time left; then the call (``workflows.call_view``).

    An entry a sub-agent reported says so: ``pending`` and ``approve`` show that run's own entry.
    """
    relayed = f"  reported by sub-agent run {approval.workflow_id} (unverified)" if approval.workflow_id else ""
    kind = "  question" if approval.kind == "question" else ""
    head = (
        f"{approval.approval_id}{kind}  rule={approval.rule or '-'}  by={who_decides(approval)}  "
        f"left={time_left(approval.expires_at)}{relayed}"
    )
    return [head, *(f"  {line}" for line in what_waits(approval))]


def deciding(decision: str, owned: Owned) -> str:
    """What ``approve`` / ``reject`` print before they sign: the whole call, as its own run lists it."""
    approval = owned.approval
    via = f" (a sub-agent of {owned.via})" if owned.via else ""
    return "\n".join(
        [
            f"{decision} {approval.approval_id} of run {owned.workflow_id}{via}, step {approval.step}, "
            f"rule {approval.rule or '-'}, expires {approval.expires_at}:",
            *(f"    {line}" for line in what_waits(approval)),
        ]
    )


def edited_lines(approval: PendingApproval, edit: dict[str, Any]) -> list[str]:
    """What ``approve --edit`` prints before it signs: the call as it will run, and which arguments changed."""
    base = approval.edited_args if approval.edited_args is not None else approval.args
    merged = {**base, **edit}
    changed = sorted(key for key in edit if base.get(key) != edit[key]) or ["nothing"]
    return [
        f"  edited ({', '.join(visible(key) for key in changed)} changed); the call to run:",
        *(f"    {line}" for line in call_lines(approval.tool, merged)),
    ]


def pending_row(owned: Owned) -> dict[str, Any]:
    """One pending approval, as its own run lists it; a sub-agent's names the run it was found under."""
    row = {**owned.approval.model_dump(), "workflow_id": owned.workflow_id}
    if owned.via:
        row["via"] = owned.via
    return {**row, "time_left": time_left(owned.approval.expires_at), "args_sha256": args_digest(owned.approval.args)}


def pending_lines(row: dict[str, Any]) -> list[str]:
    """A run's approval for ``pending``: run, id, rule, who, time left; then the call (or the question), indented.

    A tool call ends with what a rejection does (its reason reaches the model), a question with how to answer it.
    """
    approval = PendingApproval.model_validate(row)
    who = who_decides(approval)
    via = f"  (sub-agent of {row['via']})" if "via" in row else ""
    kind = "  question" if approval.kind == "question" else ""
    head = (
        f"{row['workflow_id']}  {approval.approval_id}{kind}  rule={approval.rule or '-'}  by={who}  "
        f"left={row['time_left']}"
    )
    lines = [head + via, *(f"    {line}" for line in what_waits(approval))]
    run = shlex.quote(row["via"] if "via" in row else row["workflow_id"])
    if approval.kind == "question":
        lines.append(f"    answer: {cli_command(f'answer {run} {approval.approval_id} TEXT')}")
    elif approval.kind == "tool_call":
        lines.append(
            "    hint: the --reason given with reject reaches the model; approve --edit JSON runs the call changed"
        )
    return lines


def decide_commands(workflow_id: str, approval_id: str, reviewer: str) -> tuple[str, str, str]:
    """Shell commands deciding ``approval_id``: the starter's approve (signed when so configured),
    Temporal's approve signal, and the starter's reject (its reason left to fill in)."""
    run, who = shlex.quote(workflow_id), shlex.quote(reviewer)
    signal_input = shlex.quote(json.dumps({"approval_id": approval_id, "reviewer": reviewer}))
    return (
        cli_command(f"approve {run} {approval_id} --reviewer {who}"),
        f"temporal workflow signal --workflow-id {run} --name approve --input {signal_input}",
        cli_command(f"reject {run} {approval_id} --reviewer {who} --reason '...'"),
    )


# --- the audit (``status``) ----------------------------------------------------------------

AUDIT_VALUE_CHARS = 200  # of a comment or an edit in one audit line


def when(at: str) -> str:
    """An ISO 8601 time as local ``YYYY-MM-DD HH:MM:SS`` (as given when it does not parse)."""
    try:
        moment = datetime.fromisoformat(at)
    except ValueError:
        return at or "-"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _bounded(text: str) -> str:
    text = visible(" ".join(text.split()))
    return text if len(text) <= AUDIT_VALUE_CHARS else text[: AUDIT_VALUE_CHARS - 1] + "…"


def decision_line(record: DecisionRecord) -> str:
    """One decision of the audit: when, which approval (or question), the tool, what, who, and what it carried."""
    parts = [when(record.at), record.approval_id or "-", record.tool or record.kind or "-", record.decision or "-"]
    if record.reviewer:
        parts.append(f"by {visible(record.reviewer)}")
    if record.step:
        parts.append(f"step {record.step}")
    if record.comment:
        label = "answer" if record.decision == "answered" else "comment"
        parts.append(f"{label}: {json.dumps(_bounded(record.comment), ensure_ascii=False)}")
    if record.edits is not None:
        parts.append(f"edited to: {_bounded(canonical_json(record.edits))}")
    if record.remember:
        parts.append(f"remember: {_bounded(record.remember)}")
    return "  ".join(parts)


def remembered_line(entry: RememberedApproval) -> str:
    """One remembered approval: which calls it approves, who approved it, from which decision."""
    if entry.scope == "tool":
        what = f"every {visible(entry.tool)} call"
    else:
        args = entry.args or {}
        what = f"calls identical to {call_head(entry.tool, args)} (arguments sha256 {args_digest(args)})"
    return f"{what}  by {visible(entry.reviewer) or '-'}  from {entry.approval_id or '-'} at {when(entry.at)}"
