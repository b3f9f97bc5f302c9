"""An in-memory E2B cloud and a fake ``e2b.AsyncSandbox`` bound to it, at the SDK boundary.

``FakeCloud().sdk()`` returns a class with the surface of ``e2b.AsyncSandbox``
that :class:`activities.sandbox.e2b.backend.E2BSandboxBackend` uses, with the same
names and keyword arguments:

* classmethods ``create(template, timeout, metadata, envs, secure, allow_internet_access,
  idempotency_key, **opts)``, ``connect(sandbox_id, timeout, on_resume, **opts)``,
  ``list(query, limit, next_token, **opts)`` (a paginator with ``has_next`` /
  ``await next_items()``), ``get_info(sandbox_id, **opts)`` and ``kill(sandbox_id, **opts)``;
* per VM: ``sandbox_id``, ``set_timeout(timeout)``, ``commands.run(...)`` (a handle with ``pid``,
  ``wait()`` / ``kill()`` when ``background=True``; see :mod:`tests.fakes.fake_e2b_commands`),
  ``files.write``, ``files.read(path, format)`` and ``files.get_info``.

It raises the SDK's own exception types, the way the SDK builds them (``handle_api_exception``:
``SandboxException("<status>: <message>", status_code=...)``) and behaves as the real service does
where that matters to the backend:

* a wrong ``api_key`` is an ``AuthenticationException``; a dead VM ``SandboxNotFoundException`` on
  connect/get_info and ``SandboxNotRunningException`` for commands and files;
* idempotency keys: the same key and body return the VM it first created; a second create while the
  first is still being served is a 409 ``idempotency_in_progress``; the same key with another body
  (timeout, metadata, internet setting) a 422 ``idempotency_request_mismatch``; a key whose first
  attempt's outcome the API lost (``cloud.lose_outcome()``) a 409 ``idempotency_outcome_unknown``;
* ``timeout`` over the plan's cap (``cloud.plan_max_timeout_s``, 3600 like Hobby) is a 400;
* paused VMs (``cloud.pause``) are listed (``state="paused"``), resumed by ``connect`` — unless paused
  with an unresponsive guest, which ``connect`` refuses with ``GuestUnresponsiveException`` (409)
  unless ``on_resume="reboot"`` — and their open command streams end with ``TimeoutException``, as
  the SDK raises for envd's ``CANCELED``; ``cloud.cut_streams`` does that to a running VM (the proxy);
* a ``cwd`` that does not exist is an ``InvalidArgumentException`` (envd checks it);
* ``handle.kill()`` kills the command's pid only (its children live on, as real processes).

A VM's filesystem is a real directory per fake VM (:class:`FakeDisk`: VM path ``/x`` is
``<root>/x``), which ``vm.files`` also exposes as a mapping of absolute VM path → bytes of the
regular files in it. A multi-statement script starting with ``set -e`` (what the checkpoint code
sends) is run by a real ``bash`` on the host against the VM's directory, with ``/workspace``,
``/tmp`` and ``/home/user`` rewritten into it, so ``find``/``tar``/``sort``/``comm`` behave exactly
as GNU's do in the VM. Time is the cloud's own clock: ``cloud.advance(s)`` expires VMs whose
timeout ran out. Failures are injected with ``cloud.fail_next(method, exc)``;
``cloud.lose_response("create")`` lets the VM be created but the caller see a transient error (a
lost response). Call ``cloud.shutdown()`` at the end of a test: it kills the host processes of
every VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import uuid
import weakref
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import e2b

from tests.fakes.fake_e2b_commands import (
    BASE_ENV,
    CANCELED_MESSAGE,
    PRINTS_FOREVER,
    RUN_UNTIL_KILLED,
    FakeCommandHandle,
    FakeCommands,
    RecordedCommand,
    Responder,
    kill_marked,
    processes,
)
from tests.fakes.fake_e2b_files import FakeDisk, FakeFiles

__all__ = [
    "BASE_ENV",
    "PRINTS_FOREVER",
    "RUN_UNTIL_KILLED",
    "FakeCloud",
    "FakeDisk",
    "FakeVM",
    "RecordedCommand",
]

CREATE_STEPS = 3  # event-loop turns a create takes (what lets two racing creates overlap)


@dataclass
class FakeVM:
    sandbox_id: str
    template: str
    metadata: dict[str, str]
    envs: dict[str, str]
    allow_internet_access: bool | None
    started_at: datetime
    end_at: datetime
    state: str = "running"  # running | paused | killed | expired
    unresponsive: bool = False  # paused while its guest agent did not answer (envd_unresponsive_at_pause)
    files: FakeDisk = field(default_factory=FakeDisk)
    commands: list[RecordedCommand] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.state == "running"

    @property
    def exists(self) -> bool:
        """Running or paused: what ``list`` shows and ``connect`` can reach."""
        return self.state in ("running", "paused")


@dataclass
class SandboxListing:
    """What ``list`` / ``get_info`` yield per VM (the fields of ``e2b.SandboxInfo`` the backend reads)."""

    sandbox_id: str
    metadata: dict[str, str]
    started_at: datetime
    end_at: datetime
    state: e2b.SandboxState
    template_id: str


@dataclass
class IdempotencyRecord:
    fingerprint: str  # of the request body: a retry with another body is a mismatch
    sandbox_id: str = ""
    state: str = "in_progress"  # in_progress | done | unknown


def api_error(status: int, message: str) -> e2b.SandboxException:
    """What ``e2b.api.handle_api_exception`` raises for an error body ``{"code", "message", "error_code"}``:
    the ``error_code`` is dropped, only ``"<status>: <message>"`` and ``status_code`` reach the caller."""
    return e2b.SandboxException(f"{status}: {message}", status_code=status)


class FakeCloud:
    """E2B's control plane and VMs, in memory."""

    def __init__(self, api_key: str = "e2b_fake_test_key_0123456789") -> None:
        self.api_key = api_key
        self.vms: dict[str, FakeVM] = {}
        self.idempotency: dict[str, IdempotencyRecord] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.responder: Responder | None = None
        self.handles: list[FakeCommandHandle] = []
        self.now = datetime(2030, 1, 1, tzinfo=UTC)
        self.plan_max_timeout_s = 3600  # Hobby's cap on a sandbox's timeout (Pro: 86_400)
        self._failures: dict[str, list[BaseException]] = {}
        self._lost: set[str] = set()
        self._lose_outcome: bool | None = None
        self._counter = 0
        self._pids = 1000
        self._uid = uuid.uuid4().hex
        weakref.finalize(self, kill_marked, f"{self._uid}:")

    # --- test controls -------------------------------------------------------------

    def sdk(self) -> type[FakeAsyncSandbox]:
        """A fake ``AsyncSandbox`` class bound to this cloud."""
        return type("AsyncSandbox", (FakeAsyncSandbox,), {"cloud": self})

    def fail_next(self, method: str, exc: BaseException, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (create, connect, list, kill, run, write, read) raise ``exc``."""
        self._failures.setdefault(method, []).extend([exc] * times)

    def lose_response(self, method: str) -> None:
        """The next ``method`` call takes effect, but its caller sees a timeout (a lost response)."""
        self._lost.add(method)

    def lose_outcome(self, *, created: bool) -> None:
        """The next create times out and the API loses track of its key's outcome (``created``: whether
        the VM was made all the same); retries with that key get ``idempotency_outcome_unknown``."""
        self._lose_outcome = created

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        for vm in self.vms.values():
            if vm.alive and vm.end_at <= self.now:
                self.stop(vm, "expired")

    def expire(self, sandbox_id: str) -> None:
        self.stop(self.vms[sandbox_id], "expired")

    def stop(self, vm: FakeVM, state: str) -> None:
        """The VM ends (killed / expired): everything running in it goes too."""
        vm.state = state
        kill_marked(self.marker(vm))

    def pause(self, sandbox_id: str, *, unresponsive: bool = False) -> None:
        """Pause the VM (as ``AsyncSandbox.pause`` or E2B's auto-pause would): its open command streams are
        cancelled — the SDK raises ``TimeoutException`` (envd's ``CANCELED``) — its processes are frozen."""
        vm = self.vms[sandbox_id]
        vm.state, vm.unresponsive = "paused", unresponsive
        self.cut_streams(sandbox_id)
        self._signal_all(vm, signal.SIGSTOP)

    def cut_streams(self, sandbox_id: str) -> None:
        """The proxy (or envd) cancels every open command stream of the VM; the commands keep running."""
        for handle in self.handles:
            if handle.vm is self.vms[sandbox_id]:
                handle.cut(e2b.TimeoutException(CANCELED_MESSAGE))

    def alive(self, **metadata: str) -> list[FakeVM]:
        return [
            vm for vm in self.vms.values() if vm.alive and all(vm.metadata.get(k) == v for k, v in metadata.items())
        ]

    def count(self, method: str) -> int:
        return sum(1 for name, _ in self.calls if name == method)

    def marker(self, vm: FakeVM) -> str:
        """The environment marker of the host processes running "in" ``vm``."""
        return f"{self._uid}:{vm.sandbox_id}"

    def processes(self, sandbox_id: str) -> list[tuple[int, str]]:
        """(pid, command line) of what still runs in the VM (read from the host's ``/proc``)."""
        return processes(self.marker(self.vms[sandbox_id]))

    def shutdown(self) -> None:
        """Kill the host processes of every VM (a test's teardown)."""
        for vm in self.vms.values():
            self._signal_all(vm, signal.SIGCONT)
            kill_marked(self.marker(vm))

    # --- what the fake SDK calls ------------------------------------------------------

    def enter(self, method: str, opts: dict[str, Any]) -> None:
        """Record the call, check the API key, raise an injected failure."""
        self.calls.append((method, dict(opts)))
        if opts.get("api_key") != self.api_key:
            raise e2b.AuthenticationException("401: Unauthorized, please check your credentials.")
        queue = self._failures.get(method)
        if queue:
            raise queue.pop(0)

    def leave(self, method: str) -> None:
        if method in self._lost:
            self._lost.discard(method)
            raise e2b.TimeoutException("Request timed out — the 'request_timeout' option can be used")

    def check_timeout(self, timeout: int | None) -> None:
        """The API refuses a sandbox timeout over the team's plan cap (400)."""
        if timeout is not None and timeout > self.plan_max_timeout_s:
            hours = self.plan_max_timeout_s // 3600
            raise api_error(400, f"Timeout cannot be greater than {hours} hours")

    def new_id(self) -> str:
        self._counter += 1
        return f"fake{self._counter:04d}"

    def new_pid(self) -> int:
        self._pids += 1
        return self._pids

    def vm(self, sandbox_id: str) -> FakeVM:
        """The VM for an envd call (commands, files): the proxy answers 502 "not found" for one that is
        not running (killed, paused or timed out), which the SDK raises as SandboxNotRunningException."""
        vm = self.vms.get(sandbox_id)
        if vm is None or not vm.alive:
            raise e2b.SandboxNotRunningException(
                f"The sandbox {sandbox_id} was not found: The sandbox was killed or reached its timeout."
            )
        return vm

    def listing(self, vm: FakeVM) -> SandboxListing:
        state = e2b.SandboxState.PAUSED if vm.state == "paused" else e2b.SandboxState.RUNNING
        return SandboxListing(vm.sandbox_id, dict(vm.metadata), vm.started_at, vm.end_at, state, vm.template)

    def kill_group(self, vm: FakeVM, pgid: int) -> tuple[int, str, str]:
        """``kill -KILL -- -<pgid>`` in the VM: only a group led by one of this VM's commands is signalled."""
        for handle in self.handles:
            if handle.vm is not vm or handle.pid != pgid:
                continue
            if handle.proc is None:  # an interpreted command: no real processes, it just ends
                handle.group_killed()
                return 0, "", ""
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                break
            return 0, "", ""
        return 1, "", f"bash: line 1: kill: (-{pgid}) - No such process\n"

    def _signal_all(self, vm: FakeVM, sig: signal.Signals) -> None:
        for pid, _cmd in processes(self.marker(vm)):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


class FakePaginator:
    """Like the SDK's: nothing is sent until ``next_items()``; pages of ``limit``; running and paused VMs
    unless ``query.state`` says otherwise (``SandboxApi.list``'s default)."""

    def __init__(
        self, cloud: FakeCloud, wanted: dict[str, str], states: list[str], limit: int, opts: dict[str, Any]
    ) -> None:
        self._cloud, self._wanted, self._states, self._opts = cloud, wanted, states, opts
        self._limit = max(1, limit)
        self._offset = 0
        self._items: list[SandboxListing] | None = None
        self.has_next = True

    async def next_items(self) -> list[SandboxListing]:
        if not self.has_next:
            raise Exception("No more items to fetch")
        self._cloud.enter("list", {"metadata": self._wanted, **self._opts})
        if self._items is None:
            self._items = [
                self._cloud.listing(vm)
                for vm in self._cloud.vms.values()
                if vm.exists
                and vm.state in self._states
                and all(vm.metadata.get(k) == v for k, v in self._wanted.items())
            ]
        page = self._items[self._offset : self._offset + self._limit]
        self._offset += self._limit
        self.has_next = self._offset < len(self._items)
        return page


class FakeAsyncSandbox:
    """Stands in for ``e2b.AsyncSandbox``; ``cloud`` is set on the subclass ``FakeCloud.sdk()`` makes."""

    cloud: ClassVar[FakeCloud]

    def __init__(self, vm: FakeVM) -> None:
        self.sandbox_id = vm.sandbox_id
        self._vm = vm
        self.commands = FakeCommands(self.cloud, vm)
        self.files = FakeFiles(self.cloud, vm)

    @classmethod
    async def create(
        cls,
        template: str | None = None,
        timeout: int | None = None,  # noqa: ASYNC109  (the SDK's parameter)
        metadata: dict[str, str] | None = None,
        envs: dict[str, str] | None = None,
        secure: bool | None = None,
        allow_internet_access: bool | None = None,
        idempotency_key: str | None = None,
        **opts: Any,
    ) -> FakeAsyncSandbox:
        cloud = cls.cloud
        cloud.enter("create", {"template": template, "idempotency_key": idempotency_key, "timeout": timeout, **opts})
        if idempotency_key is not None and not re.fullmatch(r"[a-z0-9-]{1,255}", idempotency_key):
            raise e2b.InvalidArgumentException("Invalid idempotency_key")  # e2b.retry.resolve_idempotency_key
        if metadata and not all(isinstance(v, str) for v in metadata.values()):
            raise e2b.InvalidArgumentException("metadata values must be strings")
        cloud.check_timeout(timeout)
        body = {
            "template": template or "base",
            "timeout": timeout,
            "metadata": metadata or {},
            "envs": envs or {},
            "internet": allow_internet_access,
        }
        fingerprint = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        record = cloud.idempotency.get(idempotency_key) if idempotency_key is not None else None
        if record is not None:  # the API's answers for a key it has seen (error_code in the body)
            if record.state == "in_progress":
                raise api_error(409, "A request with this idempotency key is in progress (idempotency_in_progress)")
            if record.fingerprint != fingerprint:
                raise api_error(
                    422,
                    "The idempotency key was used with a different request body (idempotency_request_mismatch)",
                )
            if record.state == "unknown":
                raise api_error(
                    409, "The outcome of the request with this idempotency key is unknown (idempotency_outcome_unknown)"
                )
            await asyncio.sleep(0)
            cloud.leave("create")
            return cls(cloud.vms[record.sandbox_id])  # the API replays the first answer
        if idempotency_key is not None:
            record = cloud.idempotency[idempotency_key] = IdempotencyRecord(fingerprint)
        for _ in range(CREATE_STEPS):  # placing the VM takes a while: a racing create sees the key in progress
            await asyncio.sleep(0)
        lost, cloud._lose_outcome = cloud._lose_outcome, None
        vm: FakeVM | None = None
        if lost is None or lost:
            vm = FakeVM(
                sandbox_id=cloud.new_id(),
                template=template or "base",
                metadata=dict(metadata or {}),
                envs=dict(envs or {}),
                allow_internet_access=allow_internet_access,
                started_at=cloud.now,
                end_at=cloud.now + timedelta(seconds=timeout or 300),
            )
            cloud.vms[vm.sandbox_id] = vm
        if record is not None:
            record.sandbox_id, record.state = (vm.sandbox_id if vm else ""), ("done" if lost is None else "unknown")
        if lost is not None:
            raise e2b.TimeoutException("Request timed out — the 'request_timeout' option can be used")
        cloud.leave("create")
        assert vm is not None
        return cls(vm)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        timeout: int | None = None,  # noqa: ASYNC109  (the SDK's parameter)
        *,
        on_resume: str = "restore",
        **opts: Any,
    ) -> FakeAsyncSandbox:
        cloud = cls.cloud
        cloud.enter("connect", {"sandbox_id": sandbox_id, "timeout": timeout, "on_resume": on_resume, **opts})
        await asyncio.sleep(0)
        vm = cloud.vms.get(sandbox_id)
        if vm is None or not vm.exists:  # SandboxApi._cls_connect: 404
            raise e2b.SandboxNotFoundException(f"Paused sandbox {sandbox_id} not found")
        cloud.check_timeout(timeout)
        if vm.state == "paused":  # connect resumes a paused sandbox
            if vm.unresponsive and on_resume != "reboot":
                # 409 with error_code sandbox_snapshot_guest_agent_unresponsive (e2b.api.handle_api_exception)
                raise e2b.GuestUnresponsiveException(  # type: ignore[no-untyped-call]
                    f"Sandbox {sandbox_id} was paused while its guest agent was not responding. "
                    'Resume the sandbox with on_resume="reboot".'
                )
            if on_resume == "reboot":  # a cold boot from disk: the files stay, the processes do not
                cloud.stop(vm, "paused")
            else:
                cloud._signal_all(vm, signal.SIGCONT)
            vm.state, vm.unresponsive = "running", False
        if timeout is not None:  # like the API: only ever lengthened
            vm.end_at = max(vm.end_at, cloud.now + timedelta(seconds=timeout))
        cloud.leave("connect")
        return cls(vm)

    @classmethod
    def list(
        cls, query: Any = None, limit: int | None = None, next_token: str | None = None, **opts: Any
    ) -> FakePaginator:
        cloud = cls.cloud
        wanted: dict[str, str] = dict(getattr(query, "metadata", None) or {})
        states = [str(s) for s in (getattr(query, "state", None) or ["running", "paused"])]
        return FakePaginator(cloud, wanted, states, limit or 100, opts)

    @classmethod
    async def get_info(cls, sandbox_id: str, **opts: Any) -> SandboxListing:
        """``AsyncSandbox.get_info(sandbox_id)`` (``SandboxApi._cls_get_info``: 404 -> SandboxNotFoundException)."""
        cloud = cls.cloud
        cloud.enter("get_sandbox_info", {"sandbox_id": sandbox_id, **opts})
        await asyncio.sleep(0)
        vm = cloud.vms.get(sandbox_id)
        if vm is None or not vm.exists:
            raise e2b.SandboxNotFoundException(f"Sandbox {sandbox_id} not found")
        return cloud.listing(vm)

    @classmethod
    async def kill(cls, sandbox_id: str, **opts: Any) -> bool:
        cloud = cls.cloud
        cloud.enter("kill", {"sandbox_id": sandbox_id, **opts})
        await asyncio.sleep(0)
        vm = cloud.vms.get(sandbox_id)
        if vm is None or not vm.exists:  # running or paused: both are killed
            return False
        cloud._signal_all(vm, signal.SIGCONT)
        cloud.stop(vm, "killed")
        return True

    async def set_timeout(self, timeout: int, **opts: Any) -> None:  # noqa: ASYNC109
        self.cloud.enter(
            "set_timeout", {"sandbox_id": self.sandbox_id, "timeout": timeout, "api_key": self.cloud.api_key}
        )
        self.cloud.check_timeout(timeout)
        self.cloud.vm(self.sandbox_id).end_at = self.cloud.now + timedelta(seconds=timeout)
