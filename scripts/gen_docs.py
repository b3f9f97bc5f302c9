"""Write the generated reference pages of the docs site (``make docs-gen``).

- ``docs/reference/configuration.md`` from ``Settings``: every environment variable its code reads (found in
  its source, so nothing it reads can be left out), the type that code parses it as, the default
  ``Settings.from_env({})`` holds, and the meaning from ``activities/settings_reference.py``.
- ``docs/reference/contract.md`` from the pydantic models of the contract (``workflows/types.py``): field,
  type, default, and the description (``Field(description=...)``, else the field's comment in the source).

``tests/test_docs.py`` fails when the committed pages differ from what this writes now.
``python -m scripts.gen_docs --check`` exits 1 naming the stale pages instead of writing them.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import io
import sys
import tokenize
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

import activities.settings as settings_module
from activities.settings import Settings
from activities.settings_reference import SECTIONS, VARIABLES, Variable
from workflows import session_types as sessions
from workflows import types as contract
from workflows.trust import RUNTIME_ONLY

ROOT = Path(__file__).resolve().parent.parent
CONFIGURATION_PAGE = ROOT / "docs" / "reference" / "configuration.md"
CONTRACT_PAGE = ROOT / "docs" / "reference" / "contract.md"
REGENERATE = "make docs-gen"

# --- configuration -----------------------------------------------------------------------------------------

# The methods of Settings' environment reader (and its local helpers) whose first argument is a variable name.
_READERS = {"text", "secret", "names", "number", "flag", "integer", "positive", "get"}


@dataclasses.dataclass(frozen=True)
class Read:
    """How ``Settings`` parses one variable, as its code says."""

    kind: str
    detail: str = ""

    def describe(self) -> str:
        return {
            "text": "string",
            "get": "string",
            "secret": "secret string",
            "names": "comma-separated list",
            "flag": "flag (`1`/`0`)",
            "number": "number",
            "positive": "number > 0",
            "integer": "integer",
        }[self.kind] + (f" {self.detail}" if self.detail else "")


def settings_sources() -> list[Path]:
    """The source files of ``activities.settings`` (one module, or every module of the package it may become)."""
    path = Path(settings_module.__file__ or "")
    if hasattr(settings_module, "__path__"):
        return sorted(path.parent.rglob("*.py"))
    return [path]


def _value(node: ast.expr | None, namespace: dict[str, Any]) -> Any:
    """A keyword argument's value: a literal, or arithmetic over the constants of the module that reads it."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    try:
        return eval(compile(ast.Expression(node), "<settings>", "eval"), {"__builtins__": {}}, namespace)
    except Exception:
        return None


def _namespace(path: Path) -> dict[str, Any]:
    """The globals of the settings module at ``path`` (where the names in its reads' bounds are defined)."""
    try:
        relative = path.resolve().relative_to(ROOT)
    except ValueError:
        return vars(settings_module)
    name = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
    try:
        return vars(importlib.import_module(name))
    except ImportError:
        return vars(settings_module)


def _is_variable_name(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        value = node.value
        if len(value) >= 4 and value.replace("_", "").isalnum() and value.isupper() and value[0].isalpha():
            return value
    return ""


def _read_of(call: ast.Call, namespace: dict[str, Any]) -> tuple[str, Read] | None:
    func = call.func
    method = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if method not in _READERS or not call.args:
        return None
    name = _is_variable_name(call.args[0])
    if not name:
        return None
    if method == "get" and not (isinstance(func, ast.Attribute) and ast.unparse(func.value).endswith("env")):
        return None
    keywords = {k.arg: _value(k.value, namespace) for k in call.keywords}
    detail = ""
    if method == "integer" and keywords.get("low") is not None and keywords.get("high") is not None:
        detail = f"{keywords['low']:,}–{keywords['high']:,}"
    elif method == "number" and keywords.get("positive"):
        method = "positive"
    elif method == "number" and keywords.get("minimum") is not None:
        detail = f"≥ {keywords['minimum']:g}"
    return name, Read(method, detail)


def settings_reads() -> dict[str, Read]:
    """Every environment variable the ``Settings`` code reads, with how it parses it (from its source)."""
    found: dict[str, Read] = {}
    for path in settings_sources():
        namespace = _namespace(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and (read := _read_of(node, namespace)):
                name, how = read
                # A variable read twice (a presence test, then a parse) keeps its most specific parse.
                if name not in found or found[name].kind in ("get", "text"):
                    found[name] = how
            elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In) for op in node.ops):
                name = _is_variable_name(node.left)
                if name and ast.unparse(node.comparators[0]).endswith("env"):
                    found.setdefault(name, Read("get"))
    return found


