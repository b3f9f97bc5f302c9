"""The E2B backend: one E2B microVM (``e2b.AsyncSandbox``) per run, found again by metadata.

The workflow knows a sandbox by its logical id (``sbx-...``, derived from the
run). Each VM carries that id in its E2B metadata::

    {"da_app": "durable-agents", "da_sandbox": <logical id>, "da_run": <conversation id>, "da_tenant": <tenant>}

so that any worker can find it (``AsyncSandbox.list`` filtered by metadata) and
the reaper can kill the VMs of closed runs.

* ``create`` lists first and reuses a running (or paused) VM, and passes an
  ``idempotency_key`` derived from the logical id, so a retried create never leaks
  a second VM. Two VMs for one id (a race) are resolved deterministically: the
  oldest is kept, the others are killed.
* ``connect`` finds the VM (cached id, else by metadata) and connects with
  ``timeout=AGENT_E2B_TIMEOUT_S``, which pushes the VM's expiry to now + that
  timeout: every use extends it. :class:`SandboxMissing` when there is none.
* ``connect_or_recreate`` recreates a missing VM once and reports ``recreated=True``.
* Errors: rate limits, 503s, 5xx, timeouts and connection failures raise
  :class:`SandboxTransient` (retried by Temporal); a rejected API key raises
  :class:`SandboxUnavailable` (fail closed); a VM that is gone raises
  :class:`SandboxMissing`; the rest raise :class:`SandboxError` (the model sees it).
  The API key is redacted from every message and exception chains are cut.
* Workspace checkpoints: ``activities.sandbox.e2b_checkpoints`` (archives in and out of the VM).
* No worker environment variable ever reaches the VM: ``envs={}`` at create and
  on every command.

Configuration: ``AGENT_E2B_TEMPLATE`` (default ``base``), ``AGENT_E2B_TIMEOUT_S``
(VM lifetime after its last use, default 3600), ``AGENT_E2B_INTERNET=1`` to allow
outbound internet (off by default); per-command wall time and output caps come
from ``AGENT_SANDBOX_TIMEOUT_S`` and ``AGENT_SANDBOX_OUTPUT_BYTES`` as for the
local backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import posixpath
import shlex
import time
import uuid
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import e2b
import httpx
from pydantic import SecretStr

from activities.redaction import redact
from activities.sandbox.base import (
    MAX_READ_BYTES,
    META_RUN,
    META_TENANT,
    WORKSPACE,
    CommandResult,
    Connection,
    SandboxError,
    SandboxMissing,
    SandboxRecord,
    SandboxTransient,
    SandboxUnavailable,
    validate_sandbox_id,
    workspace_relative,
)
from activities.sandbox.e2b_checkpoints import E2BCheckpoints
from activities.settings import E2BConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

APP = "durable-agents"
META_APP_KEY = "da_app"
META_SANDBOX_KEY = "da_sandbox"
META_RUN_KEY = "da_run"
META_TENANT_KEY = "da_tenant"
KILL_AFTER_S = 2  # `timeout -k`: SIGKILL this long after the SIGTERM at the deadline
TIMEOUT_MARK = "timeout: sending signal "  # what `timeout --verbose` prints when the deadline passes
STREAM_SLACK_S = 30  # the SDK's stream timeout: the command's own deadline plus this


def idempotency_key(sandbox_id: str, nonce: str = "") -> str:
    """The ``Idempotency-Key`` for creating ``sandbox_id`` (E2B wants ``[a-z0-9-]{1,255}``)."""
    digest = hashlib.sha256(f"{sandbox_id}\0{nonce}".encode()).hexdigest()[:48]
    return f"da-{digest}"


def _started(info: Any) -> tuple[float, str]:
    started = getattr(info, "started_at", None)
    stamp = started.timestamp() if started is not None else 0.0
    return stamp, str(info.sandbox_id)


class _Capture:
    """Keeps the first ``cap`` bytes of a stream the SDK hands over as text; sets ``flooded`` past ``drain``."""

    def __init__(self, cap: int, drain: int, flooded: asyncio.Event) -> None:
        self.cap, self.drain, self.flooded = cap, drain, flooded
        self.data = bytearray()
        self.total = 0

    def feed(self, chunk: str) -> None:
        raw = chunk.encode("utf-8", errors="replace")
        self.total += len(raw)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += raw[:room]
        if self.total > self.drain:
            self.flooded.set()

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", errors="replace")


class E2BSandbox(E2BCheckpoints):
    """One run's VM; ``sandbox_id`` is the logical id, ``ref`` E2B's.

    Workspace checkpoints (``scan_workspace``, ``read_workspace_files``, ``apply_workspace``, the
    marker) come from :class:`~activities.sandbox.e2b_checkpoints.E2BCheckpoints`.
    """

    _backend: E2BSandboxBackend

    def __init__(self, backend: E2BSandboxBackend, sandbox_id: str, vm: Any) -> None:
        self.sandbox_id = sandbox_id
        self.ref: str = vm.sandbox_id
        self._backend = backend
        self._vm = vm

    def _path(self, path: str, *, allow_root: bool = False) -> str:
        rel = workspace_relative(path, allow_root=allow_root)
        normal = posixpath.normpath(str(rel))
        if normal == ".." or normal.startswith("../"):
            raise SandboxError(f"path {path!r} escapes the workspace (via '..'); access refused")
        return posixpath.join(WORKSPACE, normal) if normal != "." else WORKSPACE

    async def run(
        self, argv: list[str], *, stdin: bytes = b"", timeout_s: float = 30.0, cwd: str = ""
    ) -> CommandResult:
        """Run ``argv`` in the VM under ``/workspace`` (coreutils ``timeout`` enforces the wall time)."""
        if not argv:
            raise SandboxError("empty command")
        if timeout_s <= 0:
            raise SandboxError(f"timeout_s must be positive, got {timeout_s}")
        limits = self._backend.config.limits
        wall = min(timeout_s, limits.timeout_s)
        workdir = self._path(cwd, allow_root=True) if cwd else WORKSPACE
        # --verbose: coreutils says on stderr when it had to signal the command (how a timeout is told apart)
        command = shlex.join(["timeout", "--verbose", "-k", str(KILL_AFTER_S), f"{wall:g}", *argv])
        stdin_path = ""
        if stdin:
            stdin_path = f"/tmp/.da-stdin-{uuid.uuid4().hex}"
            await self._backend.sdk_call("write stdin", self._vm.files.write(stdin_path, stdin))
            quoted = shlex.quote(stdin_path)
            command = f"{command} < {quoted}; rc=$?; rm -f {quoted}; exit $rc"
        flooded = asyncio.Event()
        out = _Capture(limits.output_bytes, limits.drain_bytes, flooded)
        err = _Capture(limits.output_bytes, limits.drain_bytes, flooded)
        started = time.monotonic()
        handle = await self._backend.sdk_call(
            "start command",
            self._vm.commands.run(
                command,
                background=True,
                envs={},  # never the worker's environment
                cwd=workdir,
                on_stdout=out.feed,
                on_stderr=err.feed,
                timeout=wall + KILL_AFTER_S + STREAM_SLACK_S,
                retain_output=False,
            ),
        )
        exit_code, flooding, sdk_timeout = await self._wait(handle, flooded)
        elapsed = time.monotonic() - started
        stderr = err.text()
        signalled = TIMEOUT_MARK in stderr
        if signalled:
            stderr = "".join(line for line in stderr.splitlines(keepends=True) if TIMEOUT_MARK not in line)
        timed_out = sdk_timeout or (exit_code in (124, 128 + 9) and signalled)
        note = ""
        if timed_out:
            exit_code = -9
        if flooding:
            exit_code = -9
            note = f"\n[sandbox] killed: printed more than {limits.drain_bytes} bytes of output"
        return CommandResult(
            exit_code=exit_code,
            stdout=out.text(),
            stderr=stderr + note,
            timed_out=timed_out,
            truncated=out.truncated or err.truncated,
            duration_ms=int(elapsed * 1000),
        )

    async def _wait(self, handle: Any, flooded: asyncio.Event) -> tuple[int, bool, bool]:
        """(exit code, killed for flooding, the SDK's stream deadline passed)."""
        waiter: asyncio.Future[Any] = asyncio.ensure_future(handle.wait())
        watch = asyncio.ensure_future(flooded.wait())
        try:
            await asyncio.wait({waiter, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():  # flooded: stop it, then collect its end
                await self._backend.sdk_call("kill command", handle.kill())
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(waiter), 10)
                return -9, True, False
            failure = waiter.exception()
            if failure is None:
                return int(waiter.result().exit_code), False, False
            if isinstance(failure, e2b.CommandExitException):
                return int(failure.exit_code), False, False
            if isinstance(failure, e2b.TimeoutException) and not isinstance(
                failure, e2b.SandboxNotRunningException | e2b.SandboxUnreachableException
            ):
                return -9, False, True  # the SDK's stream deadline: the command outlived its own timeout
            if isinstance(failure, SandboxError | SandboxTransient):
                raise failure
            raise self._backend.translate(failure, "run command")
        finally:
            watch.cancel()
            if not waiter.done():  # cancelled (activity cancellation): do not leave it running
                waiter.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.shield(handle.kill())

    async def write_file(self, path: str, content: bytes) -> None:
        """Write ``content`` at ``path`` (workspace-relative); the SDK creates parent directories."""
        limit = self._backend.config.limits.fsize_mb * 1024 * 1024
        if len(content) > limit:
            raise SandboxError(f"{len(content)} bytes is over the sandbox's {limit}-byte file size limit")
        await self._backend.sdk_call(f"write {path!r}", self._vm.files.write(self._path(path), content))

    async def read_file(self, path: str) -> bytes:
        """Bytes of ``path`` (workspace-relative); files over 1 MiB are refused."""
        full = self._path(path)

        async def read() -> Any:
            try:
                return await self._vm.files.read(full, format="bytes")
            except e2b.FileNotFoundException:
                raise SandboxError(f"no such file: {path!r}") from None

        data = await self._backend.sdk_call(f"read {path!r}", read())
        if len(data) > MAX_READ_BYTES:
            raise SandboxError(
                f"{path!r} is {len(data)} bytes; read_file returns at most {MAX_READ_BYTES} bytes (1 MiB). "
                "Read a part of it with a command instead (e.g. head -c)."
            )
        return bytes(data)

    async def extend(self, seconds: int | None = None) -> None:
        """Push the VM's expiry to now + ``seconds`` (default ``AGENT_E2B_TIMEOUT_S``)."""
        timeout = seconds or self._backend.config.timeout_s
        await self._backend.sdk_call("extend timeout", self._vm.set_timeout(timeout))

    async def kill(self) -> None:
        """Kill the VM (and any duplicate carrying the same logical id); idempotent."""
        await self._backend.kill(self.sandbox_id)


class E2BSandboxBackend:
    """Sandboxes as E2B microVMs, mapped to logical ids through metadata.

    ``sdk`` is the class whose classmethods are called (``create``, ``connect``,
    ``list``, ``kill``); tests pass a fake with the same surface.
    """

    name = "e2b"

    def __init__(self, api_key: SecretStr | str, config: E2BConfig | None = None, *, sdk: Any = None) -> None:
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if not key:
            raise SandboxUnavailable("the e2b sandbox backend needs E2B_API_KEY")
        self._key = SecretStr(key)
        self.config = config or E2BConfig()
        self.sdk: Any = e2b.AsyncSandbox if sdk is None else sdk
        self._refs: dict[str, str] = {}  # logical id -> E2B id, as last seen by this worker

    def __repr__(self) -> str:
        return f"E2BSandboxBackend(template={self.config.template!r}, sdk={getattr(self.sdk, '__name__', self.sdk)!r})"

    # --- SDK plumbing ------------------------------------------------------------

    @property
    def _opts(self) -> dict[str, Any]:
        return {"api_key": self._key.get_secret_value(), "request_timeout": self.config.request_timeout_s}

    def translate(self, exc: BaseException, what: str) -> Exception:
        """The sandbox error for an SDK failure (the key is redacted; callers cut the chain)."""
        text = redact(f"E2B {what} failed: {type(exc).__name__}: {exc}", [self._key.get_secret_value()])
        if isinstance(exc, e2b.AuthenticationException):
            return SandboxUnavailable(f"{text} (check E2B_API_KEY)")
        if isinstance(exc, e2b.RateLimitException | e2b.ServiceBusyException):
            return SandboxTransient(text)
        if isinstance(exc, e2b.SandboxNotRunningException | e2b.SandboxNotFoundException):
            return SandboxMissing(text)
        if isinstance(exc, e2b.FileNotFoundException):
            return SandboxError(f"{text} (no such file)")
        if isinstance(exc, e2b.NotEnoughSpaceException):
            return SandboxError(f"{text} (the sandbox's disk is full)")
        if isinstance(exc, e2b.TimeoutException | httpx.TransportError | OSError | asyncio.TimeoutError):
            return SandboxTransient(text)
        status = getattr(exc, "status_code", None)
        if isinstance(status, int) and (status >= 500 or status in (408, 409, 425)):
            return SandboxTransient(text)
        return SandboxError(text)

    async def sdk_call(self, what: str, awaitable: Awaitable[T]) -> T:
        """Await an SDK call, translating its failures (see :meth:`translate`)."""
        try:
            return await awaitable
        except (SandboxError, SandboxTransient, asyncio.CancelledError):
            raise
        except Exception as exc:
            translated = self.translate(exc, what)
        # raised outside the handler: no __context__ chain back to the SDK's exception
        raise translated

    async def _list(self, metadata: dict[str, str]) -> list[Any]:
        async def paginate() -> Any:  # building the paginator sends nothing, but keep its errors translated too
            return self.sdk.list(query=e2b.SandboxQuery(metadata=metadata), limit=100, **self._opts)

        paginator = await self.sdk_call("list sandboxes", paginate())
        items: list[Any] = []
        while paginator.has_next:
            items += await self.sdk_call("list sandboxes", paginator.next_items())
        return items

    async def _find(self, sandbox_id: str) -> list[Any]:
        """This logical id's VMs, oldest first."""
        items = await self._list({META_APP_KEY: APP, META_SANDBOX_KEY: sandbox_id})
        mine = [i for i in items if (i.metadata or {}).get(META_SANDBOX_KEY) == sandbox_id]
        return sorted(mine, key=_started)

    async def _find_one(self, sandbox_id: str) -> Any | None:
        """The VM for ``sandbox_id``; duplicates from a create race are killed (every worker keeps the same one)."""
        found = await self._find(sandbox_id)
        for extra in found[1:]:
            log.warning("killing duplicate E2B sandbox %s for %s", extra.sandbox_id, sandbox_id)
            with contextlib.suppress(SandboxError, SandboxTransient):
                await self.sdk_call("kill duplicate", self.sdk.kill(extra.sandbox_id, **self._opts))
        return found[0] if found else None

    async def _attach(self, sandbox_id: str, ref: str) -> E2BSandbox:
        """Connect to VM ``ref``; the connect's ``timeout`` extends its life to now + ``timeout_s``."""
        vm = await self.sdk_call("connect", self.sdk.connect(ref, timeout=self.config.timeout_s, **self._opts))
        self._refs[sandbox_id] = ref
        return E2BSandbox(self, sandbox_id, vm)

    async def _prepare(self, vm: Any) -> None:
        """Create ``/workspace`` (idempotent), writable by the template's default user."""
        script = f"mkdir -p {WORKSPACE} && chmod 0777 {WORKSPACE}"
        await self.sdk_call("prepare workspace", vm.commands.run(script, user="root", envs={}, timeout=60))

    def _metadata(self, sandbox_id: str, metadata: Mapping[str, str] | None) -> dict[str, str]:
        metadata = metadata or {}
        return {
            META_APP_KEY: APP,
            META_SANDBOX_KEY: sandbox_id,
            META_RUN_KEY: str(metadata.get(META_RUN, "")),
            META_TENANT_KEY: str(metadata.get(META_TENANT, "")),
        }

    # --- the backend protocol ----------------------------------------------------------

    async def create(self, sandbox_id: str, *, metadata: dict[str, str] | None = None) -> E2BSandbox:
        """The VM for ``sandbox_id``: an existing one (found by metadata) or a new one (idempotency-keyed)."""
        validate_sandbox_id(sandbox_id)
        return await self._create(sandbox_id, metadata, nonce="")

    async def _create(self, sandbox_id: str, metadata: Mapping[str, str] | None, *, nonce: str) -> E2BSandbox:
        existing = await self._find_one(sandbox_id)
        if existing is not None:
            try:
                sandbox = await self._attach(sandbox_id, existing.sandbox_id)
            except SandboxMissing:
                pass  # died between list and connect: make a new one
            else:
                await self._prepare(sandbox._vm)
                return sandbox
        vm = await self.sdk_call(
            "create sandbox",
            self.sdk.create(
                template=self.config.template,
                timeout=self.config.timeout_s,
                metadata=self._metadata(sandbox_id, metadata),
                envs={},  # never the worker's environment
                allow_internet_access=self.config.internet,
                idempotency_key=idempotency_key(sandbox_id, nonce),
                **self._opts,
            ),
        )
        self._refs[sandbox_id] = vm.sandbox_id
        await self._prepare(vm)
        return E2BSandbox(self, sandbox_id, vm)

    async def connect(self, sandbox_id: str) -> E2BSandbox:
        """Attach to the run's VM; :class:`SandboxMissing` when it expired, was killed or never existed."""
        validate_sandbox_id(sandbox_id)
        cached = self._refs.get(sandbox_id)
        if cached is not None:
            try:
                return await self._attach(sandbox_id, cached)
            except SandboxMissing:
                self._refs.pop(sandbox_id, None)  # maybe another worker recreated it: look it up
        found = await self._find_one(sandbox_id)
        if found is None:
            raise SandboxMissing(f"sandbox {sandbox_id!r} does not exist (it expired, was killed or never created)")
        return await self._attach(sandbox_id, found.sandbox_id)

    async def connect_or_recreate(self, sandbox_id: str, *, metadata: dict[str, str] | None = None) -> Connection:
        """``connect``; a missing VM is created again once (``recreated=True``), a second miss raises."""
        dead = self._refs.get(sandbox_id, "")
        try:
            return Connection(await self.connect(sandbox_id))
        except SandboxMissing:
            log.info("sandbox %s is gone; recreating it", sandbox_id)
        # a fresh key: the original one may still map to the dead VM on E2B's side
        sandbox = await self._create(sandbox_id, metadata, nonce=dead or uuid.uuid4().hex)
        return Connection(sandbox, recreated=True)

    async def kill(self, sandbox_id: str) -> bool:
        """Kill every VM carrying ``sandbox_id`` (idempotent); ``True`` if one was killed."""
        validate_sandbox_id(sandbox_id)
        refs = {info.sandbox_id for info in await self._find(sandbox_id)}
        cached = self._refs.pop(sandbox_id, None)
        if cached:
            refs.add(cached)
        killed = False
        for ref in sorted(refs):
            killed = bool(await self.sdk_call("kill sandbox", self.sdk.kill(ref, **self._opts))) or killed
        return killed

    async def list_sandboxes(self) -> list[SandboxRecord]:
        """Every VM this application created (metadata ``da_app``), whatever its run."""
        records = []
        for info in await self._list({META_APP_KEY: APP}):
            meta = {str(k): str(v) for k, v in (info.metadata or {}).items()}
            logical = meta.get(META_SANDBOX_KEY, "")
            if not logical:
                continue
            started = getattr(info, "started_at", None)
            records.append(
                SandboxRecord(
                    sandbox_id=logical,
                    run_id=meta.get(META_RUN_KEY, ""),
                    tenant=meta.get(META_TENANT_KEY, ""),
                    ref=str(info.sandbox_id),
                    created_at=started.timestamp() if started is not None else None,
                    metadata=meta,
                )
            )
        return records
