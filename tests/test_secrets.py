"""Secrets never reach a result, history or a log line: not whole, not cut in half, not echoed by a model."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import SecretStr
from temporalio.testing import WorkflowEnvironment

from activities.redaction import REDACTED, clip, redact, redact_cut_tail, redact_parts, skeleton
from activities.runtime import Runtime
from activities.settings import ProviderEndpoint, Settings
from durable_agents.logs import Redactor
from tests.conftest import WorkerFactory, require_bwrap, start_agent
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.test_mcp import ROOT, mcp_runtime, tool_messages
from tests.test_providers import KINDS, fails, make

KEY = "sk-test-0123456789abcdefghijklmnopqrstuvwxyz"


def test_clip_redacts_before_cutting_and_removes_a_cut_secret() -> None:
    text = "a" * 490 + KEY + " tail"
    cut = clip(text, 500, [KEY])  # the cut falls inside the key
    assert KEY[:4] not in cut and cut.endswith(REDACTED)
    assert clip("short " + KEY, 500, [KEY]) == "short " + REDACTED
    assert redact_cut_tail("ends with sk-t", [KEY]) == "ends with " + REDACTED
    assert redact_cut_tail("ends with sk-", [KEY]) == "ends with sk-", "3 characters identify nothing"
    assert redact_cut_tail("short pw12", ["pw123"]) == "short pw12", "short secrets have no partial form"


def test_log_lines_cut_before_logging_lose_the_fragment() -> None:
    event = Redactor([KEY])(None, "info", {"event": "x", "error": ("y" * 20 + KEY)[:40]})
    assert KEY[:12] not in event["error"] and event["error"].endswith(REDACTED)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_a_long_provider_error_never_leaks_part_of_the_key(kind: str) -> None:
    with FakeLLMServer() as server:
        # 490 characters, then the key: the old 500-character cut came before redaction.
        server.enqueue(Scripted(status=401, text="x" * 490 + KEY))
        exc = await fails(make(kind, server, key=KEY))
    assert KEY[:5] not in exc.message, exc.message
    assert REDACTED in exc.message


async def test_a_model_echoing_the_key_and_a_tool_printing_it_leave_no_trace(
    dev_env: WorkflowEnvironment, runtime: Runtime, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    require_bwrap()
    keyed = Runtime.from_settings(replace(runtime.settings, openai=ProviderEndpoint(llm.openai_url, SecretStr(KEY))))
    half = len(KEY) // 2
    # The command builds the key from two halves, so only the tool's output contains it whole.
    printer = f"printf '%s%s\\n' '{KEY[:half]}' '{KEY[half:]}'"
    llm.enqueue(
        Scripted(
            text=f"my key is {KEY}",
            tool_calls=[
                ("write_file", json.dumps({"path": "k.txt", "content": KEY})),
                ("run_shell", json.dumps({"command": printer})),
            ],
        ),
        Scripted(text=f"done: {KEY}"),
    )
    try:
        async with run_worker(dev_env.client, keyed) as task_queue:
            handle = await start_agent(dev_env.client, task_queue)
            result = await handle.result()
            history = await handle.fetch_history()
        transcript = [m.message for m in await keyed.store.messages(f"{handle.id}/{result_run_id(history)}", 5)]
    finally:
        await keyed.aclose()
    assert result.status == "completed" and result.output == f"done: {REDACTED}"
    assert KEY not in history.to_json()
    stored = json.dumps([m.model_dump() for m in transcript])
    assert KEY not in stored and stored.count(REDACTED) >= 3  # reply text, tool arguments, tool output
    # The second model request shows what the model was sent back: no key in it either.
    assert KEY not in json.dumps(llm.requests[-1]["body"])


def result_run_id(history: object) -> str:
    first = history.events[0]  # type: ignore[attr-defined]
    return str(first.workflow_execution_started_event_attributes.original_execution_run_id)


# --- secrets in pieces (issue 21, item 8) ------------------------------------------------------------------

LEAKED = "sk-Q7vX2mN9pR4tK8wZ3bY6cH1jL5fD0"
INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad"


def pieces(secret: str, size: int = 6) -> list[str]:
    """Every ``size``-character piece of ``secret``: none may reach the model, however it was split."""
    return [secret[i : i + size] for i in range(0, len(secret) - size + 1)]


def test_a_secret_split_by_invisible_characters_or_over_items_is_redacted() -> None:
    half = len(KEY) // 2
    for inserted in INVISIBLE:
        spelt = f"key {KEY[:half]}{inserted}{KEY[half:]}!"
        assert redact(spelt, [KEY]) == f"key {REDACTED}!", repr(inserted)
    everywhere = "".join(c + "\u200b" for c in KEY)
    assert redact(f"<{everywhere}>", [KEY]) == f"<{REDACTED}\u200b>"
    fullwidth = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in KEY)  # NFKC folds it back
    assert redact(fullwidth, [KEY]) == REDACTED
    assert redact("café au lait", [KEY]) == "café au lait", "unrelated non-ASCII text is left alone"
    # one MCP result: a key that starts in one item and ends in the next is redacted in both
    assert redact_parts(["key: " + KEY[:half], KEY[half:] + " end", "other"], [KEY]) == [
        f"key: {REDACTED}",
        f"{REDACTED} end",
        "other",
    ]
    # and a log line or an error carrying it with a zero-width space is redacted too
    event = Redactor([KEY])(None, "info", {"event": "x", "error": f"failed: {KEY[:half]}\u200b{KEY[half:]}"})
    assert event["error"] == f"failed: {REDACTED}"


async def test_an_mcp_server_leaking_a_secret_in_pieces_never_gets_it_to_the_model(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Path, run_worker: WorkerFactory, llm: FakeLLMServer
) -> None:
    leaky = {
        "command": sys.executable,
        "args": ["-m", "tests.fakes.mcp_leaky"],
        "cwd": str(ROOT),
        "env": {"LEAKY_SECRET": "${LEAKY_SECRET}"},  # a ${VAR} value: a secret of the worker
    }
    runtime = mcp_runtime(settings, tmp_path, {"leaky": leaky}, LEAKY_SECRET=LEAKED)
    llm.enqueue(
        Scripted(
            tool_calls=[
                ("mcp__leaky__leak", json.dumps({"how": "split"})),
                ("mcp__leaky__leak", json.dumps({"how": "zwsp"})),
                ("mcp__leaky__leak", json.dumps({"how": "invisible"})),
            ]
        ),
        Scripted(text="done"),
    )
    try:
        async with run_worker(dev_env.client, runtime) as tq:
            handle = await start_agent(dev_env.client, tq, id_prefix="mcp-leak", tools=["mcp__leaky__*"])
            result = await handle.result()
            history = await handle.fetch_history()
        transcript = [m.message for m in await runtime.store.messages(f"{handle.id}/{result_run_id(history)}", 5)]
    finally:
        await runtime.aclose()
    assert result.status == "completed", result.output
    answers = tool_messages(llm, 1)
    assert len(answers) == 3 and all(REDACTED in a for a in answers), answers
    assert answers[0] == f"key: {REDACTED}\n{REDACTED}", "both items of the split result lose their half"
    sent = json.dumps(llm.requests[1]["body"], ensure_ascii=False)
    stored = json.dumps([m.model_dump() for m in transcript], ensure_ascii=False)
    for where, text in (("model request", sent), ("transcript", stored), ("history", history.to_json())):
        assert not [p for p in pieces(LEAKED) if p in text], f"a piece of the secret reached the {where}"
        assert LEAKED not in skeleton(text), where