def _cell(text: str) -> str:
    """Text for a markdown table cell (a ``|`` would end the cell)."""
    return text.replace("|", "\\|")


def _format_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "unset" if not value.get_secret_value() else "(secret)"
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, tuple):
        return ", ".join(f"`{v}`" for v in value) if value else "empty"
    text = str(value)
    return f"`{text}`" if text else "empty"


def _default_of(variable: Variable, defaults: Settings) -> str:
    if variable.default:
        return variable.default
    value: Any = defaults
    for part in variable.field.split("."):
        value = getattr(value, part)
    return _format_default(value)


def check_reference() -> list[str]:
    """Problems between what ``Settings`` reads and ``activities/settings_reference.py`` (empty: none)."""
    reads = settings_reads()
    described = [v.name for v in VARIABLES]
    problems = [f"{name}: read by Settings but not described in activities/settings_reference.py" for name in reads]
    problems = [p for p in problems if p.split(":")[0] not in described]
    problems += [f"{name}: described but Settings does not read it" for name in described if name not in reads]
    problems += [f"{name}: described twice" for name in {n for n in described if described.count(n) > 1}]
    for variable in VARIABLES:
        if variable.section not in SECTIONS:
            problems.append(f"{variable.name}: unknown section {variable.section!r}")
        if not variable.field and not variable.default:
            problems.append(f"{variable.name}: needs a field (the Settings attribute) or a default text")
    return problems


def configuration_page() -> str:
    problems = check_reference()
    if problems:
        raise SystemExit("activities/settings_reference.py is out of date:\n  " + "\n  ".join(problems))
    reads = settings_reads()
    defaults = Settings.from_env({})
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated by scripts/gen_docs.py from activities/settings/ and activities/settings_reference.py:"
        f" do not edit; run `{REGENERATE}`. -->",
        "",
        "Every environment variable `Settings` reads, for `durable-agents-worker` (`worker.py`), `durable-agents`",
        "(`starter.py`) and `DurableAgentsPlugin(Settings.from_env())` alike. `Settings` reads the environment",
        "once, at start; a bad value stops the process with one line naming the variable (exit 2). Operator",
        'extensions read their own variables through `settings.variable("NAME")`.',
        "",
    ]
    for section in SECTIONS:
        lines += [f"## {section}", "", "| variable | type | default | meaning |", "|---|---|---|---|"]
        for variable in (v for v in VARIABLES if v.section == section):
            kind = variable.kind or reads[variable.name].describe()
            cells = (f"`{variable.name}`", kind, _default_of(variable, defaults))
            lines.append(f"| {' | '.join(cells)} | {_cell(variable.meaning)} |")
        lines.append("")
    return "\n".join(lines)


# --- contract ----------------------------------------------------------------------------------------------

