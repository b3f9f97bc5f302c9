"""Typed results: the contract of a run's ``output_schema`` (workflow-safe: standard library and pydantic only).

A run (or a sub-agent definition) may give a JSON Schema its final answer must match. The schema is
checked once at the run's start (``run_config``) and stored in the run store; each model turn gets
its digest, and the ``model`` activity checks a final answer against it. An answer that does not
match goes back to the model with the errors, up to ``limits.max_output_retries`` times; then the run
ends ``failed`` with them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel

MAX_OUTPUT_SCHEMA_BYTES = 32 * 1024  # of the schema as compact JSON
MAX_OUTPUT_RETRIES = 10  # the ceiling of limits.max_output_retries
MAX_OUTPUT_ERRORS = 5  # validation errors told to the model (and kept in the run's failure)
MAX_OUTPUT_ERROR_CHARS = 300  # of each


def _bounded_schema(schema: dict[str, Any]) -> dict[str, Any]:
    try:
        size = len(json.dumps(schema, separators=(",", ":"), allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must be JSON: {exc}") from None
    if size > MAX_OUTPUT_SCHEMA_BYTES:
        raise ValueError(f"is {size} bytes as JSON; at most {MAX_OUTPUT_SCHEMA_BYTES} are accepted")
    return schema


# A JSON Schema object (its validity as a schema is checked by the run's ``run_config``).
OutputSchema = Annotated[dict[str, Any], AfterValidator(_bounded_schema)]


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema of a pydantic model, as ``output_schema`` takes it."""
    return model.model_json_schema()


def retry_instruction(errors: list[str], attempt: int, allowed: int) -> str:
    """What the model is told when its final answer does not match the schema (a user message)."""
    listed = "\n".join(f"- {error}" for error in errors)
    return (
        f"Your final answer does not match the required output schema (attempt {attempt} of {allowed + 1}):\n"
        f"{listed}\n"
        "Answer again with only a JSON value that matches the schema: no prose, no code fence."
    )


def failure_text(errors: list[str], attempts: int) -> str:
    """A run's output when its final answer still does not match after its retries."""
    return f"the final answer did not match output_schema after {attempts} attempt(s): " + "; ".join(errors)
