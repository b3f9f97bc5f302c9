"""An in-memory E2B cloud and a fake ``e2b.AsyncSandbox`` bound to it, at the SDK boundary.

``FakeCloud().sdk()`` returns a class with the surface of ``e2b.AsyncSandbox``
that :class:`activities.sandbox.e2b.E2BSandboxBackend` uses, with the same
names and keyword arguments:

* classmethods ``create(template, timeout, metadata, envs, secure, allow_internet_access,
  idempotency_key, **opts)``, ``connect(sandbox_id, timeout, **opts)``,
  ``list(query, limit, next_token, **opts)`` (a paginator with ``has_next`` /
  ``await next_items()``) and ``kill(sandbox_id, **opts)``;
* per VM: ``sandbox_id``, ``set_timeout(timeout)``, ``commands.run(cmd, background, envs,
  user, cwd, on_stdout, on_stderr, stdin, timeout, request_timeout, retain_output)``
  (a handle with ``wait()`` / ``kill()`` when ``background=True``), ``files.write(path, data)``
  and ``files.read(path, format)``.

It raises the SDK's own exception types (``AuthenticationException`` for a wrong
``api_key``, ``SandboxNotFoundException`` when connecting to a dead VM,
``SandboxNotRunningException`` for commands in one, ``FileNotFoundException``,
``CommandExitException`` for a non-zero exit) and honours idempotency keys like
the API: the same key returns the VM it first created.

A VM's filesystem is a real directory per fake VM (:class:`FakeDisk`: VM path ``/x`` is
``<root>/x``), which ``vm.files`` also exposes as a mapping of absolute VM path → bytes of the
regular files in it. Commands get deterministic answers from a tiny interpreter
(``echo``, ``cat``, ``env``, ``pwd``, ``true``, ``false``, ``sleep``, ``sh -c 'exit N'``,
the workspace preparation) or from ``cloud.responder`` when a test sets one; a multi-statement
script starting with ``set -e`` (what the checkpoint code sends) is run by a real ``bash`` on
the host against the VM's directory, with ``/workspace``, ``/tmp`` and ``/home/user`` rewritten
into it, so ``find``/``tar``/``sort``/``comm`` behave exactly as GNU's do in the VM.
Time is the cloud's own clock: ``cloud.advance(s)`` expires VMs whose timeout ran out.
Failures are injected with ``cloud.fail_next(method, exc)``; ``cloud.lose_response("create")``
lets the VM be created but the caller see a transient error (a lost response).
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import tempfile
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import e2b
from e2b.sandbox.commands.command_handle import CommandResult as E2BCommandResult

BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/home/user"}
RUN_UNTIL_KILLED = -1  # an exit code a responder returns for "keeps running until killed"
Responder = Callable[["FakeVM", list[str], str, bytes], "tuple[int, str, str] | None"]


@dataclass
class RecordedCommand:
    cmd: str
    envs: dict[str, str] | None
    cwd: str | None
    user: str | None
    timeout: float | None
    background: bool | None


class FakeDisk(MutableMapping[str, bytes]):
    """A VM's filesystem: a real directory (made on first use, removed with the VM object).

    As a mapping: absolute VM path -> contents of the regular files (what ``files.write`` /
    ``files.read`` see). ``host(path)`` is where VM path ``path`` lives on the host, for tests that
    make what the files API cannot (modes, symlinks, FIFOs). A path resolving outside the VM's
    directory (an outward symlink) is treated as absent: in a real VM it would resolve inside the VM.
    """

    def __init__(self) -> None:
        self._root = ""

    @property
    def root(self) -> str:
        if not self._root:
            self._root = os.path.realpath(tempfile.mkdtemp(prefix="fake-e2b-vm-"))
            weakref.finalize(self, shutil.rmtree, self._root, True)
        return self._root

    def host(self, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"not an absolute VM path: {path!r}")
        return self.root + posixpath.normpath("/" + path.lstrip("/")).rstrip("/")

    def _inside(self, host: str) -> bool:
        real = os.path.realpath(host)
        return real == self.root or real.startswith(self.root + "/")

    def stat(self, path: str) -> tuple[os.stat_result, e2b.FileType, str | None] | None:
        """(lstat, type, link text) of VM path ``path``, None when there is nothing there."""
        host = self.host(path)
        try:
            st = os.lstat(host)
        except OSError:
            return None
        if os.path.islink(host):
            return st, e2b.FileType.SYMLINK, os.readlink(host)
        return st, e2b.FileType.DIR if os.path.isdir(host) else e2b.FileType.FILE, None

    def __getitem__(self, path: str) -> bytes:
        host = self.host(path)
        if not self._inside(host) or not os.path.isfile(host):
            raise KeyError(path)
        with open(host, "rb") as f:
            return f.read()

    def __setitem__(self, path: str, data: bytes) -> None:
        host = self.host(path)
        os.makedirs(os.path.dirname(host), exist_ok=True)
        if not self._inside(host):
            raise PermissionError(path)
        with open(host, "wb") as f:
            f.write(data)

    def __delitem__(self, path: str) -> None:
        host = self.host(path)
        if not os.path.isfile(host) or os.path.islink(host):
            raise KeyError(path)
        os.unlink(host)

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str) or not path.startswith("/"):
            return False
        host = self.host(path)
        return self._inside(host) and os.path.isfile(host)

    def __iter__(self) -> Iterator[str]:
        if not self._root:
            return
        for top, _dirs, names in os.walk(self._root):
            for name in names:
                full = os.path.join(top, name)
                if os.path.isfile(full) and not os.path.islink(full):
                    yield full[len(self._root) :]

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass
class FakeVM:
    sandbox_id: str
    template: str
    metadata: dict[str, str]
    envs: dict[str, str]
    allow_internet_access: bool | None
    started_at: datetime
    end_at: datetime
    state: str = "running"  # running | killed | expired
    files: FakeDisk = field(default_factory=FakeDisk)
    commands: list[RecordedCommand] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.state == "running"


@dataclass
class SandboxListing:
    """What ``list`` yields per VM (the fields of ``e2b.SandboxInfo`` the backend reads)."""

    sandbox_id: str
    metadata: dict[str, str]
    started_at: datetime
    end_at: datetime
    state: str
    template_id: str


class FakeCloud:
    """E2B's control plane and VMs, in memory."""

    def __init__(self, api_key: str = "e2b_fake_test_key_0123456789") -> None:
        self.api_key = api_key
        self.vms: dict[str, FakeVM] = {}
        self.idempotency: dict[str, str] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.responder: Responder | None = None
        self.handles: list[FakeCommandHandle] = []
        self.now = datetime(2030, 1, 1, tzinfo=UTC)
        self._failures: dict[str, list[BaseException]] = {}
        self._lost: set[str] = set()
        self._counter = 0

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

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        for vm in self.vms.values():
            if vm.alive and vm.end_at <= self.now:
                vm.state = "expired"

    def expire(self, sandbox_id: str) -> None:
        self.vms[sandbox_id].state = "expired"

    def alive(self, **metadata: str) -> list[FakeVM]:
        return [
            vm for vm in self.vms.values() if vm.alive and all(vm.metadata.get(k) == v for k, v in metadata.items())
        ]

    def count(self, method: str) -> int:
        return sum(1 for name, _ in self.calls if name == method)

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

    def new_id(self) -> str:
        self._counter += 1
        return f"fake{self._counter:04d}"

    def vm(self, sandbox_id: str) -> FakeVM:
        vm = self.vms.get(sandbox_id)
        if vm is None or not vm.alive:
            raise e2b.SandboxNotRunningException(
                f"The sandbox {sandbox_id} was not found: The sandbox was killed or reached its timeout."
            )
        return vm


