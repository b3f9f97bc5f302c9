"""The tenant as a Temporal fairness key: a busy tenant's tasks share the task queue with the others'.

Temporal's matching service dispatches the tasks of each fairness key in proportion to its weight when
fairness is on for the namespace (server 1.29 and later: dynamic config ``matching.enableFairness``); a
server without it ignores the key. A run's activities and sub-agents inherit the key from its workflow.
"""

from __future__ import annotations

import hashlib

from temporalio.common import Priority

FAIRNESS_KEY_MAX_BYTES = 64  # the server's limit


def fairness_key(tenant: str) -> str:
    """``tenant`` itself when it fits the server's 64 bytes, else a stable digest of it ("" for no tenant)."""
    if len(tenant.encode()) <= FAIRNESS_KEY_MAX_BYTES:
        return tenant
    return "sha256:" + hashlib.sha256(tenant.encode()).hexdigest()[:40]


def tenant_priority(tenant: str) -> Priority:
    """The start priority of a run for ``tenant``: its fairness key (the default priority for no tenant)."""
    key = fairness_key(tenant)
    return Priority(fairness_key=key) if key else Priority.default


__all__ = ["FAIRNESS_KEY_MAX_BYTES", "fairness_key", "tenant_priority"]
