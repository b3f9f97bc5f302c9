"""The codec server: the remote codec protocol, CORS, the bearer token, body limits, bad keys, its command line."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from durable_agents.codec_server import build_app
from tests.crypto_keys import TEST_ONLY_K1, TEST_ONLY_K2, ring
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parent.parent
UI = "http://localhost:8233"
PLAIN = {"metadata": {"encoding": base64.b64encode(b"json/plain").decode()}, "data": base64.b64encode(b'"hi"').decode()}


def client_for(keys: str, **options: object) -> httpx.AsyncClient:
    app = build_app(ring(keys), origins=[UI, "http://127.0.0.1:8233"], **options)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://codec")


@pytest.fixture
async def codec() -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(TEST_ONLY_K1) as client:
        yield client


async def test_round_trip(codec: httpx.AsyncClient) -> None:
    headers = {"X-Namespace": "default", "Content-Type": "application/json"}
    encoded = await codec.post("/encode", json={"payloads": [PLAIN]}, headers=headers)
    assert encoded.status_code == 200
    [sealed] = encoded.json()["payloads"]
    assert base64.b64decode(sealed["metadata"]["encoding"]) == b"binary/encrypted"
    assert base64.b64decode(sealed["metadata"]["encryption-key-id"]) == b"test-k1"
    decoded = await codec.post("/decode", json={"payloads": [sealed, PLAIN]}, headers=headers)
    assert decoded.status_code == 200 and decoded.json() == {"payloads": [PLAIN, PLAIN]}


async def test_cors_preflight_and_simple_responses(codec: httpx.AsyncClient) -> None:
    preflight = await codec.options(
        "/decode",
        headers={
            "Origin": UI,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,x-namespace,content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == UI
    allowed = preflight.headers["access-control-allow-headers"].lower()
    assert {"authorization", "x-namespace", "content-type"} <= {h.strip() for h in allowed.split(",")}
    assert "POST" in preflight.headers["access-control-allow-methods"]
    answer = await codec.post("/decode", json={"payloads": []}, headers={"Origin": UI})
    assert answer.headers["access-control-allow-origin"] == UI
    other = await codec.options(
        "/decode", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


async def test_bearer_token() -> None:
    async with client_for(TEST_ONLY_K1, token="s3cret") as codec:
        body = {"payloads": [PLAIN]}
        missing = await codec.post("/decode", json=body, headers={"Origin": UI})
        assert missing.status_code == 401 and missing.headers["access-control-allow-origin"] == UI
        wrong = await codec.post("/decode", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = await codec.post("/decode", json=body, headers={"Authorization": "Bearer s3cret"})
        assert right.status_code == 200
        preflight = await codec.options(
            "/decode",
            headers={
                "Origin": UI,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert preflight.status_code == 200, "a preflight carries no token and is still answered"


async def test_oversized_and_malformed_bodies() -> None:
    async with client_for(TEST_ONLY_K1, max_body=1024) as codec:
        big = await codec.post("/decode", content=b"x" * 2048, headers={"Content-Type": "application/json"})
        assert big.status_code == 413

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
            for _ in range(4):
                yield b"x" * 512

        streamed = await codec.post("/decode", content=chunks())
        assert streamed.status_code == 413
        bad = await codec.post("/decode", content=b"{not json")
        assert bad.status_code == 400 and "payloads" in bad.json()["error"]
        assert (await codec.get("/decode")).status_code == 405


async def test_a_payload_of_another_key_is_an_error_status(codec: httpx.AsyncClient) -> None:
    async with client_for(TEST_ONLY_K2) as other:
        [sealed] = (await other.post("/encode", json={"payloads": [PLAIN]})).json()["payloads"]
    answer = await codec.post("/decode", json={"payloads": [sealed]})
    assert answer.status_code == 400 and "test-k2" in answer.json()["error"]
    tampered = dict(sealed, data=base64.b64encode(os.urandom(40)).decode())
    tampered["metadata"] = dict(sealed["metadata"], **{"encryption-key-id": base64.b64encode(b"test-k1").decode()})
    answer = await codec.post("/decode", json={"payloads": [tampered]})
    assert answer.status_code == 400 and "does not authenticate" in answer.json()["error"]
    assert (await codec.post("/decode", json={"payloads": [PLAIN]})).status_code == 200, "still serving"


def starter(*args: str, keys: str | None = TEST_ONLY_K1) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env["PYTHONPATH"] = str(ROOT)
    if keys is not None:
        env["AGENT_PAYLOAD_KEYS"] = keys
    return subprocess.run(
        [sys.executable, str(ROOT / "starter.py"), *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "keys", "expected"),
    [
        (["codec-server", "--port", "abc"], TEST_ONLY_K1, "argument --port: 'abc' is not a port number"),
        (["codec-server", "--port", "70000"], TEST_ONLY_K1, "not a port number (0-65535)"),
        (["codec-server"], None, "the codec server needs the key ring: set AGENT_PAYLOAD_KEYS"),
        (["codec-server"], "k1:short", "AGENT_PAYLOAD_KEYS: entry 1 (key id 'k1'): the key is not valid base64"),
    ],
    ids=["port-abc", "port-range", "no-keys", "bad-keys"],
)
def test_command_line_errors_are_one_line(args: list[str], keys: str | None, expected: str) -> None:
    done = starter(*args, keys=keys)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and expected in done.stderr and "Traceback" not in done.stderr


class CodecProcess:
    """``starter.py codec-server --port 0`` as a subprocess (its stderr log lines collected as they come)."""

    def __init__(self, **env: str) -> None:
        full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        full.update(PYTHONPATH=str(ROOT), AGENT_PAYLOAD_KEYS=TEST_ONLY_K1, **env)
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "starter.py"), "codec-server", "--port", "0"],
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        assert line.startswith("codec server on http://"), line + self.proc.stderr.read()
        self.url = line.split()[3]
        self.lines: list[str] = []
        stderr = self.proc.stderr
        threading.Thread(target=lambda: self.lines.extend(stderr), daemon=True).start()

    async def wait_for_log(self, text: str) -> None:
        def logged() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError("the codec server exited")
            assert any(text in line for line in list(self.lines)), f"no log line with {text!r}: {self.lines[-5:]}"
            return True

        await eventually(logged, f"the codec server logs {text!r}", every_s=0.02)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def codec_process(request: pytest.FixtureRequest) -> Iterator[CodecProcess]:
    server = CodecProcess(**request.param)
    try:
        yield server
    finally:
        server.stop()


def empty_payloads(n: int) -> bytes:
    return json.dumps({"payloads": [{}] * n}).encode()


@pytest.mark.parametrize("codec_process", [{"AGENT_CODEC_MAX_PAYLOADS": "100"}], indirect=True)
async def test_a_request_over_the_payload_cap_is_refused(codec_process: CodecProcess) -> None:
    async with httpx.AsyncClient(base_url=codec_process.url, timeout=60) as client:
        over = await client.post("/decode", content=empty_payloads(101), headers={"Content-Type": "application/json"})
        assert over.status_code == 413
        assert "101 payloads, over the cap of 100" in over.json()["error"]
        at = await client.post("/decode", content=empty_payloads(100))
        assert at.status_code == 200 and len(at.json()["payloads"]) == 100


async def test_the_default_payload_cap_refuses_the_review_request() -> None:
    """The review's 1.3 million empty payloads (3.9 MB, under the body cap) are refused, not decoded."""
    async with client_for(TEST_ONLY_K1) as codec:
        answer = await codec.post("/decode", content=empty_payloads(1_300_000))
        assert answer.status_code == 413 and "over the cap of 10000" in answer.json()["error"]


