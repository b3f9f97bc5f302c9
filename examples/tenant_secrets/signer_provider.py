"""Example model ``signer:v1``: offline; asks ``sign_invoice`` for the invoice its task names, then answers with it."""

from __future__ import annotations

import json
import re
from typing import Any

from durable_agents import Message, ModelProvider, ProviderReply, RecordedToolCall, Settings, provider

_INVOICE = re.compile(r"\bINV-\d{1,12}\b")


class SignerProvider:
    async def complete(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        task = next((m.content for m in messages if m.role == "user"), "")
        results = [m for m in messages if m.role == "tool"]
        invoice = _INVOICE.search(task)
        if not results and invoice and "sign_invoice" in {t["name"] for t in tools}:
            arguments = json.dumps({"invoice": invoice[0]})
            call = RecordedToolCall(id="sign_0", name="sign_invoice", arguments_json=arguments)
            return ProviderReply(tool_calls=[call], input_tokens=10, output_tokens=5, finish_reason="tool_calls")
        text = "; ".join(f"{'error: ' if m.is_error else ''}{m.content}" for m in results) or "nothing to sign"
        return ProviderReply(text=text, input_tokens=10, output_tokens=5, finish_reason="stop")


@provider("signer")
def signer(settings: Settings) -> ModelProvider:
    return SignerProvider()
