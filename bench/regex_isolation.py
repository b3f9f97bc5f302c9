"""Does a run whose policy has a catastrophic pattern slow another run on the same worker? (issue 21, item 5)

    .venv/bin/python -m bench.regex_isolation --repeat 7

One worker, a local dev server and the fake LLM server. A normal run (``--turns`` model turns, each
one GET to a local HTTP sink) is timed ``--repeat`` times alone, then ``--repeat`` times beside a
hostile run, then alone again. The hostile run's policy is ``(a+)+b`` (the pattern of the issue: with
Python's ``re`` a URL ending in 25 ``a``'s took seconds per match, holding the GIL) followed by a deny
rule. Its model asks for ``--calls`` GETs of URLs ending in 8,000 ``a``'s every turn (a turn every
0.25 s, like a real model) until the normal runs are done, so each of its turns evaluates the
catastrophic pattern ``--calls`` times (the calls are then denied: no HTTP work of its own). Reports
the median wall time of the normal run alone and beside the hostile run and their ratio, the hostile
run's decisions meanwhile, and what one catastrophic match costs (RE2, 8,000 ``a``'s) against Python's
``re`` (20 ``a``'s), measured in-process. Writes ``bench/results/regex_isolation.json``.

Target: the normal run beside the hostile run within 1.2x of its time alone (exit code 1 if missed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.settings import ProviderEndpoint, Settings
from durable_agents.testing._http_sink import HttpSink
from durable_agents.testing._llm_server import FakeLLMServer, Scripted
from worker import build_worker
from workflows.agent import AgentWorkflow
from workflows.patterns import Pattern
from workflows.types import AgentInput, Limits

TEMPORAL_CLI = Path(sys.executable).parent / "temporal"
RESULTS = Path(__file__).parent / "results" / "regex_isolation.json"
TARGET_RATIO = 1.2
HOSTILE_TURN_DELAY_S = 0.25
CATASTROPHIC = "(a+)+b"
HOSTILE_POLICY = {
    "rules": [
        {"name": "catastrophic", "tool": "http_request", "when": {"url": CATASTROPHIC}, "decision": "deny"},
        {"name": "deny-a", "tool": "http_request", "when": {"url": "a{100}$"}, "decision": "deny"},
    ]
}


class Script:
    """The fake model: normal runs GET the sink ``turns`` times; the hostile run asks until told to stop."""

    def __init__(self, sink_url: str, turns: int, calls: int) -> None:
        self.sink_url, self.turns, self.calls = sink_url, turns, calls
        self.stop_hostile = False
        self.hostile_turns = 0
        self.hostile_running = threading.Event()  # set by the fake model's thread after 3 hostile turns

    def __call__(self, body: dict[str, Any]) -> Scripted:
        messages = body["messages"]
        task = next(m["content"] for m in messages if m["role"] == "user")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if task == "hostile":
            if self.stop_hostile:
                return Scripted(text="hostile done")
            self.hostile_turns += 1
            if self.hostile_turns >= 3:
                self.hostile_running.set()
            url = f"{self.sink_url}/{'a' * 8000}"
            call = ("http_request", json.dumps({"method": "GET", "url": url}))
            # Paced like a real model, so that what it adds beside the normal run is its policy decisions.
            return Scripted(tool_calls=[call] * self.calls, delay_s=HOSTILE_TURN_DELAY_S)
        if turn < self.turns:
            url = f"{self.sink_url}/normal/{turn}"
            return Scripted(tool_calls=[("http_request", json.dumps({"method": "GET", "url": url}))])
        return Scripted(text="normal done")


def match_costs() -> dict[str, float]:
    """One catastrophic match, RE2 (8,000 a's) against Python's re (20 a's: each more a doubles it)."""
    text = "https://h.test/" + "a" * 8000
    pattern = Pattern(CATASTROPHIC, ignore_case=True)
    started = time.perf_counter()
    for _ in range(100):
        pattern.search(text)
    re2_ms = (time.perf_counter() - started) * 10  # / 100 * 1000
    started = time.perf_counter()
    re.search(CATASTROPHIC, "https://h.test/" + "a" * 20, flags=re.IGNORECASE)
    python_ms = (time.perf_counter() - started) * 1000
    return {"re2_8000_a_ms": round(re2_ms, 3), "python_re_20_a_ms": round(python_ms, 1)}


async def time_normal(env: WorkflowEnvironment, task_queue: str, turns: int) -> float:
    started = time.monotonic()
    handle = await env.client.start_workflow(
        AgentWorkflow.run,
        AgentInput(task="normal", limits=Limits(max_steps=turns + 2)),
        id=f"bench-normal-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
    )
    result = await handle.result()
    if result.status != "completed":
        raise SystemExit(f"the normal run ended {result.status}: {result.output}")
    return time.monotonic() - started


async def measure(repeat: int, turns: int, calls: int) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI), data_converter=pydantic_data_converter, dev_server_log_level="error"
    )
    try:
        with tempfile.TemporaryDirectory(prefix="bench-regex-") as tmp, FakeLLMServer() as llm, HttpSink() as sink:
            script = Script(sink.url, turns, calls)
            llm.default = script
            settings = Settings(
                model="openai:bench-model",
                openai=ProviderEndpoint(llm.openai_url),
                http_allow=("127.0.0.1:1024-65535",),
                store_url=str(Path(tmp) / "store.sqlite3"),
                state_dir=Path(tmp) / "agent",
            )
            runtime = Runtime.from_settings(settings)
            task_queue = f"bench-{uuid.uuid4().hex[:8]}"
            try:
                async with build_worker(env.client, runtime, task_queue=task_queue):
                    await time_normal(env, task_queue, turns)  # warm up
                    alone = [await time_normal(env, task_queue, turns) for _ in range(repeat)]
                    hostile = await env.client.start_workflow(
                        AgentWorkflow.run,
                        AgentInput(task="hostile", policy=HOSTILE_POLICY, limits=Limits(max_steps=10_000)),
                        id=f"bench-hostile-{uuid.uuid4().hex[:8]}",
                        task_queue=task_queue,
                    )
                    # It is deciding its calls before the first timed run.
                    if not await asyncio.to_thread(script.hostile_running.wait, 120):
                        raise SystemExit("the hostile run did not get going")
                    turns_before = script.hostile_turns
                    beside = [await time_normal(env, task_queue, turns) for _ in range(repeat)]
                    turns_beside = script.hostile_turns - turns_before
                    script.stop_hostile = True
                    hostile_result = await hostile.result()
                    after = [await time_normal(env, task_queue, turns) for _ in range(repeat)]
            finally:
                await runtime.aclose()
    finally:
        await env.shutdown()
    alone_all = alone + after
    alone_s, beside_s = statistics.median(alone_all), statistics.median(beside)
    ratio = beside_s / alone_s
    return {
        "normal_turns": turns,
        "repeat": repeat,
        "hostile_policy": HOSTILE_POLICY,
        "hostile_calls_per_turn": calls,
        "hostile_status": hostile_result.status,
        "hostile_turns_while_timed": turns_beside,
        "hostile_decisions_while_timed": turns_beside * calls,
        "alone_s": [round(s, 3) for s in alone],
        "alone_after_s": [round(s, 3) for s in after],
        "beside_s": [round(s, 3) for s in beside],
        "alone_median_s": round(alone_s, 3),
        "beside_median_s": round(beside_s, 3),
        "ratio": round(ratio, 3),
        "match_costs": match_costs(),
        "target": f"normal run beside the hostile one within {TARGET_RATIO}x of its time alone",
        "target_met": ratio <= TARGET_RATIO,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7, help="timed normal runs in each phase")
    parser.add_argument("--turns", type=int, default=5, help="model turns of the normal run (one GET each)")
    parser.add_argument("--calls", type=int, default=5, help="GETs the hostile run asks for per turn")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)
    report = asyncio.run(measure(args.repeat, args.turns, args.calls))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"normal run alone     median {report['alone_median_s']} s ({report['alone_s']} / {report['alone_after_s']})")
    print(f"beside hostile run   median {report['beside_median_s']} s ({report['beside_s']})")
    print(f"ratio                {report['ratio']}x")
    print(f"hostile run          {report['hostile_decisions_while_timed']} catastrophic-pattern decisions meanwhile")
    costs = report["match_costs"]
    print(f"one match            RE2 {costs['re2_8000_a_ms']} ms (8,000 a's); re {costs['python_re_20_a_ms']} ms (20)")
    print(f"target               {report['target']}: {'met' if report['target_met'] else 'MISSED'}")
    print(f"written to           {args.out}")
    return 0 if report["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
