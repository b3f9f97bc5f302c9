"""The E2B backend against what the real service does and a lenient fake would hide (issue 16).

The fake (tests/fakes/fake_e2b.py) imitates each behaviour after the SDK / envd code named there:
a killed command's children live on (real host processes), a paused VM's streams end with
``TimeoutException``, idempotency conflicts, paused VMs in ``list``, the plan's timeout cap and
envd's ``cwd`` check. The tests that do not need the fake's controls also run against real E2B
(``AGENT_TEST_REAL_E2B=1``, see tests/test_sandbox_e2b.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

import e2b
import pytest

from activities.sandbox.base import MAX_READ_BYTES, SandboxError, SandboxMissing, SandboxTransient, SandboxUnavailable
from activities.sandbox.e2b.backend import E2BSandbox, E2BSandboxBackend
from activities.sandbox.local.backend import LocalLimits
from activities.sandbox.reaper import reap
from activities.settings import ConfigurationError, Settings
from tests.e2b_support import (  # noqa: F401  (the *_fixture names register the fixtures)
    REAL,
    Backends,
    backend_fixture,
    backends_fixture,
    cloud_fixture,
    fake_fixture,
    meta,
    still_running,
    vms_for,
)
from tests.fakes.fake_e2b import PRINTS_FOREVER, FakeCloud

FLOOD = ["sh", "-c", "trap '' PIPE; while :; do echo yyyyyyyyyyyyyyyyyyyyyyyyyyyyyy; done"]


def flood_responder(vm: object, argv: list[str], cwd: str, stdin: bytes) -> tuple[int, str, str] | None:
    return (PRINTS_FOREVER, "y" * 4096 + "\n", "") if argv == FLOOD else None


async def started(box: E2BSandbox, task: asyncio.Task[Any], cloud: FakeCloud | None) -> None:
    """Until the command of ``task`` runs in the VM (the fake records its handle; a real VM gets a moment)."""
    if cloud is None:
        await asyncio.sleep(2)
        return
    count = len(cloud.handles)
    while len(cloud.handles) == count or cloud.handles[-1].proc is None:
        assert not task.done(), task
        await asyncio.sleep(0.01)


# --- 1. a cancelled or flooding command leaves nothing running --------------------------------


async def test_cancelled_and_flooding_commands_leave_nothing_running(
    backends: Backends, cloud: FakeCloud | None
) -> None:
    backend = backends.new(limits=LocalLimits(timeout_s=15, output_bytes=1000, drain_bytes=200_000))
    box = await backend.create(backends.sandbox_id(), metadata=meta("conv-leak"))
    task = asyncio.create_task(box.run(["sleep", "infinity"], timeout_s=15))
    await started(box, task, cloud)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await still_running(box, cloud, "sleep infinity") == []  # envd's kill alone leaves `sleep` behind
    if cloud is not None:
        cloud.responder = flood_responder
    flood = await box.run(FLOOD, timeout_s=15)
    assert flood.exit_code == -9 and "printed more than 200000 bytes" in flood.stderr
    assert await still_running(box, cloud, "sleep infinity") == []
    assert await still_running(box, cloud, "yyyy") == []
    assert (await box.run(["echo", "still fine"])).stdout == "still fine\n"


# --- 2. a cancelled stream is not a command timeout --------------------------------------------


async def test_a_paused_or_cut_stream_is_reported_as_sandbox_unavailable(
    backend: E2BSandboxBackend, fake: FakeCloud
) -> None:
    box = await backend.create("sbx-cut", metadata=meta("c"))
    task = asyncio.create_task(box.run(["sleep", "infinity"], timeout_s=15))
    await started(box, task, fake)
    fake.pause(box.ref)  # the SDK raises a plain TimeoutException for the cancelled stream
    with pytest.raises(SandboxMissing, match="unavailable"):
        await task
    again = await backend.connect("sbx-cut")  # connect resumes it; the paused command resumes under its timeout(1)
    assert fake.vms[again.ref].state == "running"
    task = asyncio.create_task(again.run(["sleep", "infinity"], timeout_s=15))
    await started(again, task, fake)
    group = fake.handles[-1].pid
    fake.cut_streams(again.ref)  # the proxy cut it, the VM runs on: not a timeout, and the command is stopped
    with pytest.raises(SandboxError, match="unavailable") as caught:
        await task
    assert not isinstance(caught.value, SandboxMissing)

    def in_group() -> list[int]:
        found = []
        for pid, _cmd in fake.processes(again.ref):
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == group:
                    found.append(pid)
        return found

    for _ in range(200):  # SIGKILL is sent; wait (bounded) for the kernel to act on it
        if not in_group():
            break
        await asyncio.sleep(0.02)
    assert in_group() == []


# --- 3. read_file checks the size before downloading ------------------------------------------


async def test_read_file_refuses_large_files_before_downloading(backend: E2BSandboxBackend, backends: Backends) -> None:
    box = await backend.create(backends.sandbox_id(), metadata=meta("conv-big"))
    await box.write_file("big.bin", b"x" * (MAX_READ_BYTES + 1))
    await box.write_file("ok.bin", b"y" * MAX_READ_BYTES)
    cloud = backends.cloud
    reads = cloud.count("read") if cloud is not None else 0
    with pytest.raises(SandboxError, match="too large"):
        await box.read_file("big.bin")
    if cloud is not None:
        assert cloud.count("read") == reads  # refused on its size, nothing downloaded
    assert await box.read_file("ok.bin") == b"y" * MAX_READ_BYTES
    if cloud is None:
        await box.run(["ln", "-s", "big.bin", "link.bin"])
    else:  # a symlink's own size is tiny: the cap while downloading still holds
        os.symlink("big.bin", cloud.vms[box.ref].files.host("/workspace/link.bin"))
    with pytest.raises(SandboxError, match="too large"):
        await box.read_file("link.bin")
    await box.write_file("sub/x.txt", b"")
    with pytest.raises(SandboxError, match="not a regular file"):
        await box.read_file("sub")


# --- 4. idempotency conflicts ---------------------------------------------------------------------


async def test_a_create_racing_one_in_progress_waits_for_it(backends: Backends, fake: FakeCloud) -> None:
    a, b = backends.new(), backends.new()
    boxes = await asyncio.gather(a.create("sbx-race2", metadata=meta("c")), b.create("sbx-race2", metadata=meta("c")))
    assert boxes[0].ref == boxes[1].ref and len(fake.alive(da_sandbox="sbx-race2")) == 1


async def test_a_create_whose_body_changed_gets_a_vm_of_its_own(backends: Backends, fake: FakeCloud) -> None:
    first = await backends.new().create("sbx-body", metadata=meta("c"))
    fake.expire(first.ref)  # gone, but E2B still remembers its idempotency key and body
    changed = backends.new(timeout_s=1800)  # the worker was redeployed with another AGENT_E2B_TIMEOUT_S
    box = await changed.create("sbx-body", metadata=meta("c"))
    assert box.ref != first.ref and [vm.sandbox_id for vm in fake.alive(da_sandbox="sbx-body")] == [box.ref]
    assert (await box.run(["echo", "ok"])).stdout == "ok\n"


@pytest.mark.parametrize("created", [False, True])
async def test_an_unknown_create_outcome_is_looked_up_then_retried_with_a_new_key(
    backend: E2BSandboxBackend, fake: FakeCloud, created: bool
) -> None:
    fake.lose_outcome(created=created)
    with pytest.raises(SandboxTransient):  # the first attempt's answer is lost (a transient error: Temporal retries)
        await backend.create("sbx-unknown", metadata=meta("c"))
    if created:  # it is visible to the lookup, so the retry never even calls create; hide it once
        vm = fake.alive(da_sandbox="sbx-unknown")[0]
        vm.metadata["da_sandbox"] = "hidden"
        box = await backend.create("sbx-unknown", metadata=meta("c"))
        vm.metadata["da_sandbox"] = "sbx-unknown"
    else:
        box = await backend.create("sbx-unknown", metadata=meta("c"))
    alive = [vm.sandbox_id for vm in fake.alive(da_sandbox="sbx-unknown")]
    assert box.ref in alive and len(alive) == (2 if created else 1)  # created: the lost one, and a new key's
    other = E2BSandboxBackend(fake.api_key, backend.config, sdk=fake.sdk())  # another worker: no cached id
    assert (await other.connect("sbx-unknown")).ref == alive[0]  # the oldest is kept...
    assert [vm.sandbox_id for vm in fake.alive(da_sandbox="sbx-unknown")] == [alive[0]]  # ...the duplicate killed


# --- 5. paused sandboxes -------------------------------------------------------------------------------


async def test_paused_vms_are_listed_resumed_and_reaped(backends: Backends, fake: FakeCloud) -> None:
    backend = backends.new()
    box = await backend.create("sbx-paused", metadata=meta("conv-paused"))
    await box.write_file("kept.txt", b"kept")
    fake.pause(box.ref)
    assert box.ref in await vms_for(backend, "sbx-paused")
    fake.vms[box.ref].unresponsive = True  # paused while its guest agent did not answer: a plain resume is a 409
    again = await backends.new().connect("sbx-paused")
    assert again.ref == box.ref and await again.read_file("kept.txt") == b"kept"
    assert fake.count("connect") <= 3  # bounded: one refused resume, one reboot
    fake.pause(box.ref)

    async def closed(run_id: str) -> bool:
        return run_id == "conv-paused"

    report = await reap(backend, closed, min_age_s=0)
    assert "sbx-paused" in report.killed and fake.vms[box.ref].state == "killed"


async def test_an_unresumable_vm_is_given_up_not_retried_forever(backend: E2BSandboxBackend, fake: FakeCloud) -> None:
    box = await backend.create("sbx-stuck", metadata=meta("c"))
    fake.pause(box.ref, unresponsive=True)
    unresponsive = e2b.GuestUnresponsiveException('stuck. Resume the sandbox with on_resume="reboot".')  # type: ignore[no-untyped-call]
    fake.fail_next("connect", unresponsive, times=10)
    got = await backend.connect_or_recreate("sbx-stuck", metadata=meta("c"))
    assert got.recreated and got.sandbox.ref != box.ref  # type: ignore[attr-defined]
    assert fake.count("connect") <= 4


# --- 6. the plan's cap on the sandbox timeout ----------------------------------------------------


async def test_the_timeout_is_clamped_to_the_plan_cap(
    backends: Backends, fake: FakeCloud, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        backend = backends.new(timeout_s=7200)  # AGENT_E2B_TIMEOUT_S over AGENT_E2B_MAX_TIMEOUT_S (3600)
    assert sum("AGENT_E2B_MAX_TIMEOUT_S" in r.getMessage() for r in caplog.records) == 1
    box = await backend.create("sbx-cap", metadata=meta("c"))
    await backend.connect("sbx-cap")
    assert all(opts["timeout"] <= 3600 for name, opts in fake.calls if name in ("create", "connect"))
    fake.plan_max_timeout_s = 1800  # the plan is smaller still than the setting says: fail closed, clearly
    with pytest.raises(SandboxUnavailable, match="AGENT_E2B_MAX_TIMEOUT_S"):
        await backends.new().connect("sbx-cap")
    assert box.ref


def test_max_timeout_setting() -> None:
    assert Settings.from_env({}).sandbox.e2b.max_timeout_s == 3600
    assert Settings.from_env({"AGENT_E2B_MAX_TIMEOUT_S": "86400"}).sandbox.e2b.max_timeout_s == 86400
    with pytest.raises(ConfigurationError, match="AGENT_E2B_MAX_TIMEOUT_S"):
        Settings.from_env({"AGENT_E2B_MAX_TIMEOUT_S": "a day"})


# --- 7. a cwd that does not exist ------------------------------------------------------------------


async def test_a_missing_cwd_is_a_clear_error(backend: E2BSandboxBackend, backends: Backends) -> None:
    box = await backend.create(backends.sandbox_id(), metadata=meta("conv-cwd"))
    with pytest.raises(SandboxError) as caught:
        await box.run(["pwd"], cwd="no/such/dir")
    assert str(caught.value) == "no such directory in the workspace: 'no/such/dir'"
    await box.write_file("a/file.txt", b"")
    with pytest.raises(SandboxError, match="no such directory"):
        await box.run(["pwd"], cwd="a/file.txt")
