"""What ``AgentClient`` raises: one hierarchy, each error one line a person can act on."""

from __future__ import annotations


class AgentClientError(Exception):
    """Base of every error ``AgentClient`` raises; ``str()`` is one line meant for a person."""


class RunNotFound(AgentClientError):
    """No run with this id (or none the caller's tenant may see: the API answers 404 either way)."""


class NotAnAgentRun(AgentClientError):
    """The workflow exists but is not an ``AgentWorkflow``."""


class RunExists(AgentClientError):
    """A run with this id exists (open, or closed without ``reuse_id``: then ``closed`` is true)."""

    def __init__(self, message: str, *, closed: bool = False) -> None:
        super().__init__(message)
        self.closed = closed


class DecisionRefused(AgentClientError):
    """The run refused the decision (unknown approval, not an approver, bad signature, invalid edit, ...)."""


class NoAnswer(AgentClientError):
    """The run did not answer in time (no worker polls its task queue, or the worker is busy)."""


class InvalidRequest(AgentClientError, ValueError):
    """A value the run would refuse (too long, malformed, another tenant's input): nothing was sent."""


class RunNotOpen(AgentClientError):
    """The run has ended (or cannot take this request in its state): ``state`` says how it ended."""

    def __init__(self, message: str, *, state: str = "") -> None:
        super().__init__(message)
        self.state = state


class MessageRefused(AgentClientError):
    """A session refused the message (not a session, closing, its queue full, a malformed message, ...).

    ``reason`` is the run's own words; ``by_session`` is true when the session's validator refused it
    (an ``ApplicationError`` of type ``MessageRefused``), false when the update failed otherwise.
    """

    def __init__(self, message: str, *, reason: str = "", by_session: bool = False) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.by_session = by_session
