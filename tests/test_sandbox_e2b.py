"""The E2B backend against a fake ``AsyncSandbox`` at the SDK boundary (tests/fakes/fake_e2b.py).

E2B's cloud is not reachable from CI, so by default every test runs against
:class:`tests.fakes.fake_e2b.FakeCloud`, injected through the backend's ``sdk=``
parameter (no monkeypatching of the SDK).

Against real E2B, with a key (this creates and kills a few short-lived VMs):

    E2B_API_KEY=e2b_... AGENT_TEST_REAL_E2B=1 .venv/bin/pytest tests/test_sandbox_e2b*.py

The tests that need the fake (injected failures, lost responses, simulated expiry,
inspecting what the cloud recorded) are skipped in that mode; the others —
create idempotency, reconnect from a second backend, commands and files, kill,
cancel, reaping, the empty environment — run against real VMs
(``AGENT_E2B_TEMPLATE`` picks the template, default ``base``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import e2b
import httpx
import pytest
from pydantic import SecretStr

from activities.sandbox.base import (
    RECREATED_NOTE,
    SandboxError,
    SandboxMissing,
    SandboxTransient,
    SandboxUnavailable,
)
from activities.sandbox.e2b.backend import (
    APP,
    META_APP_KEY,
    META_RUN_KEY,
    META_SANDBOX_KEY,
    META_TENANT_KEY,
    E2BSandbox,
    E2BSandboxBackend,
    idempotency_key,
)
from activities.sandbox.factory import backend_for
from activities.sandbox.local.backend import LocalLimits
from activities.sandbox.reaper import reap
from activities.settings import ConfigurationError, E2BConfig, SandboxSettings, Settings
from activities.tools import ToolContext, ToolError
from activities.tools.builtins import RunShellArgs, run_shell
from tests.e2b_support import (  # noqa: F401  (the *_fixture names register the fixtures)
    REAL,
    Backends,
    backend_fixture,
    backends_fixture,
    cloud_fixture,
    fake_fixture,
    meta,
    rate_limit,
    vms_for,
)
from tests.fakes.fake_e2b import FakeCloud
from workflows.types import ToolInvocation

# --- create / connect / kill ---------------------------------------------------------------


async def test_create_twice_makes_one_vm_with_run_metadata(backends: Backends, cloud: FakeCloud | None) -> None:
    sid = backends.sandbox_id()
    first = await backends.new().create(sid, metadata=meta("conv-1"))
    again = await backends.new().create(sid, metadata=meta("conv-1"))  # a retried activity, maybe on another worker
    assert isinstance(first, E2BSandbox) and again.ref == first.ref and first.sandbox_id == sid
    assert await vms_for(backends.new(), sid) == [first.ref]
    record = next(r for r in await backends.new().list_sandboxes() if r.sandbox_id == sid)
    assert (record.run_id, record.tenant) == ("conv-1", "acme")
    assert record.metadata[META_APP_KEY] == APP
    if cloud is not None:
        vm = cloud.vms[first.ref]
        assert vm.metadata == {
            META_APP_KEY: APP,
            META_SANDBOX_KEY: sid,
            META_RUN_KEY: "conv-1",
            META_TENANT_KEY: "acme",
        }
        assert vm.envs == {} and vm.allow_internet_access is False and vm.template == "base"
        creates = [opts for name, opts in cloud.calls if name == "create"]
        assert len(creates) == 1 and creates[0]["idempotency_key"] == idempotency_key(sid)


async def test_lost_create_response_then_retry_reuses_the_vm(backend: E2BSandboxBackend, fake: FakeCloud) -> None:
    fake.lose_response("create")
    with pytest.raises(SandboxTransient):
        await backend.create("sbx-lost", metadata=meta("conv-lost"))
    assert len(fake.alive(da_sandbox="sbx-lost")) == 1  # it was created after all
    box = await backend.create("sbx-lost", metadata=meta("conv-lost"))
    assert [vm.sandbox_id for vm in fake.alive(da_sandbox="sbx-lost")] == [box.ref]
    assert fake.count("create") == 1  # the retry found it by metadata


async def test_racing_creates_share_the_idempotency_key(backends: Backends, fake: FakeCloud) -> None:
    a, b = backends.new(), backends.new()
    boxes = await asyncio.gather(a.create("sbx-race", metadata=meta("c")), b.create("sbx-race", metadata=meta("c")))
    assert fake.count("create") == 2  # neither saw the other's VM when it listed...
    assert boxes[0].ref == boxes[1].ref  # ...but the idempotency key made it one VM
    assert len(fake.alive(da_sandbox="sbx-race")) == 1


async def test_duplicates_are_resolved_to_the_oldest(backends: Backends, fake: FakeCloud) -> None:
    sdk = fake.sdk()
    tags = {META_APP_KEY: APP, META_SANDBOX_KEY: "sbx-dup", META_RUN_KEY: "c", META_TENANT_KEY: ""}
    old = await sdk.create(metadata=tags, api_key=fake.api_key)
    fake.advance(1)
    await sdk.create(metadata=tags, api_key=fake.api_key)
    box = await backends.new().connect("sbx-dup")
    assert box.ref == old.sandbox_id
    assert [vm.sandbox_id for vm in fake.alive(da_sandbox="sbx-dup")] == [old.sandbox_id]


async def test_reconnect_from_a_second_backend(backends: Backends) -> None:
    sid = backends.sandbox_id()
    box = await backends.new().create(sid, metadata=meta("conv-2"))
    await box.write_file("notes/hello.txt", b"kept between steps\n")
    other = await backends.new().connect(sid)  # another worker, no shared memory
    assert other.ref == box.ref
    assert await other.read_file("/workspace/notes/hello.txt") == b"kept between steps\n"
    result = await other.run(["cat", "notes/hello.txt"])
    assert result.exit_code == 0 and result.stdout == "kept between steps\n"


async def test_connect_extends_the_vm_lifetime(backend: E2BSandboxBackend, fake: FakeCloud) -> None:
    box = await backend.create("sbx-life", metadata=meta("c"))
    fake.advance(3000)
    await backend.connect("sbx-life")  # a use: the expiry moves to now + 3600
    fake.advance(3000)
    assert fake.vms[box.ref].alive
    assert [opts["timeout"] for name, opts in fake.calls if name == "connect"][-1] == 3600
    fake.advance(3601)
    with pytest.raises(SandboxMissing):
        await backend.connect("sbx-life")


async def test_kill_is_idempotent_and_final(backends: Backends) -> None:
    sid = backends.sandbox_id()
    backend = backends.new()
    box = await backend.create(sid, metadata=meta("conv-3"))
    assert await backend.kill(sid) is True  # what sandbox_kill runs when the run ends or is cancelled
    assert await vms_for(backend, sid) == []
    assert await backend.kill(sid) is False
    await box.kill()  # the Sandbox-level kill is idempotent too
    with pytest.raises(SandboxMissing):
        await backends.new().connect(sid)


async def test_cancelling_a_command_kills_it(
    backend: E2BSandboxBackend, backends: Backends, cloud: FakeCloud | None
) -> None:
    box = await backend.create(backends.sandbox_id(), metadata=meta("conv-4"))
    task = asyncio.create_task(box.run(["sleep", "infinity"], timeout_s=15))
    await asyncio.sleep(0.5 if REAL else 0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    if cloud is not None:
        assert [h for h in cloud.handles if "sleep infinity" in h.cmd][-1].killed


# --- commands and files ---------------------------------------------------------------


async def test_commands_files_stdin_and_cwd(backend: E2BSandboxBackend, backends: Backends) -> None:
    box = await backend.create(backends.sandbox_id(), metadata=meta("conv-5"))
    hello = await box.run(["echo", "hello", "world"])
    assert (hello.exit_code, hello.stdout, hello.timed_out, hello.truncated) == (0, "hello world\n", False, False)
    failed = await box.run(["sh", "-c", "exit 3"])
    assert failed.exit_code == 3
    fed = await box.run(["cat"], stdin=b"fed via stdin")
    assert fed.stdout == "fed via stdin"
    await box.write_file("sub/dir/keep.txt", b"")
    where = await box.run(["pwd"], cwd="sub/dir")
    assert where.stdout == "/workspace/sub/dir\n"
    for bad in ("../x", "a/../../x", "/etc/passwd", "", "."):
        with pytest.raises(SandboxError):
            await box.write_file(bad, b"x")
    with pytest.raises(SandboxError, match="no such file"):
        await box.read_file("missing.txt")
    with pytest.raises(SandboxError):
        await box.run(["true"], cwd="../..")


async def test_environment_never_carries_worker_secrets(
    backend: E2BSandboxBackend, backends: Backends, cloud: FakeCloud | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "s3cr3t-worker-value")
    box = await backend.create(backends.sandbox_id(), metadata=meta("conv-6"))
    result = await box.run(["env"])
    assert result.exit_code == 0
    assert "s3cr3t-worker-value" not in result.stdout and "SECRET_TOKEN" not in result.stdout
    assert backend._key.get_secret_value() not in result.stdout
    if cloud is not None:
        vm = cloud.vms[box.ref]
        assert vm.envs == {}
        assert vm.commands and all(c.envs == {} for c in vm.commands)


async def test_output_caps_flooding_and_timeouts(backends: Backends, fake: FakeCloud) -> None:
    backend = backends.new(limits=LocalLimits(timeout_s=5, output_bytes=1000, drain_bytes=200_000))
    box = await backend.create("sbx-caps", metadata=meta("c"))
    fake.responder = lambda vm, argv, cwd, stdin: (0, "x" * 100_000, "err\n") if argv[:1] == ["big"] else None
    big = await box.run(["big"])
    assert big.exit_code == 0 and big.truncated and len(big.stdout) == 1000 and big.stderr == "err\n"
    fake.responder = lambda vm, argv, cwd, stdin: (0, "y" * 3_000_000, "") if argv[:1] == ["flood"] else None
    flood = await box.run(["flood"])
    assert flood.exit_code == -9 and flood.truncated and "printed more than 200000 bytes" in flood.stderr
    assert [h for h in fake.handles if "flood" in h.cmd][-1].killed
    slow = await box.run(["sleep", "100"], timeout_s=60)  # capped at the backend's 5 s
    assert slow.timed_out and "(timed out)" in slow.render()
    *_, command, group_kill = fake.vms[box.ref].commands  # a timed-out command's process group is killed too
    assert command.cmd.startswith("exec timeout --verbose -k 2 5 sleep 100")
    assert group_kill.cmd.startswith("kill -KILL -- -") and group_kill.user == "root"


# --- error mapping ------------------------------------------------------------------


async def test_rate_limits_and_transient_errors_are_retryable(backend: E2BSandboxBackend, fake: FakeCloud) -> None:
    fake.fail_next("create", rate_limit())
    with pytest.raises(SandboxTransient) as caught:
        await backend.create("sbx-rl", metadata=meta("c"))
    assert not isinstance(caught.value, SandboxError)  # so the tool activity lets Temporal retry it
    box = await backend.create("sbx-rl", metadata=meta("c"))  # the retry
    assert len(fake.alive(da_sandbox="sbx-rl")) == 1
    busy = e2b.ServiceBusyException("503: Service temporarily unavailable, please retry.")
    server = e2b.SandboxException("500: internal error", status_code=500)
    for method, exc in (
        ("connect", busy),
        ("connect", server),
        ("list", httpx.ConnectError("connection refused")),
        ("connect", e2b.SandboxUnreachableException("port is not open")),
    ):
        fresh = E2BSandboxBackend(fake.api_key, backend.config, sdk=fake.sdk())
        fake.fail_next(method, exc)
        with pytest.raises(SandboxTransient):
            await fresh.connect("sbx-rl")
    fake.fail_next("run", rate_limit())
    with pytest.raises(SandboxTransient):
        await box.run(["true"])


async def test_transient_errors_escape_the_tool_for_a_temporal_retry(
    backend: E2BSandboxBackend, fake: FakeCloud
) -> None:
    box = await backend.create("sbx-tool", metadata=meta("c"))
    inv = ToolInvocation(
        conversation_id="c", workflow_id="w", step=1, call_id="t1", call_index=0, seq=2,
        tool="run_shell", arguments={"command": "echo hi"}, idempotency_key="ik", sandbox_id="sbx-tool",
    )  # fmt: skip
    ctx = ToolContext(invocation=inv, settings=Settings(), sandbox=box)
    assert "hi" in await run_shell(RunShellArgs(command="echo hi"), ctx)
    fake.fail_next("run", rate_limit())
    with pytest.raises(SandboxTransient):
        await run_shell(RunShellArgs(command="echo hi"), ctx)
    fake.expire(box.ref)
    with pytest.raises(ToolError, match="E2B"):  # a gone VM is the model's to hear about
        await run_shell(RunShellArgs(command="echo hi"), ctx)


async def test_auth_errors_fail_closed_without_leaking_the_key(fake: FakeCloud) -> None:
    wrong = "e2b_wrong_key_that_must_not_leak_42"
    backend = E2BSandboxBackend(SecretStr(wrong), sdk=fake.sdk())
    with pytest.raises(SandboxUnavailable) as caught:
        await backend.create("sbx-auth", metadata=meta("c"))
    assert "E2B_API_KEY" in str(caught.value) and wrong not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    assert wrong not in repr(backend) and fake.vms == {}
    with pytest.raises(SandboxUnavailable, match="E2B_API_KEY"):
        E2BSandboxBackend("", sdk=fake.sdk())
    leaky = E2BSandboxBackend(fake.api_key, sdk=fake.sdk())
    fake.fail_next("list", e2b.SandboxException(f"400: bad request with key {fake.api_key}", status_code=400))
    with pytest.raises(SandboxError) as bad:
        await leaky.create("sbx-auth", metadata=meta("c"))
    assert fake.api_key not in str(bad.value) and "[REDACTED]" in str(bad.value)


async def test_missing_vm_is_recreated_once_and_the_model_is_told(backends: Backends, fake: FakeCloud) -> None:
    backend = backends.new()
    box = await backend.create("sbx-exp", metadata=meta("conv-exp", "t1"))
    await box.write_file("data.txt", b"lost soon")
    fake.advance(3601)  # expired
    with pytest.raises(SandboxMissing):
        await backends.new().connect("sbx-exp")
    with pytest.raises(SandboxMissing):
        await backend.connect("sbx-exp")  # the cached id is dead and nothing else carries the logical id
    got = await backend.connect_or_recreate("sbx-exp", metadata=meta("conv-exp", "t1"))
    assert got.recreated and got.note() == RECREATED_NOTE and "files" in got.note()
    fresh = got.sandbox
    assert isinstance(fresh, E2BSandbox) and fresh.ref != box.ref
    assert fake.vms[fresh.ref].metadata[META_RUN_KEY] == "conv-exp"
    with pytest.raises(SandboxError, match="no such file"):
        await fresh.read_file("data.txt")
    assert (await fresh.run(["echo", "ok"])).stdout == "ok\n"
    again = await backends.new().connect_or_recreate("sbx-exp", metadata=meta("conv-exp", "t1"))
    assert not again.recreated and isinstance(again.sandbox, E2BSandbox) and again.sandbox.ref == fresh.ref
    # missing again straight after the recreate: raised, not looped
    fake.expire(fresh.ref)
    creates = fake.count("create")
    fake.fail_next("run", e2b.SandboxNotRunningException("The sandbox was not found"))
    with pytest.raises(SandboxMissing):
        await backend.connect_or_recreate("sbx-exp", metadata=meta("conv-exp", "t1"))
    assert fake.count("create") == creates + 1


async def test_a_vm_dying_under_a_command_is_reported(backend: E2BSandboxBackend, fake: FakeCloud) -> None:
    box = await backend.create("sbx-die", metadata=meta("c"))
    fake.expire(box.ref)
    with pytest.raises(SandboxMissing):
        await box.run(["echo", "x"])
    with pytest.raises(SandboxMissing):
        await box.read_file("x")


# --- reaping ------------------------------------------------------------------------


async def test_reaper_kills_the_sandboxes_of_closed_runs(backends: Backends, cloud: FakeCloud | None) -> None:
    backend = backends.new()
    closed_id, open_id = backends.sandbox_id(), backends.sandbox_id()
    run_closed, run_open = f"conv-closed-{uuid.uuid4().hex[:6]}", f"conv-open-{uuid.uuid4().hex[:6]}"
    await backend.create(closed_id, metadata=meta(run_closed))
    await backend.create(open_id, metadata=meta(run_open))
    asked: list[str] = []

    async def is_run_closed(run_id: str) -> bool:
        asked.append(run_id)
        if run_id in (run_closed, run_open):
            return run_id == run_closed
        raise LookupError(f"not this test's run: {run_id}")  # other tests' (or people's) VMs: kept

    clock = time.time if cloud is None else cloud.now.timestamp
    report = await reap(backend, is_run_closed, min_age_s=0)
    assert closed_id in report.killed and open_id in report.kept
    assert open_id not in report.killed
    assert await vms_for(backend, closed_id) == [] and len(await vms_for(backend, open_id)) == 1
    assert asked.count(run_closed) == 1
    young = await reap(backend, is_run_closed, min_age_s=600, now=clock)
    assert open_id in young.kept and not young.killed
    if cloud is not None:
        tags = {META_APP_KEY: APP, META_SANDBOX_KEY: "sbx-orphan"}  # no run id: kept unless asked to
        await cloud.sdk().create(metadata=tags, api_key=cloud.api_key)
        unknown = await reap(backend, is_run_closed, min_age_s=0)
        assert unknown.unknown == ["sbx-orphan"]
        forced = await reap(backend, is_run_closed, min_age_s=0, kill_unknown=True)
        assert forced.killed == ["sbx-orphan"]
        cloud.fail_next("kill", rate_limit())
        await backend.create("sbx-late", metadata=meta(run_closed))
        failed = await reap(backend, is_run_closed, min_age_s=0)
        assert "sbx-late" in failed.errors and "kill failed" in failed.summary()


# --- configuration ------------------------------------------------------------------


def test_config_from_env() -> None:
    assert Settings.from_env({}).sandbox.e2b == E2BConfig()
    config = Settings.from_env(
        {"AGENT_E2B_TEMPLATE": "py-data", "AGENT_E2B_TIMEOUT_S": "900", "AGENT_E2B_INTERNET": "1"}
    ).sandbox.e2b
    assert (config.template, config.timeout_s, config.internet) == ("py-data", 900, True)
    assert not Settings.from_env({"AGENT_E2B_INTERNET": "0"}).sandbox.e2b.internet
    with pytest.raises(ConfigurationError, match="AGENT_E2B_TIMEOUT_S"):
        Settings.from_env({"AGENT_E2B_TIMEOUT_S": "soon"})
    assert idempotency_key("sbx-1") == idempotency_key("sbx-1") != idempotency_key("sbx-1", "again")


@pytest.fixture
def no_e2b_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AGENT_E2B_TEMPLATE", "AGENT_E2B_TIMEOUT_S", "AGENT_E2B_INTERNET"):
        monkeypatch.delenv(name, raising=False)
    yield


def test_factory_picks_e2b_and_fails_closed_without_a_key(tmp_path: object, no_e2b_env: None) -> None:
    with pytest.raises(SandboxUnavailable, match="E2B_API_KEY"):
        backend_for(Settings(sandbox=SandboxSettings(backend="e2b")))
    settings = Settings(sandbox=SandboxSettings(backend="e2b", e2b_api_key=SecretStr("e2b_factory_key")))
    backend = backend_for(settings)
    assert isinstance(backend, E2BSandboxBackend) and backend.name == "e2b"
    assert backend.sdk is e2b.AsyncSandbox and backend.config == E2BConfig()
    assert backend_for(settings) is backend
    assert "e2b_factory_key" not in repr(backend)
