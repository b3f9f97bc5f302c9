"""Turning text into search terms, and a query into something each database can run without parsing it.

A query is hostile text (the model's, an operator's): it is never handed to FTS5's or ``tsquery``'s own
syntax. It is cut into terms here (runs of letters and digits, lower-cased, NFKC-normalised), and each
database gets an OR of those terms quoted as literals, so ``a AND (b``, quotes, ``NEAR`` or ``:*`` are
only words.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter

from activities.memory.base import MAX_QUERY_CHARS, MAX_QUERY_TERMS

_TERM = re.compile(r"[^\W_]+")  # letters and digits of any script
MAX_TERM_CHARS = 64  # longer runs are cut (a base64 blob is one "word")
# BM25's usual constants, the same as FTS5's bm25() and used by the keyed index's scoring.
BM25_K1 = 1.2
BM25_B = 0.75


def terms(text: str) -> list[str]:
    """The terms of ``text`` in order, with repeats."""
    normal = unicodedata.normalize("NFKC", text).casefold()
    return [match[:MAX_TERM_CHARS] for match in _TERM.findall(normal)]


# English function words, left out of a query that has other words: a recall's query is a whole task
# ("what tea does ann drink in the morning?"), and in a small namespace BM25's idf cannot tell "in" or
# "the" from a word that matters, so a short entry that shares only those would rank first.
_FUNCTION_WORDS = (
    "a about an and are as at be been but by can could did do does for from had has have how i if in "
    "into is it its me my no not of on or our please should so than that the their them then there these "
    "they this to us was we were what when where which who whom why will with would you your"
)
QUERY_STOPWORDS = frozenset(_FUNCTION_WORDS.split())


def query_terms(query: str) -> list[str]:
    """The distinct terms of a search query, in order, at most ``MAX_QUERY_TERMS``; function words
    (``QUERY_STOPWORDS``) only when the query has nothing else."""
    found = list(dict.fromkeys(terms(query[:MAX_QUERY_CHARS])))
    content = [term for term in found if term not in QUERY_STOPWORDS]
    return (content or found)[:MAX_QUERY_TERMS]


def term_counts(text: str) -> tuple[Counter[str], int]:
    """Each term's frequency in ``text``, and how many terms it has in all."""
    found = terms(text)
    return Counter(found), len(found)


def fts5_match(words: list[str]) -> str:
    """An FTS5 MATCH expression: any of ``words``, each a quoted string (terms hold no quote)."""
    return " OR ".join(f'"{word}"' for word in words)


def tsquery_text(words: list[str]) -> str:
    """A ``to_tsquery`` text: any of ``words``, each a quoted lexeme (terms hold no quote, colon or operator)."""
    return " | ".join(f"'{word}'" for word in words)


def bm25_idf(entries: int, with_term: int) -> float:
    """BM25's inverse document frequency, floored above zero like FTS5's (a term in every entry still counts)."""
    return max(math.log((entries - with_term + 0.5) / (with_term + 0.5) + 1.0), 1e-6)