class FakePaginator:
    """Like the SDK's: nothing is sent until ``next_items()``; pages of ``limit``."""

    def __init__(self, cloud: FakeCloud, wanted: dict[str, str], limit: int, opts: dict[str, Any]) -> None:
        self._cloud, self._wanted, self._opts = cloud, wanted, opts
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
                SandboxListing(vm.sandbox_id, dict(vm.metadata), vm.started_at, vm.end_at, "running", vm.template)
                for vm in self._cloud.vms.values()
                if vm.alive and all(vm.metadata.get(k) == v for k, v in self._wanted.items())
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
        cloud.enter("create", {"template": template, "idempotency_key": idempotency_key, **opts})
        if idempotency_key is not None and not re.fullmatch(r"[a-z0-9-]{1,255}", idempotency_key):
            raise e2b.InvalidArgumentException("Invalid idempotency_key")
        if metadata and not all(isinstance(v, str) for v in metadata.values()):
            raise e2b.InvalidArgumentException("metadata values must be strings")
        await asyncio.sleep(0)
        if idempotency_key is not None and idempotency_key in cloud.idempotency:
            vm = cloud.vms[cloud.idempotency[idempotency_key]]  # the API replays the first answer
        else:
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
            if idempotency_key is not None:
                cloud.idempotency[idempotency_key] = vm.sandbox_id
        cloud.leave("create")
        return cls(vm)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        timeout: int | None = None,  # noqa: ASYNC109  (the SDK's parameter)
        **opts: Any,
    ) -> FakeAsyncSandbox:
        cloud = cls.cloud
        cloud.enter("connect", {"sandbox_id": sandbox_id, "timeout": timeout, **opts})
        await asyncio.sleep(0)
        vm = cloud.vms.get(sandbox_id)
        if vm is None or not vm.alive:
            raise e2b.SandboxNotFoundException(f"Paused sandbox {sandbox_id} not found")
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
        return FakePaginator(cloud, wanted, limit or 100, opts)

    @classmethod
    async def kill(cls, sandbox_id: str, **opts: Any) -> bool:
        cloud = cls.cloud
        cloud.enter("kill", {"sandbox_id": sandbox_id, **opts})
        await asyncio.sleep(0)
        vm = cloud.vms.get(sandbox_id)
        if vm is None or not vm.alive:
            return False
        vm.state = "killed"
        return True

    async def set_timeout(self, timeout: int, **opts: Any) -> None:  # noqa: ASYNC109
        self.cloud.enter(
            "set_timeout", {"sandbox_id": self.sandbox_id, "timeout": timeout, "api_key": self.cloud.api_key}
        )
        self.cloud.vm(self.sandbox_id).end_at = self.cloud.now + timedelta(seconds=timeout)


