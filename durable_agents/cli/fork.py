"""``starter.py fork`` / ``rewind``: a new run from another run's first N steps, or a run reset to its step N.

``fork`` starts a new ``AgentWorkflow`` with the source run's own input (read from the first
event of its history) and ``fork`` set: the worker copies the source's transcript up to the end
of step N (``fork_prepare``) and the fork's first model turn is step N + 1, in the workspace the
source had then. The source is only read.

``rewind`` resets the run itself (Temporal's ResetWorkflowExecution) to the workflow task that
ended step N: the one that scheduled the model turn of step N + 1. The new run asks its model
again from there, on a branch of its transcript; identical tool calls get their recorded results
(same idempotency keys), and the workspace is restored to step N before the next sandbox tool.
Signals sent after that point are reapplied (Temporal's default). A step that ran in an earlier
run of a continue-as-new chain cannot be rewound to.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from activities.settings import Settings
from durable_agents.cli.checkpoint_steps import decode_results, refuse_uncheckpointed
from durable_agents.cli.common import (
    EXIT_USAGE,
    RPC_TIMEOUT,
    CliError,
    check_agent_run,
    cli_command,
    describe_run,
    following,
    on_interrupt,
    warn_when_no_worker,
)
from durable_agents.cli.names import check_model
from durable_agents.cli.review import FollowReviewer
from durable_agents.cli.run import (
    WAITING,
    DemoModelNote,
    _follow,
    _report,
    add_reuse_id_option,
    checked_task,
    start_agent_run,
    static_details,
    ui_link,
)
from workflows.progress import FORK_OF
from workflows.types import AgentInput, ForkSpec

MODEL_ACTIVITY = "model"
MAX_STEP = 1_000_000  # ForkSpec.step's bound
FORK_SUMMARY_TASK_CHARS = 100
# What a fork keeps of its source's input (a fork is a run started from outside: no depth, budget, parent).
# A session's fork is a session.
KEPT_FIELDS = (
    "tools", "limits", "policy", "approvers", "tenant", "user", "system_prompt", "subagents", "session",
)  # fmt: skip


def step_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_STEP:
        raise argparse.ArgumentTypeError(f"expected a step number (0 to {MAX_STEP:,}), got {text!r}")
    return value


def add_fork_command(sub: argparse._SubParsersAction[Any]) -> None:
    fork = sub.add_parser(
        "fork", help="start a new run from another run's first N steps (its transcript and workspace then)"
    )
    fork.add_argument("workflow_id", metavar="RUN_ID", help="the run to fork (it is only read)")
    fork.add_argument(
        "--at-step",
        dest="step",
        type=step_number,
        required=True,
        metavar="N",
        help="keep the source's first N steps; the fork's first model turn is step N+1 (0: only the task)",
    )
    fork.add_argument("--id", help="the fork's workflow id (default: RUN_ID-forkN-<random>)")
    add_reuse_id_option(fork)
    fork.add_argument(
        "--task",
        default=None,
        help="a new instruction, given to the model after the N steps (default: none, the source's task goes on)",
    )
    fork.add_argument("--model", default="", help="e.g. openai:gpt-4o-mini (default: the source's model)")
    fork.add_argument(
        "--run-id",
        default="",
        metavar="R",
        help="fork this run of RUN_ID (one before a reset or a continue-as-new; default: the latest)",
    )
    mode = fork.add_mutually_exclusive_group()
    mode.add_argument("--wait", action="store_true", help="wait for the fork's result")
    mode.add_argument("--follow", action="store_true", help="show the fork's progress until it ends")


def add_rewind_command(sub: argparse._SubParsersAction[Any]) -> None:
    rewind = sub.add_parser(
        "rewind",
        help="reset a run to the end of step N (running or closed); it goes on from there on a transcript branch",
    )
    rewind.add_argument("workflow_id", metavar="RUN_ID", help="the run to reset (its latest run)")
    rewind.add_argument(
        "--to-step",
        dest="step",
        type=step_number,
        required=True,
        metavar="N",
        help="keep steps 1..N; the model is asked for step N+1 again (0: from the start)",
    )
    rewind.add_argument("--reason", default="", help="recorded with the reset (default: 'rewind to step N')")


# --- fork ------------------------------------------------------------------------------------


async def cmd_fork(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    source_id, step = args.workflow_id, args.step
    check_model(args.model, settings)  # a misspelt name is a usage error now, not a failed fork later
    handle, desc = await _describe(client, source_id, args.run_id)
    check_agent_run(desc)
    events = await _history(handle)
    await _decode_model_inputs(client, events)
    source = await _source_input(client, source_id, events)
    steps = steps_done(events, source)
    if step > steps:
        raise CliError(f"run {source_id} has {steps} complete step(s); cannot fork at step {step}")
    await decode_results(client, events)
    refuse_uncheckpointed(events, source_id, step, "fork")
    inp = fork_input(source, args)
    workflow_id = args.id or f"{source_id}-fork{step}-{uuid.uuid4().hex[:6]}"
    task_queue = desc.task_queue  # where the source's workers (and so its run store) are
    on_interrupt(f"fork {workflow_id} may or may not have started: see {cli_command(f'status {workflow_id}')}")
    summary = fork_summary(source_id, step, args.task)
    new = await _start_fork(client, inp, workflow_id, task_queue, summary, reuse_id=args.reuse_id)
    following(workflow_id)
    print(f"started fork {workflow_id} of {source_id} at step {step} on task queue {task_queue}")
    link = ui_link(settings.temporal.ui_url, client.namespace, workflow_id, new.result_run_id)
    print(f"  ui: {link}", flush=True)  # before a long wait: through a pipe too
    note = DemoModelNote()
    note.model(inp.model)
    if inp.session is not None:
        talk, end = cli_command(f"send {workflow_id} TEXT"), cli_command(f"close {workflow_id}")
        print(f"  a session: {talk} talks to it, {end} ends it")
        return 0
    if not (args.wait or args.follow):
        return 0
    reviewer = None
    if args.follow:
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
        reviewer = FollowReviewer(
            client, workflow_id, settings.reviewer, interactive=interactive, approval_key=settings.approval_key
        )
    watchdog = asyncio.ensure_future(warn_when_no_worker(client, workflow_id, task_queue, doing=WAITING))
    try:
        result = await _follow(client, new, quiet=not args.follow, reviewer=reviewer, note=note)
    finally:
        watchdog.cancel()
    return _report(result, False, new, ui_link(settings.temporal.ui_url, client.namespace, new.id, None))


def fork_input(source: AgentInput, args: argparse.Namespace) -> AgentInput:
    """The fork's input: the source's tools, limits, policy ... with ``fork`` set; a bad value is a usage error."""
    # A session's fork does not take the source's first message again; a task given is its next message.
    default_task = "" if source.session is not None else source.task
    task = default_task if args.task is None else checked_task(args.task)
    try:
        return AgentInput(
            task=task,
            model=args.model,
            fork=ForkSpec(workflow_id=args.workflow_id, run_id=args.run_id, step=args.step),
            **{name: getattr(source, name) for name in KEPT_FIELDS},
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "input"
        raise CliError(f"invalid fork input: {where}: {first['msg']}", code=EXIT_USAGE) from None


def fork_summary(source_id: str, step: int, task: str | None) -> str:
    summary = f"fork of {source_id} at step {step}"
    return summary + (f": {' '.join(task.split())[:FORK_SUMMARY_TASK_CHARS]}" if task else "")


async def _start_fork(
    client: Client, inp: AgentInput, workflow_id: str, task_queue: str, summary: str, *, reuse_id: bool = False
) -> WorkflowHandle[Any, Any]:
    """Start the fork, with ``AgentForkOf`` when the namespace has it (without it when the server refuses it)."""
    assert inp.fork is not None
    attributes = TypedSearchAttributes([SearchAttributePair(FORK_OF, inp.fork.workflow_id)])
    details = f"{static_details(inp)}\n\n**fork of** {inp.fork.workflow_id} at step {inp.fork.step}"
    return await start_agent_run(
        client,
        inp,
        workflow_id,
        task_queue,
        summary=summary,
        details=details,
        search_attributes=attributes,
        what="fork",
        reuse_id=reuse_id,
    )


def steps_done(events: Sequence[HistoryEvent], inp: AgentInput) -> int:
    """The source's steps whose model turn completed, counting those of earlier runs of its chain."""
    completed = {
        event.activity_task_completed_event_attributes.scheduled_event_id
        for event in events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    }
    done = [turn for event_id, (turn, _) in model_turns(events).items() if event_id in completed]
    return max(done, default=inp.carry.step if inp.carry else 0)


