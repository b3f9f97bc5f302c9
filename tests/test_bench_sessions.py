"""The sessions bench times a send by the model request of its session: which session a request is for."""

from __future__ import annotations

from bench.scale.sessions import ModelClock, message_key


def test_a_request_is_for_the_session_its_last_user_message_names() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "you are an agent"},
            {"role": "user", "content": "hello sessions-ours-1-7"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "cold sessions-ours-1-7"},
        ]
    }
    assert message_key(body) == "cold sessions-ours-1-7"
    assert message_key({"messages": [{"role": "user", "content": "what is 2 + 2?"}]}) is None
    assert message_key({"messages": []}) is None


def test_the_clock_keeps_each_request_s_arrival_and_answers_at_once() -> None:
    clock = ModelClock()
    first = {"messages": [{"role": "user", "content": "cold s-1"}]}
    assert clock(first).text == "ok" and clock(first).text == "ok"
    clock({"messages": [{"role": "user", "content": "unrelated"}]})
    assert clock.count("cold s-1") == 2 and clock.count("cold s-2") == 0
    arrived = clock.first("cold s-1")
    assert arrived is not None and arrived <= clock.arrivals["cold s-1"][1]
    assert clock.first("cold s-2") is None
