"""``ScriptedModel``: an in-process model provider that plays a script of turns and records every request.

A run on a worker that has the model registered (``AgentTestEnvironment(models=[model])``, or
``model.add_to(registry)`` for a registry of your own) and that names ``model="<name>:<anything>"`` sends
each model turn to :meth:`ScriptedModel.complete`, which answers with the next turn of the script.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from activities.models.base import FatalProviderError, ModelProvider, ProviderError, ProviderReply
from activities.models.registry import ProviderRegistry, provider
from activities.settings import Settings
from workflows.types import Message, RecordedToolCall


class ModelCall(BaseModel):
    """One request the model was sent: what a real provider would have received for one turn."""

    model_config = ConfigDict(frozen=True)

    model: str  # the model name after the prefix: ``"x"`` for ``"test:x"``
    messages: list[Message]  # the transcript so far, system prompt first
    tools: list[dict[str, Any]] = Field(default_factory=list)  # ``{"name", "description", "parameters"}`` each
    max_output_tokens: int | None = None  # the output cap the worker sent (``AGENT_MAX_OUTPUT_TOKENS``)
    output_schema: dict[str, Any] | None = None  # the JSON schema asked of the answer, when the run asks one

    @property
    def tool_names(self) -> list[str]:
        """The names of the tools offered on this turn, in the order offered."""
        return [str(t.get("name", "")) for t in self.tools]

    @property
    def tool_results(self) -> list[Message]:
        """Every tool result in the transcript (``role == "tool"``), oldest first."""
        return [m for m in self.messages if m.role == "tool"]

    def tool_result(self, name: str) -> Message:
        """The last result of tool ``name`` in the transcript; ``AssertionError`` (naming what is there) if none."""
        for message in reversed(self.messages):
            if message.role == "tool" and message.name == name:
                return message
        seen = [m.name for m in self.tool_results]
        raise AssertionError(f"no result of tool {name!r} in this request (tool results: {seen})")

    @property
    def last_user_message(self) -> str:
        """The text of the last user message (the task, or a session's latest message)."""
        return next((m.content for m in reversed(self.messages) if m.role == "user"), "")


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model makes: ``args`` a JSON object, or a string sent verbatim (it may be invalid JSON)."""

    name: str
    args: Mapping[str, Any] | str = field(default_factory=dict)
    id: str = ""  # the model's id of the call; generated (``scripted_<turn>_<index>``) when empty

    def arguments_json(self) -> str:
        return self.args if isinstance(self.args, str) else json.dumps(dict(self.args))


@dataclass(frozen=True)
class Turn:
    """One scripted model turn.

    It answers ``text`` and ``tool_calls`` with the given usage, after ``delay_s`` seconds (a slow model);
    with ``error`` it raises that instead: a :class:`~activities.models.RetryableProviderError` makes the
    ``model`` activity retry (the retry is answered by the next turn of the script), a
    :class:`~activities.models.FatalProviderError` ends the run ``failed``.
    """

    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    input_tokens: int = 10
    output_tokens: int = 5
    error: ProviderError | None = None
    delay_s: float = 0.0


Responder = Callable[[ModelCall], Turn]
"""A turn computed from the request it answers (to echo a tool result, or to branch on the transcript)."""
Step = Turn | Responder


def say(text: str, *, input_tokens: int = 10, output_tokens: int = 5, delay_s: float = 0.0) -> Turn:
    """A turn that answers ``text`` and calls no tool (the run's final answer, unless more turns follow)."""
    return Turn(text=text, input_tokens=input_tokens, output_tokens=output_tokens, delay_s=delay_s)


def call(
    name: str,
    args: Mapping[str, Any] | str | None = None,
    *more: ToolCall,
    text: str = "",
    input_tokens: int = 10,
    output_tokens: int = 5,
) -> Turn:
    """A turn that calls tool ``name`` with ``args`` (and the ``more`` calls in the same turn)."""
    first = ToolCall(name, {} if args is None else args)
    return Turn(text=text, tool_calls=(first, *more), input_tokens=input_tokens, output_tokens=output_tokens)


def fail(error: ProviderError, *, delay_s: float = 0.0) -> Turn:
    """A turn that raises ``error`` (``RetryableProviderError`` is retried, ``FatalProviderError`` is not)."""
    return Turn(error=error, delay_s=delay_s)


class ScriptExhausted(FatalProviderError):
    """The model was asked for a turn after its script's last one.

    Raised from :meth:`ScriptedModel.complete`; a fatal provider error, so the run ends ``failed`` (with this
    message as its output) instead of retrying a turn that can never come.
    """


class ScriptedModel:
    """A model provider that answers each request with the next :class:`Turn` of ``script`` and records it.

    ``name`` is the provider prefix: runs with ``model="<name>:<anything>"`` reach this model. ``script`` items
    are turns or responders (``Callable[[ModelCall], Turn]``); :meth:`extend` adds more. Every request is in
    :attr:`requests`, in the order received (a retried turn is recorded again). Asked for a turn after the
    last one, it raises :class:`ScriptExhausted`, naming the model and how many turns it played.
    """

    def __init__(self, name: str = "test", script: Iterable[Step] = ()) -> None:
        def factory(settings: Settings) -> ModelProvider:
            return self

        # ``provider()`` checks the prefix the way ``@provider`` does for a module's providers.
        self._factory = provider(name)(factory)
        self.name = name
        self._script: list[Step] = list(script)
        self._played = 0
        self.requests: list[ModelCall] = []

    def extend(self, *steps: Step) -> ScriptedModel:
        """Append turns to the script; returns the model."""
        self._script.extend(steps)
        return self

    @property
    def remaining(self) -> int:
        """How many turns of the script have not been played."""
        return len(self._script) - self._played

    @property
    def model(self) -> str:
        """A model string that reaches this provider: ``"<name>:scripted"``."""
        return f"{self.name}:scripted"

    def add_to(self, registry: ProviderRegistry) -> ProviderRegistry:
        """Register this model in ``registry`` under its name (again is a no-op); returns the registry.

        For a worker built without :class:`~durable_agents.testing.AgentTestEnvironment`:
        ``DurableAgentsPlugin(settings, providers=model.add_to(provider_registry(settings)))``.
        """
        registry.add(self.name, self._factory)
        return registry

    async def complete(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        max_output_tokens: int | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> ProviderReply:
        """Record the request, then play the next turn: its reply after its delay, or its error."""
        request = ModelCall(
            model=model,
            messages=[m.model_copy(deep=True) for m in messages],
            tools=[dict(t) for t in tools],
            max_output_tokens=max_output_tokens,
            output_schema=output_schema,
        )
        # No await until the turn is taken: concurrent runs (one event loop) take turns in the order they ask.
        self.requests.append(request)
        if self._played >= len(self._script):
            raise ScriptExhausted(
                f"ScriptedModel {self.name!r} has no turn left: it played all {len(self._script)} turn(s) "
                f"of its script and was asked for one more (request {len(self.requests)}, last message: "
                f"{_describe(messages[-1]) if messages else 'none'}); add turns with extend()"
            )
        step = self._script[self._played]
        index = self._played
        self._played += 1
        turn = step if isinstance(step, Turn) else step(request)
        if turn.delay_s > 0:
            await asyncio.sleep(turn.delay_s)
        if turn.error is not None:
            raise turn.error
        calls = [
            RecordedToolCall(id=c.id or f"scripted_{index}_{i}", name=c.name, arguments_json=c.arguments_json())
            for i, c in enumerate(turn.tool_calls)
        ]
        return ProviderReply(
            text=turn.text,
            tool_calls=calls,
            input_tokens=turn.input_tokens,
            output_tokens=turn.output_tokens,
            finish_reason="tool_calls" if calls else "stop",
            response_id=f"{self.name}-{index + 1}",
        )


def _describe(message: Message) -> str:
    text = message.content if len(message.content) <= 80 else message.content[:77] + "..."
    return f"{message.role} {text!r}"
