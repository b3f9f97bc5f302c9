"""What does the local sandbox cost per command and per run?

    .venv/bin/python -m bench.sandbox_latency --n 50

Runs ``python3 -c pass`` ``--n`` times directly (a plain subprocess) and ``--n``
times through ``LocalSandbox.run`` (bubblewrap namespaces, seccomp, rlimits, the
uid switch of a root worker, pid-namespace teardown), interleaved in the same
process so both see the same machine state, and reports p50/p95 of each and of
the difference. ``/bin/true`` is measured the same way to show the fixed cost of
the sandbox without an interpreter start. Per run, it measures the workspace a
``create`` leaves on disk (directory + ``meta.json``) and how long ``create`` and
``kill`` take. Prints a summary and writes ``bench/results/sandbox_latency.json``.

Target: p50 added latency of ``python3 -c pass`` under 50 ms (exit code 1 if missed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from activities.sandbox.local import seccomp
from activities.sandbox.local.backend import LocalLimits, LocalSandbox, LocalSandboxBackend, require_bwrap
from bench.report import write_results

RESULTS = Path(__file__).parent / "results" / "sandbox_latency.json"
TARGET_ADDED_P50_MS = 50.0
PYTHON = "/usr/bin/python3"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(samples_ms: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(samples_ms, 50), 2),
        "p95_ms": round(percentile(samples_ms, 95), 2),
        "mean_ms": round(statistics.fmean(samples_ms), 2),
        "min_ms": round(min(samples_ms), 2),
    }


async def direct(argv: list[str]) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
    )
    await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"direct {argv} exited {proc.returncode}")
    return (time.perf_counter() - started) * 1000


async def sandboxed(box: LocalSandbox, argv: list[str]) -> float:
    started = time.perf_counter()
    result = await box.run(argv, timeout_s=30)
    if result.exit_code != 0:
        raise SystemExit(f"sandboxed {argv} exited {result.exit_code}: {result.stderr}")
    return (time.perf_counter() - started) * 1000


async def command_latency(box: LocalSandbox, argv: list[str], n: int) -> dict[str, Any]:
    for _ in range(3):  # warm caches (and the bwrap probe) before measuring
        await direct(argv)
        await sandboxed(box, argv)
    plain: list[float] = []
    boxed: list[float] = []
    for _ in range(n):  # interleaved: both see the same machine state
        plain.append(await direct(argv))
        boxed.append(await sandboxed(box, argv))
    added = [b - p for b, p in zip(boxed, plain, strict=True)]
    return {
        "argv": argv,
        "direct": summary(plain),
        "sandboxed": summary(boxed),
        "added": {
            "p50_ms": round(percentile(boxed, 50) - percentile(plain, 50), 2),
            "p95_ms": round(percentile(boxed, 95) - percentile(plain, 95), 2),
            "paired_p50_ms": round(percentile(added, 50), 2),
        },
    }


def disk_usage(path: Path) -> tuple[int, int]:
    """(allocated bytes, apparent bytes) of everything under ``path``, directories included."""
    allocated = apparent = 0
    for root, dirs, files in os.walk(path):
        names = [root] if root == str(path) else []
        names += [os.path.join(root, name) for name in (*dirs, *files)]
        for name in names:
            info = os.lstat(name)
            allocated += info.st_blocks * 512
            apparent += info.st_size
    return allocated, apparent


async def workspace_overhead(root: Path, n: int) -> dict[str, Any]:
    backend = LocalSandboxBackend(root, LocalLimits())
    create_ms: list[float] = []
    kill_ms: list[float] = []
    sizes: list[tuple[int, int]] = []
    for i in range(n):
        sandbox_id = f"bench-ws-{i}"
        started = time.perf_counter()
        await backend.create(sandbox_id, metadata={"conversation_id": f"conv-{i}", "tenant": "bench"})
        create_ms.append((time.perf_counter() - started) * 1000)
        sizes.append(disk_usage(root / sandbox_id))
        started = time.perf_counter()
        await backend.kill(sandbox_id)
        kill_ms.append((time.perf_counter() - started) * 1000)
    allocated, apparent = sizes[0]
    return {
        "bytes_on_disk": allocated,  # <root>/<id>/, workspace/ and meta.json, as allocated
        "apparent_bytes": apparent,
        "create": summary(create_ms),
        "kill": summary(kill_ms),
    }


def bwrap_version() -> str:
    done = subprocess.run([require_bwrap(), "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


async def main(n: int) -> int:
    version = bwrap_version()
    tmp = Path(tempfile.mkdtemp(prefix="sandbox-bench-"))
    try:
        backend = LocalSandboxBackend(tmp / "sandboxes", LocalLimits())
        box = await backend.create("bench-latency", metadata={"conversation_id": "bench"})
        python = await command_latency(box, [PYTHON, "-c", "pass"], n)
        true = await command_latency(box, ["/bin/true"], n)
        meta_bytes = (backend.root / "bench-latency" / "meta.json").stat().st_size
        await box.kill()
        workspace = await workspace_overhead(tmp / "ws", n)
        workspace["meta_json_bytes"] = meta_bytes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report: dict[str, Any] = {
        "n": n,
        "python_c_pass": python,
        "bin_true": true,
        "workspace": workspace,
        "host": {
            "kernel": platform.release(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "bwrap": version,
            "worker_uid": os.geteuid(),
            "mode": "root worker: per-sandbox unprivileged uid" if os.geteuid() == 0 else "worker's own uid",
            "seccomp_instructions": len(seccomp.host_program()) // 8,
            "python": sys.version.split()[0],
        },
        "target": {"added_p50_ms": TARGET_ADDED_P50_MS},
    }
    met = python["added"]["p50_ms"] < TARGET_ADDED_P50_MS
    report["target"]["met"] = met
    write_results(RESULTS, report)
    print(f"python3 -c pass, n={n} (interleaved, same process):")
    print(f"  direct     p50 {python['direct']['p50_ms']:7.2f} ms   p95 {python['direct']['p95_ms']:7.2f} ms")
    print(f"  sandboxed  p50 {python['sandboxed']['p50_ms']:7.2f} ms   p95 {python['sandboxed']['p95_ms']:7.2f} ms")
    print(f"  added      p50 {python['added']['p50_ms']:7.2f} ms   p95 {python['added']['p95_ms']:7.2f} ms")
    print(f"/bin/true added p50 {true['added']['p50_ms']:.2f} ms (the sandbox's fixed cost)")
    print(
        f"workspace: {workspace['bytes_on_disk']} bytes on disk ({workspace['apparent_bytes']} apparent, "
        f"meta.json {workspace['meta_json_bytes']} B); create p50 {workspace['create']['p50_ms']} ms, "
        f"kill p50 {workspace['kill']['p50_ms']} ms"
    )
    print(f"target: added p50 < {TARGET_ADDED_P50_MS:.0f} ms -> {'met' if met else 'MISSED'}; wrote {RESULTS}")
    return 0 if met else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50, help="commands per variant (default 50)")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.n)))
