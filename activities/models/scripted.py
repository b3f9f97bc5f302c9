"""``scripted:demo`` — an offline, deterministic model for demos and tests.

It reads the transcript like a model would and plays a fixed plan: write a
Python file and run it in the sandbox, fetch the first URL in the task with an
HTTP GET (when the task has one), POST a reservation to ``<url>/reservations``
when the task asks to reserve (a side effect, so policy asks for approval),
then answer with what it saw. When the task also says "ask me", it first asks how many
to reserve with ``ask_human`` (options 1, 2, 3) and reserves the number answered. The same
transcript always yields the same reply.

Follow-up messages (a session's second message and later, the last user entry of the transcript):
when the message names a URL, or says "again" after an earlier message named one, it GETs that URL
once more and answers with what changed since the earlier result; otherwise it answers from the
earlier tool results of the conversation, naming the message it is answering.

Delegation: when the run offers sub-agents (tools whose arguments are ``{"task": str}``) and the
task says "delegate", the first turn hands the task to every offered sub-agent at once (each gets
the task without the word, so it plays the plan above instead of delegating again) and the answer
lists what each returned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from activities.models.base import FatalProviderError, ProviderReply
from activities.models.registry import provider
from activities.settings import Settings
from workflows.types import Message, RecordedToolCall

DEMO_SCRIPT = """\
import statistics

