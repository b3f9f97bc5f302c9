"""``profile``: py-spy samples of the workers under ``throughput`` (ours, or the floor's with ``--only floor``),
summarised by where time goes; the same categories for both, so that their difference shows what ours adds."""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.scale.common import RESULTS, machine

# A sample counts for a category when any frame of its stack matches (inclusive, "cumulative" time);
# categories overlap (pydantic encode inside an activity inside the event loop).
CATEGORIES: dict[str, str] = {
    "workflow activation (temporalio _workflow_instance.activate)": (
        r"activate \(.*temporalio/worker/_workflow_instance\.py"
    ),
    "workflow sandbox (in-sandbox run + import/restriction proxies)": r"temporalio/worker/workflow_sandbox/",
    "our workflow code (workflows/)": r"\(workflows/",
    "activities (ours: activities/)": r"\(activities/",
    "model activity (activities/model_turn.py)": r"activities/model_turn\.py",
    "tool activity (activities/tools/activity.py)": r"activities/tools/activity\.py",
    "run store (activities/store/)": r"activities/store/",
    "sqlite3 calls": r"(sqlite3|aiosqlite)",
    "pydantic (validate/serialize, core)": r"(pydantic/|pydantic_core)",
    "temporalio converter / contrib.pydantic": r"(temporalio/converter\.py|temporalio/contrib/pydantic)",
    "protobuf": r"google/protobuf",
    "structlog": r"structlog/",
    "stdlib logging": r"logging/__init__\.py",
    "OpenTelemetry": r"opentelemetry/",
    "progress stream (workflow_streams)": r"temporalio/contrib/workflow_streams",
    "temporalio activity worker": r"temporalio/worker/_activity\.py",
    "temporalio workflow worker (outside activations)": r"temporalio/worker/_workflow\.py",
    "temporalio bridge (Rust core calls)": r"temporalio/bridge/",
    "bench client (start/result/history)": r"temporalio/client\.py",
    "asyncio event loop": r"asyncio/(base_events|events)\.py",
    "threading (workflow task executor threads)": r"threading\.py",
}
# Leaf frames of threads that wait (py-spy's idle detection misses them under GIL contention): an executor
# thread blocked on its work queue, the event loop in select(). Their samples are counted apart.
IDLE_LEAVES = ("_worker (concurrent/futures/thread.py)", "EpollSelector.select (selectors.py)")
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _short(frame: str) -> str:
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = match.group("file")
    for marker in ("site-packages/", "lib/python3.11/", "/wt-s14-bench/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match.group('fn')} ({path})"


def summarise(raw: Path, top: int = 40) -> dict[str, Any]:
    """Inclusive and self sample shares by category, function and thread, from py-spy's raw (collapsed) output."""
    total = idle = 0
    by_category: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    patterns = {name: re.compile(rx) for name, rx in CATEGORIES.items()}
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if frames and frames[0].startswith(("thread (", "process ")):
            threads[frames[0]] += count
            frames = [f for f in frames if not f.startswith(("thread (", "process "))]
        if frames and _short(frames[-1]) in IDLE_LEAVES:
            idle += count
            continue
        total += count
        joined = ";".join(frames)
        for name, rx in patterns.items():
            if rx.search(joined):
                by_category[name] += count
        for fn in {_short(f) for f in frames}:
            inclusive[fn] += count
        if frames:
            own[_short(frames[-1])] += count

    def share(counter: collections.Counter[str], n: int) -> list[dict[str, Any]]:
        return [{"what": k, "samples": v, "pct": round(100 * v / total, 1)} for k, v in counter.most_common(n)]

    return {
        "samples": total,
        "idle_samples_excluded": idle,
        "categories_inclusive": share(by_category, len(CATEGORIES)),
        "top_inclusive": share(inclusive, top),
        "top_self": share(own, top),
        "threads": share(threads, 20),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    raw = args.raw or (RESULTS / "scale_profile.raw.txt")
    if not args.summarise_only:
        child_out = raw.with_suffix(".throughput.json")
        command = [
            py_spy, "record", "--format", "raw", "--rate", str(args.rate), "--threads", "--output", str(raw), "--",
            sys.executable, "-m", "bench.scale", "throughput", "--only", args.only, "--rounds", "1",
            "--runs", str(args.runs), "--turns", str(args.turns), "--workers", str(args.workers),
            "--out", str(child_out),
        ]  # fmt: skip
        print("running:", " ".join(command))
        subprocess.run(command, check=True)
    report = {
        "bench": "profile",
        "what": f"py-spy record --rate {args.rate} (wall-clock samples of non-idle threads) of one process "
        f"running `throughput --only {args.only}` ({args.runs} runs x {args.turns} turns, {args.workers} in-process "
        "workers, plus the bench's own client); "
        "shares are of busy samples (idle waits excluded: idle_samples_excluded); "
        "a category counts a sample when any "
        "frame of its stack matches (inclusive), so categories overlap",
        "machine": machine(),
        **summarise(raw, args.top),
    }
    for row in report["categories_inclusive"]:
        print(f"{row['pct']:5.1f}%  {row['what']}")
    return report