@pytest.mark.parametrize(
    "codec_process",
    [{"AGENT_CODEC_MAX_PAYLOADS": "400000", "AGENT_CODEC_DEADLINE_S": "600", "AGENT_LOG_LEVEL": "DEBUG"}],
    indirect=True,
)
async def test_a_small_request_is_answered_while_a_maximal_one_decodes(codec_process: CodecProcess) -> None:
    done: list[str] = []
    async with httpx.AsyncClient(base_url=codec_process.url, timeout=600) as client:

        async def post(name: str, n: int) -> httpx.Response:
            answer = await client.post("/decode", content=empty_payloads(n))
            done.append(name)
            return answer

        big = asyncio.create_task(post("maximal", 400_000))
        await codec_process.wait_for_log('"payloads": 400000')  # its decoding has begun
        small = await post("small", 1)
        assert small.status_code == 200 and small.json() == {"payloads": [{}]}
        maximal = await big
        assert maximal.status_code == 200 and len(maximal.json()["payloads"]) == 400_000
    assert done == ["small", "maximal"]


@pytest.mark.parametrize(
    "codec_process", [{"AGENT_CODEC_MAX_PAYLOADS": "400000", "AGENT_CODEC_DEADLINE_S": "0.05"}], indirect=True
)
async def test_a_request_past_its_deadline_is_abandoned(codec_process: CodecProcess) -> None:
    async with httpx.AsyncClient(base_url=codec_process.url, timeout=600) as client:
        late = await client.post("/decode", content=empty_payloads(400_000))
        assert late.status_code == 504 and "abandoned" in late.json()["error"]
        after = await client.post("/decode", json={"payloads": [PLAIN]})
        assert after.status_code == 200, "the abandoned work gave its thread back"
