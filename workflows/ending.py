"""How the agent loop's work ended (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from workflows.types import ResultStatus

# ``run``: the run ends with this status. ``message`` (sessions): the work on the messages handed to
# the model ends; the session goes on. ``close`` (sessions): ``close`` arrived; the session ends.
EndingScope = Literal["run", "message", "close"]


@dataclass(frozen=True)
class Ending:
    status: ResultStatus
    text: str
    scope: EndingScope = "run"
