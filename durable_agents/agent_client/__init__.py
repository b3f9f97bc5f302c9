"""``AgentClient``: a typed async client for front ends (the CLI, the HTTP API, your own code).

Everything a front end does to a run goes through here: start it, send a session a message,
read its status and pending approvals, decide them (signed when a key is configured), follow its
events (progress and streamed model text, resumable from a cursor), read its transcript, fork,
rewind, cancel, list, and manage schedules. One exception hierarchy (``AgentClientError``).
"""

from durable_agents.agent_client._client import AgentClient
from durable_agents.agent_client._errors import (
    AgentClientError,
    DecisionRefused,
    NoAnswer,
    NotAnAgentRun,
    RunExists,
    RunNotFound,
)
from durable_agents.agent_client._types import (
    Decision,
    EventCursor,
    PendingItem,
    RunEvent,
    RunRef,
    RunSummary,
)

__all__ = [
    "AgentClient",
    "AgentClientError",
    "Decision",
    "DecisionRefused",
    "EventCursor",
    "NoAnswer",
    "NotAnAgentRun",
    "PendingItem",
    "RunEvent",
    "RunExists",
    "RunNotFound",
    "RunRef",
    "RunSummary",
]
