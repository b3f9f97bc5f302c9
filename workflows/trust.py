"""Run input fields only the runtime sets: refused from outside, checked against what the server says.

Anyone who can start an ``AgentWorkflow`` decides its whole input, so the fields that only the
runtime itself sets (``carry``, handed over by continue-as-new; ``depth``, ``budget``,
``parent_conversation``, ``checkpoint``, ``subagents_ref`` and ``as_subagent``, set by a parent for
its sub-agent) are trusted only
as far as the server's own account of the run (``workflow.info()``: its workflow id, first run,
predecessor and parent) backs them:

- a run started from outside (no parent) may set none of the parent's fields, and a run that is
  not a continuation may not carry anything;
- a parent's field must name the run's actual parent (or, for a tree's budget, an ancestor);
- a carry's identities are checked again even in a real continuation: its conversation is this
  workflow's, its sandbox is the one derived from that conversation or from the verified parent's,
  its budget is the one the run was given or its own.

``input_problem`` is called once, before the run uses anything of its input; a field it refuses
fails the run with ``invalid run input: <field>: ...`` on its first workflow task, before any
command. A new runtime-only field is one line in ``RUNTIME_ONLY``.

Pure functions of the input and ``Lineage``: deterministic, and testable without a server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from temporalio import workflow

from workflows.identity import SESSION_RUN, sandbox_id_for
from workflows.inputs import quote
from workflows.types import SUBAGENT_NAME_PATTERN, AgentInput

# A conversation id is ``<workflow id>/<first run id>``, plus one ``~<10 hex>`` per branch a reset
# made (activities/model_turn.py, ``_branch_after_reset``); run ids are the server's UUIDs.
RUN_SEGMENT = r"[^/~]{1,100}"
BRANCHES = r"(?:~[0-9a-f]{10})*"
_BRANCH_SUFFIX = re.compile(r"~[0-9a-f]{10}$")
# A child's workflow id is ``<parent's>/<sub-agent>/s<step>c<index>`` (workflows/tool_calls.py, ``child_workflow_id``).
_CHILD_SUFFIX = re.compile(r"/" + SUBAGENT_NAME_PATTERN.strip("^$") + r"/s\d+c\d+$")


@dataclass(frozen=True)
class Lineage:
    """The server's account of this run (never its input)."""

    workflow_id: str
    first_run_id: str  # the first run of its continue-as-new chain (kept by resets too)
    continued: bool  # ``continued_run_id`` is set: started by continue-as-new (or a cron run or a retry)
    parent_workflow_id: str | None  # None: started from outside (a client, the CLI, a schedule)

    @classmethod
    def of_this_run(cls) -> Lineage:
        info = workflow.info()
        return cls(
            workflow_id=info.workflow_id,
            first_run_id=info.first_execution_run_id,
            # A cron run or a workflow retry names the run before it too, and gets that run's input: a carry
            # sent from outside in it still fails, since its conversation must name this chain's first run,
            # whose id the server made after the input was sent.
            continued=bool(info.continued_run_id),
            parent_workflow_id=info.parent.workflow_id if info.parent else None,
        )

    @property
    def conversation(self) -> str:
        """The conversation this run's chain started with."""
        return f"{self.workflow_id}/{self.first_run_id}"


Check = Callable[[AgentInput, Lineage], str]  # "" when the field's value is backed, else why not


def input_problem(inp: AgentInput, run: Lineage) -> str:
    """``<field>: <why>`` for the first runtime-only field this run may not have as it is, or ``""``."""
    for name, check in RUNTIME_ONLY.items():
        field = AgentInput.model_fields[name]
        if getattr(inp, name) == field.get_default(call_default_factory=True):
            continue  # not set: nothing to trust
        problem = check(inp, run)
        if problem:
            return f"{name}: {problem}"
    return ""


# --- the checks --------------------------------------------------------------------------------

OUTSIDE = "this run was started from outside"


def from_parent(inp: AgentInput, run: Lineage) -> str:
    """Set by a parent for its sub-agent: refused from a run started from outside."""
    if run.parent_workflow_id is None:
        return f"only a parent run sets it for its sub-agent ({OUTSIDE})"
    return ""


def _depth(inp: AgentInput, run: Lineage) -> str:
    return from_parent(inp, run)