# (model, what it is) in page order: the run's input and result, the query, the signals and the update.
CONTRACT_MODELS: tuple[tuple[type[BaseModel], str], ...] = (
    (contract.AgentInput, "The input of `AgentWorkflow` (a JSON object; only `task` is required)."),
    (contract.Limits, "`AgentInput.limits`: brakes the workflow checks before every model turn."),
    (contract.ForkSpec, "`AgentInput.fork`: where a fork starts."),
    (contract.SubagentDef, "A sub-agent definition (`AgentInput.subagents`, `AGENT_SUBAGENTS_FILE`)."),
    (contract.AgentResult, "The result of `AgentWorkflow`."),
    (contract.Usage, "Tokens and cost (`AgentResult.usage`, `StatusView.usage`)."),
    (contract.StatusView, "The answer of the `status` query."),
    (contract.PendingApproval, "One entry of `StatusView.pending_approvals`."),
    (contract.ApproveSignal, "The `approve` signal."),
    (contract.RejectSignal, "The `reject` signal."),
    (contract.ResolveSignal, "The `resolve` signal: a human's answer to an unknown outcome."),
    (contract.DecideRequest, "The `decide` update's input (the CLI's `approve`, `reject` and `resolve` use it)."),
    (contract.DecideResult, "The `decide` update's answer."),
    (contract.AnswerSignal, "The `answer` signal: a human's answer to a question (`ask_human`)."),
    (contract.ForgetApprovalsSignal, "The `forget_approvals` signal: drop the run's remembered approvals."),
    (contract.AskHumanArgs, "The arguments of the built-in `ask_human` tool."),
    (contract.DecisionRecord, "One entry of the audit (`StatusView.decisions`, `AgentResult.decisions`)."),
    (contract.RememberedApproval, "One entry of `StatusView.remembered`."),
    (contract.Message, "One transcript entry (what a model provider is given)."),
    (contract.RecordedToolCall, "A tool call exactly as the model emitted it (`Message.tool_calls`)."),
    (contract.ToolInvocation, "What a tool's activity receives (`ToolContext.invocation`)."),
    (sessions.SessionSpec, "`AgentInput.session`: the run is a session (docs: Sessions)."),
    (sessions.SessionMessage, "The `message` signal and the `send` update's input."),
    (sessions.SendResult, "The `send` update's answer."),
    (sessions.CloseSignal, "The `close` signal (its payload is optional)."),
)


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line."""
    return {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }


def _field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Field -> its comment in the source: the comment lines right above it plus the one at its end."""
    source = Path(sys.modules[model.__module__].__file__ or "").read_text(encoding="utf-8")
    lines = source.splitlines()
    comments = _comments(source)
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ClassDef) and node.name == model.__name__):
            continue
        for statement in node.body:
            if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
                continue
            above: list[str] = []
            number = statement.lineno - 1
            while number >= 1 and lines[number - 1].strip().startswith("#"):
                above.insert(0, comments[number])
                number -= 1
            trailing = [comments[n] for n in range(statement.lineno, (statement.end_lineno or 0) + 1) if n in comments]
            # A field's own comment wins over a block above it, which may speak of several fields.
            found[statement.target.id] = " ".join(trailing or above)
    return found


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is Literal:
        return " \\| ".join(f'`"{a}"`' for a in typing.get_args(annotation))
    if origin in (types.UnionType, typing.Union):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin in (list, tuple):
        return f"list[{_type_name(typing.get_args(annotation)[0])}]"
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"dict[{_type_name(key)}, {_type_name(value)}]"
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        shown = {m.__name__ for m, _ in CONTRACT_MODELS}
        return (
            f"[{annotation.__name__}](#{annotation.__name__.lower()})"
            if annotation.__name__ in shown
            else (annotation.__name__)
        )
    return getattr(annotation, "__name__", str(annotation))


def _bounds(info: FieldInfo) -> str:
    parts = []
    for item in info.metadata:
        for attr, label in (("ge", "≥"), ("le", "≤"), ("min_length", "min length"), ("max_length", "max length")):
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{label} {value:,}" if isinstance(value, int) else f"{label} {value:g}")
        if getattr(item, "pattern", None):
            parts.append(f"pattern `{item.pattern}`")
    return ", ".join(parts)


def _field_default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return f"`{type(value).__name__}()` defaults"
    else:
        value = info.default
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, list | dict):
        return f"`{value!r}`"
    return f"`{value}`"


def _model_section(model: type[BaseModel], what: str) -> Iterator[str]:
    comments = _field_comments(model)
    yield f"## {model.__name__}"
    yield ""
    yield what
    yield ""
    yield "| field | type | default | description |"
    yield "|---|---|---|---|"
    for name, info in model.model_fields.items():
        description = (info.description or comments.get(name, "")).replace("``", "`")
        if not description:
            raise SystemExit(
                f"{model.__module__}: {model.__name__}.{name} has no description (a comment on its line or "
                "Field(description=...)); the contract reference needs one"
            )
        description = description[0].upper() + description[1:].rstrip(".") + "."
        if model is contract.AgentInput and name in RUNTIME_ONLY:
            description += " Set by the runtime: refused from a run started from outside."
        kind = _type_name(info.annotation)
        bounds = _bounds(info)
        cell = f"{kind} ({bounds})" if bounds else kind
        yield f"| `{name}` | {cell} | {_field_default(info)} | {_cell(description)} |"
    yield ""


