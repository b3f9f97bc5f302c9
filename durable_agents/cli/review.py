"""Reviewing while following a run: ``run --follow`` asks for each approval, or prints the commands.

A question the model asks (``ask_human``) is asked the same way: the prompt takes an option's
number or (when the question allows it) any text, and sends it as ``starter.py answer`` does.

The decisions go through :func:`durable_agents.cli.decisions.send_decision`, signed
when the settings carry ``AGENT_APPROVAL_KEY``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from pydantic import SecretStr
from temporalio.client import Client
from temporalio.service import RPCError

from durable_agents.cli.approval_text import decide_commands, question_lines, time_left, who_decides
from durable_agents.cli.approvals import running_view
from durable_agents.cli.common import QUERY_TIMEOUT, CliError, cli_command
from durable_agents.cli.decisions import Decision, Extras, send_decision
from durable_agents.cli.owners import owned, tree
from durable_agents.cli.watch import answer_commands
from workflows.call_view import call_lines
from workflows.types import PendingApproval

# input() runs here, not in the loop's default executor: asyncio.run() joins that executor on exit,
# which would hang a finished `run --follow` until someone pressed Enter at an abandoned prompt.
_PROMPTS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="approval-prompt")


class FollowReviewer:
    """Reacts once to each approval a followed run starts waiting for.

    On a terminal (stdin and stdout) it asks ``approve? [y/n/c=comment]`` and sends
    the answer; the prompt is read in a thread, so the follow loop keeps polling.
    Otherwise, or once stdin is closed, it prints the exact commands that decide it.
    """

    def __init__(
        self,
        client: Client,
        workflow_id: str,
        reviewer: str,
        *,
        interactive: bool,
        approval_key: SecretStr | None = None,
    ) -> None:
        self.client, self.workflow_id, self.reviewer = client, workflow_id, reviewer
        self.interactive = interactive
        self.approval_key = approval_key  # decisions are signed with it; commands printed without it are not
        self.busy = False  # a prompt is open: the follow loop holds its progress lines
        self._seen: set[str] = set()
        self._queue: asyncio.Queue[PendingApproval] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def notice(self, approvals: list[PendingApproval]) -> None:
        for approval in approvals:
            if approval.approval_id in self._seen:
                continue
            self._seen.add(approval.approval_id)
            if not self.interactive:
                self._print_commands(approval)
                continue
            self._queue.put_nowait(approval)
            if self._task is None:
                self._task = asyncio.ensure_future(self._review_queue())

    async def close(self) -> None:
        if self.busy:
            print("\n(the run ended; the open approval prompt is closed)", flush=True)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _print_commands(self, approval: PendingApproval) -> None:
        relayed = f", reported by sub-agent run {approval.workflow_id}" if approval.workflow_id else ""
        if approval.kind == "question":
            print(
                f"question asked: {approval.approval_id}  (may answer: {who_decides(approval)}, "
                f"expires in {time_left(approval.expires_at)}{relayed})"
            )
            print("\n".join(f"  {line}" for line in question_lines(approval)))
            answer, signal = answer_commands(self.workflow_id, approval.approval_id, self.reviewer)
            print(f"   answer: {answer}")
            print(f"       or: {signal}", flush=True)
            return
        print(
            f"approval needed: {approval.approval_id}  (rule {approval.rule or '-'}, may decide: "
            f"{who_decides(approval)}, expires in {time_left(approval.expires_at)}{relayed})"
        )
        print("\n".join(call_lines(approval.tool, approval.args)))
        approve, signal, reject = decide_commands(self.workflow_id, approval.approval_id, self.reviewer)
        print(f"  approve: {approve}")
        print(f"       or: {signal}")
        if self.approval_key is not None:
            print("           (unsigned: refused by workers that require signed decisions)")
        print(f"           (a signal gets no answer: {cli_command(f'status {self.workflow_id}')} lists refusals)")
        print(f"   reject: {reject}", flush=True)

    async def _review_queue(self) -> None:
        while True:
            approval = await self._queue.get()
            if not self.interactive:
                self._print_commands(approval)
                continue
            self.busy = True
            try:
                await self._review(approval)
            except EOFError:
                print("\n(stdin closed: decide with the commands below)")
                self.interactive = False
                self._print_commands(approval)
            except (CliError, RPCError) as err:
                print(f"error: {err}", file=sys.stderr, flush=True)
            finally:
                self.busy = False

    async def _review(self, approval: PendingApproval) -> None:
        # Shown and signed as the run that waits for it lists it, never as a parent relayed it.
        _, view = await running_view(self.client, self.workflow_id, query_timeout=QUERY_TIMEOUT)
        runs = await tree(self.client, self.workflow_id, view) if view is not None else []
        found = [o for (_, aid), o in owned(runs, self.workflow_id).items() if aid == approval.approval_id]
        if not found:
            print(f"approval {approval.approval_id} is no longer pending")
            return
        owner, approval = found[0].workflow_id, found[0].approval
        where = f" of sub-agent run {owner}" if owner != self.workflow_id else ""
        if approval.kind == "question":
            await self._answer(owner, approval, where)
            return
        print(f"\napproval needed: {approval.approval_id}{where} (step {approval.step})")
        print("\n".join(call_lines(approval.tool, approval.args)))
        left = time_left(approval.expires_at)
        print(f"  rule: {approval.rule or '-'}   may decide: {who_decides(approval)}   expires in: {left}", flush=True)
        decision: Decision
        while True:
            answer = (await _ask("approve? [y/n/c=comment] ")).strip().lower()
            if answer in ("y", "yes"):
                decision, note = "approve", ""
            elif answer in ("c", "comment"):
                decision, note = "approve", (await _ask("comment: ")).strip()
            elif answer in ("n", "no"):
                decision, note = "reject", ""
                while not note:
                    note = (await _ask("reason: ")).strip()
            else:
                continue
            break
        try:
            line = await send_decision(
                self.client,
                owner,
                approval.approval_id,
                decision,
                self.reviewer,
                note,
                approval,
                approval_key=self.approval_key,
            )
        except CliError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            approve, _, reject = decide_commands(self.workflow_id, approval.approval_id, "<reviewer>")
            print(f"  to decide it otherwise: {approve}\n                      or: {reject}", flush=True)
        else:
            print(line, flush=True)

    async def _answer(self, owner: str, question: PendingApproval, where: str) -> None:
        print(f"\nquestion{where}: {question.approval_id} (step {question.step})")
        print("\n".join(f"  {line}" for line in question_lines(question)))
        print(f"  may answer: {who_decides(question)}   expires in: {time_left(question.expires_at)}", flush=True)
        text = await read_answer(question, _ask)
        try:
            line = await send_decision(
                self.client,
                owner,
                question.approval_id,
                "answer",
                self.reviewer,
                "",
                question,
                approval_key=self.approval_key,
                extras=Extras(text=text),
            )
        except CliError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            answer, _ = answer_commands(self.workflow_id, question.approval_id, "<reviewer>")
            print(f"  to answer it otherwise: {answer}", flush=True)
        else:
            print(line, flush=True)


async def read_answer(question: PendingApproval, ask: Callable[[str], Awaitable[str]]) -> str:
    """Prompt until the answer is one the question takes: an option's number or text, or (when the
    question allows it) any text."""
    prompt = "answer (an option's number or text): " if question.options else "answer: "
    if question.options and not question.allow_free_text:
        prompt = f"answer (1-{len(question.options)}): "
    while True:
        text = (await ask(prompt)).strip()
        if text.isdigit() and 1 <= int(text) <= len(question.options):
            return question.options[int(text) - 1]
        if question.options and not question.allow_free_text and text not in question.options:
            continue  # only the options are accepted: ask again
        if text:
            return text


async def _ask(prompt: str) -> str:
    return await asyncio.get_running_loop().run_in_executor(_PROMPTS, input, prompt)
