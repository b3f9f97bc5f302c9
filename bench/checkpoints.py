"""What do workspace checkpoints cost per step, in time and in run store bytes?

    .venv/bin/python -m bench.checkpoints --files 50 --file-mb 1 --steps 100 --change-kb 10

A real local sandbox (bubblewrap, the worker's quota mechanism) gets ``--files`` files of
``--file-mb`` MiB of random bytes (50 MB by default: random, so compression cannot flatter the
numbers), and one checkpoint is taken. Then, ``--steps`` times, one ``--change-kb`` KB file is
rewritten by a command in the sandbox (new random content each step) and a checkpoint is taken, as
the tool activity does after every sandbox tool. Reported: the first checkpoint's time, p50/p95 of
the per-step checkpoint time, the time of restoring the first step's checkpoint over the last
step's workspace, and the growth of the SQLite run store (file + WAL, after a WAL checkpoint) over
the initial workspace's size. Writes ``bench/results/checkpoints.json``.

Targets: store growth under 2 MB plus the initial workspace, p50 checkpoint time under 30 ms
(exit code 1 if either is missed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from activities.checkpoints import engine
from activities.sandbox.local.backend import LocalLimits, LocalSandboxBackend, require_bwrap
from activities.store.sqlite import SQLiteRunStore
from bench.report import write_results

RESULTS = Path(__file__).parent / "results" / "checkpoints.json"
TARGET_P50_MS = 30.0
TARGET_GROWTH_BYTES = 2 * 1000 * 1000
MAX_BYTES = 256 * 1024 * 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def store_bytes(path: Path) -> int:
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


async def measure(files: int, file_mb: int, steps: int, change_kb: int) -> dict[str, Any]:
    require_bwrap()
    with tempfile.TemporaryDirectory(prefix="bench-checkpoints-") as tmp:
        root = Path(tmp)
        backend = LocalSandboxBackend(root / "sandboxes", LocalLimits(disk_mb=max(512, files * file_mb * 2)))
        store = SQLiteRunStore(root / "store.sqlite3")
        sandbox = await backend.create("sbx-bench-checkpoints", metadata={})
        try:
            for index in range(files):
                await sandbox.write_file(f"data/part-{index:03}.bin", os.urandom(file_mb * 1024 * 1024))
            empty_store = store_bytes(root / "store.sqlite3")
            started = time.perf_counter()
            first = await engine.take(sandbox, store, max_bytes=MAX_BYTES)
            first_ms = (time.perf_counter() - started) * 1000
            initial_store = store_bytes(root / "store.sqlite3")
            step_ms: list[float] = []
            read_bytes: list[int] = []
            checkpoints = [first.checkpoint_id]
            for step in range(steps):
                # What a run_python/run_shell step does: a command in the sandbox changes one file.
                command = f"head -c {change_kb * 1000} /dev/urandom > notes.bin && echo {step} > step.txt"
                result = await sandbox.run(["sh", "-c", command], timeout_s=30)
                assert result.exit_code == 0, result.stderr
                started = time.perf_counter()
                taken = await engine.take(sandbox, store, max_bytes=MAX_BYTES)
                step_ms.append((time.perf_counter() - started) * 1000)
                read_bytes.append(taken.read_bytes)
                checkpoints.append(taken.checkpoint_id)
            final_store = store_bytes(root / "store.sqlite3")
            started = time.perf_counter()
            await engine.restore(sandbox, store, checkpoints[1], max_bytes=MAX_BYTES)
            restore_ms = (time.perf_counter() - started) * 1000
        finally:
            await backend.kill("sbx-bench-checkpoints")
            await store.close()
            backend.close()
    workspace = files * file_mb * 1024 * 1024
    growth = final_store - initial_store
    return {
        "workspace_bytes": workspace,
        "files": files,
        "steps": steps,
        "change_bytes": change_kb * 1000,
        "quota_mechanism": backend.quota_mechanism,
        "first_checkpoint_ms": round(first_ms, 1),
        "step_checkpoint_ms": {
            "p50": round(percentile(step_ms, 50), 2),
            "p95": round(percentile(step_ms, 95), 2),
            "mean": round(statistics.fmean(step_ms), 2),
            "max": round(max(step_ms), 2),
        },
        "step_read_bytes_p50": percentile([float(b) for b in read_bytes], 50),
        "restore_first_step_ms": round(restore_ms, 1),
        "store_bytes": {
            "empty": empty_store,
            "after_first_checkpoint": initial_store,
            "after_steps": final_store,
            "growth_over_steps": growth,
            "growth_per_step": round(growth / steps),
        },
        "distinct_checkpoints": len(set(checkpoints)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--file-mb", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--change-kb", type=int, default=10)
    args = parser.parse_args()
    results = asyncio.run(measure(args.files, args.file_mb, args.steps, args.change_kb))
    results["machine"] = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "root": os.geteuid() == 0,
    }
    ok = (
        results["step_checkpoint_ms"]["p50"] < TARGET_P50_MS
        and results["store_bytes"]["growth_over_steps"] < TARGET_GROWTH_BYTES
    )
    results["targets"] = {"p50_ms": TARGET_P50_MS, "growth_bytes": TARGET_GROWTH_BYTES, "met": ok}
    write_results(RESULTS, results, echo=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
