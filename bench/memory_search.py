"""How fast is memory search in a full namespace? (issue 25: p50/p95 with 100,000 entries in one namespace)

    .venv/bin/python -m bench.memory_search --entries 100000 --queries 200

Fills one namespace (tenant, user) with ``--entries`` entries through the store's own ``save`` (each a
transaction with its bounds check, as a tool's save is), on SQLite and on an embedded PostgreSQL, each
plaintext (FTS5 / tsvector + GIN) and encrypted (the keyed term index), with a second namespace of
``--others`` entries beside it. Texts are 12-30 words drawn from a 20,000-word vocabulary with a Zipf-like
distribution (a few words in most entries, most words rare), as notes are. Then times ``--queries``
searches of 1-4 words (limit 5, the tool's default), the words drawn from the same distribution.
Prints a summary and writes ``bench/results/memory_search.json``.

Target: p95 under 100 ms on every store (exit code 1 if missed).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import platform
import random
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from activities.crypto.keyring import KeyRing
from activities.memory.base import MemoryLimits, MemoryStore
from activities.memory.postgres import PostgresMemoryStore
from activities.memory.sealing import Sealer
from activities.memory.sqlite import SQLiteMemoryStore
from bench.report import write_results
from bench.scale.common import embedded_postgres

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "memory_search.json"
TARGET_P95_MS = 100.0
VOCABULARY = 20_000
KEYS = f"bench:{base64.b64encode(os.urandom(32)).decode()}"


def summary(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 2)

    return {
        "p50_ms": pct(50),
        "p95_ms": pct(95),
        "max_ms": round(ordered[-1], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
    }


class Words:
    """Synthetic words ``w<rank>`` with weights 1/rank (Zipf, s=1)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.words = [f"w{rank}x{self.rng.randrange(1000)}" for rank in range(1, VOCABULARY + 1)]
        self.weights = [1.0 / rank for rank in range(1, VOCABULARY + 1)]

    def draw(self, k: int) -> list[str]:
        return self.rng.choices(self.words, self.weights, k=k)

    def text(self) -> str:
        return " ".join(self.draw(self.rng.randint(12, 30)))


async def fill(memory: MemoryStore, tenant: str, entries: int, words: Words) -> float:
    began = time.perf_counter()
    for i in range(entries):
        await memory.save(tenant, "u", f"k{i}", words.text(), f"{tenant}-{i}")
    return time.perf_counter() - began


async def measure(memory: MemoryStore, entries: int, others: int, queries: int, seed: int) -> dict[str, Any]:
    words = Words(seed)
    fill_s = await fill(memory, "bench", entries, words)
    await fill(memory, "beside", others, words)
    query_words = Words(seed + 1)
    query_words.words = words.words
    asks = [" ".join(query_words.draw(query_words.rng.randint(1, 4))) for _ in range(queries)]
    for ask in asks[:10]:  # warm the caches
        await memory.search("bench", "u", ask, 5)
    samples, hits = [], 0
    for ask in asks:
        began = time.perf_counter()
        found = await memory.search("bench", "u", ask, 5)
        samples.append((time.perf_counter() - began) * 1000)
        hits += bool(found)
    return {
        "entries": await memory.count("bench", "u"),
        "fill_s": round(fill_s, 1),
        "saves_per_s": round(entries / fill_s, 1),
        "queries": queries,
        "queries_with_results": hits,
        **summary(samples),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    limits = MemoryLimits(max_entries=10 * args.entries, max_bytes=1 << 40)
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        pg_url = stack.enter_context(embedded_postgres()) if "postgres" in args.stores else ""
        for store in args.stores:
            for sealed in (False, True):
                name = f"{store}{'-encrypted' if sealed else ''}"
                sealer = Sealer(KeyRing.parse(KEYS)) if sealed else None
                folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-memory-")))
                memory: MemoryStore
                if store == "sqlite":
                    memory = SQLiteMemoryStore(folder / "store.sqlite3", sealer, limits)
                else:
                    memory = PostgresMemoryStore(pg_url, sealer, limits)
                    await memory.forget("bench", None)
                    await memory.forget("beside", None)
                try:
                    results[name] = await measure(memory, args.entries, args.others, args.queries, args.seed)
                finally:
                    await memory.close()
                print(name, results[name], flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--others", type=int, default=1000, help="entries of a second namespace beside it")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--stores", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    args = parser.parse_args()
    results = asyncio.run(run(args))
    figures = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()[0]},
        "args": vars(args),
        "target_p95_ms": TARGET_P95_MS,
        "stores": results,
    }
    write_results(RESULTS, figures, echo=True)
    return 0 if all(r["p95_ms"] < TARGET_P95_MS for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
