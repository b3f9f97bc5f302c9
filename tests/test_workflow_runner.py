"""The workers' sandbox answers serialization- and store-context asks in process, with the SDK's answers.

A codec that records the context of every payload it encodes or decodes sees the same contexts, payload
for payload, whether a workflow runs in the SDK's sandbox or in ours; and our instances answer without
re-entering the sandbox, except for the asks that must (Nexus operations).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import CommandType
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker._command_aware_visitor import CommandInfo
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import _runner as sandbox_runner

from durable_agents.workflow_runner import DIRECT_CONTEXT, DirectContextSandboxedWorkflowRunner


@activity.defn(name="runner_probe_activity")
async def probe_activity(text: str) -> str:
    return text.upper()


@workflow.defn(name="RunnerProbeChild")
class RunnerProbeChild:
    @workflow.run
    async def run(self, text: str) -> str:
        return f"child saw {text}"


@workflow.defn(name="RunnerProbe")
class RunnerProbe:
    @workflow.run
    async def run(self, text: str) -> list[str]:
        remote = await workflow.execute_activity(
            probe_activity,
            f"remote {text}",
            start_to_close_timeout=timedelta(seconds=60),
            summary=f"summary of remote {text}",
        )
        local = await workflow.execute_local_activity(
            probe_activity,
            f"local {text}",
            start_to_close_timeout=timedelta(seconds=60),
            summary=f"summary of local {text}",
        )
        child = await workflow.execute_child_workflow(
            RunnerProbeChild.run, f"child {text}", id=f"{workflow.info().workflow_id}-child"
        )
        return [remote, local, child]


@dataclass
class RecordingCodec(PayloadCodec, WithSerializationContext):
    """Passes payloads through unchanged and records (direction, context, data) for each."""

    records: list[tuple[str, str, bytes]] = field(default_factory=list)
    context: SerializationContext | None = None

    def with_context(self, context: SerializationContext) -> RecordingCodec:
        return RecordingCodec(self.records, context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.records.extend(("encode", repr(self.context), p.data) for p in payloads)
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.records.extend(("decode", repr(self.context), p.data) for p in payloads)
        return list(payloads)


async def run_probe(env: WorkflowEnvironment, runner: WorkflowRunner, ids: str) -> list[tuple[str, str, bytes]]:
    """Each payload's contexts in one probe run on ``runner``, replaying every task (no cache)."""
    codec = RecordingCodec()
    config = env.client.config()
    config["data_converter"] = DataConverter(payload_codec=codec)
    client = Client(**config)
    async with Worker(
        client,
        task_queue=f"tq-{ids}",
        workflows=[RunnerProbe, RunnerProbeChild],
        activities=[probe_activity],
        workflow_runner=runner,
        max_cached_workflows=0,
    ):
        result = await client.execute_workflow(
            RunnerProbe.run, "hello", id=f"probe-{ids}", task_queue=f"tq-{ids}", execution_timeout=timedelta(minutes=2)
        )
    assert result == ["REMOTE HELLO", "LOCAL HELLO", "child saw child hello"]
    # A set: how many tasks replay depends on timing, which contexts each payload gets does not.
    return sorted(set(codec.records))


