"""Whether a provider takes the output cap is read from its ``complete`` once per function, and stays right."""

from __future__ import annotations

import gc
import inspect
import weakref
from typing import Any

import pytest

from activities.models import base
from activities.models.base import takes_output_cap


class Capped:
    async def complete(self, model: str, messages: Any, tools: Any, *, max_output_tokens: int) -> None: ...


class Uncapped:
    async def complete(self, model: str, messages: Any, tools: Any) -> None: ...


class Open:
    async def complete(self, model: str, messages: Any, tools: Any, **options: Any) -> None: ...


class CallableComplete:
    """``complete`` is an object with ``__call__`` and ``__slots__``: it cannot be weakly referenced."""

    class _Complete:
        __slots__ = ()

        async def __call__(self, model: str, messages: Any, tools: Any, *, max_output_tokens: int) -> None: ...

    complete = _Complete()


def test_each_kind_of_complete_gets_its_answer() -> None:
    assert takes_output_cap(Capped())
    assert not takes_output_cap(Uncapped())
    assert takes_output_cap(Open())  # through **kwargs
    assert takes_output_cap(CallableComplete())
    assert not takes_output_cap(object())  # no complete at all
    assert not takes_output_cap(type("Broken", (), {"complete": 3})())  # not callable


def test_a_class_is_inspected_once_and_instances_with_their_own_complete_are_not_confused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[object] = []
    real_signature = inspect.signature

    def counting_signature(obj: Any, *args: Any, **kwargs: Any) -> inspect.Signature:
        reads.append(obj)
        return real_signature(obj, *args, **kwargs)

    monkeypatch.setattr(inspect, "signature", counting_signature)

    class Fresh:  # a class no other test asked about
        async def complete(self, model: str, messages: Any, tools: Any, *, max_output_tokens: int) -> None: ...

    assert all(takes_output_cap(Fresh()) for _ in range(5))
    assert len(reads) == 1
    # An instance whose complete is its own function (a closure, say) is answered for that function.
    odd = Fresh()

    async def plain(model: str, messages: Any, tools: Any) -> None: ...

    odd.complete = plain  # type: ignore[method-assign,assignment]
    assert not takes_output_cap(odd)
    assert takes_output_cap(Fresh())
    # Not weakly referenceable: read every time, still right.
    reads.clear()
    assert takes_output_cap(CallableComplete()) and takes_output_cap(CallableComplete())
    assert len(reads) == 2


def _ask_about_a_temporary_class() -> weakref.ref[Any]:
    class Temporary:
        async def complete(self, model: str, messages: Any, tools: Any, *, max_output_tokens: int) -> None: ...

    answer = takes_output_cap(Temporary())
    assert answer and Temporary.complete in base._TAKES_OUTPUT_CAP
    return weakref.ref(Temporary.complete)


def test_the_cache_does_not_keep_classes_alive() -> None:
    function = _ask_about_a_temporary_class()
    gc.collect()
    assert function() is None