class FakeFiles:
    def __init__(self, cloud: FakeCloud, vm: FakeVM) -> None:
        self._cloud, self._vm = cloud, vm

    async def write(self, path: str, data: str | bytes, user: str | None = None, **kwargs: Any) -> None:
        self._cloud.enter("write", {"path": path, "api_key": self._cloud.api_key})
        vm = self._cloud.vm(self._vm.sandbox_id)
        vm.files[path] = data.encode() if isinstance(data, str) else bytes(data)

    async def read(self, path: str, format: str = "text", user: str | None = None, **kwargs: Any) -> str | bytearray:
        self._cloud.enter("read", {"path": path, "api_key": self._cloud.api_key})
        vm = self._cloud.vm(self._vm.sandbox_id)
        if path not in vm.files:
            raise e2b.FileNotFoundException(f"file not found: {path}")
        data = vm.files[path]
        if format == "stream":  # Filesystem.read(format="stream") -> AsyncFileStreamReader (envd GET /files)
            return FakeFileStream(data)  # type: ignore[return-value]
        return bytearray(data) if format == "bytes" else data.decode()

    async def get_info(self, path: str, user: str | None = None, **kwargs: Any) -> e2b.EntryInfo:
        """Filesystem.get_info (envd ``filesystem.Stat``, which does not follow a final symlink)."""
        self._cloud.enter("get_info", {"path": path, "api_key": self._cloud.api_key})
        vm = self._cloud.vm(self._vm.sandbox_id)
        found = vm.files.stat(path)
        if found is None:
            raise e2b.FileNotFoundException(f"file not found: {path}")
        st, kind, target = found
        return e2b.EntryInfo(
            name=posixpath.basename(path),
            type=kind,
            path=path,
            size=st.st_size,
            mode=st.st_mode,
            permissions="",
            owner="user",
            group="user",
            modified_time=datetime.fromtimestamp(st.st_mtime, tz=UTC),
            symlink_target=target,
        )


