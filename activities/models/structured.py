"""Structured output: a run's ``output_schema`` on the way to the model and on its final answer.

A provider whose ``complete`` (or ``stream``) takes an ``output_schema`` keyword gets the schema and
asks its API for native structured output (OpenAI-compatible servers: ``response_format`` of type
``json_schema``; Anthropic: a forced ``final_output`` tool). Any other provider's model is told the
schema in its system prompt instead. Either way the ``model`` activity checks the final answer with
:func:`check_output`; what does not match goes back to the model (``workflows.typed_output``).
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from workflows.typed_output import MAX_OUTPUT_ERROR_CHARS, MAX_OUTPUT_ERRORS
from workflows.types import Message

OUTPUT_TOOL = "final_output"  # the tool a provider without a JSON mode forces for the final answer
MAX_OUTPUT_BYTES = 32 * 1024  # of a final answer that must be JSON (what history keeps of a turn's text)
_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n(?P<body>.*)\n\s*```$", re.DOTALL)


def takes_output_schema(method: object) -> bool:
    """Whether a provider method accepts ``output_schema`` (by name, or through ``**kwargs``)."""
    try:
        parameters = inspect.signature(method).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return "output_schema" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def schema_problem(schema: dict[str, Any]) -> str:
    """Why ``schema`` is not a usable JSON Schema (draft 2020-12), or "" when it is."""
    # jsonschema is imported by the runs that ask for typed output, not by every worker (~2 MB).
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"not a valid JSON Schema: {_short(exc.message)} (at {_path(exc.absolute_path)})"
    return ""


def instruction(schema: dict[str, Any]) -> str:
    """The system-prompt text that asks a model without a JSON mode for a final answer matching ``schema``."""
    return (
        "When you give your final answer (a reply without tool calls), it must be only a JSON value that "
        "matches this JSON Schema, with no other text and no code fence:\n"
        + json.dumps(schema, separators=(",", ":"), sort_keys=True)
    )


def with_instruction(messages: list[Message], schema: dict[str, Any]) -> list[Message]:
    """``messages`` with :func:`instruction` at the end of the system prompt (one is added when there is none).

    Only the request carries it: the transcript in the run store keeps the prompt the run started with.
    """
    text = instruction(schema)
    for index, message in enumerate(messages):
        if message.role == "system":
            joined = f"{message.content}\n\n{text}" if message.content else text
            return [*messages[:index], message.model_copy(update={"content": joined}), *messages[index + 1 :]]
    return [Message(role="system", content=text), *messages]


def tool_schema(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """An object schema for a tool's input from ``schema``, and whether it wraps it (as ``{"output": ...}``).

    Tool inputs are JSON objects; an answer of any other type travels in one property.
    """
    if schema.get("type") == "object":
        return schema, False
    return {"type": "object", "properties": {"output": schema}, "required": ["output"]}, True


def check_output(text: str, schema: dict[str, Any]) -> tuple[Any, list[str]]:
    """The final answer ``text`` parsed, and why it does not match ``schema`` (empty when it does).

    One code fence around the JSON is forgiven (models add them). At most ``MAX_OUTPUT_ERRORS`` errors
    are listed, each with where in the answer it is. ``$ref`` resolves within the schema only: a schema
    never makes the worker fetch anything.
    """
    size = len(text.encode())
    if size > MAX_OUTPUT_BYTES:
        return None, [f"the answer is {size} bytes; a JSON answer may have at most {MAX_OUTPUT_BYTES}"]
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group("body").strip()
    try:
        value = json.loads(body)
    except ValueError as exc:
        return None, [f"the answer is not JSON: {_short(str(exc))}"]
    from jsonschema import Draft202012Validator
    from referencing import Registry
    from referencing.exceptions import Unresolvable

    validator = Draft202012Validator(schema, registry=Registry())
    try:
        found = sorted(validator.iter_errors(value), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    except Unresolvable as exc:
        return None, [f"the schema has a reference that cannot be resolved here: {_short(str(exc))}"]
    if not found:
        return value, []
    errors = [f"at {_path(e.absolute_path)}: {_short(e.message)}" for e in found[:MAX_OUTPUT_ERRORS]]
    if len(found) > MAX_OUTPUT_ERRORS:
        errors.append(f"... and {len(found) - MAX_OUTPUT_ERRORS} more")
    return None, errors


def _path(parts: Any) -> str:
    path = "$"
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _short(text: str) -> str:
    return text if len(text) <= MAX_OUTPUT_ERROR_CHARS else text[: MAX_OUTPUT_ERROR_CHARS - 3] + "..."


__all__ = [
    "MAX_OUTPUT_BYTES",
    "OUTPUT_TOOL",
    "check_output",
    "instruction",
    "schema_problem",
    "takes_output_schema",
    "tool_schema",
    "with_instruction",
]
