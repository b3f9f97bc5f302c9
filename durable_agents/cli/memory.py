"""Operators' view of long-term memory: ``starter.py memory list|search|delete --tenant T [--user U]``.

Opens the memory store from the same settings as the worker (``AGENT_STORE_URL``, ``AGENT_PAYLOAD_KEYS``,
``AGENT_MEMORY_*``); needs no Temporal server. ``--user`` omitted: ``list`` covers every user of the
tenant, ``search`` and ``delete`` the tenant's namespace without a user (``""``), since a search or a
delete is always in one namespace. Entries are printed as ``[key] (user) text``, one line each (the
text's line breaks shown as spaces); ``--json`` prints the entries as objects.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from activities.settings import Settings
from durable_agents.cli.common import EXIT_OK, EXIT_RUN, EXIT_USAGE, CliError, Parser, positive_int, print_json

LIST_LIMIT = 50
TEXT_CHARS = 200  # of each entry's text in the table (--json has all of it)


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    memory = sub.add_parser("memory", help="list, search or delete long-term memory entries of a tenant (or user)")
    memory_sub = memory.add_subparsers(dest="memory_command", required=True, parser_class=Parser)
    listing = memory_sub.add_parser("list", help="the newest entries of a tenant (every user) or of one user")
    search = memory_sub.add_parser("search", help="the entries of one namespace that best match a query")
    search.add_argument("query", help="words to look for")
    delete = memory_sub.add_parser("delete", help="delete one entry by its key")
    delete.add_argument("--key", required=True, help="the entry's key (as list or search shows it)")
    for command in (listing, search, delete):
        command.add_argument("--tenant", required=True, help='the tenant ("" for runs without one)')
        command.add_argument("--user", default=None, help="the tenant's user (default: every user for list, none else)")
    for command in (listing, search):
        command.add_argument("--limit", type=positive_int, default=LIST_LIMIT, help="at most this many (up to 100)")
        command.add_argument("--json", action="store_true", help="one JSON array of entry objects")


async def cmd_memory(args: argparse.Namespace, settings: Settings) -> int:
    from activities.memory import MemoryStoreError, open_memory

    memory = open_memory(settings)
    try:
        if args.memory_command == "list":
            entries = await memory.list(args.tenant, args.user, args.limit)
        elif args.memory_command == "search":
            entries = await memory.search(args.tenant, args.user or "", args.query, args.limit)
            if not entries and not _has_words(args.query):
                raise CliError("the query has no words to search for", code=EXIT_USAGE)
        else:
            deleted = await memory.delete(args.tenant, args.user or "", args.key)
            where = _namespace(args.tenant, args.user or "")
            print(f"deleted {args.key!r} of {where}" if deleted else f"no entry {args.key!r} in {where}")
            return EXIT_OK if deleted else EXIT_RUN
    except MemoryStoreError as err:
        raise CliError(str(err), code=EXIT_USAGE) from None
    finally:
        await memory.close()
    if args.json:
        print_json([entry.model_dump(mode="json") for entry in entries])
    elif not entries:
        print(f"no entries in {_namespace(args.tenant, args.user)}")
    for entry in [] if args.json else entries:
        print(_line(entry.key, entry.user, entry.text, entry.expires_at))
    return EXIT_OK


def _has_words(query: str) -> bool:
    from activities.memory.terms import query_terms

    return bool(query_terms(query))


def _namespace(tenant: str, user: str | None) -> str:
    who = f"tenant {tenant!r}"
    return who if user is None else f"{who} user {user!r}"


def _line(key: str, user: str, text: str, expires_at: float | None) -> str:
    flat = " ".join(("".join(c if c.isprintable() else " " for c in text)).split())
    shown = flat if len(flat) <= TEXT_CHARS else flat[: TEXT_CHARS - 3] + "..."
    expiry = "" if expires_at is None else f" (expires in {max(expires_at - time.time(), 0) / 86400:.1f} d)"
    return f"[{key}] ({user or '-'}) {shown}{expiry}"
