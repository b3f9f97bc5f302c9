"""A tool call as a human must read it before deciding: one formatting for every place that asks.

``pending``, ``status``, ``approve`` / ``reject``, ``run --follow``, ``watch`` and the
Temporal UI's current details all show a call through :func:`call_lines`:

1. the tool, the HTTP method and the full canonical URL, never cut (the URL is the
   one the request goes to: ``HttpRequestArgs`` canonicalised it when the call was
   validated);
2. the body's size and sha256 digest, never the body itself (a long body used to push
   the method and URL out of a 120-character preview);
3. the other arguments, each bounded (a longer one shows its size and digest);
4. the sha256 of all the arguments (canonical JSON), which names the call exactly.

Pure and stdlib only, so workflow code (``workflows.narration``) uses it too. Text the
model chose is shown with invisible and control characters escaped, so nothing in an
argument can move the cursor, hide text or reorder it on a reviewer's terminal.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from workflows.identity import canonical_json

OTHER_ARG_CHARS = 200  # of one other argument's value; a longer one shows its size and digest
BODY_FIELDS = ("body", "json")  # http_request's body fields: size and digest only


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def args_digest(args: dict[str, Any]) -> str:
    """The sha256 of the call's canonical arguments: what a reviewer can compare across screens."""
    return digest(canonical_json(args))


def visible(text: str) -> str:
    """``text`` with every character that does not print (controls, zero-width, bidi) escaped."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in text)


def wrap(text: str, width: int | None, indent: str) -> list[str]:
    """``text`` in lines of at most ``width`` characters (all of it: wrapped, never cut)."""
    if not width or len(text) <= width:
        return [text]
    return [text[:width]] + [indent + text[i : i + width] for i in range(width, len(text), width)]


def _sized(text: str) -> str:
    return f"{len(text.encode('utf-8', 'surrogatepass'))} bytes, sha256 {digest(text)}"


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    if len(text) <= OTHER_ARG_CHARS:
        return visible(json.dumps(value, ensure_ascii=False) if isinstance(value, str) else text)
    return f"{_sized(text)} (longer than {OTHER_ARG_CHARS} characters: not shown)"


def call_head(tool: str, args: dict[str, Any]) -> str:
    """``http_request POST https://host/path?query`` — the tool, method and full URL; the tool alone otherwise."""
    if tool == "http_request":
        return f"{tool} {visible(str(args.get('method', '')).upper())} {visible(str(args.get('url', '')))}"
    return visible(tool)


def call_lines(tool: str, args: dict[str, Any], *, width: int | None = None, indent: str = "  ") -> list[str]:
    """The call, first line its head (:func:`call_head`), the others indented by ``indent``.

    ``width`` hard-wraps long lines (the URL included) for displays that would cut or
    scroll them (the Temporal UI); without it every line is whole and the terminal wraps it.
    """
    given = {key: value for key, value in args.items() if value is not None}  # unset optional arguments
    lines = wrap(call_head(tool, given), width, indent)
    rest = dict(given)
    if tool == "http_request":
        rest.pop("method", None)
        rest.pop("url", None)
        for field in BODY_FIELDS:
            if field in rest:
                value = rest.pop(field)
                text = value if isinstance(value, str) else canonical_json(value)
                label = "body" if field == "body" else "json body (canonical JSON)"
                lines.append(f"{indent}{label}: {_sized(text)}")
    for key in sorted(rest):
        lines += wrap(f"{indent}{visible(key)}: {_value(rest[key])}", width, indent + "  ")
    lines.append(f"{indent}arguments sha256 {args_digest(args)}")
    return lines


def call_text(tool: str, args: dict[str, Any], *, indent: str = "  ") -> str:
    return "\n".join(call_lines(tool, args, indent=indent))
