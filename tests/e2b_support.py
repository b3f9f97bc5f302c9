"""What the E2B backend tests share: the fake-or-real cloud fixtures and small helpers.

By default every test runs against :class:`tests.fakes.fake_e2b.FakeCloud`, injected through the
backend's ``sdk=`` parameter. With ``AGENT_TEST_REAL_E2B=1`` (and ``E2B_API_KEY``) the tests that do
not need the fake run against real VMs; a missing key fails them loudly, never skips them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import e2b
import pytest

from activities.sandbox.base import META_RUN, META_TENANT, SandboxError, SandboxTransient
from activities.sandbox.e2b.backend import E2BSandbox, E2BSandboxBackend
from activities.sandbox.local.backend import LocalLimits
from activities.settings import E2BConfig, Settings
from tests.fakes.fake_e2b import FakeCloud

REAL = os.environ.get("AGENT_TEST_REAL_E2B", "") == "1"


def real_key() -> str:
    key = os.environ.get("E2B_API_KEY", "")
    if not key:
        pytest.fail("AGENT_TEST_REAL_E2B=1 needs E2B_API_KEY")
    return key


@pytest.fixture(name="cloud")
def cloud_fixture() -> Iterator[FakeCloud | None]:
    made = None if REAL else FakeCloud()
    yield made
    if made is not None:
        made.shutdown()  # whatever a test left running in a fake VM is a host process: never leak it


@pytest.fixture(name="fake")
def fake_fixture(cloud: FakeCloud | None) -> FakeCloud:
    """The fake cloud, for tests that inject failures or inspect its state (skipped against real E2B)."""
    if cloud is None:
        pytest.skip("needs the fake E2B cloud (failure injection / state inspection)")
    return cloud


class Backends:
    """Makes backends sharing one cloud (two instances = two workers) and kills what the test created."""

    def __init__(self, cloud: FakeCloud | None) -> None:
        self.cloud = cloud
        self.created: set[str] = set()
        self.made: list[E2BSandboxBackend] = []

    def new(
        self, *, key: str | None = None, limits: LocalLimits | None = None, timeout_s: int | None = None
    ) -> E2BSandboxBackend:
        config = E2BConfig() if not REAL else Settings.from_env().sandbox.e2b
        config = E2BConfig(
            template=config.template,
            timeout_s=timeout_s or (600 if REAL else 3600),
            max_timeout_s=config.max_timeout_s,
            internet=False,
            limits=limits or LocalLimits(timeout_s=20, output_bytes=64 * 1024),
        )
        if self.cloud is None:
            backend = E2BSandboxBackend(key or real_key(), config)
        else:
            backend = E2BSandboxBackend(key or self.cloud.api_key, config, sdk=self.cloud.sdk())
        self.made.append(backend)
        return backend

    def sandbox_id(self) -> str:
        sid = f"sbx-test-{uuid.uuid4().hex[:16]}"
        self.created.add(sid)
        return sid


@pytest.fixture(name="backends")
async def backends_fixture(cloud: FakeCloud | None) -> AsyncIterator[Backends]:
    made = Backends(cloud)
    yield made
    if made.made:
        cleaner = made.made[0]
        for sid in made.created:
            with contextlib.suppress(SandboxError, SandboxTransient):
                await cleaner.kill(sid)


@pytest.fixture(name="backend")
def backend_fixture(backends: Backends) -> E2BSandboxBackend:
    return backends.new()


def rate_limit() -> Exception:
    """The SDK's 429 (its constructor is untyped)."""
    return e2b.RateLimitException("429: Rate limit exceeded, please try again later.")  # type: ignore[no-untyped-call]


def meta(run: str, tenant: str = "acme") -> dict[str, str]:
    return {META_RUN: run, META_TENANT: tenant}


async def vms_for(backend: E2BSandboxBackend, sandbox_id: str) -> list[str]:
    return [r.ref for r in await backend.list_sandboxes() if r.sandbox_id == sandbox_id]


async def still_running(box: E2BSandbox, cloud: FakeCloud | None, needle: str) -> list[str]:
    """Command lines of what still runs in the VM and contains ``needle``, once the kernel has had the
    chance to act on the signals sent (a bounded wait for processes that are going, not a timing check)."""
    for _ in range(200):
        if cloud is not None:
            found = [cmd for _pid, cmd in cloud.processes(box.ref) if needle in cmd]
        else:  # a real VM: ask it (ps itself is not a match: its own line is filtered out)
            listing = await box.run(["ps", "-eo", "args"])
            found = [line for line in listing.stdout.splitlines() if needle in line and "ps -eo" not in line]
        if not found:
            return []
        await asyncio.sleep(0.02 if cloud is not None else 0.5)
    return found
