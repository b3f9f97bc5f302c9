"""``AgentClient``: every operation a front end performs on runs, over a Temporal ``Client``.

INTERFACE STUB (issue 26): the signatures below are the contract the CLI, the HTTP API and the
schedules code are written against; the bodies are filled in on the i26-client branch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import SecretStr
from temporalio.client import Client

from durable_agents.agent_client._types import Decision, EventCursor, PendingItem, RunEvent, RunRef, RunSummary
from workflows.session_types import SendResult
from workflows.types import AgentInput, AgentResult, StatusView


class AgentClient:
    """A typed client over a Temporal ``Client``.

    ``tenant`` (optional) scopes every call: runs of another tenant are ``RunNotFound`` and
    ``list``/``pending`` show only the tenant's runs, and ``start``/``send`` stamp it on the input.
    ``approval_key`` signs decisions for workers that require signed decisions.
    """

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = "agent-tasks",
        tenant: str | None = None,
        approval_key: SecretStr | None = None,
        store_url: str = "",
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.tenant = tenant
        self.approval_key = approval_key
        self.store_url = store_url

    def for_tenant(self, tenant: str) -> AgentClient:
        """The same client scoped to ``tenant`` (the API makes one per request's token)."""
        raise NotImplementedError

    async def start(self, inp: AgentInput, *, workflow_id: str | None = None, reuse_id: bool = False) -> RunRef:
        raise NotImplementedError

    async def send(
        self,
        session_id: str,
        text: str,
        *,
        message_id: str = "",
        sender: str = "",
        start: AgentInput | None = None,
    ) -> SendResult:
        """Send a session a message; with ``start`` the session is started with it when missing."""
        raise NotImplementedError

    async def status(self, workflow_id: str) -> StatusView:
        raise NotImplementedError

    async def result(self, workflow_id: str) -> AgentResult:
        """Wait for the run (following continue-as-new) and answer its result."""
        raise NotImplementedError

    async def pending(
        self, workflow_id: str | None = None, *, limit: int = 100, page_token: str = ""
    ) -> tuple[list[PendingItem], str]:
        """Pending approvals and questions of one run (and its sub-agents) or of all open runs;
        the second value is the next page's token ("" when there is none)."""
        raise NotImplementedError

    async def decide(
        self,
        workflow_id: str,
        approval_id: str,
        decision: Decision,
        *,
        reviewer: str,
        comment: str = "",
        reason: str = "",
        arguments: dict[str, Any] | None = None,
        text: str = "",
        remember: str = "",
    ) -> str:
        """Decide an approval (``arguments``: approve an edited call; ``text``: answer a question).
        Answers what took effect in one line; ``DecisionRefused`` when the run refused it."""
        raise NotImplementedError

    def events(self, workflow_id: str, *, after: EventCursor | None = None) -> AsyncIterator[RunEvent]:
        """The run's events after ``after`` until it (its last continued run) closes: progress
        events read by query (adding nothing to the run's history) merged with streamed text."""
        raise NotImplementedError

    async def transcript(self, workflow_id: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def fork(
        self, workflow_id: str, *, step: int | None = None, task: str | None = None, new_id: str | None = None
    ) -> RunRef:
        raise NotImplementedError

    async def rewind(self, workflow_id: str, *, step: int) -> RunRef:
        raise NotImplementedError

    async def cancel(self, workflow_id: str, *, reason: str = "") -> None:
        raise NotImplementedError

    async def list(
        self, *, state: str | None = None, limit: int = 50, page_token: str = ""
    ) -> tuple[list[RunSummary], str]:
        raise NotImplementedError
