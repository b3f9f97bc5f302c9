"""The data contract shared by the workflow, the activities and the starter.

Every workflow and activity input/output is one of these pydantic models and
travels through ``temporalio.contrib.pydantic``'s data converter. New fields
always get defaults so that recorded histories keep decoding.
"""

from __future__ import annotations

import base64
import math
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.workflow_streams import WorkflowStreamState

from workflows.human_types import ASK_HUMAN as ASK_HUMAN
from workflows.human_types import MAX_DECISIONS_KEPT as MAX_DECISIONS_KEPT
from workflows.human_types import MAX_REMEMBERED as MAX_REMEMBERED
from workflows.human_types import AnswerSignal as AnswerSignal
from workflows.human_types import AskHumanArgs as AskHumanArgs
from workflows.human_types import DecisionRecord as DecisionRecord
from workflows.human_types import EditCheck as EditCheck
from workflows.human_types import EditChecked as EditChecked
from workflows.human_types import ForgetApprovalsSignal as ForgetApprovalsSignal
from workflows.human_types import Remember as Remember
from workflows.human_types import RememberedApproval as RememberedApproval
from workflows.human_types import bounded_arguments
from workflows.known_keys import KnownKeys
from workflows.session_types import SessionCarry, SessionOpenRequest, SessionOpenResult, SessionSpec
from workflows.typed_output import MAX_OUTPUT_RETRIES, OutputSchema, schema_of

# Bounds of what a run accepts from outside. Every number and string a caller sends is bounded, so
# that no input can overflow a timer or a datetime in workflow code, or grow the run's state
# (history, status query, continue-as-new input) past Temporal's payload limits.
MAX_STEPS = 10_000
MAX_TOKENS = 10**9
MAX_COST_USD = 1e6
MAX_TIMEOUT_S = 30 * 24 * 3600  # 30 days of working time (time waiting for a human does not count)
MAX_TASK_CHARS = 1_000_000
MAX_SYSTEM_PROMPT_CHARS = 100_000
MAX_NAME_CHARS = 200  # model, tool, tenant, approver and reviewer names
MAX_TOOLS = 200
MAX_APPROVERS = 100
MAX_APPROVAL_ID_CHARS = 64
MAX_NOTE_CHARS = 4000  # a decision's comment or reason
MAX_SIGNATURE_CHARS = 256
MAX_APPROVAL_TIMEOUT_S = 365 * 24 * 3600  # of any policy rule (a run's own policy or the operator's)
# The system prompt of a run whose input and sub-agent definition give none.
DEFAULT_SYSTEM_PROMPT = (
    "You are an agent running inside a durable runtime. Use the tools to do the task; "
    "code runs in an isolated sandbox with no network. When you are done, answer without calling tools."
)
MAX_CARRIED_EVENTS = 2_000  # progress events a continued run may be handed (it keeps STREAM_RETAIN)
MAX_SUBAGENTS = 50
MAX_DEPTH = 10  # of sub-agent delegation
MAX_DESCRIPTION_CHARS = 2000
SUBAGENT_NAME_PATTERN = r"^[a-zA-Z][a-zA-Z0-9_-]{0,63}$"
BLOB_REF_PATTERN = r"^(sha256:[0-9a-f]{64})?$"  # a run store blob's digest ("": none)
# A run's input (without ``carry``) at start, in JSON bytes: what the run and every continue-as-new of it
# carry, well under Temporal's 2 MB payload limit. A sub-agent's start is refused (a tool error) over it.
MAX_RUN_INPUT_BYTES = 1024 * 1024
# The sub-agent starts of one model turn together (one workflow task sends them all; gRPC's limit is 4 MB).
MAX_TURN_CHILD_INPUT_BYTES = 2 * 1024 * 1024

Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
_M = TypeVar("_M", bound=BaseModel)

# ``idle``: a session waiting for its next message.
RunState = Literal[
    "running", "waiting_approval", "waiting_human", "idle", "completed", "failed", "cancelled", "limit_exceeded"
]
ResultStatus = Literal["completed", "failed", "cancelled", "limit_exceeded"]


class Limits(KnownKeys):  # a misspelled limit must not run with the default
    """Brakes enforced by the workflow before every model turn."""

    max_steps: int = Field(default=20, ge=1, le=MAX_STEPS)  # model turns
    max_tokens: int = Field(default=200_000, ge=1, le=MAX_TOKENS)  # input + output tokens, children included
    max_cost_usd: float = Field(default=5.0, ge=0, le=MAX_COST_USD, allow_inf_nan=False)  # 0: no cost limit
    timeout_s: int = Field(default=3600, ge=1, le=MAX_TIMEOUT_S)  # working time; waiting for people does not count
    max_depth: int = Field(default=3, ge=0, le=MAX_DEPTH)  # depth of sub-agent delegation (0: none)
    # Final answers that do not match ``output_schema`` sent back to the model before the run fails.
    max_output_retries: int = Field(default=2, ge=0, le=MAX_OUTPUT_RETRIES)

    # Only the limits a caller set are serialized, so the workflow can tell an explicit cap from the default
    # (``model_fields_set``): an explicit max_cost_usd with a model that has no price is refused at start.
    @model_serializer(mode="wrap")
    def _only_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {name: value for name, value in data.items() if name in self.model_fields_set}