class FakeFileStream:
    """Imitates ``e2b.sandbox.filesystem.filesystem.AsyncFileStreamReader``: an async iterator of byte chunks."""

    CHUNK = 64 * 1024

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._offset = 0
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self.closed or self._offset >= len(self._data):
            raise StopAsyncIteration
        chunk = self._data[self._offset : self._offset + self.CHUNK]
        self._offset += len(chunk)
        await asyncio.sleep(0)
        return chunk

    async def aclose(self) -> None:
        self.closed = True

    async def __aenter__(self) -> FakeFileStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class FakeCommandHandle:
    """What ``commands.run(..., background=True)`` returns: output is delivered while ``wait()`` runs."""

    def __init__(
        self,
        cloud: FakeCloud,
        vm: FakeVM,
        answer: tuple[int, str, str],
        on_stdout: Callable[[str], Any] | None,
        on_stderr: Callable[[str], Any] | None,
    ) -> None:
        self._cloud, self._vm = cloud, vm
        self._answer = answer
        self._on_stdout, self._on_stderr = on_stdout, on_stderr
        self.killed = False
        self._killed = asyncio.Event()

    async def wait(self) -> E2BCommandResult[Any]:
        code, out, err = self._answer
        if code == RUN_UNTIL_KILLED:  # `sleep infinity`
            await self._killed.wait()
        for text, callback in ((out, self._on_stdout), (err, self._on_stderr)):
            for start in range(0, len(text), 64 * 1024):
                if self.killed:
                    break
                if callback is not None:
                    callback(text[start : start + 64 * 1024])
                await asyncio.sleep(0)
        if self.killed:
            code = 137
        if not self._vm.alive:
            raise e2b.SandboxNotRunningException(f"The sandbox {self._vm.sandbox_id} was not found")
        if code != 0:  # like the SDK's: the (retained) output travels with the exception / the result
            raise e2b.CommandExitException(stdout=out, stderr=err, exit_code=code, error=None)
        return E2BCommandResult(stdout=out, stderr=err, exit_code=0, error=None)

    async def kill(self) -> bool:
        self.killed = True
        self._killed.set()
        return True


class FakeCommands:
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
        self._cloud.enter("run", {"cmd": cmd, "envs": envs, "api_key": self._cloud.api_key})
        vm = self._cloud.vm(self._vm.sandbox_id)
        vm.commands.append(RecordedCommand(cmd, None if envs is None else dict(envs), cwd, user, timeout, background))
        answer = self._interpret(vm, cmd, envs or {}, cwd or "/home/user")
        handle = FakeCommandHandle(self._cloud, vm, answer, on_stdout, on_stderr)
        self._cloud.handles.append(handle)
        if background:
            return handle
        return await handle.wait()

    def _interpret(self, vm: FakeVM, cmd: str, envs: dict[str, str], cwd: str) -> tuple[int, str, str]:
        if cmd.startswith("set -e"):
            return self._script(vm, cmd, envs)
        stdin = b""
        if " < " in cmd:  # `<argv> < /tmp/file; rc=$?; rm -f /tmp/file; exit $rc` (how the backend feeds stdin)
            cmd, rest = cmd.split(" < ", 1)
            path = shlex.split(rest.split(";", 1)[0])[0]
            stdin = vm.files.pop(path, b"")
        argv = shlex.split(cmd)
        wall: float | None = None
        if argv[:2] == ["timeout", "--verbose"]:  # timeout --verbose -k N WALL argv...
            wall = float(argv[4])
            argv = argv[5:]
        if self._cloud.responder is not None:
            answer = self._cloud.responder(vm, argv, cwd, stdin)
            if answer is not None:
                return answer
        if cmd.startswith("mkdir -p /workspace"):  # the backend's workspace preparation, done for real
            os.makedirs(vm.files.host("/workspace"), exist_ok=True)
            os.chmod(vm.files.host("/workspace"), 0o777)
            return 0, "", ""
        return self._builtin(vm, argv, envs, cwd, stdin, wall)

    SCRIPT_ROOTS = re.compile(r"(?<![\w/.-])(/workspace|/tmp|/home/user)(?=[/'\"\s;]|$)")

    def _script(self, vm: FakeVM, cmd: str, envs: dict[str, str]) -> tuple[int, str, str]:
        """envd's ``process.Start`` runs ``/bin/bash -l -c cmd``: here a real bash on the host, against
        the VM's directory (the VM paths the script names are rewritten into it), with an empty
        environment but ``PATH`` and ``HOME``, like the VM's."""
        root = vm.files.root
        for top in ("/workspace", "/tmp", "/home/user"):
            os.makedirs(vm.files.host(top), exist_ok=True)
        script = self.SCRIPT_ROOTS.sub(lambda m: root + m.group(1), cmd)
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
    ) -> tuple[int, str, str]:
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
