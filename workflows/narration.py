"""How a run describes itself to people: activity summaries, current details, tool error texts.

Pure functions of workflow state, safe to call from workflow code.
"""

from __future__ import annotations

import json
from typing import Any

from temporalio.exceptions import ActivityError

from workflows.call_view import call_lines
from workflows.identity import canonical_json
from workflows.types import Message, PendingApproval, StatusView, ToolCall

DETAILS_WIDTH = 100  # the Temporal UI scrolls a code block's long lines out of view: wrapped at this width
EDIT_NOTE_CHARS = 2000  # of the edited arguments the model is shown
EXCHANGE_PREVIEW = 600  # characters of a session's last message and reply in its current details


def cause_text(err: BaseException) -> str:
    """The innermost readable message of an activity failure."""
    cause: BaseException | None = err
    while isinstance(cause, ActivityError) and cause.cause is not None:
        cause = cause.cause
    return str(cause) if cause is not None else str(err)


def tool_error(call: ToolCall, text: str) -> Message:
    return Message(role="tool", content=text, tool_call_id=call.id, name=call.name, is_error=True)


def tool_summary(call: ToolCall) -> str:
    args = call.arguments
    if call.mcp is not None:
        return f"mcp {call.mcp.server}.{call.mcp.tool}"[:120]
    if call.name == "http_request":
        url = str(args.get("url", ""))
        return f"http_request {str(args.get('method', '')).upper()} {url.split('://', 1)[-1][:80]}"
    if call.name in ("write_file", "read_file"):
        return f"{call.name} {str(args.get('path', ''))[:80]}"
    if call.name == "run_python":
        return f"run_python · {str(args.get('code', '')).count(chr(10)) + 1} lines"
    if call.name == "run_shell":
        return f"run_shell {str(args.get('command', ''))[:80]}"
    return f"{call.name} {canonical_json(args)[:80]}"


def details_markdown(workflow_id: str, view: StatusView, recent_refusals: list[str]) -> str:
    """The workflow's current details in the Temporal UI (markdown)."""
    usage = view.usage
    lines = [
        f"**state** {view.state} · **step** {view.step} · **model** {view.model}",
        "",
        f"**last** {view.last_event}",
        "",
        f"**usage** {usage.input_tokens} in / {usage.output_tokens} out tokens · ${usage.cost_usd:.4f}",
    ]
    if view.session:  # the last exchange, as indented blocks (nothing in a message can close them)
        lines += [
            "",
            f"**session** {view.messages} message(s) · {view.replied} answered · {view.queued} queued · "
            f"last message {view.last_message_at or 'none yet'}",
        ]
        for label, text in (("last message", view.last_message), ("last reply", view.output)):
            if text:
                lines += ["", f"**{label}**", "", *(f"    {line}" for line in _wrapped(text, EXCHANGE_PREVIEW))]
    for approval in view.pending_approvals:
        verbs = "approve|reject" if approval.kind == "tool_call" else "resolve --as retry|mark_done|fail"
        owner = approval.workflow_id or workflow_id
        relayed = f" · reported by sub-agent run `{owner}` (its own status shows it)" if owner != workflow_id else ""
        if approval.kind == "question":
            lines += _question_lines(owner, approval, relayed)
            continue
        quorum = (
            f" · approved {len(approval.approved_by)}/{approval.approvals_required}"
            + (f" by {', '.join(approval.approved_by)}" if approval.approved_by else "")
            if approval.approvals_required > 1
            else ""
        )
        lines += [
            "",
            f"**waiting for approval** `{approval.approval_id}` · rule {approval.rule} · "
            f"expires {approval.expires_at}{quorum}{relayed}",
            "",
            # an indented code block: nothing in the call can close it, and long lines are wrapped
            *(f"    {line}" for line in call_lines(approval.tool, approval.args, width=DETAILS_WIDTH)),
            "",
            # read in the Temporal UI, not in a shell the workflow knows: the installed console script
            f"`durable-agents {verbs.split('|')[0]} {owner} {approval.approval_id} --reviewer NAME`"
            + (f" (or {verbs})" if approval.kind == "tool_call" else f" ({verbs})"),
        ]
    for refusal in recent_refusals:
        lines += ["", f"**refused** {refusal}"]
    return "\n".join(lines)


def _question_lines(owner: str, question: PendingApproval, relayed: str) -> list[str]:
    """A pending ``ask_human`` question: the question, its options, and the command that answers it."""
    offered = [f"    {n}. {option}" for n, option in enumerate(question.options, start=1)]
    free = "any answer" if question.allow_free_text else "one of the options"
    return [
        "",
        f"**waiting for an answer** `{question.approval_id}` · expires {question.expires_at}{relayed}",
        "",
        *(f"    {line}" for line in _wrapped(question.question, 2000)),
        *(["", *offered] if offered else []),
        "",
        f'`durable-agents answer {owner} {question.approval_id} "TEXT"` ({free})',
    ]


def _wrapped(text: str, limit: int) -> list[str]:
    """``text`` cut to ``limit`` characters, as lines of at most ``DETAILS_WIDTH``."""
    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    lines: list[str] = []
    for line in cut.splitlines() or [""]:
        lines += [line[i : i + DETAILS_WIDTH] for i in range(0, max(len(line), 1), DETAILS_WIDTH)]
    return lines[:20]


def edit_note(reviewer: str, original: dict[str, Any], edited: dict[str, Any]) -> str:
    """What the model reads before the result of a call a reviewer changed: who, and which arguments."""
    changed = sorted(k for k in {*original, *edited} if original.get(k) != edited.get(k))
    shown = json.dumps({k: edited.get(k) for k in changed}, sort_keys=True, default=str)
    if len(shown) > EDIT_NOTE_CHARS:
        shown = shown[: EDIT_NOTE_CHARS - 1] + "…"
    return (
        f"Note: a reviewer ({reviewer}) changed this call's arguments before it ran; it ran with "
        f"{', '.join(changed) or 'the same arguments'} set to {shown}."
    )
