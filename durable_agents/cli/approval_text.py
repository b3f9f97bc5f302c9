"""How the approval commands show an approval: one header line, then the call (``workflows.call_view``)."""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime
from typing import Any

from durable_agents.cli.common import cli_command
from durable_agents.cli.owners import Owned
from workflows.call_view import args_digest, call_lines
from workflows.types import PendingApproval


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


def approval_summary(approval: PendingApproval) -> list[str]:
    """For ``status``: id, rule, who may decide, time left; then the call (``workflows.call_view``).

    An entry a sub-agent reported says so: ``pending`` and ``approve`` show that run's own entry.
    """
    relayed = f"  reported by sub-agent run {approval.workflow_id} (unverified)" if approval.workflow_id else ""
    head = (
        f"{approval.approval_id}  rule={approval.rule or '-'}  by={who_decides(approval)}  "
        f"left={time_left(approval.expires_at)}{relayed}"
    )
    return [head, *(f"  {line}" for line in call_lines(approval.tool, approval.args))]


def deciding(decision: str, owned: Owned) -> str:
    """What ``approve`` / ``reject`` print before they sign: the whole call, as its own run lists it."""
    approval = owned.approval
    via = f" (a sub-agent of {owned.via})" if owned.via else ""
    return "\n".join(
        [
            f"{decision} {approval.approval_id} of run {owned.workflow_id}{via}, step {approval.step}, "
            f"rule {approval.rule or '-'}, expires {approval.expires_at}:",
            *(f"    {line}" for line in call_lines(approval.tool, approval.args)),
        ]
    )


def pending_row(owned: Owned) -> dict[str, Any]:
    """One pending approval, as its own run lists it; a sub-agent's names the run it was found under."""
    row = {**owned.approval.model_dump(), "workflow_id": owned.workflow_id}
    if owned.via:
        row["via"] = owned.via
    return {**row, "time_left": time_left(owned.approval.expires_at), "args_sha256": args_digest(owned.approval.args)}


def pending_lines(row: dict[str, Any]) -> list[str]:
    """A run's approval for ``pending``: run, id, rule, who, time left; then the call, indented."""
    who = ", ".join(row["reviewers"]) or "anyone"
    via = f"  (sub-agent of {row['via']})" if "via" in row else ""
    head = f"{row['workflow_id']}  {row['approval_id']}  rule={row['rule'] or '-'}  by={who}  left={row['time_left']}"
    return [head + via, *(f"    {line}" for line in call_lines(row["tool"], row["args"]))]


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
