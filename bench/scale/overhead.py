"""``overhead``: wall time of one run of N turns, ours against the floor, interleaved on one server."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench.scale.common import (
    cpu_meter,
    dev_server,
    floor_workers,
    histories,
    history_stats,
    machine,
    median,
    our_workers,
    ours_settings,
    phase_ms,
    queue,
    replay_cpu_s,
    run_floor,
    run_ours,
)

TARGET_RATIO = 1.10


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    load_before = machine()["loadavg_1_5_15"]
    async with dev_server() as env:
        client = env.client
        with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
            ours_q, floor_q = queue("ours"), queue("floor")
            async with our_workers([client], ours_settings(Path(tmp)), ours_q), floor_workers([client], floor_q):
                # Warm-up (imports, sandbox, connections, store schema): not counted.
                await run_floor(client, floor_q, 2, args.kb)
                await run_ours(client, ours_q, 2, args.kb)
                for turns in args.turns:
                    floor_s: list[float] = []
                    ours_s: list[float] = []
                    cpu: dict[str, dict[str, list[float]]] = {"floor": {}, "ours": {}}
                    last: dict[str, tuple[str, str]] = {}
                    for _ in range(args.repeat):
                        with cpu_meter(cpu["floor"]):
                            wid, rid, wall = await run_floor(client, floor_q, turns, args.kb)
                        floor_s.append(wall)
                        last["floor"] = (wid, rid)
                        with cpu_meter(cpu["ours"]):
                            wid, rid, wall = await run_ours(client, ours_q, turns, args.kb)
                        ours_s.append(wall)
                        last["ours"] = (wid, rid)
                    ours_chain = await histories(client, *last["ours"])
                    floor_chain = await histories(client, *last["floor"])
                    ours_h, floor_h = history_stats(ours_chain), history_stats(floor_chain)
                    replay = {
                        "ours": round(1000 * await replay_cpu_s(ours_chain, ours=True) / turns, 2),
                        "floor": round(1000 * await replay_cpu_s(floor_chain, ours=False) / turns, 2),
                    }
                    ratio = median(ours_s) / median(floor_s)
                    rows.append(
                        {
                            "turns": turns,
                            "ours_s": [round(x, 3) for x in ours_s],
                            "floor_s": [round(x, 3) for x in floor_s],
                            "ours_median_s": round(median(ours_s), 3),
                            "floor_median_s": round(median(floor_s), 3),
                            "ratio": round(ratio, 3),
                            "ours_ms_per_turn": round(1000 * median(ours_s) / turns, 1),
                            "floor_ms_per_turn": round(1000 * median(floor_s) / turns, 1),
                            "extra_ms_per_turn": round(1000 * (median(ours_s) - median(floor_s)) / turns, 1),
                            # CPU per turn (median of the repeats): the bench process (its workers and
                            # client) and the dev server; on a shared machine less noisy than wall time.
                            "cpu_ms_per_turn": {
                                side: {part: round(1000 * median(values) / turns, 2) for part, values in parts.items()}
                                for side, parts in cpu.items()
                            },
                            # The workflow side alone: CPU ms per turn to replay the last run's history.
                            "replay_cpu_ms_per_turn": replay,
                            # Where a step's time goes (median ms per phase, the last run of each):
                            # the server's event times, so both sides are timed the same way.
                            "phase_ms": {"ours": phase_ms(ours_chain), "floor": phase_ms(floor_chain)},
                            "ours_history": ours_h,
                            "floor_history": floor_h,
                            "target_met": ratio <= TARGET_RATIO,
                        }
                    )
                    per_turn = rows[-1]["cpu_ms_per_turn"]
                    print(
                        f"turns {turns:4d}: ours {median(ours_s):7.2f} s, floor {median(floor_s):7.2f} s, "
                        f"ratio {ratio:.2f}x ({rows[-1]['extra_ms_per_turn']:+.1f} ms/turn); CPU ms/turn "
                        f"process {per_turn['ours']['process']} vs {per_turn['floor']['process']}, "
                        f"server {per_turn['ours']['server']} vs {per_turn['floor']['server']}, "
                        f"replay {replay['ours']} vs {replay['floor']}"
                    )
                    phases = rows[-1]["phase_ms"]
                    print(
                        "  phase ms (ours vs floor): "
                        + ", ".join(f"{k} {v} vs {phases['floor'].get(k, '-')}" for k, v in phases["ours"].items())
                    )
    fit = _fixed_and_per_turn(rows)
    return {
        "bench": "overhead",
        "what": "one run of N tool turns (10 KB outputs) + an answer; ours (AgentWorkflow, instant in-process "
        "model) vs the floor (bare workflow: no-op model activity + 10 KB tool activity per turn); "
        "order floor, ours, floor, ours, ... on one dev server and one process; median of the repeats",
        "machine": machine(),
        "loadavg_at_start": load_before,
        "kb": args.kb,
        "repeat": args.repeat,
        "rows": rows,
        "extra_vs_floor": fit,
        "target": f"ours <= {TARGET_RATIO}x the floor's wall time",
        "target_met": all(r["target_met"] for r in rows),
    }


def _fixed_and_per_turn(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Least-squares fit of (ours - floor) = fixed + per_turn * turns over the measured turn counts."""
    xs = [float(r["turns"]) for r in rows]
    ys = [r["ours_median_s"] - r["floor_median_s"] for r in rows]
    if len(xs) < 2:
        return {}
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return {"fixed_ms": round(1000 * (my - slope * mx), 1), "per_turn_ms": round(1000 * slope, 2)}
