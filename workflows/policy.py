r"""Pure policy evaluation: ``allow`` / ``ask`` / ``deny`` for one tool call.

The operator's policy is loaded by the worker and snapshotted into the run at
start (it is recorded in history, so replays and later edits of the file do
not change a running run). A run's own rules can only tighten the outcome:
the stricter of the operator's and the run's decision wins.

Rules are checked in order and the first match decides. A rule matches a call
when its ``tool`` glob matches the tool name and every ``when`` entry's regular
expression is found in the string form of that argument (case-insensitive).
A rule with ``allow_only`` (``{"argument": [regex, ...]}``) is an allow list:
a call it matches is allowed when every listed argument *fully* matches one of
that argument's regexes (case-sensitive), and gets the rule's ``decision``
(``ask`` or ``deny``) otherwise. Calls no rule matches get the default:
``allow`` for read-only tools (rule ``default:read-only``) and for tools that
run inside the run's sandbox (``default:sandboxed``), ``ask`` for tools with
side effects (``default:side-effect``).

Shell commands and Python code cannot be policed by regular expressions.
``rm -r -f``, ``rm -fr``, ``find . -delete``, ``echo cm0gLXJmIC8= | base64 -d | sh``,
quoting (``r''m``), variables and ``python3 -c`` all do what a ``rm\s+-rf`` deny
rule was meant to stop, and code can build any string at run time. So policy for
``run_shell`` and ``run_python`` is tool-level: a rule allows, asks for or denies
the tool, and a ``when`` pattern on their ``command`` / ``code`` is refused when
a policy is loaded (the operator's file at worker start, a ``--policy`` file
given to ``starter.py run``) rather than left to give a false sense of safety.
To restrict what those tools may do, list what is allowed with ``allow_only``
(everything else is asked or denied), with patterns that cannot match shell
metacharacters (``ls( [\w./-]+)*``, never ``.*``). The boundary that holds
whatever the command is the sandbox.

Policies already in a run's history (the operator's snapshot, a run's own
``policy`` input) are validated again by workflow code on every replay. There a
``when`` rule on those tools is still accepted and keeps its old meaning, so that
runs started before the check existed replay unchanged; a run started through
the Temporal API with such a run policy only ever tightens its decisions.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from temporalio import workflow

Verdict = Literal["allow", "ask", "deny"]
_STRICTNESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}
DEFAULT_APPROVAL_TIMEOUT_S = 24 * 3600
# Arguments that are programs: no regular expression can say what they do (see the module docstring).
CODE_ARGUMENTS: dict[str, tuple[str, ...]] = {"run_shell": ("command",), "run_python": ("code",)}


class PolicyRule(BaseModel):
    name: str = ""
    tool: str = "*"
    when: dict[str, str] = Field(default_factory=dict)
    allow_only: dict[str, list[str]] = Field(default_factory=dict)
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

    @field_validator("allow_only")
    @classmethod
    def _allow_lists_compile(cls, allow_only: dict[str, list[str]]) -> dict[str, list[str]]:
        for key, patterns in allow_only.items():
            if not patterns:
                raise ValueError(f"allow_only.{key}: list at least one regular expression")
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"allow_only.{key}: invalid regular expression {pattern!r}: {exc}") from None
        return allow_only

    @model_validator(mode="after")
    def _enforceable(self) -> PolicyRule:
        if self.allow_only and self.decision == "allow":
            raise ValueError("allow_only needs decision ask or deny: the decision for the calls it does not list")
        if workflow.in_workflow():
            return self  # recorded in a run's history: accepted as it was (see the module docstring)
        for tool, arguments in CODE_ARGUMENTS.items():
            if not fnmatch.fnmatchcase(tool, self.tool):
                continue
            for key in arguments:
                if key in self.when:
                    raise ValueError(
                        f"when.{key}: a regular expression cannot police {tool}'s {key} (rm -r -f, "
                        "find -delete or base64 -d | sh dodge any pattern); decide for the whole tool "
                        f"(drop when.{key}) or list what is allowed with allow_only.{key}"
                    )
        return self

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

    def verdict_for(self, args: dict[str, Any]) -> Verdict:
        """The rule's verdict for a call it matches: ``allow`` for a call its ``allow_only`` lists."""
        for key, patterns in self.allow_only.items():
            value = args.get(key)
            if value is None or not any(re.fullmatch(pattern, str(value)) for pattern in patterns):
                return self.decision
        return "allow" if self.allow_only else self.decision


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


def default_rule(*, side_effect: bool, sandboxed: bool) -> tuple[Verdict, str]:
    """The verdict and rule name for a call no rule matches."""
    if side_effect:
        return "ask", "default:side-effect"
    return "allow", "default:sandboxed" if sandboxed else "default:read-only"


def decide(
    operator: Policy,
    run: Policy | None,
    tool: str,
    args: dict[str, Any],
    *,
    side_effect: bool,
    sandboxed: bool = False,
) -> Decision:
    """The verdict for one call and the rule that decided it (``sandboxed``: the tool runs in the run's sandbox)."""
    found = _first_match(operator.rules, "operator", tool, args) or _first_match(BUILTIN_RULES, "builtin", tool, args)
    if found is not None:
        rule, label = found
        decision = Decision(
            verdict=rule.verdict_for(args),
            rule=label,
            approval_timeout_s=rule.approval_timeout_s or operator.approval_timeout_s,
        )
    else:
        verdict, name = default_rule(side_effect=side_effect, sandboxed=sandboxed)
        decision = Decision(verdict=verdict, rule=name, approval_timeout_s=operator.approval_timeout_s)
    if run is None:
        return decision
    timeout = min(decision.approval_timeout_s, run.approval_timeout_s)
    tightened = _first_match(run.rules, "run", tool, args)
    if tightened is not None and _STRICTNESS[tightened[0].verdict_for(args)] > _STRICTNESS[decision.verdict]:
        rule, label = tightened
        return Decision(
            verdict=rule.verdict_for(args),
            rule=label,
            approval_timeout_s=min(timeout, rule.approval_timeout_s or timeout),
        )
    return decision.model_copy(update={"approval_timeout_s": timeout})


def parse_run_policy(raw: dict[str, Any]) -> Policy | None:
    """A run input's ``policy`` object (``{"rules": [...], "approval_timeout_s": N}``), or None when empty."""
    return Policy.model_validate(raw) if raw else None
