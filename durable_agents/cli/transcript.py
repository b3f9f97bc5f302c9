"""``starter.py transcript ID``: a run's conversation (messages, replies, tool calls), from ``AgentClient``.

How it is read from the run's histories: ``durable_agents/agent_client/_transcript.py``. Output is
bounded per entry: tool results and arguments are cut to ``SHORT_CHARS``, texts to ``TEXT_CHARS``
in the text rendering.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from temporalio.client import Client

from activities.settings import Settings
from durable_agents.agent_client._transcript import SHORT_CHARS as SHORT_CHARS
from durable_agents.agent_client._transcript import TEXT_CHARS, Entry, short
from durable_agents.agent_client._transcript import Transcript as Transcript
from durable_agents.agent_client._transcript import executions as executions
from durable_agents.agent_client._transcript import read_transcript as read_transcript
from durable_agents.cli.common import agent_client, client_errors, print_json

# --- the command ------------------------------------------------------------------------


def add_command(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "transcript", help="a session's or run's conversation: messages, replies, tool calls (from its history)"
    )
    parser.add_argument("workflow_id")
    parser.add_argument("--json", action="store_true", help="a JSON list of entries (kind, seq, text/name, at, ...)")


@client_errors
async def cmd_transcript(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    transcript = await agent_client(client, settings).read_transcript(args.workflow_id)
    if args.json:
        print_json([entry.as_json() for entry in transcript.entries])
        return 0
    lines = render(transcript.entries)
    print("\n".join(lines) if lines else f"{args.workflow_id} has no messages or replies in its history yet")
    return 0


def render(entries: Sequence[Entry]) -> list[str]:
    """The text rendering: one block per entry, tool calls indented under their message."""
    lines: list[str] = []
    for entry in entries:
        clock = entry.at[11:19] if len(entry.at) >= 19 else "--:--:--"
        if entry.kind == "tool_call":
            arguments = short(json.dumps(entry.arguments, ensure_ascii=False, default=str))
            outcome = "(no result in history)" if entry.ok is None else ("→ " if entry.ok else "✗ ") + entry.result
            lines.append(f"{clock}    tool {entry.name} {arguments} {outcome}")
            continue
        who = f"message {entry.seq}" + (f" from {entry.sender}" if entry.sender else "")
        head = who if entry.kind == "message" else f"reply to {entry.seq}"
        text = entry.text if len(entry.text) <= TEXT_CHARS else entry.text[: TEXT_CHARS - 1] + "…"
        first, *rest = text.splitlines() or [""]
        lines.append(f"{clock} {head}: {first}")
        lines.extend(f"{' ' * 9}{line}" for line in rest)
    return lines
