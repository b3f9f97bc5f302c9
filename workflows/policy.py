"""Pure policy evaluation: ``allow`` / ``ask`` / ``deny`` for one tool call.

The operator's policy is loaded by the worker and snapshotted into the run at
start (it is recorded in history, so replays and later edits of the file do
not change a running run). A run's own rules can only tighten the outcome:
the stricter of the operator's and the run's decision wins.

Rules are checked in order and the first match decides. A rule matches a call
when its ``tool`` glob matches the tool name and every ``when`` entry's regular
expression is found in the string form of that argument (case-insensitive).
Calls no rule matches get the default: ``allow`` for read-only tools, ``ask``
for tools with side effects.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

Verdict = Literal["allow", "ask", "deny"]
_STRICTNESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}
DEFAULT_APPROVAL_TIMEOUT_S = 24 * 3600


class PolicyRule(BaseModel):
    name: str = ""
    tool: str = "*"
    when: dict[str, str] = Field(default_factory=dict)
    decision: Verdict
    approval_timeout_s: int | None = Field(default=None, ge=1)

    @field_validator("when")
    @classmethod
    def _patterns_compile(cls, when: dict[str, str]) -> dict[str, str]:
        for key, pattern in when.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"when.{key}: invalid regular expression {pattern!r}: {exc}") from None
        return when

    def label(self, index: int, origin: str) -> str:
        return self.name or f"{origin}#{index + 1}"

    def matches(self, tool: str, args: dict[str, Any]) -> bool:
        if not fnmatch.fnmatchcase(tool, self.tool):
            return False
        for key, pattern in self.when.items():
            if key not in args or args[key] is None:
                return False
            if re.search(pattern, str(args[key]), flags=re.IGNORECASE) is None:
                return False
        return True


class Policy(BaseModel):
    rules: list[PolicyRule] = Field(default_factory=list)
    approval_timeout_s: int = Field(default=DEFAULT_APPROVAL_TIMEOUT_S, ge=1)


# Safe reads over HTTP need no human; every other method is a side effect.
BUILTIN_RULES = [
    PolicyRule(name="builtin:http-read", tool="http_request", when={"method": "^(GET|HEAD)$"}, decision="allow"),
]


class Decision(BaseModel):
    verdict: Verdict
    rule: str
    approval_timeout_s: int = DEFAULT_APPROVAL_TIMEOUT_S


def _first_match(
    rules: list[PolicyRule], origin: str, tool: str, args: dict[str, Any]
) -> tuple[PolicyRule, str] | None:
    for index, rule in enumerate(rules):
        if rule.matches(tool, args):
            return rule, rule.label(index, origin)
    return None


def decide(operator: Policy, run: Policy | None, tool: str, args: dict[str, Any], *, side_effect: bool) -> Decision:
    """The verdict for one call and the rule that decided it."""
    found = _first_match(operator.rules, "operator", tool, args) or _first_match(BUILTIN_RULES, "builtin", tool, args)
    if found is not None:
        rule, label = found
        decision = Decision(
            verdict=rule.decision, rule=label, approval_timeout_s=rule.approval_timeout_s or operator.approval_timeout_s
        )
    else:
        verdict: Verdict = "ask" if side_effect else "allow"
        decision = Decision(
            verdict=verdict,
            rule="default:side-effect" if side_effect else "default:read-only",
            approval_timeout_s=operator.approval_timeout_s,
        )
    if run is None:
        return decision
    timeout = min(decision.approval_timeout_s, run.approval_timeout_s)
    tightened = _first_match(run.rules, "run", tool, args)
    if tightened is not None and _STRICTNESS[tightened[0].decision] > _STRICTNESS[decision.verdict]:
        rule, label = tightened
        return Decision(
            verdict=rule.decision, rule=label, approval_timeout_s=min(timeout, rule.approval_timeout_s or timeout)
        )
    return decision.model_copy(update={"approval_timeout_s": timeout})


def parse_run_policy(raw: dict[str, Any]) -> Policy | None:
    """A run input's ``policy`` object (``{"rules": [...], "approval_timeout_s": N}``), or None when empty."""
    return Policy.model_validate(raw) if raw else None
