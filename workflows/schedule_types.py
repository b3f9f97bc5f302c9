"""The data contract of schedules: how a Temporal Schedule names its runs and what a session schedule sends.

A schedule (``starter.py schedule create``, ``AgentClient.schedule_create``) is a real Temporal Schedule
whose id is ``SCHEDULE_ID_PREFIX + name``, followed by ``@`` and its tenant when it has one
(``durable_agents/agent_client/_schedule_checks.py``). A task schedule's action starts an ``AgentWorkflow``; a session
schedule's starts a ``ScheduledMessageWorkflow`` (``workflows/scheduled_message.py``) with a
:class:`ScheduledMessage`, which hands the message to a session through the ``scheduled_message_send``
activity (a Schedule can only start workflows, and only a client can update-with-start a session).

Pure pydantic (workflow code imports it). New fields always get defaults.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from workflows.session_types import MAX_MESSAGE_CHARS, MAX_MESSAGE_ID_CHARS, MAX_SENDER_CHARS
from workflows.types import MAX_NAME_CHARS, AgentInput

SCHEDULE_ID_PREFIX = "agent-schedule-"  # a schedule's id, and the workflow id of its runs before Temporal's time
MAX_SCHEDULE_NAME_CHARS = 64
# Letters, digits, ".", "_" and "-", starting with a letter or digit: safe in a workflow id, a URL and a shell.
SCHEDULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SCHEDULED_MESSAGE_WORKFLOW = "ScheduledMessageWorkflow"
SCHEDULED_SEND_ACTIVITY = "scheduled_message_send"
# Why the activity refuses for good (not retried): the session is another tenant's, the id is a run that is
# not a session, or the session refused the message for a reason a retry does not change.
SCHEDULED_SEND_REFUSED = "ScheduledMessageRefused"


class ScheduledMessage(BaseModel):
    """``ScheduledMessageWorkflow``'s input: send ``text`` to session ``session_id``, starting it when missing."""

    schedule: str = Field(default="", max_length=MAX_SCHEDULE_NAME_CHARS)  # the schedule's name (the sender)
    session_id: str = Field(min_length=1, max_length=1000)
    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    tenant: str = Field(default="", max_length=MAX_NAME_CHARS)  # the session must be this tenant's
    task_queue: str = Field(default="", max_length=1000)  # where a missing session starts ("": the activity's)
    # The input a missing session starts with (its ``session`` set); None: a plain session of ``tenant``.
    start: AgentInput | None = None


class ScheduledSend(ScheduledMessage):
    """``scheduled_message_send``'s input: the message with the id that makes its retries one message."""

    message_id: str = Field(min_length=1, max_length=MAX_MESSAGE_ID_CHARS)
    sender: str = Field(default="", max_length=MAX_SENDER_CHARS)