def _budget(inp: AgentInput, run: Lineage) -> str:
    if run.parent_workflow_id is None:
        return f"only a sub-agent spends from a tree's budget, set by its parent ({OUTSIDE})"
    assert inp.budget is not None
    if not any(is_conversation_of(a, inp.budget.root) for a in ancestors(run.parent_workflow_id)):
        return f"root {quote(inp.budget.root)} is not the conversation of this run's parent or of one of its ancestors"
    return ""


def _parent_conversation(inp: AgentInput, run: Lineage) -> str:
    if run.parent_workflow_id is None:
        return f"only a sub-agent may work in its own parent's sandbox ({OUTSIDE})"
    if not is_conversation_of(run.parent_workflow_id, inp.parent_conversation, branches=True):
        return (
            f"only a sub-agent may work in its own parent's sandbox: {quote(inp.parent_conversation)} "
            "is not a conversation of this run's parent"
        )
    return ""


def _checkpoint(inp: AgentInput, run: Lineage) -> str:
    if run.parent_workflow_id is None or not inp.parent_conversation:
        return "only a sub-agent working in its parent's sandbox starts from one (set by its parent)"
    return ""


def _subagents_ref(inp: AgentInput, run: Lineage) -> str:
    if run.parent_workflow_id is None:
        return f"only a sub-agent names its tree's sub-agent definitions, set by its parent ({OUTSIDE})"
    if inp.subagents is not None:
        return "a sub-agent that names its tree's definitions takes no others (subagents)"
    return ""


def _as_subagent(inp: AgentInput, run: Lineage) -> str:
    if run.parent_workflow_id is None:
        return f"only a parent run sets it for its sub-agent ({OUTSIDE})"
    if not inp.subagents_ref:
        return "needs subagents_ref (set by the parent)"
    return ""


def _carry(inp: AgentInput, run: Lineage) -> str:
    carry = inp.carry
    assert carry is not None
    if not run.continued:
        return f"only continue-as-new hands a run its carry ({OUTSIDE}, not continued from a run of its own)"
    if not is_conversation_of(run.workflow_id, carry.conversation_id, run=run.first_run_id, branches=True):
        return f"conversation_id {quote(carry.conversation_id)} is not this run's (it is {quote(run.conversation)})"
    if carry.shared_sandbox != inp.parent_conversation:
        return "shared_sandbox is not the parent's conversation this run was started with"
    owners = [*branch_chain(carry.conversation_id), *branch_chain(carry.shared_sandbox)]
    if carry.sandbox_id and carry.sandbox_id not in {sandbox_id_for(owner) for owner in owners}:
        return f"sandbox_id {quote(carry.sandbox_id)} is not the sandbox of this run's conversation or its parent's"
    if carry.budget is not None:
        given = inp.budget.root if inp.budget is not None else run.conversation
        if carry.budget.root != given:
            return f"budget.root {quote(carry.budget.root)} is not the budget this run was started with or its own"
    return ""


# Each field only the runtime sets, and what must back it.
RUNTIME_ONLY: dict[str, Check] = {
    "carry": _carry,
    "depth": _depth,
    "budget": _budget,
    "parent_conversation": _parent_conversation,
    "checkpoint": _checkpoint,
    "subagents_ref": _subagents_ref,  # sub-agent definitions by digest (workflows/delegation.py)
    "as_subagent": _as_subagent,
}


# --- identities --------------------------------------------------------------------------------


def is_conversation_of(workflow_id: str, conversation: str, *, run: str = "", branches: bool = False) -> bool:
    """Whether ``conversation`` is one of ``workflow_id``'s (of its chain that started with ``run``, when given).

    A session's conversation (``<workflow id>/session``) is every one of its runs'.
    """
    segment = f"({re.escape(run)}|{SESSION_RUN})" if run else f"({RUN_SEGMENT}|{SESSION_RUN})"
    pattern = re.escape(workflow_id) + "/" + segment + (BRANCHES if branches else "")
    return re.fullmatch(pattern, conversation) is not None


def ancestors(workflow_id: str) -> Iterator[str]:
    """``workflow_id`` and the workflow ids of the runs it descends from, by the child-id scheme, nearest first."""
    yield workflow_id
    while (found := _CHILD_SUFFIX.search(workflow_id)) is not None:
        workflow_id = workflow_id[: found.start()]
        yield workflow_id


def branch_chain(conversation: str) -> list[str]:
    """A conversation and the ones it branched from (a sandbox keeps the id of the one that created it)."""
    chain = [conversation] if conversation else []
    while (found := _BRANCH_SUFFIX.search(chain[-1] if chain else "")) is not None:
        chain.append(chain[-1][: found.start()])
    return chain