primes = [n for n in range(2, 60) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
print(f"primes below 60: {len(primes)}, mean {statistics.mean(primes):.2f}, largest {primes[-1]}")
"""

_URL = re.compile(r"https?://[^\s'\"<>]+")
_DELEGATE = re.compile(r"(?i)\bdelegat\w*\s*")
_AGAIN = re.compile(r"(?i)\bagain\b")
_ASK_ME = re.compile(r"(?i)\bask me\b")
SUBAGENT_ARGS_TITLE = "SubagentArgs"  # the schema title of a sub-agent's arguments (see activities.tools.registry)


def _call(turn: int, index: int, name: str, args: dict[str, Any]) -> RecordedToolCall:
    return RecordedToolCall(id=f"scripted_{turn}_{index}", name=name, arguments_json=json.dumps(args))


def _body(result: str) -> str:
    """The body of a rendered HTTP result (``<status line>\n<headers>\n\n<body>``)."""
    return result.split("\n\n", 1)[1].strip() if "\n\n" in result else ""


@dataclass(frozen=True)
class _Earlier:
    seq: int  # the number of the message whose work fetched it
    content: str


def _earlier_get(messages: list[Message], url: str) -> _Earlier | None:
    """The last successful GET of ``url`` in ``messages``, and the number of the message it answered."""
    urls: dict[str, str] = {}
    found: _Earlier | None = None
    seq = 0
    for message in messages:
        if message.role == "user":
            seq += 1
        for call in message.tool_calls:
            args = json.loads(call.arguments_json or "{}")
            if call.name == "http_request" and args.get("method") == "GET":
                urls[call.id] = str(args.get("url", ""))
        if message.role == "tool" and not message.is_error and urls.get(message.tool_call_id) == url:
            found = _Earlier(seq=seq, content=message.content)
    return found


def _stdout_first_line(result: str) -> str:
    """First stdout line of a rendered sandbox result (``exit_code: …\\nstdout:\\n…``)."""
    _, found, rest = result.partition("stdout:\n")
    lines = rest.strip().splitlines()
    return lines[0] if found and lines else ""


class ScriptedProvider:
    """Deterministic stand-in for a model; ``scripted:demo`` is the only script.

    With an ``output_schema`` its final answer is JSON matching the schema: strings hold the summary it
    would have written, numbers the count of tool results, booleans true, arrays their fewest items.
    """

    async def complete(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        output_schema: dict[str, Any] | None = None,
    ) -> ProviderReply:
        reply = self._reply(model, messages, tools)
        if output_schema is None or reply.tool_calls:
            return reply
        results = sum(1 for m in messages if m.role == "tool")
        value = _instance(output_schema, output_schema, reply.text, results, 0)
        return reply.model_copy(update={"text": json.dumps(value, ensure_ascii=False)})

    def _reply(self, model: str, messages: list[Message], tools: list[dict[str, Any]]) -> ProviderReply:
        if model != "demo":
            raise FatalProviderError(f"scripted: unknown script {model!r} (available: demo)", status=404)
        task = next((m.content for m in messages if m.role == "user"), "")
        asked = [i for i, m in enumerate(messages) if m.role == "user"]
        turn = sum(1 for m in messages if m.role == "assistant")
        tool_results = [m for m in messages if m.role == "tool"]
        tokens_in = sum(len(m.content) // 4 for m in messages)
        available = {t["name"] for t in tools}
        url = next(iter(_URL.findall(task)), "").rstrip(".,;:!?)")

        def reply(text: str, calls: list[RecordedToolCall], output_tokens: int) -> ProviderReply:
            return ProviderReply(
                text=text,
                tool_calls=calls,
                input_tokens=tokens_in,
                output_tokens=output_tokens,
                finish_reason="tool_calls" if calls else "stop",
                response_id=f"scripted-{turn}",
            )

        if len(asked) > 1:
            return self._follow_up(messages, asked, tools, reply, turn)
        subagents = [
            t["name"]
            for t in tools
            if isinstance(t.get("parameters"), dict) and t["parameters"].get("title") == SUBAGENT_ARGS_TITLE
        ]
        if turn == 0 and subagents and _DELEGATE.search(task):
            part = _DELEGATE.sub("", task).strip() or task
            calls = [_call(turn, i, name, {"task": part}) for i, name in enumerate(subagents)]
            return reply(f"I'll delegate this to {', '.join(subagents)} in parallel.", calls, 30)
        if any(m.name in subagents for m in tool_results):
            lines = ["Done. My sub-agents reported:"]
            lines += [f"- {m.name}: {m.content.replace(chr(10), ' ')[:300]}" for m in tool_results]
            return reply("\n".join(lines), [], 60)
        http_calls = sum(1 for m in tool_results if m.name == "http_request")
        can_http = bool(url) and "http_request" in available
        if turn == 0 and {"write_file", "run_python"} <= available:
            write = _call(turn, 0, "write_file", {"path": "analysis.py", "content": DEMO_SCRIPT})
            run = _call(turn, 1, "run_python", {"code": "exec(open('analysis.py').read())"})
            return reply("I'll compute a few statistics in the sandbox first.", [write, run], 40)
        if can_http and http_calls == 0:
            fetch = _call(turn, 0, "http_request", {"method": "GET", "url": url})
            return reply(f"Now I'll fetch {url}.", [fetch], 20)
        answers = [m for m in tool_results if m.name == "ask_human"]
        if can_http and http_calls == 1 and "reserve" in task.lower():
            if _ASK_ME.search(task) and "ask_human" in available and not answers:
                question = {"question": "How many units should I reserve?", "options": ["1", "2", "3"]}
                return reply("I'll ask how many to reserve.", [_call(turn, 0, "ask_human", question)], 20)
            answered = answers[-1].content.strip() if answers and not answers[-1].is_error else ""
            quantity = int(answered) if answered.isdigit() else 1
            # A write: policy asks a human before it runs.
            body = {"method": "POST", "url": f"{url}/reservations", "json": {"quantity": quantity}}
            reserve = _call(turn, 0, "http_request", body)
            return reply("Stock is available; I'll reserve one unit (this needs approval).", [reserve], 30)
        return reply(self._summary(tool_results), [], 60)

    def _follow_up(
        self,
        messages: list[Message],
        asked: list[int],
        tools: list[dict[str, Any]],
        reply: Callable[[str, list[RecordedToolCall], int], ProviderReply],
        turn: int,
    ) -> ProviderReply:
        """A later message of a conversation: fetch again what it asks to re-check, else answer from before."""
        last = asked[-1]
        text = messages[last].content
        number = len(asked)
        since = [m for m in messages[last:] if m.role == "tool"]
        earlier_urls = [u for i in asked[:-1] for u in _URL.findall(messages[i].content)]
        url = next(iter(_URL.findall(text)), "") or (earlier_urls[-1] if _AGAIN.search(text) and earlier_urls else "")
        url = url.rstrip(".,;:!?)")
        if url and "http_request" in {t["name"] for t in tools} and not since:
            fetch = _call(turn, 0, "http_request", {"method": "GET", "url": url})
            return reply(f"Message {number}: I'll fetch {url} again.", [fetch], 20)
        if since:
            lines = [f"Message {number}: here is what I see now:", *self._summary(since).splitlines()[1:]]
            now = next((m for m in reversed(since) if m.name == "http_request" and not m.is_error), None)
            before = _earlier_get(messages[:last], url)
            if now is not None and before is not None:
                same = _body(now.content) == _body(before.content)
                lines.append(
                    f"- unchanged since message {before.seq}"
                    if same
                    else f"- in message {before.seq} it returned {_body(before.content)[:200]}"
                )
            return reply("\n".join(lines), [], 60)
        earlier = [m for m in messages[:last] if m.role == "tool"]
        lines = [f"Message {number}: from earlier in this conversation:", *self._summary(earlier).splitlines()[1:]]
        lines.append(f"(you asked: {text.strip()[:200]})")
        return reply("\n".join(lines), [], 40)

    @staticmethod
    def _summary(results: list[Message]) -> str:
        lines = ["Done. Here is what I found:"]
        for result in results:
            if result.name == "run_python":
                lines.append(f"- sandboxed Python said: {_stdout_first_line(result.content) or '(no output)'}")
            elif result.is_error:
                lines.append(f"- {result.name} was not done: {result.content[:300]}")
            elif result.name == "http_request":
                status = result.content.splitlines()[0] if result.content else "(no response)"
                lines.append(f"- the HTTP request returned {status}: {_body(result.content)[:200]}")
        if len(lines) == 1:
            lines.append("- no tools were needed")
        return "\n".join(lines)


def _instance(schema: Any, root: dict[str, Any], text: str, count: int, depth: int) -> Any:
    """A value of ``schema`` (local ``$ref``s resolved in ``root``) made of the demo's answer ``text`` and ``count``."""
    if not isinstance(schema, dict) or depth > 16:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _instance(target, root, text, count, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return _instance(schema[key][0], root, text, count, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        assert isinstance(properties, dict)
        required = schema.get("required") if isinstance(schema.get("required"), list) else list(properties)
        assert isinstance(required, list)
        return {str(name): _instance(properties.get(name, {}), root, text, count, depth + 1) for name in required}
    if kind == "array":
        fewest = schema.get("minItems", 0)
        return [_instance(schema.get("items", {}), root, text, count, depth + 1) for _ in range(int(fewest))]
    if kind in ("integer", "number"):
        low, high = schema.get("minimum", count), schema.get("maximum", count)
        return min(max(count, low), high)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    longest = schema.get("maxLength")
    return text[: int(longest)] if isinstance(longest, int) else text


@provider("scripted")
def scripted_provider(settings: Settings) -> ScriptedProvider:
    """``scripted:demo``: offline and deterministic; the default model when no key is configured."""
    return ScriptedProvider()
