"""Commands and file reads in an E2B VM: the ``run`` / ``read_file`` half of
:class:`activities.sandbox.e2b.backend.E2BSandbox` (mixed into it).

What the real service does that shapes this code:

* ``CommandHandle.kill()`` is envd's ``SendSignal(SIGKILL)``, which signals the command's pid only
  (``cmd.Process.Signal``): whatever it started lives on, with no deadline. So every command runs as
  ``exec timeout ...``: ``exec`` makes coreutils ``timeout`` the pid envd knows, and ``timeout`` puts
  itself in a process group of its own (``setpgid(0, 0)``), so pgid == pid. On cancellation, a flood,
  a timeout or a cut stream the backend runs ``kill -KILL -- -<pid>`` (as root) before the SDK's kill.
  A process that leaves the group on purpose (``setsid``) is not reached; see docs/sandboxes.md.
* A stream that envd or the proxy cancels (the VM paused or shut down) surfaces as a plain
  ``TimeoutException``, like the SDK's own stream deadline. Our deadline tells them apart: before it,
  the VM's state is asked (``get_info``) and the command is reported as "sandbox unavailable", never
  as timed out.
* envd refuses a ``cwd`` that does not exist (``InvalidArgumentException``): said plainly.
* ``read_file`` asks the file's size first (``files.get_info``) and streams with the cap, so a large
  file is refused as "too large" instead of being downloaded under the request deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
import uuid
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

import e2b

from activities.sandbox.base import (
    MAX_READ_BYTES,
    WORKSPACE,
    CommandResult,
    SandboxError,
    SandboxMissing,
    SandboxTransient,
    validate_command,
)
from activities.settings import E2BConfig

T = TypeVar("T")


class CommandBackend(Protocol):
    """What commands need of :class:`~activities.sandbox.e2b.backend.E2BSandboxBackend` (a protocol: no cycle)."""

    config: E2BConfig

    def translate(self, exc: BaseException, what: str) -> Exception: ...

    async def sdk_call(self, what: str, awaitable: Awaitable[T]) -> T: ...

    async def vm_state(self, ref: str) -> str: ...


KILL_AFTER_S = 2  # `timeout -k`: SIGKILL this long after the SIGTERM at the deadline
TIMEOUT_MARK = "timeout: sending signal "  # what `timeout --verbose` prints when the deadline passes
STREAM_SLACK_S = 30  # the SDK's stream timeout: the command's own deadline plus this
GROUP_KILL_TIMEOUT_S = 10
CUT = "cut"  # _wait's verdict for a stream that ended before our deadline with a TimeoutException


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


def command_line(argv: list[str], wall: float, stdin_path: str = "") -> str:
    """What bash runs in the VM: ``timeout`` as the pid envd knows (see the module docstring)."""
    # --verbose: coreutils says on stderr when it had to signal the command (how a timeout is told apart)
    command = "exec " + shlex.join(["timeout", "--verbose", "-k", str(KILL_AFTER_S), f"{wall:g}", *argv])
    if stdin_path:  # opened as fd 0, then unlinked: nothing is left behind whatever happens next
        quoted = shlex.quote(stdin_path)
        command = f"exec 0< {quoted} && rm -f {quoted} && {command}"
    return command


class E2BCommands:
    """``run`` and ``read_file`` for :class:`~activities.sandbox.e2b.backend.E2BSandbox`."""

    sandbox_id: str
    ref: str
    _vm: Any
    _backend: CommandBackend

    def _path(self, path: str, *, allow_root: bool = False) -> str:
        raise NotImplementedError  # E2BSandbox's

    async def run(
        self, argv: list[str], *, stdin: bytes = b"", timeout_s: float = 30.0, cwd: str = ""
    ) -> CommandResult:
        """Run ``argv`` in the VM under ``/workspace`` (coreutils ``timeout`` enforces the wall time)."""
        validate_command(argv, timeout_s)
        limits = self._backend.config.limits
        wall = min(timeout_s, limits.timeout_s)
        workdir = self._path(cwd, allow_root=True) if cwd else WORKSPACE
        stdin_path = ""
        if stdin:
            stdin_path = f"/tmp/.da-stdin-{uuid.uuid4().hex}"
            await self._backend.sdk_call("write stdin", self._vm.files.write(stdin_path, stdin))
        flooded = asyncio.Event()
        out = _Capture(limits.output_bytes, limits.drain_bytes, flooded)
        err = _Capture(limits.output_bytes, limits.drain_bytes, flooded)
        started = time.monotonic()
        handle = await self._start(command_line(argv, wall, stdin_path), workdir, cwd, out, err, wall)
        exit_code, flooding, sdk_timeout = await self._wait(handle, flooded, deadline=started + wall + KILL_AFTER_S)
        elapsed = time.monotonic() - started
        stderr = err.text()
        signalled = TIMEOUT_MARK in stderr
        if signalled:
            stderr = "".join(line for line in stderr.splitlines(keepends=True) if TIMEOUT_MARK not in line)
        timed_out = sdk_timeout or (exit_code in (124, 128 + 9) and signalled)
        note = ""
        if timed_out:
            exit_code = -9
            # the child timeout(1) signalled may be gone while a grandchild that ignored SIGTERM is not
            await self._kill_group(handle)
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

    async def _start(self, command: str, workdir: str, cwd: str, out: _Capture, err: _Capture, wall: float) -> Any:
        async def start() -> Any:
            try:
                return await self._vm.commands.run(
                    command,
                    background=True,
                    envs={},  # never the worker's environment
                    cwd=workdir,
                    on_stdout=out.feed,
                    on_stderr=err.feed,
                    timeout=wall + KILL_AFTER_S + STREAM_SLACK_S,
                    retain_output=False,
                )
            except e2b.InvalidArgumentException as exc:
                if "cwd" not in str(exc):
                    raise
            # envd checks the cwd exists (and is a directory it can enter); say it in the model's terms
            raise SandboxError(f"no such directory in the workspace: {cwd or '.'!r}")

        return await self._backend.sdk_call("start command", start())

    async def _wait(
        self, handle: Any, flooded: asyncio.Event, *, deadline: float | None = None
    ) -> tuple[int, bool, bool]:
        """(exit code, killed for flooding, the SDK's stream deadline passed).

        ``deadline`` (monotonic): when the command's own time is up. A ``TimeoutException`` before it is
        a cut stream, not a timeout: the command is stopped and "sandbox unavailable" raised. Without a
        deadline (checkpoint scripts, not started by :func:`command_line`) nothing is killed by group.
        """
        grouped = deadline is not None
        waiter: asyncio.Future[Any] = asyncio.ensure_future(handle.wait())
        watch = asyncio.ensure_future(flooded.wait())
        try:
            await asyncio.wait({waiter, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():  # flooded: stop it, then collect its end
                await self._stop(handle, grouped)
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
                if deadline is not None and time.monotonic() < deadline:
                    raise await self._cut(handle)
                await self._stop(handle, grouped)
                return -9, False, True  # the SDK's stream deadline: the command outlived its own timeout
            if isinstance(failure, SandboxError | SandboxTransient):
                raise failure
            raise self._backend.translate(failure, "run command")
        finally:
            watch.cancel()
            if not waiter.done():  # cancelled (activity cancellation): do not leave it running
                waiter.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._stop(handle, grouped))

    async def _cut(self, handle: Any) -> SandboxError:
        """The error for a stream E2B ended early; the command is stopped if the VM still runs."""
        state = await self._backend.vm_state(self.ref)
        what = "sandbox unavailable: E2B ended the command's stream before its deadline"
        if state != "running":  # paused, killed or expired: the next call reconnects (or recreates)
            return SandboxMissing(f"{what} (the sandbox is {state}); the command's outcome is unknown")
        with contextlib.suppress(SandboxError, SandboxTransient):
            await self._stop(handle, True)
        return SandboxError(f"{what} (the connection was cut); the command was stopped and its outcome is unknown")

    async def _stop(self, handle: Any, grouped: bool) -> None:
        """Kill the command: its whole process group first (while the pgid is surely its own), then the pid."""
        if grouped:
            await self._kill_group(handle)
        with contextlib.suppress(SandboxError, SandboxTransient):
            await self._backend.sdk_call("kill command", handle.kill())

    async def _kill_group(self, handle: Any) -> None:
        pid = getattr(handle, "pid", None)
        if not isinstance(pid, int) or pid <= 1:
            return

        async def kill() -> None:
            with contextlib.suppress(e2b.CommandExitException):  # exit 1: nothing of it is left
                await self._vm.commands.run(f"kill -KILL -- -{pid}", user="root", envs={}, timeout=GROUP_KILL_TIMEOUT_S)

        with contextlib.suppress(SandboxError, SandboxTransient):
            await self._backend.sdk_call("kill command group", kill())

    async def read_file(self, path: str) -> bytes:
        """Bytes of ``path`` (workspace-relative); files over 1 MiB are refused before they are downloaded."""
        full = self._path(path)

        async def read() -> bytes:
            try:
                info = await self._vm.files.get_info(full)
                if info.type == e2b.FileType.DIR:
                    raise SandboxError(f"{path!r} is a directory, not a regular file")
                if info.size > MAX_READ_BYTES:
                    raise _too_large(path, int(info.size))
                reader = await self._vm.files.read(full, format="stream")
            except e2b.FileNotFoundException:
                raise SandboxError(f"no such file: {path!r}") from None
            data = bytearray()
            try:
                async for chunk in reader:  # a symlink's size says nothing, and a file may grow: capped here too
                    data += chunk
                    if len(data) > MAX_READ_BYTES:
                        raise _too_large(path, len(data))
            finally:
                await reader.aclose()
            return bytes(data)

        return await self._backend.sdk_call(f"read {path!r}", read())


def _too_large(path: str, size: int) -> SandboxError:
    return SandboxError(
        f"{path!r} is too large ({size} bytes or more); read_file returns at most {MAX_READ_BYTES} bytes (1 MiB). "
        "Read a part of it with a command instead (e.g. head -c)."
    )
