"""Replace configured secret values in text before it leaves trusted code (errors, logs, results, history).

Always redact *before* cutting text short: a cut made first can split a secret so that
the whole-value replacement no longer finds it (a 500-character cut once let the first
29 characters of an API key through). :func:`clip` does both in the right order and
also removes a *partial* secret left at the cut: the text's tail that is the start of a
configured secret of :data:`MIN_PARTIAL_SECRET` characters or more.

A secret is found however it is spelt with characters a reader does not see or that
compatibility-normalise to it: text is matched on its *skeleton* (NFKD, then without
format characters such as zero-width spaces, joiners, the word joiner, the BOM and the
soft hyphen, combining marks and Hangul fillers), and the whole original span is
replaced. :func:`redact_parts` matches across the boundaries of several texts that are
shown together (the items of one MCP result), redacting its piece in each.

Secrets learned while the process runs (a tenant's credentials a tool read, the values an MCP
server was started with; :func:`learn`) are redacted by every function here, as well as the secrets
each call is given: whoever redacts (the log redactor, a tool's result, an MCP result, a model reply)
need not know which tenants' credentials this worker has handed out.

This is a last line, not a boundary: whatever is given a secret can leak it transformed
(reversed, base64, one character per line), which no redaction finds.
"""

from __future__ import annotations

import functools
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Iterable

REDACTED = "[REDACTED]"
MIN_PARTIAL_SECRET = 8  # secrets at least this long are also redacted when cut (their prefix)
MIN_PARTIAL_PREFIX = 4  # a trailing fragment this long is enough to recognise
_IGNORED_CATEGORIES = ("Cf", "Mn", "Me")  # format characters (ZWSP, ZWJ, BOM, soft hyphen, ...), combining marks
_IGNORED = frozenset("\u115f\u1160\u3164\uffa0\u180e")  # Hangul fillers, the Mongolian vowel separator
MIN_LEARNED_CHARS = 4  # a shorter learned value would redact ordinary words
# Each tenant's credentials: enough for thousands of tenants' few secrets each. Past it the value read least
# recently is forgotten first; a value is learned again each time it is read, before its reader's text is redacted.
MAX_LEARNED = 10_000

_learned: OrderedDict[str, None] = OrderedDict()
_learned_lock = threading.Lock()  # learned from activity threads (sync activities) and the event loop
_learned_snapshot: tuple[str, ...] = ()


def learn(*values: str) -> None:
    """Redact ``values`` from now on, everywhere in this process (values under ``MIN_LEARNED_CHARS`` are refused
    by whoever hands them out, and ignored here)."""
    global _learned_snapshot
    with _learned_lock:
        changed = False
        for value in values:
            if len(value) < MIN_LEARNED_CHARS:
                continue
            if value in _learned:
                _learned.move_to_end(value)
                continue
            _learned[value] = None
            changed = True
            while len(_learned) > MAX_LEARNED:
                _learned.popitem(last=False)
        if changed:
            _learned_snapshot = tuple(_learned)


def learned() -> tuple[str, ...]:
    """The secrets learned so far (see :func:`learn`)."""
    return _learned_snapshot


def _ordered(secrets: Iterable[str]) -> list[str]:
    return sorted({s for s in (*secrets, *_learned_snapshot) if s}, key=len, reverse=True)


@functools.lru_cache(maxsize=8192)
def _skeleton_char(char: str) -> str:
    """What ``char`` counts as when secrets are matched: its NFKD form without invisible characters."""
    if char.isascii():
        return char
    return "".join(
        c
        for c in unicodedata.normalize("NFKD", char)
        if c not in _IGNORED and unicodedata.category(c) not in _IGNORED_CATEGORIES
    )


def skeleton(text: str) -> str:
    """``text`` as secrets are matched on it (ASCII text is its own skeleton)."""
    return text if text.isascii() else "".join(map(_skeleton_char, text))


def _find_all(haystack: str, needle: str) -> Iterable[int]:
    start = haystack.find(needle)
    while start >= 0:
        yield start
        start = haystack.find(needle, start + len(needle))


def _spans(text: str, secrets: list[str]) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of ``text`` that spell a secret, merged, in order."""
    found: list[tuple[int, int]] = []
    for secret in secrets:
        found += [(i, i + len(secret)) for i in _find_all(text, secret)]
    shapes = [shape for shape in map(skeleton, secrets) if len(shape) >= MIN_PARTIAL_PREFIX]
    if text.isascii():
        for shape in shapes:
            if not shape.isascii() or shape in secrets:
                continue
            found += [(i, i + len(shape)) for i in _find_all(text, shape)]
    else:
        skel = skeleton(text)
        shapes = [shape for shape in shapes if shape in skel]
        if shapes:
            origin: list[int] = []  # the index in ``text`` of each skeleton character
            for index, char in enumerate(text):
                origin += [index] * len(_skeleton_char(char))
            for shape in shapes:
                found += [(origin[i], origin[i + len(shape) - 1] + 1) for i in _find_all(skel, shape)]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(found):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _replace(text: str, spans: list[tuple[int, int]]) -> str:
    out, last = [], 0
    for start, end in spans:
        out += [text[last:start], REDACTED]
        last = end
    out.append(text[last:])
    return "".join(out)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every spelling of each secret (invisible characters inserted included) replaced by
    ``[REDACTED]``."""
    ordered = _ordered(secrets)
    if not ordered or not text:
        return text
    spans = _spans(text, ordered)
    return _replace(text, spans) if spans else text


def redact_parts(parts: list[str], secrets: Iterable[str]) -> list[str]:
    """``parts`` redacted as one text: a secret that starts in one part and ends in another (an MCP result
    split over two items) is replaced in every part it touches."""
    ordered = _ordered(secrets)
    if not ordered:
        return list(parts)
    spans = _spans("".join(parts), ordered)
    out: list[str] = []
    offset = 0
    for part in parts:
        end = offset + len(part)
        local = [(max(a, offset) - offset, min(b, end) - offset) for a, b in spans if a < end and b > offset]
        out.append(_replace(part, local) if local else part)
        offset = end
    return out


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
