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

Patterns are RE2 (workflows.patterns): they match in linear time, syntax RE2
refuses (backreferences, lookaround) is refused when the policy is loaded, and
at most 64 KiB of an argument is matched. A longer argument fails closed: a
``deny`` or ``ask`` rule's ``when`` counts it as matching, an ``allow`` rule's
``when`` never matches it, and ``allow_only`` never allows it. A policy document
refuses keys it does not know, naming the nearest one (``wen``: did you mean
``when``?): a misspelt condition must not leave a rule that matches every call.

Policies already in a run's history (the operator's snapshot, a run's own
``policy`` input) are validated again by workflow code on every replay. There a
``when`` rule on those tools is still accepted and keeps its old meaning, so that
runs started before the check existed replay unchanged; a run started through
the Temporal API with such a run policy only ever tightens its decisions. Runs
recorded before RE2 and the key check (no ``STRICT_POLICY_PATCH`` marker) keep
Python's ``re`` and ignore unknown keys, as they ran.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError
from temporalio import workflow

from workflows.human_types import MAX_QUORUM
from workflows.known_keys import TOLERATE_UNKNOWN, KnownKeys
from workflows.patterns import Pattern, PatternError
from workflows.start_patch import start_patched

Verdict = Literal["allow", "ask", "deny"]
_STRICTNESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}
DEFAULT_APPROVAL_TIMEOUT_S = 24 * 3600
# Arguments that are programs: no regular expression can say what they do (see the module docstring).
CODE_ARGUMENTS: dict[str, tuple[str, ...]] = {"run_shell": ("command",), "run_python": ("code",)}
# Marks runs started with RE2 patterns and strict keys; a run recorded without it replays as it ran.
STRICT_POLICY_PATCH = "policy-re2-known-keys-v1"
LEGACY_PATTERNS = "legacy_patterns"  # validation context key: Python's re, as before STRICT_POLICY_PATCH


class PolicyRule(KnownKeys):
    name: str = ""
    tool: str = "*"
    when: dict[str, str] = Field(default_factory=dict)
    allow_only: dict[str, list[str]] = Field(default_factory=dict)
    decision: Verdict
    approval_timeout_s: int | None = Field(default=None, ge=1)
    approvals: int = Field(default=1, ge=1, le=MAX_QUORUM)  # distinct reviewers who must approve a call it asks for
    # Whether a reviewer may approve every later call of the tool at once (``--remember tool``); None: the
    # default (no for ``http_request`` with a method other than GET/HEAD, yes otherwise).
    remember: bool | None = None
    _when: list[tuple[str, Pattern]] = PrivateAttr(default_factory=list)
    _allow_only: dict[str, list[Pattern]] = PrivateAttr(default_factory=dict)

    @field_validator("allow_only")
    @classmethod
    def _allow_lists_not_empty(cls, allow_only: dict[str, list[str]]) -> dict[str, list[str]]:
        for key, patterns in allow_only.items():
            if not patterns:
                raise ValueError(f"allow_only.{key}: list at least one regular expression")
        return allow_only

    @model_validator(mode="after")
    def _compiled(self, info: ValidationInfo) -> PolicyRule:
        legacy = bool(info.context and info.context.get(LEGACY_PATTERNS))
        named = f"rule {self.name!r}: " if self.name else ""

        def compiled(where: str, source: str, *, ignore_case: bool) -> Pattern:
            try:
                return Pattern(source, ignore_case=ignore_case, legacy=legacy)
            except PatternError as exc:  # a custom error: no "Value error, " before the message
                raise PydanticCustomError(
                    "invalid_pattern", "{message}", {"message": f"{named}{where}: {exc}"}
                ) from None

        self._when = [(key, compiled(f"when.{key}", s, ignore_case=True)) for key, s in self.when.items()]
        self._allow_only = {
            key: [compiled(f"allow_only.{key}", s, ignore_case=False) for s in sources]
            for key, sources in self.allow_only.items()
        }
        return self

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
        for key, pattern in self._when:
            if key not in args or args[key] is None:
                return False
            found = pattern.search(str(args[key]))
            if found is None:  # longer than the patterns may look at: fail closed
                found = self.decision != "allow"
            if not found:
                return False
        return True

    def verdict_for(self, args: dict[str, Any]) -> Verdict:
        """The rule's verdict for a call it matches: ``allow`` for a call its ``allow_only`` lists."""
        for key, patterns in self._allow_only.items():
            value = args.get(key)
            # A value longer than the patterns may look at (fullmatch None) is never allowed.
            if value is None or not any(pattern.fullmatch(str(value)) is True for pattern in patterns):
                return self.decision
        return "allow" if self.allow_only else self.decision


class Policy(KnownKeys):
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
    approvals: int = 1  # distinct reviewers who must approve (``ask``)
    remember_tool: bool = True  # whether ``--remember tool`` may be granted for this call


def default_remember(tool: str, args: dict[str, Any]) -> bool:
    """``remember tool`` unless the call is an HTTP request that may change something."""
    return not (tool == "http_request" and str(args.get("method", "GET")).upper() not in ("GET", "HEAD"))


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
    remember = default_remember(tool, args)
    if found is not None:
        rule, label = found
        decision = Decision(
            verdict=rule.verdict_for(args),
            rule=label,
            approval_timeout_s=rule.approval_timeout_s or operator.approval_timeout_s,
            approvals=rule.approvals,
            remember_tool=remember if rule.remember is None else rule.remember,
        )
    else:
        verdict, name = default_rule(side_effect=side_effect, sandboxed=sandboxed)
        decision = Decision(
            verdict=verdict, rule=name, approval_timeout_s=operator.approval_timeout_s, remember_tool=remember
        )
    if run is None:
        return decision
    timeout = min(decision.approval_timeout_s, run.approval_timeout_s)
    tightened = _first_match(run.rules, "run", tool, args)
    if tightened is None:
        return decision.model_copy(update={"approval_timeout_s": timeout})
    rule, label = tightened
    # A run's rule only tightens: a stricter verdict, more reviewers, no remembering the tool.
    stricter = {
        "approvals": max(decision.approvals, rule.approvals),
        "remember_tool": decision.remember_tool and rule.remember is not False,
    }
    if _STRICTNESS[rule.verdict_for(args)] > _STRICTNESS[decision.verdict]:
        return Decision(
            verdict=rule.verdict_for(args),
            rule=label,
            approval_timeout_s=min(timeout, rule.approval_timeout_s or timeout),
            **stricter,
        )
    return decision.model_copy(update={"approval_timeout_s": timeout, **stricter})


def parse_run_policy(raw: dict[str, Any]) -> Policy | None:
    """A run input's ``policy`` object (``{"rules": [...], "approval_timeout_s": N}``), or None when empty.

    In workflow code this decides ``STRICT_POLICY_PATCH`` (the first call is in the run's first activation,
    before any command): a run recorded before it keeps Python's ``re`` and ignores unknown keys, as it did.
    """
    strict = not workflow.in_workflow() or start_patched(STRICT_POLICY_PATCH)
    if not raw:
        return None
    if strict:
        return Policy.model_validate(raw)
    return Policy.model_validate(raw, context={LEGACY_PATTERNS: True, TOLERATE_UNKNOWN: True})
