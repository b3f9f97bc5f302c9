"""One budget for a tree of runs (a parent and its sub-agents), shared through the run store.

Every model turn of every run of the tree reserves its turn under the root's key before it
calls the provider and settles it (with what it really spent) after. A reservation is granted:

- never once the tree has spent its cap (``exhausted``: the run ends ``limit_exceeded``);
- at once when no other turn of the tree is in flight (this turn may overshoot the cap: by one
  model turn of one agent, the most any tree can overshoot);
- otherwise only when every turn in flight plus this one fit under the cap at the largest cost
  a settled turn of the tree has had so far; else the caller waits (``wait``) and asks again.

So turns run in parallel while the budget is far from its cap, and one at a time near it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BudgetVerdict = Literal["granted", "wait", "exhausted"]
STALE_RESERVATION_S = 600.0  # a reservation whose holder died without settling or releasing stops counting


@dataclass(frozen=True)
class BudgetRow:
    key: str
    settled: bool
    tokens: int
    cost_usd: float
    at: float


@dataclass(frozen=True)
class BudgetSpent:
    tokens: int = 0
    cost_usd: float = 0.0
    turns: int = 0
    in_flight: int = 0


def decide(rows: list[BudgetRow], key: str, cap_tokens: int, cap_cost_usd: float, now: float) -> BudgetVerdict:
    """Whether the turn ``key`` may call the model now (pure; the stores call it inside one transaction)."""
    if any(row.key == key for row in rows):
        return "granted"  # a retry of a turn that already holds (or settled) its reservation
    settled = [row for row in rows if row.settled]
    tokens = sum(row.tokens for row in settled)
    cost = sum(row.cost_usd for row in settled)
    if tokens >= cap_tokens or (cap_cost_usd and cost >= cap_cost_usd):
        return "exhausted"
    in_flight = [row for row in rows if not row.settled and row.at > now - STALE_RESERVATION_S]
    if not in_flight:
        return "granted"
    if not settled:
        return "wait"  # no estimate of a turn's cost yet
    turns = len(in_flight) + 1
    fits_tokens = tokens + turns * max(row.tokens for row in settled) <= cap_tokens
    fits_cost = not cap_cost_usd or cost + turns * max(row.cost_usd for row in settled) <= cap_cost_usd
    return "granted" if fits_tokens and fits_cost else "wait"


def spent(rows: list[BudgetRow], now: float) -> BudgetSpent:
    settled = [row for row in rows if row.settled]
    return BudgetSpent(
        tokens=sum(row.tokens for row in settled),
        cost_usd=round(sum(row.cost_usd for row in settled), 8),
        turns=len(settled),
        in_flight=sum(1 for row in rows if not row.settled and row.at > now - STALE_RESERVATION_S),
    )
