"""What does the per-run checkpoint budget cost per step, and does it hold the run store's growth?

    .venv/bin/python -m bench.checkpoint_budget --steps 100 --change-kb 10 --rewrite-steps 6 --rewrite-mb 60

Through the tool activity's own path (``activities.checkpoints.workspace.Workspace``, a real local
sandbox, a SQLite run store):

* accounting: ``--steps`` steps that each rewrite one ``--change-kb`` KB file; the per-step time of
  the checkpoint with its budget bookkeeping (read the run's usage, take, record) against
  ``engine.take`` alone on the same workspace;
* growth: ``--rewrite-steps`` steps that each rewrite three ``--rewrite-mb`` MiB files of random
  bytes under ``AGENT_CHECKPOINT_RUN_MAX_MB=--run-max-mb``; the store's blob bytes after them, and
  the step at which checkpoints stopped.

Writes ``bench/results/checkpoint_budget.json``. Targets: the bookkeeping adds under 5 ms a step at
p50, and the store holds at most the budget (exit code 1 if either is missed).
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

from activities.checkpoints import engine, ids
from activities.checkpoints.workspace import Workspace
from activities.runtime import Runtime
from activities.sandbox.local.bwrap import require_bwrap
from activities.sandbox.local.sandbox import LocalSandbox
from activities.settings import CheckpointSettings, LocalLimits, LocalSandboxSettings, SandboxSettings, Settings
from bench.report import write_results
from workflows.types import ToolInvocation

RESULTS = Path(__file__).parent / "results" / "checkpoint_budget.json"
TARGET_OVERHEAD_MS = 5.0
MIB = 1024 * 1024


def p50(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def blob_bytes(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM blobs").fetchone()[0])


def invocation(conversation: str, step: int, checkpoint: str) -> ToolInvocation:
    return ToolInvocation(
        conversation_id=conversation,
        workflow_id=conversation.split("/")[0],
        step=step,
        call_id=f"call_{step}",
        call_index=0,
        seq=step,
        tool="run_shell",
        arguments={},
        idempotency_key=f"ik_{conversation}_{step}",
        sandbox_id="sbx-bench",
        checkpoints=True,
        checkpoint=checkpoint,
    )


async def measure(steps: int, change_kb: int, rewrite_steps: int, rewrite_mb: int, run_max_mb: int) -> dict[str, Any]:
    require_bwrap()
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-budget-") as tmp:
        root = Path(tmp)
        limits = LocalLimits(disk_mb=max(1024, 4 * rewrite_mb), fsize_mb=max(64, rewrite_mb + 1))
        settings = Settings(
            store_url=str(root / "store.sqlite3"),
            state_dir=root / "agent",
            sandbox=SandboxSettings(local=LocalSandboxSettings(limits=limits)),
            checkpoints=CheckpointSettings(run_max_mb=run_max_mb, max_mb=max(256, 3 * rewrite_mb + 1)),
        )
        runtime = Runtime.from_settings(settings)
        backend = runtime.sandbox_backend()
        try:
            sandbox = await backend.create("sbx-bench", metadata={})
            assert isinstance(sandbox, LocalSandbox)
            accounted: list[float] = []
            bare: list[float] = []
            checkpoint = ""
            for step in range(steps):
                command = f"head -c {change_kb * 1000} /dev/urandom > notes.bin && echo {step} > step.txt"
                assert (await sandbox.run(["sh", "-c", command], timeout_s=30)).exit_code == 0
                workspace = Workspace(runtime, invocation("bench-small/run-1", step, checkpoint))
                started = time.perf_counter()
                await workspace.checkpoint_after(sandbox)
                accounted.append((time.perf_counter() - started) * 1000)
                checkpoint = workspace.checkpoint
                assert (await sandbox.run(["sh", "-c", command], timeout_s=30)).exit_code == 0
                started = time.perf_counter()
                await engine.take(sandbox, runtime.store, max_bytes=settings.checkpoints.max_bytes)
                bare.append((time.perf_counter() - started) * 1000)
            await backend.kill("sbx-bench")

            sandbox = await backend.create("sbx-bench", metadata={})
            before = blob_bytes(root / "store.sqlite3")
            rewrite = (
                'python3 -c "import os\nfor i in range(3):\n'
                f"    open(f'f{{i}}', 'wb').write(os.urandom({rewrite_mb} * 2**20))\""
            )
            stopped_at = 0
            checkpoint = ""
            rewrite_ms: list[float] = []
            for step in range(1, rewrite_steps + 1):
                assert (await sandbox.run(["sh", "-c", rewrite], timeout_s=60)).exit_code == 0
                workspace = Workspace(runtime, invocation("bench-big/run-1", step, checkpoint))
                started = time.perf_counter()
                note = await workspace.checkpoint_after(sandbox)
                rewrite_ms.append((time.perf_counter() - started) * 1000)
                checkpoint = workspace.checkpoint
                if "checkpoints stopped" in note and not stopped_at:
                    stopped_at = step
            grown = blob_bytes(root / "store.sqlite3") - before
            usage = await runtime.store.checkpoint_usage(ids.run_key("bench-big/run-1"))
        finally:
            await backend.kill("sbx-bench")
            await runtime.aclose()
    overhead = p50(accounted) - p50(bare)
    return {
        "accounting": {
            "steps": steps,
            "change_bytes": change_kb * 1000,
            "checkpoint_with_budget_ms_p50": p50(accounted),
            "engine_take_alone_ms_p50": p50(bare),
            "overhead_ms_p50": round(overhead, 2),
        },
        "growth": {
            "steps": rewrite_steps,
            "rewritten_per_step_bytes": 3 * rewrite_mb * MIB,
            "run_max_bytes": run_max_mb * MIB,
            "uncapped_would_store_bytes": rewrite_steps * 3 * rewrite_mb * MIB,
            "store_blob_growth_bytes": grown,
            "accounted_bytes": usage.bytes,
            "checkpoints_recorded": usage.count,
            "stopped_at_step": stopped_at,
            "checkpoint_ms_p50": p50(rewrite_ms),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--change-kb", type=int, default=10)
    parser.add_argument("--rewrite-steps", type=int, default=6)
    parser.add_argument("--rewrite-mb", type=int, default=60)
    parser.add_argument("--run-max-mb", type=int, default=400)
    args = parser.parse_args()
    results = asyncio.run(measure(args.steps, args.change_kb, args.rewrite_steps, args.rewrite_mb, args.run_max_mb))
    results["machine"] = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "root": os.geteuid() == 0,
    }
    ok = (
        results["accounting"]["overhead_ms_p50"] < TARGET_OVERHEAD_MS
        and results["growth"]["store_blob_growth_bytes"] <= results["growth"]["run_max_bytes"]
    )
    results["targets"] = {"overhead_ms_p50": TARGET_OVERHEAD_MS, "growth_within_budget": True, "met": ok}
    write_results(RESULTS, results, echo=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
