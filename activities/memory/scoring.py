"""BM25 over the keyed term index (sealed entries), in one SQL statement that SQLite and PostgreSQL both run.

The inverse document frequencies are computed here from the namespace's counts (``memory_namespaces``)
and passed in as a ``VALUES`` list, so neither database needs a logarithm function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from activities.memory.terms import BM25_B, BM25_K1, bm25_idf

K = TypeVar("K")
# A query word in more than this share of the entries is left out when a rarer word is in the query: it
# would add almost nothing to a BM25 score (its idf is small) and cost a score for nearly every entry.
COMMON_SHARE = 0.2


def selective(frequencies: Mapping[K, int], entries: int) -> dict[K, int]:
    """The query terms worth scoring, given each one's number of entries: the common ones are dropped while
    a rarer one remains (a query of common words only keeps them all)."""
    rare = {term: count for term, count in frequencies.items() if count <= COMMON_SHARE * max(entries, 1)}
    return rare if any(rare.values()) else dict(frequencies)  # a word no entry holds finds nothing by itself


def weights(frequencies: Mapping[bytes, int], usage: Sequence[Any] | None) -> list[tuple[bytes, float]]:
    """Each hashed query term found in the index, with its idf in a namespace of ``usage`` (entries, terms)."""
    entries = max(int(usage[0]) if usage else 0, 1)
    return [(bytes(term), bm25_idf(entries, int(count))) for term, count in frequencies.items()]


def avg_length(usage: Sequence[Any] | None) -> float:
    if not usage or not usage[0]:
        return 1.0
    return max(float(usage[1]) / float(usage[0]), 1.0)


def flat(pairs: list[tuple[bytes, float]]) -> list[Any]:
    return [value for pair in pairs for value in pair]


def keyed_query(columns: str, mark: str, terms: int) -> str:
    """The ranked search of ``terms`` weighted terms; its parameters: (term, idf) pairs, the average entry
    length, tenant, user, now, limit. ``mark`` is the driver's placeholder (``?`` or ``%s``)."""
    blob, real = (mark, mark) if mark == "?" else (f"{mark}::bytea", f"{mark}::float8")
    values = ", ".join(f"({blob}, {real})" for _ in range(terms))
    # The hits first (MATERIALIZED): a planner that guesses the namespace small would otherwise walk all of
    # its entries and probe the index for each, instead of reading the query terms' few postings.
    sql = (
        f"WITH q (term, idf) AS (VALUES {values}),"
        " hits AS MATERIALIZED (SELECT t.entry, t.tf, q.idf FROM q JOIN memory_terms t ON t.term = q.term)"
        f" SELECT {columns},"
        f" SUM(h.idf * h.tf * {BM25_K1 + 1} / (h.tf + {BM25_K1} * ({1 - BM25_B} + {BM25_B} * e.length / {real})))"
        " AS score"
        " FROM hits h JOIN memory_entries e ON e.id = h.entry"
        f" WHERE e.tenant = {mark} AND e.user_name = {mark} AND (e.expires_at IS NULL OR e.expires_at > {real})"
        f" GROUP BY e.id ORDER BY score DESC, e.id DESC LIMIT {mark}"
    )
    return sql
