"""Documents that refuse keys they do not know, naming the nearest one they do.

A policy rule with ``wen`` for ``when`` must not load as a rule without a
condition (it would allow every call), and ``aproval_timeout_s`` must not leave
the default timeout in place without a word. Every model of an operator's or a
run's document (policies, sub-agent definitions, the MCP configuration) derives
from ``KnownKeys``: an unknown key is a validation error at that key's location
saying ``unknown key 'wen' (did you mean 'when'?)`` (or listing the valid keys
when none is close), one error per unknown key.

Pure and deterministic (stdlib and pydantic), so workflow code may use it.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

KEY_QUOTE_MAX = 40  # characters of an unknown key a message quotes
# Validation context key: ``{TOLERATE_UNKNOWN: True}`` drops unknown keys instead (documents recorded in a run's
# history before keys were checked, which must replay as they ran; see workflows.policy.parse_run_policy).
TOLERATE_UNKNOWN = "tolerate_unknown_keys"


def unknown_key_message(key: str, valid: list[str]) -> str:
    """``unknown key 'wen' (did you mean 'when'?)``, or the valid keys when none is close."""
    shown = key if len(key) <= KEY_QUOTE_MAX else key[:KEY_QUOTE_MAX] + "..."
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6) or difflib.get_close_matches(
        key.lower(), [v.lower() for v in valid], n=1, cutoff=0.6
    )
    if near:
        nearest = next(v for v in valid if v.lower() == near[0].lower())
        return f"unknown key {shown!r} (did you mean {nearest!r}?)"
    return f"unknown key {shown!r} (valid keys: {', '.join(valid)})"


class KnownKeys(BaseModel):
    """A model whose input may hold only its own fields (by name or alias)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        valid: list[str] = []
        for name, field in cls.model_fields.items():
            valid.append(name)
            if field.alias and field.alias != name:
                valid.append(field.alias)
        unknown = [key for key in data if key not in valid]
        if not unknown:
            return data
        if info.context and info.context.get(TOLERATE_UNKNOWN):
            return {key: value for key, value in data.items() if key in valid}
        # The type is pydantic's own for an extra key, so code that looks for it still finds it.
        errors = [
            InitErrorDetails(
                type=PydanticCustomError("extra_forbidden", "{message}", {"message": unknown_key_message(k, valid)}),
                loc=(k,),
                input=data[k],
            )
            for k in map(str, unknown)
        ]
        # Raised inside a validator, its errors join the outer ones with their location prefixed.
        raise ValidationError.from_exception_data(cls.__name__, errors)
