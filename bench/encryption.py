"""``bench.encryption``: what AES-256-GCM payloads and an encrypted run store cost per step.

    .venv/bin/python -m bench.encryption --turns 20 --kb 10 --repeat 7

One dev server, two workers in one process on two task queues: one plaintext (the
pydantic converter, a plain SQLite run store), one encrypted (the payload codec with a
fresh key ring, ``EncryptedRunStore`` over its own SQLite file). Runs of the same
shape (``--turns`` tool turns with ``--kb`` KB outputs, plus an answer; the instant
in-process bench model) alternate plaintext, encrypted, plaintext, ... so load on the
machine hits both alike. Reported: the median wall time per step of each, and their
ratio. Target: encrypted within 5% of plaintext. Written to
``bench/results/encryption.json``; the exit code is 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.client import Client

from activities.crypto.codec import AesGcmCodec, encrypted_converter
from activities.crypto.keyring import KeyRing
from activities.settings import EncryptionSettings
from activities.store.factory import open_store
from bench.fixtures_scale import blob
from bench.scale.common import dev_server, machine, median, our_workers, ours_settings, queue, run_ours, write
from workflows.types import Message

TARGET_RATIO = 1.05
MICRO_N = 500


async def micro(keyring: KeyRing, kb: int, tmp: Path) -> dict[str, float]:
    """CPU cost of the two seams alone, in-process: the codec on one ``kb`` KB payload (encode + decode), and
    one transcript write + read of a ``kb`` KB message, plaintext store vs encrypted store (SQLite)."""
    codec = AesGcmCodec(keyring)
    payload = Payload(metadata={"encoding": b"json/plain"}, data=blob(kb).encode())
    began = time.perf_counter()
    for _ in range(MICRO_N):
        await codec.decode(await codec.encode([payload]))
    codec_us = 1e6 * (time.perf_counter() - began) / MICRO_N
    store_us: dict[str, float] = {}
    for name, ring in (("plain", None), ("encrypted", keyring)):
        store = open_store(str(tmp / f"micro-{name}.sqlite3"), ring)
        message = Message(role="tool", content=blob(kb), tool_call_id="c")
        began = time.perf_counter()
        for seq in range(MICRO_N):
            await store.put_message("conv", seq, message)
            await store.get_message("conv", seq)
        store_us[name] = 1e6 * (time.perf_counter() - began) / MICRO_N
        await store.close()
    return {
        "codec_encode_decode_us_per_payload": round(codec_us, 1),
        "store_put_get_us_plain": round(store_us["plain"], 1),
        "store_put_get_us_encrypted": round(store_us["encrypted"], 1),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    keyring = KeyRing.parse(f"{KeyRing.generate_text('bench-k2')},{KeyRing.generate_text('bench-k1')}")
    load_before = machine()["loadavg_1_5_15"]
    plain_s: list[float] = []
    encrypted_s: list[float] = []
    async with dev_server() as env:
        plain_client = env.client
        encrypted_client = Client(
            plain_client.service_client,
            namespace=plain_client.namespace,
            data_converter=encrypted_converter(plain_client.data_converter, keyring),
        )
        with tempfile.TemporaryDirectory(prefix="bench-encryption-") as tmp:
            plain_settings = ours_settings(Path(tmp) / "plain")
            encrypted_settings = replace(
                ours_settings(Path(tmp) / "encrypted"), encryption=EncryptionSettings(keyring=keyring)
            )
            plain_q, encrypted_q = queue("plain"), queue("encrypted")
            async with (
                our_workers([plain_client], plain_settings, plain_q),
                our_workers([encrypted_client], encrypted_settings, encrypted_q),
            ):
                # Warm-up (imports, connections, store schema): not counted.
                await run_ours(plain_client, plain_q, 2, args.kb)
                await run_ours(encrypted_client, encrypted_q, 2, args.kb)
                for _ in range(args.repeat):
                    plain_s.append((await run_ours(plain_client, plain_q, args.turns, args.kb))[2])
                    encrypted_s.append((await run_ours(encrypted_client, encrypted_q, args.turns, args.kb))[2])
            seams = await micro(keyring, args.kb, Path(tmp))
    steps = args.turns + 1
    plain_ms, encrypted_ms = 1000 * median(plain_s) / steps, 1000 * median(encrypted_s) / steps
    ratio = encrypted_ms / plain_ms
    print(
        f"{args.turns} turns x {args.kb} KB, {args.repeat} runs each: plaintext {plain_ms:.1f} ms/step, "
        f"encrypted {encrypted_ms:.1f} ms/step, ratio {ratio:.3f}; seams alone: {seams}"
    )
    return {
        "bench": "encryption",
        "what": "one AgentWorkflow run of N tool turns (KB-sized outputs) + an answer, instant in-process model; "
        "plaintext (pydantic converter, SQLite store) vs encrypted (AES-256-GCM payload codec + EncryptedRunStore "
        "over SQLite), alternating on one dev server and one process; median of the repeats",
        "machine": machine(),
        "loadavg_at_start": load_before,
        "turns": args.turns,
        "kb": args.kb,
        "repeat": args.repeat,
        "plaintext_s": [round(x, 3) for x in plain_s],
        "encrypted_s": [round(x, 3) for x in encrypted_s],
        "plaintext_ms_per_step": round(plain_ms, 2),
        "encrypted_ms_per_step": round(encrypted_ms, 2),
        "ratio": round(ratio, 3),
        "seams_in_process": seams,
        "target": f"encrypted <= {TARGET_RATIO}x plaintext per step",
        "target_met": ratio <= TARGET_RATIO,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench.encryption", description=__doc__)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--kb", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report = asyncio.run(measure(args))
    print(f"written to {write('encryption', report, args.out)}")
    return 0 if report["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
