"""Kill storm: many runs, worker processes SIGKILLed at random, and not one side effect applied twice.

    .venv/bin/python -m bench.kill_storm --runs 100 --kills 12

Starts its own Temporal dev server, a destination that dedupes by
``Idempotency-Key`` (``durable_agents/testing/_dedupe_server.py``) and one fake model server
per worker slot. ``--runs`` runs each POST ``--posts`` orders through
``http_request``; ``--workers`` ``worker.py`` processes share one SQLite run
store; every 2-3 s one of them is SIGKILLed (preferably while it has a POST on
the wire) and replaced at once, ``--kills`` times; then the workers stay up
until every run finishes.

By default kills may also land on model calls, as real crashes do; the ``model``
activity has no heartbeat, so such a run waits for its 180 s start-to-close
timeout. ``--avoid-model-calls`` kills only workers with no model call in flight
(what the test suite does to stay fast).

Prints and writes to ``bench/results/kill_storm.json``: runs completed, wall
time, kills, deliveries, applied effects, duplicates prevented, recovery
latencies. Exit code 1 if a run did not complete or an order was applied other
than exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.report import write_results
from durable_agents.testing._worker_proc import DevServer, kill_storm

RESULTS = Path(__file__).parent / "results" / "kill_storm.json"


def storm_parser(description: str | None) -> argparse.ArgumentParser:
    """The options every kill storm takes (runs, workers, kills, the POSTs each run makes, pacing, seed)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--posts", type=int, default=3, help="POSTs per run")
    parser.add_argument("--post-delay", type=float, default=1.5, help="seconds the destination takes per POST")
    parser.add_argument("--spread", type=float, default=30.0, help="start the runs over this many seconds")
    parser.add_argument("--avoid-model-calls", action="store_true", help="never kill a worker mid model call")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on waiting for the runs after the storm")
    parser.add_argument("--seed", type=int, default=1)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return storm_parser(__doc__).parse_args(argv)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kill-storm-") as tmp:
        work = Path(tmp)
        server = DevServer(work / "temporal.sqlite", work / "server.log").start()
        try:
            client = await server.client()
            report = await kill_storm(
                client,
                server.address,
                work / "storm",
                runs=args.runs,
                workers=args.workers,
                kills=args.kills,
                posts=args.posts,
                storm_s=args.kills * 3.0 + 30.0,
                post_delay_s=args.post_delay,
                start_spread_s=args.spread,
                avoid_model_calls=args.avoid_model_calls,
                finish_timeout_s=args.timeout,
                seed=args.seed,
                log=lambda line: print(line, flush=True),
            )
        finally:
            server.stop()
    figures = report.as_dict()
    expected = args.runs * args.posts
    figures["expected_orders"] = expected
    figures["every_order_applied_once"] = len(report.effects_per_order) == expected and all(
        n == 1 for n in report.effects_per_order.values()
    )
    figures["params"] = {k: v for k, v in vars(args).items()}
    del figures["effects_per_order"]  # one line per order; the check above summarises it
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = asyncio.run(bench(args))
    write_results(RESULTS, figures)
    print(
        f"\nruns completed:        {figures['completed']}/{figures['runs']} {figures['statuses']}\n"
        f"wall time:             {figures['wall_s']} s (slowest run {figures['max_run_s']} s)\n"
        f"kills:                 {figures['kills']} of {figures['workers']} workers "
        f"({figures['posts_in_flight_at_kills']} POSTs and {figures['model_calls_in_flight_at_kills']} "
        f"model calls in flight)\n"
        f"deliveries:            {figures['deliveries']}\n"
        f"applied effects:       {figures['applied']} (expected {figures['expected_orders']}, "
        f"each exactly once: {figures['every_order_applied_once']})\n"
        f"duplicates prevented:  {figures['duplicates_prevented']}\n"
        f"ledger:                {figures['ledger_states']}\n"
        f"max recovery latency:  {figures['max_recovery_s']} s (kill -> re-send of an in-flight POST); "
        f"model calls: {figures['max_model_recovery_s']} s\n"
        f"errors:                {figures['errors'] or 'none'}\n"
        f"written to {RESULTS}"
    )
    ok = (
        figures["completed"] == figures["runs"]
        and figures["every_order_applied_once"]
        and figures["applied"] == figures["expected_orders"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
