"""``AgentClient``: a typed async client for front ends (the CLI, the HTTP API, your own code).

Everything a front end does to a run goes through here: start it, send a session a message,
read its status and pending approvals, decide them (signed when a key is configured), follow its
events (progress and streamed model text, resumable from a cursor), read its transcript, fork,
rewind, cancel, list. One exception hierarchy (``AgentClientError``).
"""

from durable_agents.agent_client._client import AgentClient
from durable_agents.agent_client._errors import (
    AgentClientError,
    DecisionRefused,
    InvalidRequest,
    MessageRefused,
    NoAnswer,
    NotAnAgentRun,
    RunExists,
    RunNotFound,
    RunNotOpen,
)
from durable_agents.agent_client._events import DeltaSource
from durable_agents.agent_client._forking import ForkPlan
from durable_agents.agent_client._history import NoSuchStep
from durable_agents.agent_client._transcript import Entry as TranscriptEntry
from durable_agents.agent_client._transcript import Transcript
from durable_agents.agent_client._types import (
    Decision,
    EventCursor,
    PendingItem,
    PendingPage,
    RunDescription,
    RunEvent,
    RunPage,
    RunRef,
    RunSummary,
    SessionSend,
)

__all__ = [
    "AgentClient",
    "AgentClientError",
    "Decision",
    "DecisionRefused",
    "DeltaSource",
    "EventCursor",
    "ForkPlan",
    "InvalidRequest",
    "MessageRefused",
    "NoAnswer",
    "NoSuchStep",
    "NotAnAgentRun",
    "PendingItem",
    "PendingPage",
    "RunDescription",
    "RunEvent",
    "RunExists",
    "RunNotFound",
    "RunNotOpen",
    "RunPage",
    "RunRef",
    "RunSummary",
    "SessionSend",
    "Transcript",
    "TranscriptEntry",
]
