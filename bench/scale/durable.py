"""``durable-bytes``: what one long run leaves durably: history plus run store, against the floor's history."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from bench.scale.common import (
    dev_server,
    floor_workers,
    histories,
    history_stats,
    machine,
    our_workers,
    ours_settings,
    queue,
    run_floor,
    run_ours,
)

TARGET_RATIO = 1.0


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def _sample_wal(wal: Path, peak: list[int], every_s: float = 0.02) -> None:
    while True:
        peak[0] = max(peak[0], _size(wal))
        await asyncio.sleep(every_s)


def _checkpoint(db: Path) -> dict[str, int]:
    """``PRAGMA wal_checkpoint(TRUNCATE)`` through a separate connection; the file sizes after it."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        busy, _log_frames, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        pages, page_size = (
            conn.execute("PRAGMA page_count").fetchone()[0],
            conn.execute("PRAGMA page_size").fetchone()[0],
        )
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        tables: dict[str, int] = {}
        with contextlib.suppress(sqlite3.OperationalError):  # dbstat is a compile-time option
            tables = dict(conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall())
    return {
        "checkpoint_busy": busy,
        "db_bytes": _size(db),
        "wal_bytes": _size(db.with_name(db.name + "-wal")),
        "pages": pages,
        "page_size": page_size,
        "free_pages": free,
        "bytes_by_table": {k: v for k, v in sorted(tables.items(), key=lambda kv: -kv[1]) if v},
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    async with dev_server() as env:
        client = env.client
        with tempfile.TemporaryDirectory(prefix="bench-durable-") as tmp:
            floor_q, ours_q = queue("floor"), queue("ours")
            async with floor_workers([client], floor_q):
                fwid, frid, floor_s = await run_floor(client, floor_q, args.turns, args.kb)
            floor = history_stats(await histories(client, fwid, frid))
            settings = ours_settings(Path(tmp))
            db = Path(settings.store_url)
            peak = [0]
            async with our_workers([client], settings, ours_q):
                sampler = asyncio.create_task(_sample_wal(db.with_name(db.name + "-wal"), peak))
                try:
                    owid, orid, ours_s = await run_ours(client, ours_q, args.turns, args.kb)
                finally:
                    sampler.cancel()
                wal_at_end = _size(db.with_name(db.name + "-wal"))
                store = await asyncio.to_thread(_checkpoint, db)  # while the worker's connection is still open
            ours = history_stats(await histories(client, owid, orid))
    store_bytes = store["db_bytes"] + store["wal_bytes"]
    durable = ours["proto_bytes"] + store_bytes
    ratio = durable / floor["proto_bytes"]
    report = {
        "bench": "durable-bytes",
        "what": f"one run of {args.turns} tool turns with {args.kb} KB outputs + an answer: ours = history "
        "(protobuf, every run of the continue-as-new chain) + SQLite run store (file + WAL after "
        "PRAGMA wal_checkpoint(TRUNCATE)); the floor = its history (the 10 KB outputs are in it)",
        "machine": machine(),
        "turns": args.turns,
        "kb": args.kb,
        "ours_history": ours,
        "ours_store": store,
        "ours_store_bytes": store_bytes,
        "ours_durable_bytes": durable,
        "ours_wal_peak_bytes": peak[0],
        "ours_wal_at_end_bytes": wal_at_end,
        "floor_history": floor,
        "floor_durable_bytes": floor["proto_bytes"],
        "ratio": round(ratio, 3),
        "tool_output_bytes": args.turns * args.kb * 1024,
        "wall_s": {"ours": round(ours_s, 2), "floor": round(floor_s, 2)},
        "target": f"ours <= {TARGET_RATIO}x the floor's durable bytes",
        "target_met": ratio <= TARGET_RATIO,
    }
    mib = 1024 * 1024
    print(f"ours : history {ours['proto_bytes'] / mib:.2f} MiB + store {store_bytes / mib:.2f} MiB", end="")
    print(f" = {durable / mib:.2f} MiB")
    print(f"       WAL peak {peak[0] / mib:.2f} MiB during the run ({wal_at_end / mib:.2f} MiB at its end)")
    print(f"floor: history {floor['proto_bytes'] / mib:.2f} MiB; ratio {ratio:.2f}x (target <= {TARGET_RATIO}x)")
    return report
