"""The fake E2B VM's process API (``vm.commands``), imitating envd's ``process`` service and the SDK's
``AsyncCommandHandle`` (see :mod:`tests.fakes.fake_e2b` for the rest of the fake).

Most commands get deterministic answers from a tiny interpreter (``echo``, ``cat``, ``env``, ``pwd``,
``true``, ``false``, ``sleep N``, ``sh -c 'exit N'``, the workspace preparation) or from
``cloud.responder``. A command that *runs until killed* (``sleep infinity``, or a responder answer of
:data:`RUN_UNTIL_KILLED` / :data:`PRINTS_FOREVER`) runs as a **real process tree on the host**, built
from the backend's own command string (``bash -c`` of it, its argv swapped for a stand-in that keeps a
child running), because how it dies is what matters:

* ``handle.kill()`` sends SIGKILL to the command's pid only — envd's ``Handler.SendSignal`` is
  ``p.cmd.Process.Signal(signal)`` — so whatever that process started keeps running, as in a real VM;
* envd does not put the command in a process group of its own (no ``Setpgid`` in its ``SysProcAttr``),
  so the pid is a group leader only if the command makes itself one (coreutils ``timeout`` does:
  ``setpgid(0, 0)``, unless ``--foreground``);
* ``kill -KILL -- -N`` (run as a command) really signals process group ``N`` — only groups led by a
  process this fake VM started, never anything else on the host.

Every such process carries ``FAKE_E2B_VM=<marker>`` in its environment, inherited by its children, so
:meth:`FakeCloud.processes` can list what is still running in a VM from ``/proc`` — the leak a test checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
import shlex
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import e2b
from e2b.sandbox.commands.command_handle import CommandResult as E2BCommandResult

if TYPE_CHECKING:
    from tests.fakes.fake_e2b import FakeCloud, FakeVM

BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/home/user"}
RUN_UNTIL_KILLED = -1  # a responder's exit code for "keeps running, silently, until killed" (`sleep infinity`)
PRINTS_FOREVER = -2  # a responder's exit code for "prints its stdout over and over until killed" (`yes`)
CHUNK = 64 * 1024
# What a long-running command is swapped for on the host: a shell with a child, both running until killed
# (so a kill of the shell alone leaves the child behind, like `bash -c` or `timeout` would in the VM).
STAND_IN = ["sh", "-c", "sleep infinity & wait"]
# envd's end event for a process killed by a signal: Go's ProcessState.ExitCode() is -1 then.
SIGNALLED = -1
# envd's Code.CANCELED, as e2b.envd.rpc._DEFAULT_RPC_ERROR_MAP words it (a TimeoutException).
CANCELED_MESSAGE = (
    "stream cancelled: The request was cancelled by the server or a proxy while it was in flight "
    "— for example when the sandbox is paused or shut down."
)
MARKER_VAR = "FAKE_E2B_VM"
SCRIPT_ROOTS = re.compile(r"(?<![\w/.-])(/workspace|/tmp|/home/user)(?=[/'\"\s;]|$)")
STDIN_PREFIX = re.compile(r"^exec 0< (\S+) && rm -f \1 && (.*)$", re.S)  # the backend's stdin wrapper
GROUP_KILL = re.compile(r"^kill -KILL -- -(\d+)$")

Answer = tuple[int, str, str]
Responder = Callable[["FakeVM", list[str], str, bytes], "Answer | None"]


@dataclass
class RecordedCommand:
    cmd: str
    envs: dict[str, str] | None
    cwd: str | None
    user: str | None
    timeout: float | None
    background: bool | None


def _read(path: str) -> bytes:
    # os.open, not open(): kill_marked also runs from a weakref finalizer, which the garbage collector may
    # call on a workflow task thread, where the Temporal sandbox has replaced builtins.open.
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def processes(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of the live (not zombie) host processes whose environment carries ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            state = _read(f"/proc/{entry}/stat").rsplit(b")", 1)[1].split()[0]
            environ = _read(f"/proc/{entry}/environ").split(b"\0")
            cmdline = _read(f"/proc/{entry}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if state not in (b"Z", b"X") and f"{MARKER_VAR}={marker}".encode() in environ:
            found.append((int(entry), cmdline))
    return found


def kill_marked(marker: str) -> None:
    """SIGKILL every host process carrying ``marker`` (a killed or expired VM stops everything in it)."""
    for _ in range(50):  # children may fork while their parents are being killed
        alive = processes(marker)
        if not alive:
            return
        for pid, _cmd in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


class FakeCommandHandle:
    """``AsyncCommandHandle``: ``pid``, ``wait()`` (output delivered meanwhile) and ``kill()``.

    ``proc`` is the real host process for a command that runs until killed (None for the interpreted
    ones, which end on their own once their output is delivered).
    """

    def __init__(
        self,
        cloud: FakeCloud,
        vm: FakeVM,
        pid: int,
        answer: Answer,
        on_stdout: Callable[[str], Any] | None,
        on_stderr: Callable[[str], Any] | None,
        proc: asyncio.subprocess.Process | None = None,
        cmd: str = "",
    ) -> None:
        self._cloud, self.vm = cloud, vm
        self.cmd = cmd
        self.pid = pid
        self._answer = answer
        self._on_stdout, self._on_stderr = on_stdout, on_stderr
        self.proc = proc
        self.killed = False
        self.kill_calls = 0
        self._ended = asyncio.Event()  # killed, or its stream was cut
        self._cut: BaseException | None = None

    def cut(self, exc: BaseException) -> None:
        """End the stream with ``exc`` (envd / the proxy cancelling it); the process itself lives on."""
        if self._cut is None:
            self._cut = exc
        self._ended.set()

    def group_killed(self) -> None:
        """The command's process group got SIGKILL (the interpreted commands have no real processes)."""
        self.killed = True
        self._ended.set()

    async def _deliver(self, text: str, callback: Callable[[str], Any] | None) -> None:
        for start in range(0, len(text), CHUNK):
            if self.killed or self._cut is not None:
                return
            if callback is not None:
                callback(text[start : start + CHUNK])
            await asyncio.sleep(0)

    async def wait(self) -> E2BCommandResult[Any]:
        code, out, err = self._answer
        if self.proc is not None:
            code = await self._wait_process(out)
        elif code == RUN_UNTIL_KILLED:  # unreachable in practice (those get a real process); kept simple
            await self._ended.wait()
        else:
            await self._deliver(out, self._on_stdout)
            await self._deliver(err, self._on_stderr)
            if self.killed:
                code = SIGNALLED
        if self._cut is not None:
            raise self._cut
        if not self.vm.alive:
            raise e2b.SandboxNotRunningException(f"The sandbox {self.vm.sandbox_id} was not found")
        if code != 0:  # like the SDK's: the (retained) output travels with the exception / the result
            raise e2b.CommandExitException(stdout=out, stderr=err, exit_code=code, error=None)
        return E2BCommandResult(stdout=out, stderr=err, exit_code=0, error=None)

    async def _wait_process(self, out: str) -> int:
        """Stream (``PRINTS_FOREVER``: ``out`` again and again) until the pid exits or the stream is cut."""
        assert self.proc is not None
        exited = asyncio.ensure_future(self.proc.wait())
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            while not exited.done() and not self._ended.is_set():
                if self._answer[0] == PRINTS_FOREVER and out and self._on_stdout is not None:
                    self._on_stdout(out[:CHUNK])
                    await asyncio.sleep(0)
                else:
                    await asyncio.wait({exited, ended}, return_when=asyncio.FIRST_COMPLETED)
            if self._cut is None:
                await exited  # envd sends the end event once the pid has exited (its children may live on)
        finally:
            ended.cancel()
            if not exited.done():
                exited.cancel()
        returncode = self.proc.returncode
        return SIGNALLED if returncode is None or returncode < 0 else returncode

    async def kill(self) -> bool:
        """envd ``SendSignal(SIGKILL)``: stops the output stream and signals the pid — only the pid."""
        self.kill_calls += 1
        self.killed = True
        self._ended.set()
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return False
        return True


