"""Run limits enforced by the workflow before every model turn (pure, deterministic)."""

from __future__ import annotations

from workflows.types import Carry, Limits


def deadline(limits: Limits, carry: Carry) -> float:
    """Epoch seconds by which the run must end.

    ``timeout_s`` bounds the run's own working time, measured from its first
    execution; time spent waiting for a human decision does not count (each
    approval has its own expiry), so a day-long approval wait does not kill a run. A session's
    ``timeout_s`` covers one message's work: it counts from when that work began.
    """
    return (carry.work_started_at or carry.started_at) + limits.timeout_s + carry.waited_s


def limit_reason(limits: Limits, carry: Carry, now: float) -> str:
    """Why the run must stop before another model turn, or ``""``."""
    # A fork's limit counts its own steps; a session's, those of the message being worked on.
    if carry.step - max(carry.forked_at_step, carry.message_step) >= limits.max_steps:
        return f"max_steps={limits.max_steps} reached"
    if carry.usage.total_tokens >= limits.max_tokens:
        return f"max_tokens={limits.max_tokens} reached ({carry.usage.total_tokens} used)"
    if limits.max_cost_usd and carry.usage.cost_usd >= limits.max_cost_usd:
        return f"max_cost_usd={limits.max_cost_usd} reached (${carry.usage.cost_usd:.4f} spent)"
    if now >= deadline(limits, carry):
        return f"timeout_s={limits.timeout_s} reached"
    return ""


def budget_spent(limits: Limits, carry: Carry) -> bool:
    """Whether ``max_tokens`` or ``max_cost_usd`` is reached: for a session, these cover all its messages."""
    if carry.usage.total_tokens >= limits.max_tokens:
        return True
    return bool(limits.max_cost_usd and carry.usage.cost_usd >= limits.max_cost_usd)
