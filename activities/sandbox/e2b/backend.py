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
* Commands and file reads: ``activities.sandbox.e2b.commands`` (process-group kills, cut streams,
  size-checked reads); creating under the idempotency key: ``activities.sandbox.e2b.lifecycle``.
* Workspace checkpoints: ``activities.sandbox.e2b.checkpoints`` (archives in and out of the VM).
* ``AGENT_E2B_TIMEOUT_S`` is clamped to ``AGENT_E2B_MAX_TIMEOUT_S`` (the plan's cap); a paused VM is
  resumed on connect, one that cannot be (unresponsive guest) is rebooted once, then killed.
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
import logging
import posixpath
import uuid
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import e2b
import httpx
from pydantic import SecretStr

from activities.redaction import redact
from activities.sandbox.base import (
    META_RUN,
    META_TENANT,
    WORKSPACE,
    Connection,
    SandboxError,
    SandboxMissing,
    SandboxRecord,
    SandboxTransient,
    SandboxUnavailable,
    validate_sandbox_id,
    workspace_relative,
)
from activities.sandbox.e2b.checkpoints import E2BCheckpoints
from activities.sandbox.e2b.commands import E2BCommands
from activities.sandbox.e2b.lifecycle import (
    IdempotencyConflict,
    body_nonce,
    create_with_key,
    idempotency_kind,
)
from activities.sandbox.e2b.lifecycle import idempotency_key as idempotency_key  # re-exported
from activities.settings import E2BConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

APP = "durable-agents"
META_APP_KEY = "da_app"
META_SANDBOX_KEY = "da_sandbox"
META_RUN_KEY = "da_run"
META_TENANT_KEY = "da_tenant"


def _started(info: Any) -> tuple[float, str]:
    started = getattr(info, "started_at", None)
    stamp = started.timestamp() if started is not None else 0.0
    return stamp, str(info.sandbox_id)


class E2BSandbox(E2BCommands, E2BCheckpoints):
    """One run's VM; ``sandbox_id`` is the logical id, ``ref`` E2B's.

    Workspace checkpoints (``scan_workspace``, ``read_workspace_files``, ``apply_workspace``, the
    marker) come from :class:`~activities.sandbox.e2b.checkpoints.E2BCheckpoints`.
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

    async def write_file(self, path: str, content: bytes) -> None:
        """Write ``content`` at ``path`` (workspace-relative); the SDK creates parent directories."""
        limit = self._backend.config.limits.fsize_mb * 1024 * 1024
        if len(content) > limit:
            raise SandboxError(f"{len(content)} bytes is over the sandbox's {limit}-byte file size limit")
        await self._backend.sdk_call(f"write {path!r}", self._vm.files.write(self._path(path), content))

    async def extend(self, seconds: int | None = None) -> None:
        """Push the VM's expiry to now + ``seconds`` (default ``AGENT_E2B_TIMEOUT_S``)."""
        timeout = min(seconds or self._backend.timeout_s, self._backend.timeout_s)
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
        # E2B refuses a timeout over the plan's cap on every create and connect: clamp it, say so once
        self.timeout_s = min(self.config.timeout_s, self.config.max_timeout_s)
        if self.timeout_s < self.config.timeout_s:
            log.warning(
                "AGENT_E2B_TIMEOUT_S=%d is over AGENT_E2B_MAX_TIMEOUT_S=%d (the E2B plan's cap); using %d s",
                self.config.timeout_s,
                self.config.max_timeout_s,
                self.timeout_s,
            )

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
        if status in (400, 422) and "timeout" in str(exc).lower():  # the plan's cap is lower than configured
            return SandboxUnavailable(
                f"{text} (the sandbox timeout of {self.timeout_s} s is over what this E2B team's plan allows: "
                "set AGENT_E2B_MAX_TIMEOUT_S to the plan's cap, 3600 on Hobby, 86400 on Pro)"
            )
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
        """Connect to VM ``ref``; the connect's ``timeout`` extends its life to now + ``timeout_s``.

        A paused VM is resumed by the connect. One paused while its guest agent did not answer is refused
        with ``GuestUnresponsiveException`` (a 409, which would otherwise be retried forever): it is tried
        once more with ``on_resume="reboot"`` (a cold boot: files kept, processes lost), and if that fails
        too it is killed and reported missing, so ``connect_or_recreate`` makes a fresh one.
        """

        async def connect() -> Any:
            try:
                return await self.sdk.connect(ref, timeout=self.timeout_s, **self._opts)
            except e2b.GuestUnresponsiveException:
                log.warning("E2B sandbox %s (%s) cannot be resumed as it was; rebooting it", ref, sandbox_id)
            try:
                return await self.sdk.connect(ref, timeout=self.timeout_s, on_resume="reboot", **self._opts)
            except e2b.GuestUnresponsiveException:
                pass
            with contextlib.suppress(Exception):
                await self.sdk.kill(ref, **self._opts)
            raise SandboxMissing(f"E2B sandbox {ref} could not be resumed (its guest agent is unresponsive); killed")

        vm = await self.sdk_call("connect", connect())
        self._refs[sandbox_id] = ref
        return E2BSandbox(self, sandbox_id, vm)

    async def vm_state(self, ref: str) -> str:
        """``running``, ``paused``, ``gone`` (killed or expired) or ``unknown`` (E2B could not be asked)."""
        try:
            info = await self.sdk_call("get sandbox info", self.sdk.get_info(ref, **self._opts))
        except SandboxMissing:
            return "gone"
        except (SandboxError, SandboxTransient):
            return "unknown"
        return str(getattr(info, "state", "unknown"))

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
        tags = self._metadata(sandbox_id, metadata)

        async def create(key: str) -> Any:
            try:
                return await self.sdk.create(
                    template=self.config.template,
                    timeout=self.timeout_s,
                    metadata=tags,
                    envs={},  # never the worker's environment
                    allow_internet_access=self.config.internet,
                    idempotency_key=key,
                    **self._opts,
                )
            except e2b.SandboxException as exc:
                kind = idempotency_kind(exc)
                if kind is None:
                    raise
                text = self.translate(exc, "create sandbox")
            raise IdempotencyConflict(kind, str(text))

        async def find() -> Any | None:
            return await self._find_one(sandbox_id)

        body = body_nonce(self.config.template, self.timeout_s, self.config.internet, tags)
        made, found = await create_with_key(
            lambda key: self.sdk_call("create sandbox", create(key)),
            find,
            sandbox_id=sandbox_id,
            nonce=nonce,
            body=body,
        )
        if found is not None:  # another caller's create (or a lost first attempt) made it after all
            sandbox = await self._attach(sandbox_id, found.sandbox_id)
            await self._prepare(sandbox._vm)
            return sandbox
        vm: Any = made
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