class FakeCommands:
    """``vm.commands``: ``run`` like ``Commands.run`` (envd ``process.Start`` of ``/bin/bash -l -c cmd``)."""

    def __init__(self, cloud: FakeCloud, vm: FakeVM) -> None:
        self._cloud, self._vm = cloud, vm

    async def run(
        self,
        cmd: str,
        background: bool | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,  # noqa: ASYNC109  (the SDK's parameter)
        request_timeout: float | None = None,
        *,
        retain_output: bool = True,
    ) -> Any:
        self._cloud.enter("run", {"cmd": cmd, "envs": envs, "user": user, "api_key": self._cloud.api_key})
        vm = self._cloud.vm(self._vm.sandbox_id)
        vm.commands.append(RecordedCommand(cmd, None if envs is None else dict(envs), cwd, user, timeout, background))
        if cwd is not None and not os.path.isdir(vm.files.host(cwd)):  # noqa: ASYNC240  (an in-memory VM)
            # envd handler.New: os.Stat(cwd) -> connect.CodeInvalidArgument, which the SDK raises as
            # InvalidArgumentException (e2b.envd.rpc._DEFAULT_RPC_ERROR_MAP)
            raise e2b.InvalidArgumentException(f"cwd '{cwd}' does not exist")
        workdir = cwd or "/home/user"
        answer, real = self._interpret(vm, cmd, envs or {}, workdir)
        proc = await self._spawn(vm, real, workdir) if real is not None else None
        pid = proc.pid if proc is not None else self._cloud.new_pid()
        handle = FakeCommandHandle(self._cloud, vm, pid, answer, on_stdout, on_stderr, proc, cmd)
        self._cloud.handles.append(handle)
        if background:
            return handle
        return await handle.wait()

    async def _spawn(self, vm: FakeVM, command: str, workdir: str) -> asyncio.subprocess.Process:
        """Start ``command`` on the host the way envd starts it in the VM (no new process group)."""
        root = vm.files.root
        for top in ("/workspace", "/tmp", "/home/user"):
            os.makedirs(vm.files.host(top), exist_ok=True)
        script = SCRIPT_ROOTS.sub(lambda m: root + m.group(1), command)
        return await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            script,
            cwd=vm.files.host(workdir),
            env={**BASE_ENV, "HOME": vm.files.host("/home/user"), MARKER_VAR: self._cloud.marker(vm)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _interpret(self, vm: FakeVM, cmd: str, envs: dict[str, str], cwd: str) -> tuple[Answer, str | None]:
        """The answer, and the host command line to run for real when the command runs until killed."""
        if cmd.startswith("set -e"):
            return self._script(vm, cmd, envs), None
        if m := GROUP_KILL.match(cmd.strip()):
            return self._cloud.kill_group(vm, int(m.group(1))), None
        stdin_path = ""
        inner = cmd
        if m := STDIN_PREFIX.match(cmd):  # exec 0< FILE && rm -f FILE && exec timeout ... (the backend's stdin)
            stdin_path, inner = m.group(1), m.group(2)
        elif " < " in cmd:  # `<argv> < /tmp/file; rc=$?; rm -f /tmp/file; exit $rc` (an older way to feed stdin)
            inner, rest = cmd.split(" < ", 1)
            stdin_path = shlex.split(rest.split(";", 1)[0])[0]
        inner = inner.removeprefix("exec ")
        argv = shlex.split(inner)
        wall: float | None = None
        if argv[:2] == ["timeout", "--verbose"]:  # timeout --verbose -k N WALL argv...
            wall = float(argv[4])
            argv = argv[5:]
        stdin = vm.files.get(stdin_path, b"") if stdin_path else b""
        answer = self._answer(vm, cmd, argv, envs, cwd, stdin, wall)
        if answer[0] in (RUN_UNTIL_KILLED, PRINTS_FOREVER):
            stand_in = argv if argv == ["sleep", "infinity"] else STAND_IN
            return answer, cmd.replace(shlex.join(argv), shlex.join(stand_in), 1)
        if stdin_path:
            vm.files.pop(stdin_path, None)  # what the command line's `rm -f` does
        return answer, None

    def _answer(
        self, vm: FakeVM, cmd: str, argv: list[str], envs: dict[str, str], cwd: str, stdin: bytes, wall: float | None
    ) -> Answer:
        if self._cloud.responder is not None:
            answer = self._cloud.responder(vm, argv, cwd, stdin)
            if answer is not None:
                return answer
        if cmd.startswith("mkdir -p /workspace"):  # the backend's workspace preparation, done for real
            os.makedirs(vm.files.host("/workspace"), exist_ok=True)
            os.chmod(vm.files.host("/workspace"), 0o777)
            return 0, "", ""
        return self._builtin(vm, argv, envs, cwd, stdin, wall)

    def _script(self, vm: FakeVM, cmd: str, envs: dict[str, str]) -> Answer:
        """envd's ``process.Start`` runs ``/bin/bash -l -c cmd``: here a real bash on the host, against
        the VM's directory (the VM paths the script names are rewritten into it), with an empty
        environment but ``PATH`` and ``HOME``, like the VM's."""
        root = vm.files.root
        for top in ("/workspace", "/tmp", "/home/user"):
            os.makedirs(vm.files.host(top), exist_ok=True)
        script = SCRIPT_ROOTS.sub(lambda m: root + m.group(1), cmd)
        home = vm.files.host("/home/user")
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=home,
            env={**BASE_ENV, "HOME": home, **envs},
            capture_output=True,
            timeout=60,
            check=False,
        )
        out = done.stdout.decode("utf-8", errors="replace").replace(root, "")
        err = done.stderr.decode("utf-8", errors="replace").replace(root, "")
        return done.returncode, out, err

    def _builtin(
        self, vm: FakeVM, argv: list[str], envs: dict[str, str], cwd: str, stdin: bytes, wall: float | None
    ) -> Answer:
        name, args = (posixpath.basename(argv[0]), argv[1:]) if argv else ("", [])

        def path_of(arg: str) -> str:
            return arg if arg.startswith("/") else f"{cwd.rstrip('/')}/{arg}"

        if name == "echo":
            return 0, " ".join(args) + "\n", ""
        if name == "cat":
            if not args:
                return 0, stdin.decode(errors="replace"), ""
            if path_of(args[0]) not in vm.files:
                return 1, "", f"cat: {args[0]}: No such file or directory\n"
            return 0, vm.files[path_of(args[0])].decode(errors="replace"), ""
        if name == "env":
            merged = {**BASE_ENV, **vm.envs, **envs}
            return 0, "".join(f"{k}={v}\n" for k, v in merged.items()), ""
        if name == "pwd":
            return 0, cwd + "\n", ""
        if name == "true":
            return 0, "", ""
        if name == "false":
            return 1, "", ""
        if name == "sleep" and args == ["infinity"]:
            return RUN_UNTIL_KILLED, "", ""
        if name == "sleep":
            if wall is not None and float(args[0]) > wall:
                return 124, "", f"timeout: sending signal TERM to command '{name}'\n"
            return 0, "", ""
        if name in ("sh", "bash") and args[:1] == ["-c"] and len(args) > 1:
            if m := re.fullmatch(r"exit (\d+)", args[1].strip()):
                return int(m.group(1)), "", ""
            return self._builtin(vm, shlex.split(args[1]), envs, cwd, stdin, wall)
        return 127, "", f"fake e2b: {name}: command not found\n"
