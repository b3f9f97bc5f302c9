"""A PNG of a Temporal UI page, taken with headless Chromium once the page has rendered its data.

    python scripts/ui_screenshot.py URL OUT.png [--wait-s 8] [--size 1400,1000]

Chromium's own ``--screenshot`` shoots at the load event, before the UI's single-page app has
fetched anything (a blank page), and ``--virtual-time-budget`` never ends on a page that polls.
So this starts Chromium with a DevTools port, opens the page, waits, and asks for the picture over
the DevTools protocol (a WebSocket, spoken here with the standard library only). Used for the
docs' UI screenshots (``docs/img/ui-session.png``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class DevTools:
    """One DevTools WebSocket to a page: send a command, read until its answer."""

    def __init__(self, ws_url: str) -> None:
        host_port, _, path = ws_url.removeprefix("ws://").partition("/")
        host, _, port = host_port.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"DevTools refused the WebSocket: {head.decode(errors='replace')}")
        self.next_id = 0

    def _recv_exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise RuntimeError("DevTools closed the WebSocket")
            data += chunk
        return data

    def _frame(self) -> tuple[bool, bytes]:
        first, second = self._recv_exact(2)
        length = second & 0x7F
        if length == 126:
            (length,) = struct.unpack(">H", self._recv_exact(2))
        elif length == 127:
            (length,) = struct.unpack(">Q", self._recv_exact(8))
        return bool(first & 0x80), self._recv_exact(length)

    def _message(self) -> dict[str, Any]:
        payload = b""
        while True:
            final, part = self._frame()
            payload += part
            if final:
                decoded: dict[str, Any] = json.loads(payload)
                return decoded

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        body = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        size = len(body)
        header = bytes([0x81]) + (
            bytes([0x80 | size])
            if size < 126
            else bytes([0x80 | 126]) + struct.pack(">H", size)
            if size < 65536
            else bytes([0x80 | 127]) + struct.pack(">Q", size)
        )
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(body)))
        while True:
            message = self._message()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def page_socket(port: int, deadline: float) -> str:
    """The WebSocket URL of Chromium's first page, once its DevTools port answers."""
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
                pages = [t for t in json.load(answer) if t.get("type") == "page"]
            if pages:
                url: str = pages[0]["webSocketDebuggerUrl"]
                return url
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("Chromium's DevTools port did not answer")
        time.sleep(0.2)


def screenshot(url: str, out: Path, wait_s: float, width: int, height: int) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("error: chromium is not installed (apt-get install -y chromium)")
    port = free_port()
    with tempfile.TemporaryDirectory() as profile:
        browser = subprocess.Popen(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--remote-debugging-port={port}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            tools = DevTools(page_socket(port, time.monotonic() + 60))
            tools.call(
                "Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False
            )
            tools.call("Page.enable")
            tools.call("Page.navigate", url=url)
            time.sleep(wait_s)  # the UI fetches the workflow and its history after the load event
            shot = tools.call("Page.captureScreenshot", format="png")
            out.write_bytes(base64.b64decode(shot["data"]))
        finally:
            browser.terminate()
            try:
                browser.wait(timeout=20)
            except subprocess.TimeoutExpired:
                browser.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/ui_screenshot.py", description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out", type=Path)
    parser.add_argument("--wait-s", type=float, default=8.0, help="seconds between opening the page and the shot")
    parser.add_argument("--size", default="1400,1000", help="width,height of the window")
    args = parser.parse_args(argv)
    try:
        width, height = (int(part) for part in args.size.split(","))
    except ValueError:
        parser.error(f"--size: expected WIDTH,HEIGHT, got {args.size!r}")
    screenshot(args.url, args.out, args.wait_s, width, height)
    print(f"{args.out}: {args.out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
