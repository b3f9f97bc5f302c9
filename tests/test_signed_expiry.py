"""A signature over the expires_at a reviewer read stays valid when the run keeps a slightly later one.

A status query answered while the workflow task that opens an approval is still to start shows the
entry computed ahead of that task, with the previous task's time; the run's own entry then expires a
few milliseconds (under load, seconds) later. Signers say which expires_at they signed
(``signed_expires_at``); the run accepts it within ``SIGNED_EXPIRY_SLACK`` of its own, and never more.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from pydantic import SecretStr
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.conftest import WorkerFactory, start_agent, with_settings
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.scenarios import pending_view
from tests.waiting import DEADLINE_S, eventually
from workflows.agent import AgentWorkflow
from workflows.approval_handlers import SIGNED_EXPIRY_SLACK, signed_expiry
from workflows.identity import decision_signature
from workflows.types import ApproveSignal, StatusView

KEY = "signed-expiry-key"
ASK_FIRST = {"rules": [{"name": "ask-first", "tool": "always_fails", "decision": "ask"}]}


def _shifted(iso: str, delta: timedelta) -> str:
    return (datetime.fromisoformat(iso) + delta).isoformat()


def test_the_signed_expiry_is_used_only_within_the_slack() -> None:
    kept = "2026-12-03T10:00:00.500000+00:00"
    near = _shifted(kept, -timedelta(milliseconds=93))
    assert signed_expiry(near, kept) == near
    assert signed_expiry(_shifted(kept, SIGNED_EXPIRY_SLACK), kept) != kept
    assert signed_expiry(_shifted(kept, SIGNED_EXPIRY_SLACK + timedelta(seconds=1)), kept) == kept
    assert signed_expiry("", kept) == kept
    assert signed_expiry("not a time", kept) == kept
    assert signed_expiry("2026-12-03T10:00:00", kept) == kept  # no timezone: not comparable


async def test_a_signature_over_a_nearby_expiry_approves_and_a_far_one_does_not(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    client = dev_env.client
    llm.enqueue(Scripted(tool_calls=[("always_fails", "{}")]), Scripted(text="done"))
    async with run_worker(client, with_settings(runtime, approval_key=SecretStr(KEY))) as tq:
        handle = await start_agent(client, tq, id_prefix="signed-expiry", approvers=["alice"], policy=ASK_FIRST)
        approval = (await pending_view(handle)).pending_approvals[0]

        def signed(expires_at: str) -> ApproveSignal:
            signature = decision_signature(KEY.encode(), approval.approval_id, "approve", "alice", expires_at)
            return ApproveSignal(
                approval_id=approval.approval_id, reviewer="alice", signature=signature, signed_expires_at=expires_at
            )

        # Signed over an expiry an hour off: refused, and the call still waits.
        await handle.signal(AgentWorkflow.approve, signed(_shifted(approval.expires_at, timedelta(hours=1))))

        async def refused() -> StatusView | None:
            view = await handle.query(AgentWorkflow.status)
            return view if view.refused_counts.get("bad_signature") == 1 else None

        view = await eventually(refused, "the far signature is refused")
        assert [p.approval_id for p in view.pending_approvals] == [approval.approval_id]

        # Signed over what a query ahead of the opening task would have shown (93 ms earlier): approved.
        await handle.signal(AgentWorkflow.approve, signed(_shifted(approval.expires_at, -timedelta(milliseconds=93))))
        result = await asyncio.wait_for(handle.result(), timeout=DEADLINE_S)
    assert result.status == "completed" and result.output == "done"