async def test_every_payload_gets_the_contexts_the_sdk_sandbox_gives_it(dev_env: WorkflowEnvironment) -> None:
    assert DIRECT_CONTEXT, "the installed SDK's sandbox layout is unknown: the runner fell back"
    ids = uuid.uuid4().hex[:8]
    # Same workflow ids and task queue for both runs, one after the other, so the contexts may be compared.
    sdk = await run_probe(dev_env, SandboxedWorkflowRunner(), ids)
    ours = await run_probe(dev_env, DirectContextSandboxedWorkflowRunner(), ids)
    assert ours == sdk
    # The comparison covers the asks the workflow side makes: an activity's and a local activity's
    # input, a child's input, the run's own result.
    activity_input = ActivitySerializationContext(
        namespace=dev_env.client.namespace,
        workflow_id=f"probe-{ids}",
        workflow_type="RunnerProbe",
        activity_type="runner_probe_activity",
        activity_id=None,  # the workflow side's context for an activity's input has no id
        activity_task_queue=f"tq-{ids}",
        is_local=False,
    )
    assert ("encode", repr(activity_input), b'"remote hello"') in ours
    summary = WorkflowSerializationContext(namespace=dev_env.client.namespace, workflow_id=f"probe-{ids}")
    assert ("encode", repr(summary), b'"summary of remote hello"') in ours
    local_input = [r for r in ours if r[2] == b'"local hello"' and r[0] == "encode"]
    assert local_input and all("is_local=True" in r[1] for r in local_input)
    child_input = WorkflowSerializationContext(namespace=dev_env.client.namespace, workflow_id=f"probe-{ids}-child")
    assert ("encode", repr(child_input), b'"child hello"') in ours


def _instance(runner: SandboxedWorkflowRunner) -> Any:
    """A workflow instance the way the SDK's ``prepare_workflow`` builds one to validate a definition."""
    defn = workflow._Definition.must_from_class(RunnerProbe)
    return runner.create_instance(
        WorkflowInstanceDetails(
            payload_converter_factory=DataConverter.default._new_payload_converter,
            failure_converter_class=DataConverter.default.failure_converter_class,
            interceptor_classes=[],
            defn=defn,
            info=sandbox_runner._fake_info,
            randomness_seed=-1,
            extern_functions={},
            disable_eager_activity_execution=False,
            worker_level_failure_exception_types=[],
            patch_activation_callback=None,
            last_completion_result=Payloads(),
            last_failure=Failure(),
        )
    )


def count_sandbox_entries(instance: Any) -> list[str]:
    """The code strings ``instance`` runs inside its sandbox from now on, as a list that grows."""
    entered: list[str] = []
    sdk_run_code = instance._run_code

    def run_code(code: str, **kwargs: Any) -> Any:
        entered.append(code)
        return sdk_run_code(code, **kwargs)

    instance._run_code = run_code
    return entered


ASKS = [
    None,
    CommandInfo(CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK, 1),
    CommandInfo(CommandType.COMMAND_TYPE_START_CHILD_WORKFLOW_EXECUTION, 1),
    CommandInfo(CommandType.COMMAND_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION, 1),
    CommandInfo(CommandType.COMMAND_TYPE_COMPLETE_WORKFLOW_EXECUTION, 1),
]


@pytest.mark.parametrize("ask", ASKS, ids=lambda a: "none" if a is None else CommandType.Name(a.command_type))
async def test_asks_are_answered_without_reentering_the_sandbox(ask: CommandInfo | None) -> None:
    instance = _instance(DirectContextSandboxedWorkflowRunner())
    entered = count_sandbox_entries(instance)
    ours = (instance.get_serialization_context(ask), instance.get_external_store_context(ask))
    assert entered == []
    sdk = (
        sandbox_runner._Instance.get_serialization_context(instance, ask),
        sandbox_runner._Instance.get_external_store_context(instance, ask),
    )
    assert len(entered) == 2  # the SDK's answers come through the sandbox
    assert ours == sdk


async def test_nexus_asks_and_foreign_inner_runners_keep_the_sandbox_path() -> None:
    nexus = CommandInfo(CommandType.COMMAND_TYPE_SCHEDULE_NEXUS_OPERATION, 1)
    instance = _instance(DirectContextSandboxedWorkflowRunner())
    entered = count_sandbox_entries(instance)
    instance.get_serialization_context(nexus)
    assert len(entered) == 1

    # An application's own inner runner may answer differently: its instances are asked through the sandbox.
    instance.runner_class = SandboxedWorkflowRunner
    entered.clear()
    instance.get_external_store_context(None)
    assert len(entered) == 1
