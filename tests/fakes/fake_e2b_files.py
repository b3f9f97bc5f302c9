"""The fake E2B VM's filesystem (a real directory per VM) and its files API (``vm.files``), imitating
``e2b.sandbox_async.filesystem.filesystem.Filesystem`` (envd's ``filesystem`` service and ``/files``)."""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import tempfile
import weakref
from collections.abc import AsyncIterator, Iterator, MutableMapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import e2b

if TYPE_CHECKING:
    from tests.fakes.fake_e2b import FakeCloud, FakeVM


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
