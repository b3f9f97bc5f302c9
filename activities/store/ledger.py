"""Idempotency ledger records: intent before a side effect, outcome after.

A claim on a key is decided atomically by the store (unique key + row lock or
a write transaction), so two workers can never both believe they hold a fresh
intent for the same call. A holder keeps a lease on the key while it works
(renewed by the activity's heartbeat loop); a claim on a key whose lease ran
out without an outcome means the previous holder died mid-call.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

LedgerState = Literal["intent", "done", "unknown"]
ClaimStatus = Literal["fresh", "done", "busy", "recovered"]


class LedgerEntry(BaseModel):
    key: str
    tool: str
    args_hash: str
    workflow_id: str
    state: LedgerState
    owner: str
    attempt: int
    lease_until: float  # epoch seconds
    executions: int  # how many times a side effect was started for this key
    result: str = ""
    is_error: bool = False
    note: str = ""


class Claim(BaseModel):
    """The store's answer to "may I run this call?".

    - ``fresh``: nobody recorded this key before; you hold it, run the side effect.
    - ``done``: an outcome is recorded; return it and do nothing.
    - ``busy``: another holder's lease is live; come back later.
    - ``recovered``: an earlier holder recorded intent and no outcome, and its lease
      ran out; you hold it now, and the tool's recovery mode says what to do.
    """

    status: ClaimStatus
    entry: LedgerEntry


class ClaimRequest(BaseModel):
    key: str
    tool: str
    args_hash: str
    workflow_id: str
    owner: str
    attempt: int
    lease_s: float
    force: bool = False  # a human chose "retry": take the key whatever its state
    # A ``fresh`` claim also counts the execution as started, in the same write: nothing happens between
    # a fresh claim and the side effect, so ``started`` would be a second round trip for the same fact.
    start_if_fresh: bool = False
