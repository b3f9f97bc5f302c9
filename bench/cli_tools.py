"""How long ``starter.py tools`` takes with one MCP server, and what the rest of the CLI pays for it.

    .venv/bin/python -m bench.cli_tools --repeat 7 [--before GIT_REF]

Times, as wall clock of a fresh process each (``--repeat`` times, median and best):

- ``tools`` with one stdio MCP server (``mcp-server-time``, as in ``examples/mcp/mcp.json``);
- ``tools`` with no MCP server;
- ``status RUN`` against an address where no server listens (a command that needs no MCP: it pays
  only for what ``starter.py`` imports, then exits 2);
- ``import durable_agents.cli.main`` alone; the MCP client library with one server's start, listing
  and stop, and nothing else of the CLI (``mcp_pool_alone``).

Each figure is the wall clock and the CPU seconds (user + system, the server's process included):
on a loaded machine the wall clock follows the CPU the commands need.

With ``--before REF`` the same commands run from a copy of that commit too (``git archive``), so one
run gives the before/after figures. Writes ``bench/results/cli_tools.json``. No target: it reports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import write_results

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cli_tools.json"
BIN = Path(sys.executable).parent
ONE_SERVER = {"mcpServers": {"time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]}}}
MCP_ALONE = """
import asyncio
from activities.settings import Settings
from activities.mcp.config import load_mcp_config
from activities.mcp.pool import McpPool
async def main():
    pool = McpPool(load_mcp_config(Settings.from_env()))
    await pool.list_tools("time")
    await pool.aclose()
asyncio.run(main())
"""


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall-clock seconds of the command, and the CPU seconds (user + system) of it and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 2):
        raise SystemExit(f"{argv} exited {done.returncode}: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls, cpus = [wall for wall, _ in samples], [cpu for _, cpu in samples]
    return {
        "wall_median_s": round(statistics.median(walls), 3),
        "wall_best_s": round(min(walls), 3),
        "cpu_median_s": round(statistics.median(cpus), 3),
    }


def cases(tree: Path, state: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    config = state / "one_server.json"
    config.write_text(json.dumps(ONE_SERVER))
    base = {
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(tree),
        "AGENT_STATE_DIR": str(state / "agent"),
    }
    starter = [sys.executable, str(tree / "starter.py")]
    return {
        "tools_one_mcp_server": ([*starter, "tools"], {**base, "AGENT_MCP_CONFIG": str(config)}),
        "tools_no_mcp_server": ([*starter, "tools"], base),
        "status_no_server": ([*starter, "status", "x"], {**base, "TEMPORAL_ADDRESS": "127.0.0.1:1"}),
        "import_cli": ([sys.executable, "-c", "import durable_agents.cli.main"], base),
        "mcp_pool_alone": ([sys.executable, "-c", MCP_ALONE], {**base, "AGENT_MCP_CONFIG": str(config)}),
    }


def measure(trees: dict[str, Path], repeat: int, state: Path) -> dict[str, dict[str, Any]]:
    """Every case of every tree, interleaved (tree after tree, case after case) so they share the load."""
    plans = {}
    for label, tree in trees.items():
        (state / label).mkdir()
        plans[label] = cases(tree, state / label)
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for round_ in range(repeat + 1):  # round 0 warms the file cache and the .pyc files
        for name in next(iter(plans.values())):
            for label, plan in plans.items():
                argv, env = plan[name]
                sample = timed(argv, env, trees[label])
                if round_:
                    samples.setdefault((label, name), []).append(sample)
    return {label: {name: summary(samples[(label, name)]) for name in plan} for label, plan in plans.items()}


def checkout(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cli_tools", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--before", metavar="GIT_REF", help="also time the CLI of this commit")
    args = parser.parse_args()
    if shutil.which("mcp-server-time", path=f"{BIN}:{os.environ.get('PATH', '')}") is None:
        raise SystemExit("mcp-server-time is not installed (make mcp-servers)")
    results: dict[str, Any] = {
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"after": ROOT}
        if args.before:
            (Path(tmp) / "before").mkdir()
            trees = {"before": checkout(args.before, Path(tmp) / "before"), **trees}
            results["before_ref"] = args.before
        (Path(tmp) / "state").mkdir()
        results.update(measure(trees, args.repeat, Path(tmp) / "state"))
    write_results(RESULTS, results, echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