# --- rewind ----------------------------------------------------------------------------------


async def cmd_rewind(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    workflow_id, step = args.workflow_id, args.step
    _, desc = await describe_run(client, workflow_id)
    check_agent_run(desc)
    current = client.get_workflow_handle(workflow_id, run_id=desc.run_id)
    events = await _history(current)
    await _decode_model_inputs(client, events)
    target = reset_event_for_step(events, step)
    if target is None:
        turns = [turn for turn, _ in model_turns(events).values()]
        first = await _first_step(client, events)
        if step + 1 <= first or (turns and step + 1 < min(turns)):
            raise CliError(
                f"step {step + 1} of run {workflow_id} ran in an earlier run of its continue-as-new chain "
                f"(the current run {desc.run_id} starts after step {first}): rewinding across continue-as-new "
                "is not supported"
            )
        raise CliError(
            f"run {workflow_id} has no step after {step} to rewind from (steps it has: {max(turns, default=first)})"
        )
    await decode_results(client, events)
    refuse_uncheckpointed([e for e in events if e.event_id < target], workflow_id, step, "rewind")
    response = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=desc.run_id),
            reason=args.reason or f"rewind to step {step}",
            workflow_task_finish_event_id=target,
            request_id=str(uuid.uuid4()),
            identity=client.identity,
        ),
        retry=True,
        timeout=RPC_TIMEOUT,
    )
    print(f"rewound {workflow_id} to step {step}: new run {response.run_id}")
    print(
        f"next: its model is asked for step {step + 1} again; identical tool calls get their recorded results, "
        f"and the workspace is restored to step {step} (watch it: {cli_command(f'watch {workflow_id}')})"
    )
    return 0


