"""Scale benchmarks, ours against a bare-Temporal floor, measured side by side in one run (issue 14).

    python -m bench.scale overhead --turns 10 50 200
    python -m bench.scale throughput --runs 100 --turns 10 --workers 3
    python -m bench.scale waiting --runs 10000 --approvals 500
    python -m bench.scale durable-bytes --turns 200 --kb 10
    python -m bench.scale sessions-idle --sessions 10000 --sends 500
    python -m bench.scale profile --runs 100 --turns 10 --workers 3

Each writes ``bench/results/scale_<name>.json`` (``sessions-idle``: ``sessions_idle.json``; ``--out``
elsewhere) and prints a summary.
The machine is shared, so ours and the floor run interleaved in the same process and dev
server, and every result records ``os.getloadavg()``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from bench.scale import durable, overhead, profile, sessions, throughput, waiting
from bench.scale.common import write
from durable_agents import logs

RESULT_NAMES = {"sessions-idle": "sessions_idle"}  # the sessions bench keeps its own name


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench.scale", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="bench", required=True)

    o = sub.add_parser("overhead", help="wall time per run of N turns, ours vs the floor")
    o.add_argument("--turns", type=int, nargs="+", default=[10, 50, 200])
    o.add_argument("--repeat", type=int, default=5, help="floor, ours pairs per turn count")
    o.add_argument("--kb", type=int, default=10)

    t = sub.add_parser("throughput", help="concurrent runs through several workers: runs/s, activities/s")
    t.add_argument("--runs", type=int, default=100)
    t.add_argument("--turns", type=int, default=10)
    t.add_argument("--workers", type=int, default=3)
    t.add_argument("--kb", type=int, default=10)
    t.add_argument("--rounds", type=int, default=2, help="floor, ours phases per round")
    t.add_argument("--only", choices=["both", "ours", "floor"], default="both")
    t.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite", help="ours' shared store")

    w = sub.add_parser("waiting", help="N runs waiting for approval on one worker: RSS, approval latency")
    w.add_argument("--runs", type=int, default=10_000)
    w.add_argument("--approvals", type=int, default=500)
    w.add_argument("--systems", nargs="+", choices=waiting.SYSTEMS, default=list(waiting.SYSTEMS))
    w.add_argument("--start-concurrency", type=int, default=100)
    w.add_argument("--park-timeout", type=float, default=1800)
    w.add_argument("--approve-timeout", type=float, default=300)
    w.add_argument(
        "--max-cached", type=int, default=None, help="the worker's AGENT_MAX_CACHED_WORKFLOWS (default: its own)"
    )

    s = sub.add_parser("sessions-idle", help="N idle sessions on one worker: RSS, cold send -> model call latency")
    s.add_argument("--sessions", type=int, default=10_000)
    s.add_argument("--sends", type=int, default=500, help="send updates at once to cold sessions")
    s.add_argument("--systems", nargs="+", choices=sessions.SYSTEMS, default=list(sessions.SYSTEMS))
    s.add_argument("--cold", choices=sessions.COLD_MODES, default="restart", help="how the sent-to sessions are cold")
    s.add_argument(
        "--no-first-message",
        dest="first_message",
        action="store_false",
        help="start sessions without a task (idle at once, no model call)",
    )
    s.add_argument("--start-concurrency", type=int, default=100)
    s.add_argument("--idle-timeout", type=float, default=3600, help="give up waiting for all to be idle after")
    s.add_argument("--send-timeout", type=float, default=300)
    s.add_argument(
        "--max-cached", type=int, default=None, help="the worker's AGENT_MAX_CACHED_WORKFLOWS (default: its own)"
    )

    d = sub.add_parser("durable-bytes", help="history + run store bytes of one long run vs the floor's history")
    d.add_argument("--turns", type=int, default=200)
    d.add_argument("--kb", type=int, default=10)

    f = sub.add_parser("profile", help="py-spy profile of our workers under throughput")
    f.add_argument("--runs", type=int, default=100)
    f.add_argument("--turns", type=int, default=10)
    f.add_argument("--workers", type=int, default=3)
    f.add_argument("--rate", type=int, default=100)
    f.add_argument("--top", type=int, default=40)
    f.add_argument("--only", choices=["ours", "floor"], default="ours", help="whose workers to profile")
    f.add_argument("--raw", type=Path, default=None, help="py-spy raw output (default bench/results/...raw.txt)")
    f.add_argument("--summarise-only", action="store_true", help="summarise an existing --raw file")

    for sp in (o, t, w, s, d, f):
        sp.add_argument("--out", type=Path, default=None, help="where to write the JSON result")
        sp.add_argument("--log-level", default="INFO", help="of the in-process workers (JSON lines on stderr)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    name = RESULT_NAMES.get(args.bench, "scale_" + args.bench.replace("-", "_"))
    logs.configure(args.log_level, json=True)  # as worker.py does (INFO by default), to stderr
    if args.bench == "profile":
        report = profile.measure(args)
    else:
        module = {
            "overhead": overhead,
            "throughput": throughput,
            "waiting": waiting,
            "sessions-idle": sessions,
            "durable-bytes": durable,
        }
        report = asyncio.run(module[args.bench].measure(args))
    path = write(name, report, args.out)
    print(f"load average {report['machine']['loadavg_1_5_15']}; written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
