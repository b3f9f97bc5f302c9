"""Decoding what arrives from outside the run: its input, signals and updates.

Anyone who can start a run or signal it decides what these payloads contain, so
nothing here trusts them. The SDK is handed the raw payload (``RawValue``) and
this module decodes it into the expected model, or says in bounded text why
not. A payload the SDK decoded itself would fail *before* workflow code runs: a
signal is then dropped with a worker traceback, and a run input fails every
workflow task, forever.

Every message built here quotes at most a short, UTF-8-safe prefix of what was
sent, never the content itself: a refusal that copied a 1.5 MB field would be
kept in the status view and the progress stream and carried into
continue-as-new.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue

M = TypeVar("M", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])

# What the payload codec (activities/crypto/codec.py) makes of a payload. A worker that receives one still
# encrypted has no key ring (AGENT_PAYLOAD_KEYS): that is the worker's fault, not the sender's.
ENCRYPTED_ENCODING = b"binary/encrypted"


class EncryptedPayload(RuntimeError):
    """A payload arrived encrypted: raised, not refused, so the workflow task fails (visibly, in history) and is
    retried until a worker with the key ring takes it, instead of failing the run or dropping the signal."""


# The default of a raw parameter when no payload was sent at all.
NO_PAYLOAD = RawValue(Payload())
QUOTE_MAX = 80  # characters of a sent value a message may quote
MESSAGE_MAX = 2000  # characters of a whole problem description
ERRORS_MAX = 10  # validation errors listed; the rest are counted
_JSON_TYPES = {
    "dict": "an object",
    "list": "an array",
    "str": "a string",
    "int": "a number",
    "float": "a number",
    "bool": "a boolean",
    "NoneType": "null",
}


def one_payload(fn: F) -> F:
    """Let a handler take any number of payloads while the SDK hands it the first one raw.

    The SDK decodes with the handler's annotations only when as many payloads
    arrived as the handler has parameters, and then calls it with all of them:
    a signal or start sent with two payloads would raise ``TypeError`` inside the
    workflow task and fail every task of the run, forever. The handler therefore
    also takes ``*extra``, hidden from the signature the SDK inspects, so that a
    single payload still arrives as ``RawValue`` and extra ones can be refused.
    """
    signature = inspect.signature(fn)
    shown = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    fn.__signature__ = signature.replace(parameters=shown)  # type: ignore[attr-defined]
    return fn


def safe(text: str, limit: int = QUOTE_MAX) -> str:
    """``text`` cut to at most ``limit`` characters (the cut marked), anything not valid Unicode escaped."""
    cut = text if len(text) <= limit else text[: max(0, limit - 1)] + "…"
    return cut.encode("utf-8", "backslashreplace").decode("utf-8")


def quote(value: object, limit: int = QUOTE_MAX) -> str:
    """A short quotation of a sent value, for messages."""
    return repr(safe(value if isinstance(value, str) else repr(value), limit))


def json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value).__name__, type(value).__name__)


def problems(err: ValidationError) -> str:
    """A validation error as ``field: message; ...``, naming fields but never copying values."""
    errors = err.errors(include_url=False, include_input=False, include_context=False)
    parts = []
    for e in errors[:ERRORS_MAX]:
        where = ".".join(safe(str(p), 40) for p in e["loc"]) or "input"
        parts.append(f"{where}: {safe(e['msg'], 200)}")
    more = f"; and {len(errors) - ERRORS_MAX} more problem(s)" if len(errors) > ERRORS_MAX else ""
    return safe("; ".join(parts), MESSAGE_MAX - len(more)) + more  # the count survives the cut


def decode(value: object, model: type[M], extra: tuple[Any, ...] = ()) -> M | str:
    """``value`` (as a handler received it) as ``model``, or why it is not one.

    ``value`` is normally the ``RawValue`` of the one payload sent; it is already
    decoded when the SDK decoded it itself (more than one payload was sent, see
    ``one_payload``), and a model instance when workflow code calls a handler.
    """
    if extra:
        return f"expected one payload, got {len(extra) + 1}"
    if isinstance(value, model):
        return value
    if isinstance(value, RawValue):
        return _decode_payload(value.payload, model)
    try:  # decoded by the SDK without our annotation: validate what it made of the JSON
        return model.model_validate(value)
    except ValidationError as err:
        return _shape_problem(err, value) or problems(err)


def _decode_payload(payload: Payload, model: type[M]) -> M | str:
    if not payload.metadata and not payload.data:
        return "no payload was sent"
    encoding = payload.metadata.get("encoding", b"")
    if encoding == ENCRYPTED_ENCODING:
        key_id = safe(payload.metadata.get("encryption-key-id", b"").decode("utf-8", "replace"), 64)
        raise EncryptedPayload(
            f"a payload encrypted with key {key_id!r} reached a worker without that key: "
            "start the worker with AGENT_PAYLOAD_KEYS (or AGENT_PAYLOAD_KEYS_FILE) holding it"
        )
    if encoding != b"json/plain":
        return f"expected a JSON object, got a payload with encoding {quote(encoding.decode('utf-8', 'replace'))}"
    try:
        return model.model_validate_json(payload.data)
    except ValidationError as err:
        if any(e["type"] == "json_invalid" for e in err.errors()):
            return _json_problem(payload.data, err)
        return _shape_problem(err, None) or problems(err)


def _shape_problem(err: ValidationError, value: object) -> str:
    """Say what was sent instead of an object, when that is the problem."""
    for e in err.errors(include_url=False):
        if e["loc"] == () and e["type"] in ("model_type", "model_attributes_type", "dict_type"):
            got = e.get("input", value)
            return f"expected a JSON object, got {json_type(got)}"
    return ""


def _json_problem(data: bytes, err: ValidationError) -> str:
    """Why ``data`` is not JSON pydantic can read, as precisely as the standard library can tell."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 (byte {exc.start})"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return "not valid JSON: nested too deeply"
    found = unencodable(parsed)
    if found is not None:
        path, index, char = found
        return f"{path or 'input'}: not valid Unicode: a lone surrogate {char!a} at character {index}"
    return problems(err)


def unencodable(value: object) -> tuple[str, int, str] | None:
    """The first string (or key) in a JSON value that cannot be encoded as UTF-8: (path, index, char)."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return path, exc.start, item[exc.start]
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                key_path = f"{path}.{safe(str(key), 40)}" if path else safe(str(key), 40)
                stack.append((key_path, child))
                stack.append((f"{key_path} (key)", key))
        elif isinstance(item, list):
            stack.extend((f"{path}.{i}" if path else str(i), child) for i, child in reversed(list(enumerate(item))))
    return None
