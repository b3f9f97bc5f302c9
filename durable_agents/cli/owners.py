"""Which run owns an approval: ``AgentClient``'s (``agent_client/_owners.py``), its warnings on stderr."""

from __future__ import annotations

import sys

from temporalio.client import Client

import durable_agents.agent_client._owners as _owners
from durable_agents.agent_client._owners import Owned as Owned
from durable_agents.agent_client._owners import owned as owned
from durable_agents.agent_client._owners import unconfirmed as unconfirmed
from workflows.types import StatusView


def warn(line: str) -> None:
    """A warning line of the client (a run that did not answer), on stderr as the CLI's warnings are."""
    print(line, file=sys.stderr)


async def tree(client: Client, workflow_id: str, view: StatusView) -> list[tuple[str, StatusView]]:
    return await _owners.tree(client, workflow_id, view, warn)


async def owned_in_tree(client: Client, workflow_id: str, view: StatusView) -> list[Owned]:
    return await _owners.owned_in_tree(client, workflow_id, view, warn)
