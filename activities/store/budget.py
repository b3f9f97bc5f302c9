"""One budget for a tree of runs (a parent and its sub-agents), shared through the run store.

Every model turn of every run of the tree reserves its turn under the root's key before it
calls the provider, and settles it (with what it really spent) after. A reservation is the
turn's own worst case, worked out from the request itself: an upper bound of its prompt
(the transcript and tool definitions it sends) plus the most it may return (the output cap
sent to the provider with it). A reservation is granted:

- never once the tree has spent its cap (``exhausted``: the run ends ``limit_exceeded``);
- at once when no other turn of the tree is in flight (this turn may overshoot the cap: by one
  model turn of one agent, the most any tree can overshoot);
- otherwise only when what is settled, plus every reservation in flight, plus this one fit under
  the cap; else the caller waits (``wait``) and asks again.

Settling replaces the reservation with the turn's actual usage. So turns run in parallel while
the budget is far from its cap, and one at a time near it, whatever the concurrency: every turn
granted beside another fits under the cap at its worst, so only a turn granted alone can cross
it. (A custom provider that ignores the output cap, or a prompt that tokenises denser than the
estimate, can spend more than its reservation; settling still counts what it really spent.)
An unsettled row's ``tokens`` and ``cost_usd`` are its reservation.
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


def decide(
    rows: list[BudgetRow],
    key: str,
    cap_tokens: int,
    cap_cost_usd: float,
    now: float,
    tokens: int = 0,
    cost_usd: float = 0.0,
) -> BudgetVerdict:
    """Whether the turn ``key``, reserving ``tokens`` and ``cost_usd``, may call the model now (pure; the stores
    call it inside one transaction)."""
    if any(row.key == key for row in rows):
        return "granted"  # a retry of a turn that already holds (or settled) its reservation
    settled = [row for row in rows if row.settled]
    spent_tokens = sum(row.tokens for row in settled)
    spent_cost = sum(row.cost_usd for row in settled)
    if spent_tokens >= cap_tokens or (cap_cost_usd and spent_cost >= cap_cost_usd):
        return "exhausted"
    in_flight = [row for row in rows if not row.settled and row.at > now - STALE_RESERVATION_S]
    if not in_flight:
        return "granted"
    fits_tokens = spent_tokens + sum(row.tokens for row in in_flight) + tokens <= cap_tokens
    fits_cost = not cap_cost_usd or spent_cost + sum(row.cost_usd for row in in_flight) + cost_usd <= cap_cost_usd
    return "granted" if fits_tokens and fits_cost else "wait"


def spent(rows: list[BudgetRow], now: float) -> BudgetSpent:
    settled = [row for row in rows if row.settled]
    return BudgetSpent(
        tokens=sum(row.tokens for row in settled),
        cost_usd=round(sum(row.cost_usd for row in settled), 8),
        turns=len(settled),
        in_flight=sum(1 for row in rows if not row.settled and row.at > now - STALE_RESERVATION_S),
    )
