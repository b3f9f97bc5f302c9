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
import sys
from typing import Any

from temporalio.client import Client

from activities.settings import Settings
from durable_agents.agent_client._history import MAX_STEP
from durable_agents.agent_client._history import model_turns as model_turns
from durable_agents.agent_client._history import reset_event_for_step as reset_event_for_step
from durable_agents.agent_client._history import steps_done as steps_done
from durable_agents.cli.common import (
    agent_client,
    cli_command,
    client_errors,
    following,
    on_interrupt,
    warn_when_no_worker,
)
from durable_agents.cli.names import check_model
from durable_agents.cli.review import FollowReviewer
from durable_agents.cli.run import WAITING, DemoModelNote, _follow, _report, add_reuse_id_option, checked_task, ui_link
from workflows.types import AgentResult


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


@client_errors
async def cmd_fork(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    source_id, step = args.workflow_id, args.step
    check_model(args.model, settings)  # a misspelt name is a usage error now, not a failed fork later
    task = None if args.task is None else checked_task(args.task)
    agents = agent_client(client, settings)
    plan = await agents.plan_fork(source_id, step=step, task=task, model=args.model, run_id=args.run_id)
    inp, task_queue = plan.input, plan.task_queue
    workflow_id = args.id or plan.default_id()
    on_interrupt(f"fork {workflow_id} may or may not have started: see {cli_command(f'status {workflow_id}')}")
    ref = await agents.start_fork(plan, new_id=workflow_id, reuse_id=args.reuse_id)
    new = client.get_workflow_handle(workflow_id, run_id=ref.run_id or None, result_type=AgentResult)
    following(workflow_id)
    print(f"started fork {workflow_id} of {source_id} at step {step} on task queue {task_queue}")
    link = ui_link(settings.temporal.ui_url, client.namespace, workflow_id, ref.run_id or None)
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


# --- rewind ----------------------------------------------------------------------------------


@client_errors
async def cmd_rewind(client: Client, args: argparse.Namespace, settings: Settings) -> int:
    workflow_id, step = args.workflow_id, args.step
    ref = await agent_client(client, settings).rewind(workflow_id, step=step, reason=args.reason)
    print(f"rewound {workflow_id} to step {step}: new run {ref.run_id}")
    print(
        f"next: its model is asked for step {step + 1} again; identical tool calls get their recorded results, "
        f"and the workspace is restored to step {step} (watch it: {cli_command(f'watch {workflow_id}')})"
    )
    return 0
