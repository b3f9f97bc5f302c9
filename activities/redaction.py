"""Replace configured secret values in text before it leaves trusted code (errors, logs, results)."""

from __future__ import annotations

from collections.abc import Iterable

REDACTED = "[REDACTED]"


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret (longest first) replaced by ``[REDACTED]``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text
