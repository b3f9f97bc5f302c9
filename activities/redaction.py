"""Replace configured secret values in text before it leaves trusted code (errors, logs, results, history).

Always redact *before* cutting text short: a cut made first can split a secret so that
the whole-value replacement no longer finds it (a 500-character cut once let the first
29 characters of an API key through). :func:`clip` does both in the right order and
also removes a *partial* secret left at the cut: the text's tail that is the start of a
configured secret of :data:`MIN_PARTIAL_SECRET` characters or more.
"""

from __future__ import annotations

from collections.abc import Iterable

REDACTED = "[REDACTED]"
MIN_PARTIAL_SECRET = 8  # secrets at least this long are also redacted when cut (their prefix)
MIN_PARTIAL_PREFIX = 4  # a trailing fragment this long is enough to recognise


def _ordered(secrets: Iterable[str]) -> list[str]:
    return sorted({s for s in secrets if s}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret (longest first) replaced by ``[REDACTED]``."""
    for secret in _ordered(secrets):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_cut_tail(text: str, secrets: Iterable[str]) -> str:
    """Redact a trailing fragment of ``text`` that is the beginning of a long secret (what a cut leaves)."""
    for secret in _ordered(secrets):
        if len(secret) < MIN_PARTIAL_SECRET:
            continue
        for size in range(min(len(secret) - 1, len(text)), MIN_PARTIAL_PREFIX - 1, -1):
            if text.endswith(secret[:size]):
                return text[: len(text) - size] + REDACTED
    return text


def clip(text: str, limit: int, secrets: Iterable[str]) -> str:
    """At most about ``limit`` characters of ``text``: redacted first, then cut, then the cut's tail checked."""
    ordered = _ordered(secrets)
    clean = redact(text, ordered)
    if len(clean) <= limit:
        return clean
    return redact_cut_tail(clean[:limit], ordered)
