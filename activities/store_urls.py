"""Which run store ``AGENT_STORE_URL`` names: PostgreSQL (a URL or a libpq conninfo) or a SQLite file.

``postgresql://...`` and ``postgres://...`` URLs and conninfo strings (``host=... dbname=...
user=... password=...``: key=value pairs libpq parses) name PostgreSQL. Anything else is a
SQLite path (``sqlite:///`` optional), except text that looks like connection settings (it has a
``password=`` or starts with ``key=``): opening it would create a file whose name holds them,
so it is refused, and the refusal never repeats the text.
"""

from __future__ import annotations

import re

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
_PASSWORD = re.compile(r"password\s*=", re.IGNORECASE)
_KEY_FIRST = re.compile(r"\s*[A-Za-z_]+\s*=")  # `dbname=x ...`: a conninfo libpq refused (a typo in a key)


class StoreUrlError(ValueError):
    """A store URL that names no store we can open safely; the message never includes the URL."""


def conninfo(url: str) -> dict[str, str] | None:
    """The parameters of a libpq conninfo string, or ``None`` when ``url`` is not one."""
    if "://" in url or "=" not in url:
        return None
    try:  # here: a SQLite path, the common case, never loads libpq
        import psycopg
        import psycopg.conninfo
    except ImportError:  # without the postgres extra nothing parses a conninfo (a postgresql:// URL names the extra)
        return None

    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return None
    return {k: str(v) for k, v in params.items() if v is not None} or None


def is_postgres(url: str) -> bool:
    """Whether ``url`` names the shared (PostgreSQL) run store rather than a SQLite file."""
    return url.startswith(POSTGRES_SCHEMES) or conninfo(url) is not None


def sqlite_path(url: str) -> str:
    """The SQLite file a non-PostgreSQL ``url`` names; ``StoreUrlError`` for text that looks like settings."""
    path = url.removeprefix("sqlite:///").removeprefix("sqlite://")
    # `sqlite:///dbname=x` opens that file deliberately; a password in a file name never.
    if _PASSWORD.search(path) or (path == url and _KEY_FIRST.match(path)):
        raise StoreUrlError(
            "looks like PostgreSQL connection settings but neither libpq nor a postgresql:// URL parses it, and "
            "as a SQLite path it would create a file named after them (password included): fix the conninfo "
            "(host=... dbname=... user=... password=...) or use postgresql://USER:PASSWORD@HOST/DB"
        )
    return path
