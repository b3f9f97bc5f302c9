"""Which host uid a root worker runs each local sandbox as; the limits themselves live in ``Settings``."""

from __future__ import annotations

import hashlib

from activities.settings import DEFAULT_UID_BASE, LocalLimits

UID_SPAN = 1_000_000


def host_uid_for(sandbox_id: str, base: int) -> int:
    """The unprivileged host uid (= gid) a root worker runs ``sandbox_id``'s commands as."""
    digest = hashlib.sha256(sandbox_id.encode()).digest()
    return base + int.from_bytes(digest[:8], "big") % UID_SPAN


__all__ = ["DEFAULT_UID_BASE", "UID_SPAN", "LocalLimits", "host_uid_for"]
