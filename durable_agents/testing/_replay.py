"""``replay``: captured histories against today's workflow code, with the data converter the plugin uses.

A history that no longer replays means the code changed what a run already in flight had recorded (a
command added, removed or reordered without ``workflow.patched``): deployed, that code would fail those
runs. Capture histories with ``temporal workflow show --workflow-id ID --output json > ID.json`` (or
``await handle.fetch_history()``) and replay them in a test, so such a change fails there first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from activities.crypto.codec import encrypted_converter
from activities.crypto.keyring import KeyRing
from durable_agents.plugin import WORKFLOWS, share_workflow_module

HistorySource = WorkflowHistory | str | os.PathLike[str] | Mapping[str, Any]
"""A history: a ``WorkflowHistory``, a path to its JSON (``temporal workflow show --output json``), or that
JSON parsed (a mapping with ``"events"``)."""


class Replayed(BaseModel):
    """One history that replayed."""

    model_config = ConfigDict(frozen=True)

    workflow_id: str
    source: str  # the file it came from, or ``<WorkflowHistory>`` / ``<mapping>``
    events: int


class ReplayFailure(BaseModel):
    """One history that did not replay, and why."""

    model_config = ConfigDict(frozen=True)

    workflow_id: str
    source: str
    nondeterministic: bool  # the code's commands differ from the history's (else: it could not run at all)
    error: str  # the replayer's message, naming the command or event that differs


class ReplayFailed(AssertionError):
    """Histories that do not replay against the code under test; ``failures`` says which and why.

    An ``AssertionError``, so a test that calls :func:`replay` fails with this message.
    """

    def __init__(self, failures: Sequence[ReplayFailure], replayed: int) -> None:
        self.failures = list(failures)
        lines = [
            f"{len(self.failures)} of {len(self.failures) + replayed} histories do not replay against this code:",
            *(
                f"- workflow {f.workflow_id} ({f.source}): "
                f"{'nondeterminism' if f.nondeterministic else 'replay error'}: {f.error}"
                for f in self.failures
            ),
        ]
        if any(f.nondeterministic for f in self.failures):
            lines.append(
                "The code schedules other commands than these runs recorded: guard the change with "
                "workflow.patched() so that runs already in flight replay as they ran."
            )
        super().__init__("\n".join(lines))


def replay_converter(payload_keys: str | KeyRing | None = None) -> DataConverter:
    """The data converter of ``DurableAgentsPlugin``: pydantic, and with payload keys the AES-256-GCM codec.

    ``payload_keys`` is ``AGENT_PAYLOAD_KEYS``' text (``id:base64key,...``) or a parsed ``KeyRing``.
    """
    keyring = KeyRing.parse(payload_keys) if isinstance(payload_keys, str) else payload_keys
    return encrypted_converter(pydantic_data_converter, keyring)


def load_history(source: HistorySource, *, workflow_id: str | None = None) -> tuple[WorkflowHistory, str]:
    """``(history, where it came from)`` for ``source``.

    The workflow id is the run's own (replaying needs it: ids derived from it are part of the history):
    ``workflow_id`` when given, else the one the history's first event records, else the file's stem.
    """
    if isinstance(source, WorkflowHistory):
        return source, "<WorkflowHistory>"
    if isinstance(source, Mapping):
        data, origin, stem = dict(source), "<mapping>", "replayed"
    else:
        path = Path(source)
        data, origin, stem = json.loads(path.read_text(encoding="utf-8")), str(path), path.stem
    return WorkflowHistory.from_json(workflow_id or _recorded_id(data) or stem, data), origin


def _recorded_id(data: Mapping[str, Any]) -> str:
    events = data.get("events") or [{}]
    started = events[0].get("workflowExecutionStartedEventAttributes") or {}
    return str(started.get("workflowId") or "")


async def replay(
    histories: HistorySource | Iterable[HistorySource],
    *,
    workflows: Sequence[type] | None = None,
    payload_keys: str | KeyRing | None = None,
    data_converter: DataConverter | None = None,
) -> list[Replayed]:
    """Replay every history against ``workflows`` and return what replayed; :class:`ReplayFailed` if any did not.

    ``workflows`` defaults to the workflows ``DurableAgentsPlugin`` registers (``AgentWorkflow``,
    ``ScheduledMessageWorkflow``); given, it replaces them (your own workflows, or a variant of ours under the
    same name). Payloads are decoded as the plugin's workers decode them: pydantic, and with ``payload_keys``
    (``AGENT_PAYLOAD_KEYS``' text) the payload codec; ``data_converter`` replaces that converter. Every
    history is replayed before the failures are raised together, each naming its workflow id and what differs.
    """
    sources: list[HistorySource] = (
        [histories] if isinstance(histories, WorkflowHistory | str | os.PathLike | Mapping) else list(histories)
    )
    replayer = Replayer(
        workflows=list(workflows if workflows is not None else WORKFLOWS),
        data_converter=data_converter if data_converter is not None else replay_converter(payload_keys),
        workflow_runner=share_workflow_module(None),  # the sandbox the plugin's workers run workflows in
    )
    replayed: list[Replayed] = []
    failures: list[ReplayFailure] = []
    for source in sources:
        history, origin = load_history(source)
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        failure = result.replay_failure
        if failure is None:
            replayed.append(Replayed(workflow_id=history.workflow_id, source=origin, events=len(history.events)))
        else:
            failures.append(
                ReplayFailure(
                    workflow_id=history.workflow_id,
                    source=origin,
                    nondeterministic=isinstance(failure, NondeterminismError),
                    error=str(failure),
                )
            )
    if failures:
        raise ReplayFailed(failures, len(replayed))
    return replayed
