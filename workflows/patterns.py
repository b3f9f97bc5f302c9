r"""Policy regular expressions that run in linear time on bounded text (RE2).

Python's ``re`` backtracks: ``(a+)+b`` against 25 ``a``\ s takes seconds, and it
holds the GIL all the while, so one run's policy stalled every workflow and
activity on its worker. Policy patterns (from the operator's file and from run
input) are compiled with RE2 instead, which matches in time linear in the text,
releases the GIL while it matches, and refuses what it cannot do in linear time:
backreferences (``\1``), lookaround (``(?=``, ``(?!``, ``(?<=``, ``(?<!``),
possessive quantifiers, ``\Z`` (RE2 spells it ``\z``). Such a pattern is refused
when its policy is loaded, naming it. Two more bounds keep a match cheap:

- the compiled program of one pattern has at most ``MAX_PROGRAM_SIZE``
  instructions (``a{1000}`` compiles to 1,000; ordinary patterns to a few dozen);
- at most ``MAX_MATCHED_BYTES`` (64 KiB, UTF-8) of an argument are matched. A
  longer argument is not matched at all: ``search`` and ``fullmatch`` answer
  ``None`` and the caller fails closed (workflows.policy: a ``deny`` or ``ask``
  rule's ``when`` counts it as matching, an ``allow`` rule's never does, and
  ``allow_only`` never allows it).

RE2's ``\d``, ``\w``, ``\s`` and ``\b`` are ASCII (Python's are Unicode; use
``\pL``, ``\pN`` for Unicode classes). Like Python's ``re.search``, ``$`` also
matches before a final newline.

Policies recorded in a run's history before RE2 was used keep Python's ``re``
(``legacy=True``, decided by a ``workflow.patched`` marker in
workflows.policy), so runs started before the change replay unchanged.
"""

from __future__ import annotations

import re
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    # google-re2: a C++ extension, deterministic (the same pattern and text always give the same answer, no
    # clock, randomness or I/O), so workflow code may call it; passed through, it is loaded once per worker.
    import re2

MAX_MATCHED_BYTES = 64 * 1024
MAX_PROGRAM_SIZE = 1000
PATTERN_QUOTE_MAX = 60  # characters of a refused pattern an error quotes


class PatternError(ValueError):
    """A pattern that cannot be a policy pattern (bad syntax, syntax RE2 refuses, too large)."""


def _quoted(pattern: str) -> str:
    return repr(pattern if len(pattern) <= PATTERN_QUOTE_MAX else pattern[:PATTERN_QUOTE_MAX] + "...")


def _options(*, ignore_case: bool) -> Any:
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.never_capture = True  # only whether it matches is wanted: no submatch pass
    options.log_errors = False  # a refused pattern is our error to report, not a line on the worker's stderr
    return options


class Pattern:
    """One compiled policy pattern: ``search`` (``when``) or ``fullmatch`` (``allow_only``)."""

    __slots__ = ("_compiled", "legacy", "source")

    def __init__(self, source: str, *, ignore_case: bool, legacy: bool = False) -> None:
        self.source = source
        self.legacy = legacy
        if legacy:  # a policy recorded before RE2: Python's re, as the run was started with
            try:
                self._compiled: Any = re.compile(source, flags=re.IGNORECASE if ignore_case else 0)
            except re.error as exc:
                raise PatternError(f"invalid regular expression {_quoted(source)}: {exc}") from None
            return
        try:
            self._compiled = re2.compile(source, _options(ignore_case=ignore_case))
        except re2.error as exc:
            detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            raise PatternError(
                f"invalid regular expression {_quoted(source)}: {detail} (RE2 syntax: no backreferences or lookaround)"
            ) from None
        size = int(self._compiled.programsize)
        if size > MAX_PROGRAM_SIZE:
            raise PatternError(f"{_quoted(source)} is too large: {size} RE2 instructions, at most {MAX_PROGRAM_SIZE}")

    def __deepcopy__(self, memo: dict[int, Any]) -> Pattern:
        return self  # immutable

    def _bounded(self, text: str) -> bytes | None:
        data = text.encode("utf-8", "surrogatepass")  # a lone surrogate from JSON must not crash a decision
        return data if len(data) <= MAX_MATCHED_BYTES else None

    def search(self, text: str) -> bool | None:
        """Whether the pattern is found in ``text``; ``None`` when ``text`` is longer than the cap."""
        if self.legacy:
            return self._compiled.search(text) is not None
        data = self._bounded(text)
        if data is None:
            return None
        if self._compiled.search(data) is not None:
            return True
        # Python's re.search lets $ match before a final newline; RE2's $ is the end. Keep the rules' meaning.
        return data.endswith(b"\n") and self._compiled.search(data[:-1]) is not None

    def fullmatch(self, text: str) -> bool | None:
        """Whether the pattern matches all of ``text``; ``None`` when ``text`` is longer than the cap."""
        if self.legacy:
            return self._compiled.fullmatch(text) is not None
        data = self._bounded(text)
        if data is None:
            return None
        return self._compiled.fullmatch(data) is not None