def contract_page() -> str:
    lines = [
        "# Contract reference",
        "",
        f"<!-- Generated by scripts/gen_docs.py from workflows/types.py: do not edit; run `{REGENERATE}`. -->",
        "",
        "The pydantic models of the public contract, importable from `durable_agents` (`AgentInput`,",
        "`AgentResult`, `Limits`, `StatusView`, `Message`, ...) or from `workflows.types`. The workflow type is",
        "`AgentWorkflow` and the default task queue `agents`; signals are `approve`, `reject`, `resolve`, `answer`,",
        "`forget_approvals`, and for sessions `message` and `close`; updates `decide` and `send`; the query is",
        "`status`. Unknown keys in",
        "`AgentInput`, `Limits`, `ForkSpec` and `SubagentDef` are refused by name, with the nearest valid one.",
        "New fields always get defaults, so recorded histories keep decoding.",
        "",
        "## Names and semantics",
        "",
        "| name | kind | payload | answer |",
        "|---|---|---|---|",
        "| `AgentWorkflow` | workflow type | [AgentInput](#agentinput) | [AgentResult](#agentresult) |",
        "| `approve` | signal | [ApproveSignal](#approvesignal) | none: a refused signal is logged and counted in "
        "`status.refused` |",
        "| `reject` | signal | [RejectSignal](#rejectsignal) | as `approve` |",
        "| `resolve` | signal | [ResolveSignal](#resolvesignal) | as `approve` |",
        "| `answer` | signal | [AnswerSignal](#answersignal) | as `approve` |",
        "| `forget_approvals` | signal | [ForgetApprovalsSignal](#forgetapprovalssignal) | as `approve` |",
        "| `decide` | update | [DecideRequest](#deciderequest) | [DecideResult](#decideresult) |",
        "| `message` | signal | [SessionMessage](#sessionmessage) | as `approve` (sessions) |",
        "| `send` | update | [SessionMessage](#sessionmessage) | [SendResult](#sendresult) (sessions) |",
        "| `close` | signal | [CloseSignal](#closesignal) or none | as `approve` (sessions) |",
        "| `status` | query | none | [StatusView](#statusview) |",
        "",
        "`decide` has the signals' semantics, but its caller gets an answer: `accepted: false` for an approval that",
        "was already decided (the message says how). Any other refusal (malformed, unknown or expired approval, not",
        "an approver, unsigned or badly signed) fails the update with a non-retryable `DecisionRefused` error, and",
        "the validator's refusals never reach history. With `AGENT_APPROVAL_KEY` set, only decisions carrying an",
        "HMAC-SHA256 `signature` over (approval id, decision, reviewer, expiry, and what the decision carries:",
        "edited `arguments`, an answer's `text`, a `remember` scope) count.",
        "",
        "With `AGENT_FAIL_WORKFLOW_ON_ERROR=1` a run that ends `failed` or `limit_exceeded` fails its workflow",
        "(`AgentRunFailed`) with the `AgentResult` as the failure's details; `durable_agents.result_of_failure(err)`",
        "reads it back from a `ChildWorkflowError` or `WorkflowFailureError`.",
        "",
        "`send` refuses what it cannot take in its validator (so a refusal never reaches history): a",
        "non-retryable `MessageRefused` error whose message starts with the reason (`malformed`, `not_a_session`,",
        "`closed`, `busy`, `queue_full`) and whose first detail is the `SendResult`. A `message_id` sent again is",
        "answered `accepted: true, duplicate: true` with the first one's `seq`, and queues nothing.",
        "",
    ]
    for model, what in CONTRACT_MODELS:
        lines += list(_model_section(model, what))
    return "\n".join(lines)


# --- entry point -------------------------------------------------------------------------------------------

PAGES = {CONFIGURATION_PAGE: configuration_page, CONTRACT_PAGE: contract_page}


def stale_pages() -> list[Path]:
    """The generated pages whose committed text differs from what the generator writes now."""
    return [page for page, build in PAGES.items() if not page.exists() or page.read_text(encoding="utf-8") != build()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is stale instead of writing it")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for page in stale:
            print(f"{page.relative_to(ROOT)} is stale: run `{REGENERATE}`", file=sys.stderr)
        return 1 if stale else 0
    for page, build in PAGES.items():
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(build(), encoding="utf-8")
        print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