SubagentName = Annotated[str, Field(pattern=SUBAGENT_NAME_PATTERN)]


class TreeBudget(BaseModel):
    """The budget a tree of runs (a parent and its sub-agents, recursively) shares through the run store."""

    model_config = ConfigDict(extra="forbid")

    root: str = Field(min_length=1, max_length=1000)  # the root run's conversation id
    max_tokens: int = Field(ge=1, le=MAX_TOKENS)
    max_cost_usd: float = Field(ge=0, le=MAX_COST_USD, allow_inf_nan=False)  # 0: no cost limit


class SubagentDef(KnownKeys):
    """A sub-agent: to the parent's model a tool named after it, taking ``{"task": str}``; run as a child run."""

    description: str = Field(min_length=1, max_length=MAX_DESCRIPTION_CHARS)  # what the parent's model is told
    model: Name = ""  # empty: the worker's default model
    tools: list[Name] | None = Field(default=None, max_length=MAX_TOOLS)  # None: every registered tool
    system_prompt: str = Field(default="", max_length=MAX_SYSTEM_PROMPT_CHARS)  # empty: the built-in prompt
    limits: Limits | None = None  # None: the defaults; always capped by the parent's remaining budget
    policy: dict[str, Any] = Field(default_factory=dict)  # can only tighten the parent's run policy
    share_sandbox: bool = False  # work in the parent's workspace (never while anything else uses it)
    output_schema: OutputSchema | None = None  # the JSON Schema its final answer must match (the parent gets the JSON)