def model_turns(events: Sequence[HistoryEvent]) -> dict[int, tuple[int, int]]:
    """Each scheduled ``model`` activity: its event id → (its turn, the WorkflowTaskCompleted that scheduled it).

    The turn is read from the activity's input (a ``ModelRequest`` as JSON); an input that is not
    plain JSON (encrypted by a codec the caller did not undo) is skipped.
    """
    turns: dict[int, tuple[int, int]] = {}
    for event in events:
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_type.name != MODEL_ACTIVITY or not attrs.input.payloads:
            continue
        payload = attrs.input.payloads[0]
        if payload.metadata.get("encoding", b"json/plain") != b"json/plain":
            continue
        try:
            turn = json.loads(payload.data).get("turn")
        except (ValueError, AttributeError):
            continue
        if isinstance(turn, int):
            turns[event.event_id] = (turn, attrs.workflow_task_completed_event_id)
    return turns


def reset_event_for_step(events: Sequence[HistoryEvent], step: int) -> int | None:
    """The id of the WorkflowTaskCompleted event that ended ``step``: the one that scheduled turn ``step + 1``.

    None when this history has no model turn ``step + 1`` (the run ended at ``step``, has not got
    there, or ran it in an earlier run of its continue-as-new chain).
    """
    for turn, completed_id in model_turns(events).values():
        if turn == step + 1:
            return completed_id
    return None


# --- shared ----------------------------------------------------------------------------------


async def _describe(
    client: Client, workflow_id: str, run_id: str
) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
    if not run_id:
        return await describe_run(client, workflow_id)
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        return handle, await handle.describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            raise CliError(f"no run {run_id!r} of {workflow_id!r}") from None
        raise


async def _history(handle: WorkflowHandle[Any, Any]) -> list[HistoryEvent]:
    """The run's whole history (the handle's run: describe's run id, or the one asked for)."""
    events = handle.fetch_history_events(rpc_timeout=RPC_TIMEOUT)
    return [event async for event in events]


async def _source_input(client: Client, workflow_id: str, events: Sequence[HistoryEvent]) -> AgentInput:
    """The run's own input, from its ``WorkflowExecutionStarted`` event (a continued run's includes its carry)."""
    if not events or events[0].event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        raise CliError(f"run {workflow_id} has no start event in its history")
    payloads = events[0].workflow_execution_started_event_attributes.input.payloads
    try:
        [inp] = await client.data_converter.decode(payloads, [AgentInput])
    except (ValueError, TypeError) as exc:
        raise CliError(f"run {workflow_id}'s input does not decode as an agent run's: {exc}") from None
    if not isinstance(inp, AgentInput):
        raise CliError(f"run {workflow_id}'s input does not decode as an agent run's")
    return inp


async def _first_step(client: Client, events: Sequence[HistoryEvent]) -> int:
    """The step a continued run starts after (its carry's), 0 for a run's first execution."""
    if not events or not events[0].workflow_execution_started_event_attributes.continued_execution_run_id:
        return 0
    try:
        [inp] = await client.data_converter.decode(
            events[0].workflow_execution_started_event_attributes.input.payloads, [AgentInput]
        )
    except (ValueError, TypeError):
        return 0
    return inp.carry.step if isinstance(inp, AgentInput) and inp.carry else 0


async def _decode_model_inputs(client: Client, events: Sequence[HistoryEvent]) -> None:
    """Undo the client's payload codec (if any) on the model activities' inputs, in place."""
    codec = client.data_converter.payload_codec
    if codec is None:
        return
    for event in events:
        attrs = event.activity_task_scheduled_event_attributes
        if (
            event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and attrs.activity_type.name == MODEL_ACTIVITY
        ):
            decoded = await codec.decode(list(attrs.input.payloads))
            del attrs.input.payloads[:]
            attrs.input.payloads.extend(decoded)
