"""Does the codec server answer a small request while a maximal one is decoded? (issue 21, item 7)

    .venv/bin/python -m bench.codec_latency --samples 50

Starts ``starter.py codec-server`` (default payload cap and deadline) as a subprocess and times a
one-payload ``POST /decode`` ``--samples`` times alone, then ``--samples`` times while maximal
requests (the payload cap's worth of encrypted payloads, filling the body cap) are decoded back to
back (``--loaders`` at once), and times the maximal requests themselves and the refusal of the review's
request (1.3 million empty payloads). Prints a summary and writes ``bench/results/codec_latency.json``.

Target: the small request's p95 during maximal decodes under 250 ms (exit code 1 if missed).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload

from activities.crypto.codec import AesGcmCodec
from activities.crypto.keyring import KeyRing
from bench.report import write_results
from durable_agents.codec_server import MAX_BODY_BYTES
from durable_agents.codec_work import DEFAULT_MAX_PAYLOADS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "codec_latency.json"
TARGET_P95_MS = 250.0
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


def maximal_body() -> bytes:
    """``DEFAULT_MAX_PAYLOADS`` encrypted payloads, as large as fit the body cap together."""
    codec = AesGcmCodec(KeyRing.parse(KEYS))
    size = 16
    while True:
        inner = Payload(metadata={"encoding": b"json/plain"}, data=b"x" * size)
        one = json.dumps(json_format.MessageToDict(codec.encode_one(inner)))
        if (len(one) + 2) * DEFAULT_MAX_PAYLOADS > MAX_BODY_BYTES * 0.97:
            break
        size += 16
    sealed = [json_format.MessageToDict(codec.encode_one(inner)) for _ in range(DEFAULT_MAX_PAYLOADS)]
    return json.dumps({"payloads": sealed}).encode()


async def small_request(client: httpx.AsyncClient, body: bytes) -> float:
    began = time.perf_counter()
    answer = await client.post("/decode", content=body)
    assert answer.status_code == 200, answer.text
    return (time.perf_counter() - began) * 1000


async def measure(url: str, samples: int, loaders: int) -> dict[str, Any]:
    codec = AesGcmCodec(KeyRing.parse(KEYS))
    small = json.dumps(
        {
            "payloads": [
                json_format.MessageToDict(codec.encode_one(Payload(metadata={"encoding": b"json/plain"}, data=b'"hi"')))
            ]
        }
    ).encode()
    big = maximal_body()
    # The small requests use a fresh connection each (``Connection: close``): a second request on a
    # kept-alive uvicorn connection waits ~40 ms for a delayed ACK whatever the server does.
    client = httpx.AsyncClient(base_url=url, timeout=600, headers={"Connection": "close"})
    loader = httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=loaders))
    async with client, loader:
        for _ in range(5):
            await small_request(client, small)
        alone = [await small_request(client, small) for _ in range(samples)]
        big_ms: list[float] = []
        stop, first = asyncio.Event(), asyncio.Event()

        async def load() -> None:
            while not stop.is_set():
                began = time.perf_counter()
                answer = await loader.post("/decode", content=big)
                assert answer.status_code == 200, answer.text[:200]
                big_ms.append((time.perf_counter() - began) * 1000)
                first.set()

        tasks = [asyncio.create_task(load()) for _ in range(loaders)]
        await first.wait()  # one maximal request done: the server has been decoding for a while
        during = []
        for _ in range(samples):
            during.append(await small_request(client, small))
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*tasks)
        began = time.perf_counter()
        review = await client.post("/decode", content=json.dumps({"payloads": [{}] * 1_300_000}).encode())
        refused_ms = (time.perf_counter() - began) * 1000
    return {
        "small_alone": summary(alone),
        "small_during_maximal": summary(during),
        "maximal_requests_at_once": loaders,
        "maximal_request": {
            **summary(big_ms),
            "count": len(big_ms),
            "payloads": DEFAULT_MAX_PAYLOADS,
            "bytes": len(big),
        },
        "review_request_1_3m_empty": {"status": review.status_code, "ms": round(refused_ms, 2)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--loaders", type=int, default=1, help="maximal requests decoded at once")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update(PYTHONPATH=str(ROOT), AGENT_PAYLOAD_KEYS=KEYS, AGENT_LOG_LEVEL="WARNING")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "starter.py"), "codec-server", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("codec server on http://"):
            print(f"the codec server did not start: {line}", file=sys.stderr)
            return 1
        result = asyncio.run(measure(line.split()[3], args.samples, args.loaders))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    p95 = result["small_during_maximal"]["p95_ms"]
    result.update(
        target={"small_during_maximal_p95_ms": TARGET_P95_MS, "met": p95 < TARGET_P95_MS},
        machine={"python": platform.python_version(), "cpus": os.cpu_count()},
        when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    write_results(RESULTS, result, echo=True)
    return 0 if p95 < TARGET_P95_MS else 1


if __name__ == "__main__":
    sys.exit(main())
