"""The data contract of humans in the loop beyond yes/no: questions, edits, remembered approvals, the audit.

Re-exported by :mod:`workflows.types` (and ``durable_agents``); kept apart so that module stays one idea
per page. Every field has a default, so histories recorded before these existed keep decoding.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

MAX_QUESTION_CHARS = 2000
MAX_OPTIONS = 20
MAX_OPTION_CHARS = 200
MAX_ANSWER_CHARS = 4000
MAX_EDIT_BYTES = 64 * 1024  # an edited call's arguments, as canonical JSON (the model's own calls: the same)
MAX_QUORUM = 10  # reviewers a policy rule may require for one call
MAX_DECISIONS_KEPT = 500  # decisions the audit keeps (newest); ``decisions_total`` counts them all
MAX_REMEMBERED = 200  # remembered approvals a run keeps

# "": only this call. ``call``: this call and every identical one (same tool, same canonical arguments).
# ``tool``: every later call of the tool. Both for the rest of the run (or session), never beyond it.
Remember = Literal["", "call", "tool"]


def bounded_arguments(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None and len(json.dumps(value, default=str)) > MAX_EDIT_BYTES:
        raise ValueError(f"edited arguments are over {MAX_EDIT_BYTES} bytes of JSON")
    return value


class AskHumanArgs(BaseModel):
    """The built-in ``ask_human`` tool's arguments, as the model sends them."""

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS, description="What to ask the human")
    options: list[Annotated[str, Field(min_length=1, max_length=MAX_OPTION_CHARS)]] = Field(
        default_factory=list, max_length=MAX_OPTIONS, description="Answers to choose from (optional)"
    )
    allow_free_text: bool = Field(default=True, description="Whether an answer outside the options is accepted")


class AnswerSignal(BaseModel):
    """Payload of the ``answer`` signal: a human's answer to a question the model asked (``ask_human``)."""

    question_id: str = Field(max_length=64)  # the question answered (``pending`` lists it)
    reviewer: Annotated[str, Field(max_length=200)]  # who answers (must be in the run's approvers when it has any)
    text: str = Field(max_length=MAX_ANSWER_CHARS)  # the answer, handed to the model verbatim
    signature: str = Field(default="", max_length=256)  # HMAC, required with AGENT_APPROVAL_KEY
    signed_expires_at: str = Field(default="", max_length=40)  # the expires_at the signature was made over


class ForgetApprovalsSignal(BaseModel):
    """Payload of the ``forget_approvals`` signal: drop every remembered approval of the run."""

    reviewer: Annotated[str, Field(max_length=200)] = ""  # who asked (kept in the audit)


class RememberedApproval(BaseModel):
    """An approval that stands for later calls of this run (``--remember call`` or ``tool``)."""

    tool: str  # the tool it approves
    scope: Literal["call", "tool"]  # identical calls only, or every call of the tool
    args: dict[str, Any] | None = None  # for ``call``: the canonical arguments it matches
    reviewer: str = ""  # who approved it
    approval_id: str = ""  # the decision it came from
    at: str = ""  # ISO 8601


class DecisionRecord(BaseModel):
    """One decision of the run's audit: what was decided, by whom, when, and with what changes."""

    approval_id: str  # the approval or question decided ("" for a forget_approvals)
    kind: str = "tool_call"  # tool_call, question, resolve_unknown_outcome
    tool: str = ""  # the tool of the call decided
    decision: str = ""  # approved, rejected, expired, answered, retry, mark_done, fail, remembered, counted
    reviewer: str = ""  # who decided
    at: str = ""  # when, ISO 8601
    comment: str = ""  # a comment, a rejection's reason, or the answer to a question
    edits: dict[str, Any] | None = None  # the arguments a reviewer set (None: the call as the model made it)
    remember: str = ""  # the scope remembered ("call" / "tool"), or why remembering was refused
    step: int = 0  # the model turn of the call


class EditCheck(BaseModel):
    """Input of the ``check_edited_call`` local activity: a reviewer's arguments for a call of ``tool``."""

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class EditChecked(BaseModel):
    """The edited arguments as the tool's argument model validates them (canonical), or why they are refused."""

    arguments: dict[str, Any] = Field(default_factory=dict)
    error: str = ""


ASK_HUMAN = "ask_human"  # the built-in tool a model asks a person with