class Usage(BaseModel):
    input_tokens: int = 0  # prompt tokens the provider reported
    output_tokens: int = 0  # completion tokens the provider reported
    cost_usd: float = 0.0  # from the price table (AGENT_PRICES); 0 for a model without a price

    def plus(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=round(self.cost_usd + other.cost_usd, 8),
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class SideEffect(BaseModel):
    """A completed side-effecting call, kept so a cancelled run can report and compensate it."""

    tool: str
    step: int
    call_id: str
    idempotency_key: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    compensable: bool = False


class CompensationRequest(BaseModel):
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    workflow_id: str
    conversation_id: str = ""
    tenant: str = ""  # the run's: a compensation's ``ctx.secret`` is its tenant's
    user: str = ""


MCP_PREFIX = "mcp__"  # tools of the operator's MCP servers: mcp__<server>__<tool> (Claude Code's convention)


class McpTarget(BaseModel):
    """Where an MCP tool call goes: the operator's server and the tool's own name on it (from the run's snapshot)."""

    server: str
    tool: str
    recovery: Literal["idempotent_by_key", "unknown"] = "unknown"
    call_timeout_s: int = 60  # of the call itself; the activity's timeout adds room for a server (re)start


class Carry(BaseModel):
    """What a run hands to itself across continue-as-new."""

    conversation_id: str
    step: int
    transcript_len: int
    usage: Usage
    started_at: float  # epoch seconds of the first execution; the deadline is measured from it
    model: str
    tools: list[str]
    sandbox_id: str = ""
    pending: list[TranscriptEntry] = Field(default_factory=list)  # workflow-made entries not yet stored
    policy: dict[str, Any] = Field(default_factory=dict)  # operator policy snapshot taken at start
    signing_required: bool = False
    side_effects: list[SideEffect] = Field(default_factory=list)
    search_attributes: bool = False
    waited_s: float = 0.0  # time spent waiting for human decisions (not counted against timeout_s)
    stream: WorkflowStreamState | None = None  # progress events carried to the next run
    continued: int = 0
    refused: list[Annotated[str, Field(max_length=2000)]] = Field(default_factory=list, max_length=20)
    refused_counts: dict[Annotated[str, Field(max_length=40)], int] = Field(default_factory=dict, max_length=40)
    subagents: dict[SubagentName, SubagentDef] = Field(default_factory=dict, max_length=MAX_SUBAGENTS)
    children_usage: Usage = Field(default_factory=Usage)  # what child runs spent (included in ``usage``)
    budget: TreeBudget | None = None  # set when the run is part of a tree of runs
    shared_sandbox: str = ""  # the parent's conversation when the run works in its parent's sandbox
    mcp_snapshot: str = ""  # digest of the run's MCP tool list in the run store (taken at start)
    checkpoint: str = ""  # the workspace checkpoint the sandbox must hold before the next sandbox tool
    fork_of: str = ""  # "<workflow id> step <n>" when the run is a fork
    forked_at_step: int = 0  # its step numbers go on from the source's; its max_steps counts from here
    mcp_per_run: list[str] = Field(default_factory=list)  # MCP servers started for this run alone
    # Set by run_config (runs recorded before have the defaults: no per-turn cap, no ceiling below MAX_DEPTH,
    # and ``subagents`` with the whole definitions, passed whole to children).
    max_subagent_calls: int = Field(default=0, ge=0)  # sub-agent calls one model turn may make (0: any)
    max_depth: int = Field(default=MAX_DEPTH, ge=0, le=MAX_DEPTH)  # the operator's ceiling (AGENT_MAX_DEPTH)
    # Digest of the run's sub-agent definitions in the run store; ``subagents`` then holds only what the
    # workflow needs of them (no system prompt, model or tools: the child resolves those from the digest).
    subagents_ref: str = Field(default="", pattern=BLOB_REF_PATTERN)
    cost_tracked: bool = True  # RunConfig.cost_tracked, shown by ``status`` after continue-as-new too
    # RunConfig.fail_workflow_on_error: a failed or limit_exceeded end fails the workflow (AgentRunFailed).
    fail_workflow_on_error: bool = False
    # RunConfig.tenant_slot: the run holds a place among its tenant's open runs; its cleanup gives it back.
    tenant_slot: bool = False
    output_schema_ref: str = Field(default="", pattern=BLOB_REF_PATTERN)  # RunConfig.output_schema_ref
    output_retries: int = Field(default=0, ge=0)  # final answers sent back for not matching the schema
    session: SessionCarry | None = None  # set for sessions: their messages, queue and idle time
    # What a session's idempotency keys and approval ids derive from: "<workflow id>/<first run id>", so
    # that a session woken under the same workflow id after it ended never meets its earlier keys.
    # "" (every run): the workflow id.
    key_scope: str = Field(default="", max_length=1200)
    # Humans in the loop: the audit of decisions and the approvals that stand for later calls.
    decisions: list[DecisionRecord] = Field(default_factory=list, max_length=MAX_DECISIONS_KEPT)
    decisions_total: int = 0  # every decision made in the run (``decisions`` keeps the newest)
    remembered: list[RememberedApproval] = Field(default_factory=list, max_length=MAX_REMEMBERED)
    # The step the current message's work began after (sessions): ``max_steps`` counts from here.
    message_step: int = Field(default=0, ge=0, le=10**6)
    # Epoch seconds the current message's work began (sessions): ``timeout_s`` counts from here (0: started_at).
    work_started_at: float = Field(default=0.0, ge=0, le=1e11)

    # A carry is made by continue-as-new, but anyone who can start a run can send one: its
    # numbers feed timers and deadlines, so they are bounded like the rest of the input.
    @model_validator(mode="after")
    def _bounded(self) -> Carry:
        for name, value, top in (
            ("step", self.step, 10**6),
            ("transcript_len", self.transcript_len, 10**8),
            ("continued", self.continued, 10**6),
            ("started_at", self.started_at, 1e11),  # epoch seconds: year 5138
            ("waited_s", self.waited_s, 1e10),
            ("usage.input_tokens", self.usage.input_tokens, 10**15),
            ("usage.output_tokens", self.usage.output_tokens, 10**15),
            ("usage.cost_usd", self.usage.cost_usd, 1e12),
        ):
            if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= top:
                raise ValueError(f"{name} must be between 0 and {top:g}")
        return self

    @field_validator("stream")
    @classmethod
    def _stream_decodes(cls, stream: WorkflowStreamState | None) -> WorkflowStreamState | None:
        # The stream is rebuilt in the workflow's __init__: an item that does not decode there
        # would fail every workflow task instead of the run.
        if stream is None:
            return None
        if len(stream.log) > MAX_CARRIED_EVENTS or len(stream.publishers) > MAX_CARRIED_EVENTS:
            raise ValueError(f"at most {MAX_CARRIED_EVENTS} events and publishers are carried")
        if stream.base_offset < 0:
            raise ValueError("base_offset must not be negative")
        for index, item in enumerate(stream.log):
            try:
                Payload().ParseFromString(base64.b64decode(item.data, validate=True))
            except Exception as exc:  # binascii.Error, or protobuf's DecodeError (not importable here)
                raise ValueError(f"log item {index} is not an encoded payload ({type(exc).__name__})") from None
        return stream


class ForkSpec(KnownKeys):
    """Where a fork starts: a run (its latest, or ``run_id``) and the number of its steps to keep."""

    workflow_id: str = Field(min_length=1, max_length=1000)  # the source run's workflow id
    run_id: str = Field(default="", max_length=100)  # empty: its latest run
    step: int = Field(ge=0, le=1_000_000)  # the source's steps to keep; the fork's first model turn is step + 1


MEMORY_RECALL_MAX = 20  # entries one recall may put into the context
MEMORY_QUERY_MAX_CHARS = 4000  # of the task or message a recall searches for (its start)


class MemorySpec(KnownKeys):
    """Long-term memory recall: ``auto`` puts the ``k`` entries of the run's (tenant, user) namespace that
    best match the task (a session's latest message) into the model's context at the start of its work."""

    recall: Literal["auto", "off"] = "off"
    k: int = Field(default=5, ge=1, le=MEMORY_RECALL_MAX)


class MemoryRecallRequest(BaseModel):
    """``memory_recall``: search the namespace for ``query`` and store what it found at ``seq`` of the conversation."""

    conversation_id: str
    seq: int = Field(ge=0)
    tenant: Name = ""
    user: Name = ""
    query: str = Field(default="", max_length=MEMORY_QUERY_MAX_CHARS)
    k: int = Field(default=5, ge=1, le=MEMORY_RECALL_MAX)


class AgentInput(KnownKeys):
    """Workflow input. Only ``task`` is required (public contract), unless ``session`` is given; unknown
    fields are refused by name, with the nearest valid one (``unknown key 'taks' (did you mean 'task'?)``)."""

    # What the agent should do (not blank). A session's is optional: when given, its first message.
    task: str = Field(default="", max_length=MAX_TASK_CHARS)
    model: Name = ""  # empty: the worker's AGENT_MODEL (scripted:demo when no key is configured)
    tools: list[Name] | None = Field(default=None, max_length=MAX_TOOLS)  # None: every registered tool
    limits: Limits = Field(default_factory=Limits)  # brakes checked before every model turn
    # The run's own policy ({"approval_timeout_s"?, "rules": [...]}), which can only tighten the operator's
    # (checked by workflows.policy.parse_run_policy).
    policy: dict[str, Any] = Field(default_factory=dict)
    approvers: list[Name] = Field(default_factory=list, max_length=MAX_APPROVERS)  # empty: anyone may decide
    tenant: Name = ""  # who the run is for (search attribute AgentTenant); a fork's source must share it
    # The tenant's user the run acts for ("" for none): with ``tenant``, the namespace of what the run
    # keeps; sub-agents and sessions keep both, and a fork's source must have the same.
    user: Name = ""
    # Long-term memory recall for this run ({"recall": "auto", "k": 5}); None: none (sub-agents get none).
    memory: MemorySpec | None = None
    system_prompt: str = Field(default="", max_length=MAX_SYSTEM_PROMPT_CHARS)  # empty: the built-in prompt
    # None: every operator-defined sub-agent; a list enables operator-defined ones by name; a dict
    # adds its own (or replaces operator-defined ones of the same name) to the operator's.
    subagents: dict[SubagentName, SubagentDef] | list[SubagentName] | None = Field(
        default=None, max_length=MAX_SUBAGENTS
    )
    depth: int = Field(default=0, ge=0, le=MAX_DEPTH)  # delegation depth: 0 for a run started from outside
    budget: TreeBudget | None = None  # a sub-agent's: the tree's budget it spends from (set by its parent)
    # A sub-agent with ``share_sandbox``: its parent's conversation, whose sandbox it works in (checked
    # against the run's actual parent, so no run can name another's workspace).
    parent_conversation: str = Field(default="", max_length=1000)
    # A sandbox-sharing sub-agent's: the checkpoint its parent's workspace holds (set by the parent).
    checkpoint: str = Field(default="", max_length=100)
    fork: ForkSpec | None = None  # start from another run's first ``step`` steps and its workspace then
    carry: Carry | None = None  # set only by continue-as-new
    # A sub-agent's (set by its parent; refused from a run started from outside): the digest of the tree's
    # sub-agent definitions in the run store, and the name of the one this run is.
    subagents_ref: str = Field(default="", pattern=BLOB_REF_PATTERN)
    as_subagent: str = Field(default="", pattern=r"^([a-zA-Z][a-zA-Z0-9_-]{0,63})?$")  # which of them this run is
    # The run is a session: after each reply it waits for the next message (``workflows.session_types``).
    session: SessionSpec | None = None
    # The JSON Schema the final answer must match (a typed result: ``AgentResult.output_json``). Not for sessions.
    output_schema: OutputSchema | None = None

    def with_output(self, model: type[BaseModel]) -> AgentInput:
        """This input with ``output_schema`` set to ``model``'s JSON Schema (read it with ``AgentResult.output_as``)."""
        return type(self).model_validate({**self.model_dump(exclude_unset=True), "output_schema": schema_of(model)})

    @model_validator(mode="before")
    @classmethod
    def _task_or_session(cls, data: Any) -> Any:
        # A run without a task is refused as a missing field, as before sessions existed; an unknown key
        # (``tsk``) is reported first, by name, by ``KnownKeys``.
        known = {name for name in cls.model_fields} | {f.alias for f in cls.model_fields.values() if f.alias}
        if isinstance(data, dict) and data.get("session") is None and not set(data) - known:
            if "task" not in data:
                missing = InitErrorDetails(type="missing", loc=("task",), input=data)
                raise ValidationError.from_exception_data(cls.__name__, [missing])
            if data["task"] == "":
                short = InitErrorDetails(type="string_too_short", loc=("task",), input="", ctx={"min_length": 1})
                raise ValidationError.from_exception_data(cls.__name__, [short])
        return data

    @field_validator("task")
    @classmethod
    def _task_has_text(cls, task: str) -> str:
        if not task.strip() and task:
            raise ValueError("must not be empty or whitespace only")
        return task

    @model_validator(mode="after")
    def _run_has_task(self) -> AgentInput:
        if not self.task and self.session is None:
            raise ValueError("task must not be empty (only a session may start without one)")
        if self.session is not None and self.output_schema is not None:
            raise ValueError("output_schema is for runs: a session's replies are text")
        return self


class AgentResult(BaseModel):
    status: ResultStatus  # how the run ended
    output: str  # the model's final answer, or why the run stopped
    usage: Usage  # what the run and its sub-agents spent
    steps: int  # model turns taken
    checkpoint: str = ""  # the workspace checkpoint the run ended with (a sandbox-sharing sub-agent's parent adopts it)
    decisions: list[DecisionRecord] = Field(default_factory=list)  # the run's decisions (as ``status`` lists them)
    output_json: Any = None  # with ``output_schema``: the final answer, parsed and valid against the schema

    def output_as(self, model: type[_M]) -> _M:
        """The typed result as ``model`` (the run's ``output_schema`` was ``model``'s).

        Raises ``ValueError`` when the run has no typed result (it did not complete, or had no
        ``output_schema``), and pydantic's ``ValidationError`` when the JSON is not a ``model``.
        """
        if self.output_json is None:
            raise ValueError(f"the run has no typed result (status {self.status}; was output_schema given?)")
        return model.model_validate(self.output_json)


class PendingApproval(BaseModel):
    approval_id: str  # ap_...: a hash of the exact call (workflow id, step, call id, tool, canonical arguments)
    tool: str  # the tool the call runs
    args: dict[str, Any]  # its canonical arguments
    requested_at: str  # ISO 8601
    expires_at: str  # ISO 8601; on expiry the call is not run and the model is told
    reviewers: list[str] = Field(default_factory=list)  # empty: anyone may decide
    rule: str = ""  # the policy rule that asked
    step: int = 0  # the model turn the call belongs to
    call_id: str = ""  # the model's id of the call
    # tool_call; resolve_unknown_outcome (a side effect whose worker died mid-call); question (``ask_human``)
    kind: str = "tool_call"
    question: str = ""  # a question's text (kind question)
    options: list[str] = Field(default_factory=list)  # the answers it offers (empty: free text)
    allow_free_text: bool = True  # whether an answer outside ``options`` is accepted
    approvals_required: int = 1  # distinct reviewers who must approve (a policy rule's ``approvals``)
    approved_by: list[str] = Field(default_factory=list)  # who approved so far (a quorum not yet reached)
    edited_args: dict[str, Any] | None = None  # the arguments a reviewer set, awaiting the rest of a quorum
    # "": this run's own approval. Else a sub-agent's, as that sub-agent reported it (relayed,
    # unverified: decide it with the run named here, which shows its own entry).
    workflow_id: str = ""


MAX_CHILD_APPROVALS = 100


class ChildApprovalsSignal(BaseModel):
    """Payload of ``child_approvals``: a sub-agent tells its parent what it (and its own sub-agents) wait for."""

    child_id: str = Field(max_length=1000)
    seq: int = Field(ge=0, le=10**9)  # the child's count of its reports (not trusted: the newest arrival wins)
    approvals: list[PendingApproval] = Field(default_factory=list, max_length=MAX_CHILD_APPROVALS)


# The expires_at a signer read (``pending``) and signed over. A status query answered while the
# workflow task that opens an approval is still to start computes the entry ahead of that task, with
# the previous task's time; the entry the run keeps then expires a little later. A signature over
# what the signer saw is accepted when it is within SIGNED_EXPIRY_SLACK of the run's own value.
SignedExpiry = Annotated[str, Field(max_length=40)]


class ApproveSignal(BaseModel):
    """Payload of the ``approve`` signal (public contract)."""

    approval_id: str = Field(max_length=MAX_APPROVAL_ID_CHARS)  # the approval decided
    reviewer: Name  # who decides (must be in the run's approvers when it has any)
    comment: str = Field(default="", max_length=MAX_NOTE_CHARS)  # kept with the decision
    signature: str = Field(default="", max_length=MAX_SIGNATURE_CHARS)  # HMAC, required with AGENT_APPROVAL_KEY
    signed_expires_at: SignedExpiry = ""  # the approval's expires_at the signature was made over
    # The call as the reviewer changed it (validated against the tool's arguments, policy checked again).
    arguments: dict[str, Any] | None = None
    remember: Remember = ""  # approve identical calls (``call``) or every call of the tool (``tool``) from now on

    _bounded = field_validator("arguments")(bounded_arguments)


class RejectSignal(BaseModel):
    """Payload of the ``reject`` signal (public contract)."""

    approval_id: str = Field(max_length=MAX_APPROVAL_ID_CHARS)  # the approval decided
    reviewer: Name  # who decides (must be in the run's approvers when it has any)
    reason: str = Field(default="", max_length=MAX_NOTE_CHARS)  # told to the model
    signature: str = Field(default="", max_length=MAX_SIGNATURE_CHARS)  # HMAC, required with AGENT_APPROVAL_KEY
    signed_expires_at: SignedExpiry = ""  # the approval's expires_at the signature was made over


DecisionKind = Literal["approve", "reject", "retry", "mark_done", "fail", "answer"]


class ResolveSignal(BaseModel):
    """Payload of the ``resolve`` signal: a human's answer to an unknown outcome."""

    approval_id: str = Field(max_length=MAX_APPROVAL_ID_CHARS)  # the approval decided
    reviewer: Name  # who decides (must be in the run's approvers when it has any)
    resolution: Literal["retry", "mark_done", "fail"]  # run the call again, record it done, or fail it
    comment: str = Field(default="", max_length=MAX_NOTE_CHARS)  # kept with the decision
    signature: str = Field(default="", max_length=MAX_SIGNATURE_CHARS)  # HMAC, required with AGENT_APPROVAL_KEY
    signed_expires_at: SignedExpiry = ""  # the approval's expires_at the signature was made over


class DecideRequest(BaseModel):
    """Payload of the ``decide`` update: one semantics with the signals, but the caller gets an answer.

    ``approve``/``reject`` answer a tool-call approval; ``retry``/``mark_done``/``fail``
    answer an unknown outcome (kind ``resolve_unknown_outcome``); ``answer`` answers a
    question (kind ``question``, ``approval_id`` the question's id, ``text`` the answer).
    """

    approval_id: str = Field(max_length=MAX_APPROVAL_ID_CHARS)  # the approval (or question) decided
    decision: DecisionKind  # approve/reject a tool call; retry/mark_done/fail an unknown outcome; answer
    reviewer: Name  # who decides (must be in the run's approvers when it has any)
    comment: str = Field(default="", max_length=MAX_NOTE_CHARS)  # kept with the decision
    signature: str = Field(default="", max_length=MAX_SIGNATURE_CHARS)  # HMAC, required with AGENT_APPROVAL_KEY
    signed_expires_at: SignedExpiry = ""  # the approval's expires_at the signature was made over
    text: str = Field(default="", max_length=MAX_NOTE_CHARS)  # the answer (decision ``answer``)
    arguments: dict[str, Any] | None = None  # approve the call with these arguments instead (an edit)
    remember: Remember = ""  # with ``approve``: remember it for identical calls or for the tool

    _bounded = field_validator("arguments")(bounded_arguments)


class DecideResult(BaseModel):
    accepted: bool  # false: the approval was already decided (the message says how)
    message: str  # what happened, in one line


class SignatureCheck(BaseModel):
    approval_id: str
    decision: DecisionKind
    reviewer: str
    expires_at: str
    signature: str
    # What else the signature covers (``workflows.identity.decision_signature``): an edit's arguments,
    # an answer's text, a remembered scope. Empty: an old-style signature over the decision alone.
    covers: dict[str, Any] = Field(default_factory=dict)


class StatusView(BaseModel):
    state: RunState  # the agent's own state (also the search attribute AgentState)
    step: int  # model turns so far
    pending_approvals: list[PendingApproval] = Field(default_factory=list)  # its own and its sub-agents' reports
    usage: Usage = Field(default_factory=Usage)  # what the run and its sub-agents spent so far
    model: str = ""  # the run's model
    output: str = ""  # the final answer, once the run has ended
    last_event: str = ""  # the latest progress event, in one line
    refused: list[str] = Field(default_factory=list)  # recent refused decisions, newest last (at most 20)
    # Every refused signal and decision, malformed ones included, by reason (``malformed``,
    # ``unknown_approval``, ``not_an_approver``, ``bad_signature``, ...). Updates refused by the
    # validator never reach the run (their caller got the reason) and are not counted.
    refused_total: int = 0  # how many were refused in all
    refused_counts: dict[str, int] = Field(default_factory=dict)  # how many, by reason
    own_usage: Usage = Field(default_factory=Usage)  # this run's model turns (``usage`` minus children)
    children_usage: Usage = Field(default_factory=Usage)  # what its child runs spent
    conversation_id: str = ""  # where its transcript is in the run store (a fork starts from it)
    checkpoint: str = ""  # the workspace checkpoint its sandbox is expected to hold
    cost_tracked: bool = True  # False: the model has no price, so max_cost_usd is not enforced
    notes: list[str] = Field(default_factory=list)  # what the run started without ("cost not tracked: ...")
    # The sub-agent runs it started that still run (from its own state): ask each for its own
    # approvals. ``pending_approvals`` entries naming another run are only what those reported.
    subagents: list[str] = Field(default_factory=list)
    # Sessions (``session`` true); their ``output`` is the last reply.
    session: bool = False  # the run is a session (its input has ``session``)
    messages: int = 0  # messages taken so far (the newest one's number)
    replied: int = 0  # the highest message number whose work has finished
    last_message_at: str = ""  # when the newest message was taken, ISO 8601
    queued: int = 0  # messages taken and not yet handed to the model
    last_message: str = ""  # the newest message, a preview of at most 500 characters
    # Every decision made in the run, newest last (at most MAX_DECISIONS_KEPT; ``decisions_total`` counts all).
    decisions: list[DecisionRecord] = Field(default_factory=list)
    decisions_total: int = 0  # every decision made in the run (``decisions`` keeps the newest)
    remembered: list[RememberedApproval] = Field(default_factory=list)  # approvals that stand for later calls


# --- transcript -----------------------------------------------------------------


class RecordedToolCall(BaseModel):
    """A tool call exactly as the model emitted it (arguments kept raw)."""

    id: str  # the model's id of the call
    name: str  # the tool's name
    arguments_json: str  # the arguments as the model wrote them (may be invalid JSON)


class Message(BaseModel):
    """One transcript entry, provider-neutral. Lives in the run store, not in history."""

    role: Literal["system", "user", "assistant", "tool"]  # who wrote it
    content: str = ""  # its text
    tool_calls: list[RecordedToolCall] = Field(default_factory=list)  # an assistant's tool calls
    tool_call_id: str = ""  # a tool result's call
    name: str = ""  # a tool result's tool
    is_error: bool = False  # a tool result that is an error the model reads


class TranscriptEntry(BaseModel):
    seq: int
    message: Message


# --- model activity -------------------------------------------------------------


# The error type of a run refused at its start because its tenant has AGENT_TENANT_MAX_OPEN_RUNS open already.
TENANT_QUOTA_EXCEEDED = "TenantQuotaExceeded"


class TenantRunRelease(BaseModel):
    """``tenant_run_release``: the run (the activity's own workflow id) no longer counts among its tenant's."""

    tenant: Name = ""


class RunConfigRequest(BaseModel):
    model: str = ""
    tools: list[str] | None = None
    subagents: dict[str, SubagentDef] | list[str] | None = None
    subagents_ref: str = ""  # a sub-agent's: the definitions by digest (instead of ``subagents``)
    as_subagent: str = ""  # ... and which of them it is (its model, tools and system prompt)
    # The run's input set limits.max_cost_usd (> 0) itself: an unpriced model is then refused (AGENT_ALLOW_UNPRICED).
    explicit_cost_cap: bool = False
    # The run's tenant: for AGENT_TENANT_MAX_OPEN_RUNS, and the ``${secret:NAME}`` of a per-run MCP server
    # listed at its start.
    tenant: Name = ""
    # A top-level run (no parent workflow): counted among its tenant's open runs while it is open.
    open_run: bool = False
    output_schema: dict[str, Any] | None = None  # the run's own (a sub-agent's comes from its definition)
    # A new run of a session: its conversation is made or found here too (``RunConfig.session``). Its
    # ``system_prompt`` is the input's; empty, the sub-agent definition's or ``DEFAULT_SYSTEM_PROMPT`` is stored.
    session: SessionOpenRequest | None = None


class RunConfig(BaseModel):
    """Worker-side settings resolved once at run start and recorded in history (the run's snapshot)."""

    model: str
    tools: list[str]
    policy: dict[str, Any] = Field(default_factory=dict)  # the operator's policy (workflows.policy.Policy)
    signing_required: bool = False
    search_attributes: bool = False  # the worker found the Agent* search attributes registered
    subagents: dict[str, SubagentDef] = Field(default_factory=dict)  # the run's sub-agents, resolved
    mcp_snapshot: str = ""  # digest of the MCP tool list (definitions, schemas) stored in the run store
    mcp_per_run: list[str] = Field(default_factory=list)  # per-run MCP servers among the run's tools
    notes: list[str] = Field(default_factory=list)  # what the run starts without (an MCP server that is down)
    # Results recorded before these existed decode with defaults that change nothing (see ``Carry``).
    subagents_ref: str = ""  # the definitions' digest; ``subagents`` then lack system prompts, models and tools
    system_prompt: str = ""  # a sub-agent's own (``as_subagent``), from the definitions
    max_subagent_calls: int = 0  # AGENT_MAX_SUBAGENT_CALLS_PER_TURN (0: any number)
    max_depth: int = MAX_DEPTH  # AGENT_MAX_DEPTH
    cost_tracked: bool = True  # False: the model has no price (its turns cost $0; max_cost_usd cannot stop it)
    fail_workflow_on_error: bool = False  # AGENT_FAIL_WORKFLOW_ON_ERROR (see ``Carry``)
    tenant_slot: bool = False  # counted among its tenant's open runs (AGENT_TENANT_MAX_OPEN_RUNS): release at the end
    output_schema_ref: str = ""  # the run's output schema, checked and stored in the run store ("": none)
    session: SessionOpenResult | None = None  # where the session's conversation stands (RunConfigRequest.session)


class ModelRequest(BaseModel):
    conversation_id: str
    model: str
    turn: int
    transcript_len: int  # entries [0, transcript_len) form the prompt, after ``append``
    append: list[TranscriptEntry] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    subagents: dict[str, str] = Field(default_factory=dict)  # sub-agent name -> description (offered as tools)
    budget: TreeBudget | None = None  # the turn is reserved under it before the provider is called
    mcp_snapshot: str = ""  # where the model activity finds the MCP tools' definitions (RunConfig.mcp_snapshot)
    subagents_ref: str = ""  # the run's sub-agent definitions (kept in the run store while the run is)
    output_schema_ref: str = ""  # the run's output schema in the run store: a final answer is checked against it
    # A session that takes ``on_busy: interrupt``: the call heartbeats every second, so that a cancel for a
    # new message reaches it at once.
    interruptible: bool = False


class ToolCall(BaseModel):
    """A model tool call after validation in trusted code.

    ``error`` is set when the call cannot run (bad JSON, unknown tool, schema
    violation); the workflow then answers the model with it instead of running.
    The execution settings come from the tool registry so that the workflow,
    which cannot import tool code, still schedules each tool with its own options.
    """

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    error: str = ""
    side_effect: bool = False
    uses_sandbox: bool = False
    timeout_s: int = 60
    max_attempts: int = 3
    heartbeat_s: int = 0
    compensable: bool = False
    subagent: bool = False  # a delegation to the sub-agent of this name (a child run), not a tool activity
    human: bool = False  # ``ask_human``: the run asks a person and waits for the answer (no activity)
    mcp: McpTarget | None = None  # a tool of an operator's MCP server (run by the ``mcp`` activity)


class ModelTurn(BaseModel):
    text: str = ""
    text_truncated: bool = False
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str = ""
    response_id: str = ""
    model: str = ""
    message_seq: int = 0
    # With ``ModelRequest.output_schema_ref`` and no tool calls: the answer parsed, or why it does not match.
    output_json: Any = None
    output_errors: list[str] = Field(default_factory=list)
    # Set when this turn moved the run to a new branch of its transcript (the run was reset: its old
    # branch already holds a different future at these positions); the run continues there.
    conversation_id: str = ""


# --- tool activities ------------------------------------------------------------


class ToolInvocation(BaseModel):
    conversation_id: str  # the run's transcript in the run store
    workflow_id: str  # the run's workflow id
    step: int  # the model turn of the call
    call_id: str  # the model's id of the call
    call_index: int  # its place among the turn's calls
    seq: int  # where the tool's result goes in the transcript
    tool: str  # the tool's name
    arguments: dict[str, Any]  # validated, canonical arguments
    idempotency_key: str  # identical on every retry, replay and continue-as-new of this call
    sandbox_id: str = ""  # the run's sandbox (sandbox tools)
    tenant: str = ""  # the run's tenant
    user: str = ""  # the run's user (within its tenant)
    # A human's resolution of an unknown outcome: "" (normal run), "retry", "mark_done" or "fail".
    resolution: str = ""
    resolution_note: str = ""  # the reviewer's comment on that resolution
    # The policy decision that let the call run (``allow``, or ``ask`` then approved) and its rule.
    policy_verdict: str = ""
    policy_rule: str = ""  # the rule that decided it
    mcp: McpTarget | None = None  # set for MCP tools (activity ``mcp``); ``side_effect`` says if it is ledgered
    side_effect: bool = False  # the call goes through the idempotency ledger
    # Sandbox tools: whether the workflow tracks this call's workspace checkpoints (calls in histories recorded
    # without checkpoints decode as False).
    checkpoints: bool = False
    checkpoint: str = ""  # the checkpoint the workspace must hold before the tool runs ("": an empty workspace)
    # Said to the model before the tool's result: a reviewer changed the call's arguments (and how).
    reviewer_note: str = ""


class ToolOutcome(BaseModel):
    """What history keeps of a tool result: a preview; the full text is in the store.

    ``unknown`` means an earlier attempt recorded its intent and died before its
    outcome: the side effect may or may not have happened, and the tool can
    neither dedupe nor check, so a human must decide.
    """

    ok: bool
    preview: str
    size_bytes: int
    truncated: bool = False
    unknown: bool = False
    checkpoint: str = ""  # the workspace checkpoint after the call ("" when none was taken)


class SandboxRequest(BaseModel):
    sandbox_id: str
    conversation_id: str = ""
    tenant: str = ""


class SandboxRef(BaseModel):
    sandbox_id: str
    backend: str


Carry.model_rebuild()


class TreeRunRequest(BaseModel):
    """Count a sub-agent's run among its tree's before it starts (activity ``tree_run_reserve``)."""

    root: str  # the tree's root (its budget's)
    child_id: str  # the child's workflow id


class TreeRunVerdict(BaseModel):
    granted: bool
    cap: int  # AGENT_MAX_TREE_RUNS: runs of the tree, its root included


class ForkRequest(BaseModel):
    source: ForkSpec
    conversation_id: str  # the fork's own
    task: str = ""  # a new instruction after the source's steps ("" for none)
    tenant: str = ""  # the fork's own (its input's); the source's must be the same
    user: str = ""  # the fork's own (its input's); the source's must be the same


class ForkResult(BaseModel):
    source_conversation: str
    transcript_len: int  # entries copied (plus the new instruction)
    step: int  # the source's steps the fork starts after
    checkpoint: str = ""  # the source's workspace at that step
    model: str = ""  # the source's model (the fork's default)
