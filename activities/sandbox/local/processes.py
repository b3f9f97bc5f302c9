"""Running one bubblewrapped command to its end: output capture, wall-time limit, and pid-namespace teardown.

:func:`execute` starts a :class:`~activities.sandbox.local.bwrap.Spawn`, feeds its stdin,
keeps at most ``limits.output_bytes`` of each stream, kills it on timeout, when
it floods its output past ``limits.drain_bytes`` or when its ``monitor`` objects
(the measured workspace quota), and returns only once the command's pid namespace
is empty: nothing the command started survives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

from activities.sandbox.base import CommandResult, SandboxError, SandboxUnavailable
from activities.sandbox.local.bwrap import SANDBOX_ENV, Spawn
from activities.sandbox.local.limits import LocalLimits

log = logging.getLogger(__name__)

KILL_GRACE_S = 5.0  # how long to wait for pipes to close after a SIGKILL before giving up on them

# Asked while the command runs; a non-empty answer kills it and is the reason given.
Monitor = Callable[[], Awaitable[str]]


class Commands(set[asyncio.subprocess.Process]):
    """One sandbox's running commands (their outer bwraps), and whether the sandbox was killed.

    Killing a bwrap's process group is not enough on its own: a bwrap killed while it still sets up
    never kills its pid-namespace init, so the command would live on. :meth:`kill` also wakes each
    command's :func:`execute`, which kills the init and waits until the namespace is empty.
    """

    def __init__(self) -> None:
        super().__init__()
        self.killed = asyncio.Event()

    def kill(self) -> None:
        self.killed.set()
        for proc in list(self):
            killpg(proc)


async def execute(
    spawn: Spawn,
    *,
    stdin: bytes,
    timeout_s: float,
    limits: LocalLimits,
    running: dict[str, Commands],
    sandbox_id: str,
    monitor: Monitor | None = None,
    monitor_min_s: float = 0.25,
) -> CommandResult:
    """Run ``spawn`` for at most ``timeout_s``; while it runs, its bwrap is in ``running[sandbox_id]``.

    ``monitor`` is awaited every ``monitor_min_s`` or more (10 times its last duration):
    when it returns a reason, the command is killed and the reason is noted.
    """
    started = time.monotonic()
    # Registered before the spawn: a kill while the process starts pops this set, which the start then sees.
    procs = running.setdefault(sandbox_id, Commands())
    try:
        proc = await asyncio.create_subprocess_exec(
            *spawn.argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # bwrap's own environ stays readable at /proc/1/environ inside: give it nothing of ours
            env=dict(SANDBOX_ENV),
            start_new_session=True,
            pass_fds=spawn.pass_fds,
            preexec_fn=spawn.preexec,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        spawn.close_all()
        if not procs and running.get(sandbox_id) is procs:
            del running[sandbox_id]
        raise SandboxUnavailable(f"could not start the sandbox: {exc}") from None
    spawn.close()
    init = _Init(spawn.info_fd)
    procs.add(proc)
    if running.get(sandbox_id) is not procs:  # the sandbox was killed while this command started
        init.kill()
        killpg(proc)
    flooded = asyncio.Event()
    out = _Capture(limits.output_bytes, limits.drain_bytes, flooded)
    err = _Capture(limits.output_bytes, limits.drain_bytes, flooded)
    tasks = {
        asyncio.ensure_future(out.pump(proc.stdout)),
        asyncio.ensure_future(err.pump(proc.stderr)),
        asyncio.ensure_future(proc.wait()),
    }
    if stdin:
        tasks.add(asyncio.ensure_future(_feed(proc, stdin)))
    watch = asyncio.ensure_future(flooded.wait())
    objection: list[str] = []
    watchers: set[asyncio.Future[Any]] = {watch, asyncio.ensure_future(procs.killed.wait())}
    if monitor is not None:
        watchers.add(asyncio.ensure_future(_watch(monitor, monitor_min_s, objection)))
    timed_out = flooding = False
    deadline = started + timeout_s
    try:
        pending = set(tasks)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            done, _ = await asyncio.wait(pending | watchers, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if watch in done:
                flooding = True
                break
            if done & watchers:
                break
            pending -= done
        if pending:
            init.kill()
            killpg(proc)
            _, pending = await asyncio.wait(pending, timeout=KILL_GRACE_S)
            for task in pending:
                task.cancel()
    finally:
        for watcher in watchers:
            watcher.cancel()
        if proc.returncode is None:  # cancelled (activity cancellation) or the grace ran out
            init.kill()
            killpg(proc)
            for task in tasks:
                task.cancel()
            await asyncio.shield(proc.wait())
        await asyncio.shield(init.gone(KILL_GRACE_S))
        procs.discard(proc)
        if not procs and running.get(sandbox_id) is procs:
            del running[sandbox_id]
    killed = timed_out or flooding or bool(objection)
    exit_code = -signal.SIGKILL if killed else (proc.returncode if proc.returncode is not None else -1)
    note = _limit_note(limits, exit_code)
    if flooding:
        note += f"\n[sandbox] killed: printed more than {limits.drain_bytes} bytes of output"
    if objection:
        note += f"\n[sandbox] killed: {objection[0]}"
    return CommandResult(
        exit_code=exit_code,
        stdout=out.text(),
        stderr=err.text() + note,
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


def _limit_note(limits: LocalLimits, exit_code: int) -> str:
    """Say which rlimit killed the command (bwrap reports a signalled command as 128 + signal)."""
    if exit_code == 128 + signal.SIGXCPU:
        return f"\n[sandbox] killed: CPU time limit of {limits.cpu_s} s exceeded"
    if exit_code == 128 + signal.SIGXFSZ:
        return f"\n[sandbox] killed: file size limit of {limits.fsize_mb} MiB exceeded"
    return ""


async def _watch(monitor: Monitor, min_s: float, objection: list[str]) -> None:
    """Ask ``monitor`` until it objects (then return, which stops the command); a failed check is skipped."""
    interval = min_s
    while True:
        await asyncio.sleep(interval)
        started = time.monotonic()
        try:
            reason = await monitor()
        except SandboxError:  # e.g. the check itself timed out: the check after the command decides
            reason = ""
        except Exception:  # a bug in the check must not kill the command
            log.exception("sandbox monitor failed")
            reason = ""
        interval = max(min_s, 10 * (time.monotonic() - started))
        if reason:
            objection.append(reason)
            return


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    if proc.stdin is None:
        return
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command exited without reading all its input


class _Capture:
    """Reads one pipe to EOF, keeping at most ``cap`` bytes; past ``drain`` bytes it fires ``flooded``."""

    def __init__(self, cap: int, drain: int, flooded: asyncio.Event) -> None:
        self.cap = cap
        self.drain = drain
        self.flooded = flooded
        self.data = bytearray()
        self.total = 0

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)

    async def pump(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while chunk := await stream.read(64 * 1024):
            self.total += len(chunk)
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if self.total > self.drain:
                self.flooded.set()

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", errors="replace")


def killpg(proc: asyncio.subprocess.Process) -> None:
    # bwrap leads its own process group (start_new_session); killing it takes --die-with-parent
    # down with it, and the pid namespace's init dying kills everything inside.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class _Init:
    """The sandbox's pid-namespace init, found through bwrap's ``--info-fd``.

    The outer bwrap exits as soon as the init reports the command's exit status,
    *before* the init has finished tearing the namespace down; and when the outer
    bwrap is killed, the init is killed asynchronously (``--die-with-parent``), or,
    if bwrap was still setting up, not at all. The init only counts as exited once
    the kernel has killed and reaped everything else in its namespace
    (``zap_pid_ns_processes``), so ``gone()`` SIGKILLs it and waits on its pidfd:
    when ``run()`` returns, nothing the command started is alive.

    bwrap writes ``{"child-pid": N, "pid-namespace": INODE, ...}`` and closes the fd
    before the sandboxed command may run, so the command cannot forge it; the pidfd
    is only trusted once the process behind it is checked to live in that namespace.
    """

    def __init__(self, info_fd: int) -> None:
        self._fd = info_fd
        self._buffer = bytearray()
        self.pidfd: int | None = None
        loop = asyncio.get_running_loop()
        self._read = loop.create_future()
        loop.add_reader(info_fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if len(self._buffer) < 64 * 1024:
            self._buffer += chunk
        if not chunk:  # read to EOF: closing early would kill bwrap with SIGPIPE mid-write
            self.pidfd = _init_pidfd(bytes(self._buffer))
            self._stop()

    def _stop(self) -> None:
        if not self._read.done():
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._read.set_result(None)

    def kill(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    async def gone(self, timeout_s: float) -> None:
        """Kill the init (a no-op once the command has ended) and wait until the namespace is empty."""
        try:
            await asyncio.wait_for(asyncio.shield(self._read), timeout_s)
            if self.pidfd is not None:
                self.kill()
                await asyncio.wait_for(_exited(self.pidfd), timeout_s)
        except TimeoutError:
            log.warning("sandbox pid namespace still alive %.0f s after its command ended", timeout_s)
        finally:
            self._stop()
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None


def _init_pidfd(info: bytes) -> int | None:
    """A pidfd on the init named in bwrap's info, or None (gone already, or not what bwrap said)."""
    try:
        data = json.loads(info)
        pid, namespace = int(data["child-pid"]), int(data["pid-namespace"])
    except (ValueError, KeyError, TypeError):
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # already exited and reaped: nothing left to wait for
        return None
    try:  # the pidfd pins the process: check it is still bwrap's init, not a reused pid
        if os.stat(f"/proc/{pid}/ns/pid").st_ino == namespace:
            return pidfd
    except OSError:
        pass
    os.close(pidfd)
    return None


async def _exited(pidfd: int) -> None:
    """Resolves when the process behind ``pidfd`` has exited (the pidfd polls readable)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def ready() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, ready)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)


__all__ = ["KILL_GRACE_S", "Monitor", "execute", "killpg"]
