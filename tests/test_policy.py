"""Pure policy evaluation (no Temporal needed: it is plain deterministic code)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workflows.identity import approval_id, decision_signature
from workflows.policy import Policy, PolicyRule, decide, parse_run_policy

POST = {"method": "POST", "url": "https://api.example.com/orders", "json": {"sku": 1}}
GET = {"method": "GET", "url": "https://api.example.com/orders"}


def test_defaults_allow_reads_and_ask_for_side_effects() -> None:
    op = Policy()
    assert decide(op, None, "read_file", {"path": "a"}, side_effect=False).verdict == "allow"
    assert decide(op, None, "read_file", {"path": "a"}, side_effect=False).rule == "default:read-only"
    post = decide(op, None, "http_request", POST, side_effect=True)
    assert (post.verdict, post.rule) == ("ask", "default:side-effect")
    get = decide(op, None, "http_request", GET, side_effect=True)
    assert (get.verdict, get.rule) == ("allow", "builtin:http-read")
    assert post.approval_timeout_s == 24 * 3600


def test_first_matching_operator_rule_decides_and_is_named() -> None:
    op = Policy(
        rules=[
            PolicyRule(name="no-secrets", tool="*_file", when={"path": r"^secrets/"}, decision="deny"),
            PolicyRule(tool="run_*", decision="ask", approval_timeout_s=600),
        ]
    )
    denied = decide(op, None, "read_file", {"path": "secrets/key"}, side_effect=False, sandboxed=True)
    assert (denied.verdict, denied.rule) == ("deny", "no-secrets")
    asked = decide(op, None, "run_python", {"code": "print(1)"}, side_effect=False, sandboxed=True)
    assert (asked.verdict, asked.rule, asked.approval_timeout_s) == ("ask", "operator#2", 600)
    # A `when` key the call does not have never matches.
    assert decide(op, None, "write_file", {}, side_effect=False, sandboxed=True).rule == "default:sandboxed"


def test_run_policy_tightens_but_never_loosens() -> None:
    op = Policy()
    loosen = parse_run_policy({"rules": [{"tool": "http_request", "decision": "allow"}]})
    assert decide(op, loosen, "http_request", POST, side_effect=True).verdict == "ask"
    tighten = parse_run_policy({"rules": [{"tool": "http_request", "decision": "deny", "name": "no-http"}]})
    result = decide(op, tighten, "http_request", GET, side_effect=True)
    assert (result.verdict, result.rule) == ("deny", "no-http")
    shorter = parse_run_policy({"approval_timeout_s": 60})
    assert decide(op, shorter, "http_request", POST, side_effect=True).approval_timeout_s == 60
    assert parse_run_policy({}) is None


def test_invalid_rules_are_refused() -> None:
    with pytest.raises(ValidationError, match="invalid regular expression"):
        Policy.model_validate({"rules": [{"tool": "x", "when": {"a": "("}, "decision": "deny"}]})
    with pytest.raises(ValidationError):
        Policy.model_validate({"rules": [{"tool": "x", "decision": "maybe"}]})


def test_approval_id_binds_the_exact_call() -> None:
    base = approval_id("wf", 3, "call_1", "http_request", POST)
    assert base == approval_id("wf", 3, "call_1", "http_request", dict(reversed(list(POST.items()))))
    assert base != approval_id("wf", 3, "call_1", "http_request", {**POST, "json": {"sku": 2}})
    assert base != approval_id("wf", 4, "call_1", "http_request", POST)
    assert base != approval_id("wf2", 3, "call_1", "http_request", POST)


def test_signature_covers_decision_reviewer_and_expiry() -> None:
    sig = decision_signature(b"k", "ap_1", "approve", "alice", "2026-01-01T00:00:00+00:00")
    assert sig != decision_signature(b"k", "ap_1", "reject", "alice", "2026-01-01T00:00:00+00:00")
    assert sig != decision_signature(b"k", "ap_1", "approve", "bob", "2026-01-01T00:00:00+00:00")
    assert sig != decision_signature(b"k", "ap_1", "approve", "alice", "2026-01-02T00:00:00+00:00")
    assert sig != decision_signature(b"k2", "ap_1", "approve", "alice", "2026-01-01T00:00:00+00:00")
