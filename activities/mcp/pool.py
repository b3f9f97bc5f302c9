"""MCP server connections the worker manages: started on first use, shared, restarted, stopped with the worker.

A stdio server is one process per worker process, shared by every run (``per_run`` servers: one per
run, stopped when the run ends or has been idle for ``PER_RUN_IDLE_S``). A Streamable HTTP server is
one client session per worker process. A connection that dies (the process exits, the HTTP session
ends) is dropped and the next call starts a new one.

The SDK's ``Client`` must be entered and left in one task (anyio cancel scopes), so each connection
is owned by a background task that holds it open until it is closed; calls from activities use the
session concurrently (JSON-RPC multiplexes them). Every wait is bounded: starting by
``startup_timeout_s``, a call by its timeout, closing by ``CLOSE_TIMEOUT_S``, so a hung server never
hangs a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO, cast

import structlog

from activities.mcp.config import McpConfig, McpServerConfig, for_tenant
from activities.redaction import clip
from activities.settings import Settings
from activities.tenant_secrets import SecretUnavailable

# The SDK (the mcp extra) is imported where a connection is made, and only a configured server makes one
# (load_mcp_config requires the extra), so a worker without MCP servers runs without it.
if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import CallToolResult, Tool

CONNECTION_CLOSED = -32000
REQUEST_TIMEOUT = -32001
CLOSE_TIMEOUT_S = 5.0
PING_TIMEOUT_S = 5.0
PER_RUN_IDLE_S = 600.0
MAX_PER_RUN_CONNECTIONS = 64
MAX_TOOLS_PER_SERVER = 500
STDERR_LINE_CHARS = 2000
STDERR_LINES_PER_MINUTE = 120  # a server flooding stderr cannot flood the worker's log
log = structlog.get_logger("activities.mcp")


class McpError(Exception):
    """Base of the MCP connection errors."""


class McpUnavailable(McpError):
    """The server could not be started or reached: nothing was sent, so nothing happened."""


class McpCallLost(McpError):
    """The connection ended or the call timed out after the request was sent: it may or may not have run."""


class McpCallTimedOut(McpCallLost):
    """No answer within the call's timeout."""


@dataclass
class _Connection:
    name: str
    config: McpServerConfig
    secrets: tuple[str, ...]
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    client: Client | None = None
    failure: str = ""
    dead: bool = False
    owner: asyncio.Task[None] | None = None
    last_used: float = field(default_factory=time.monotonic)

    async def start(self) -> None:
        self.owner = asyncio.create_task(self._own(), name=f"mcp-server-{self.name}")
        try:
            await asyncio.wait_for(self.ready.wait(), self.config.startup_timeout_s)
        except TimeoutError:
            await self.close()
            raise McpUnavailable(
                f"MCP server {self.name!r} did not start within {self.config.startup_timeout_s} s"
            ) from None
        if self.client is None:
            await self.close()
            raise McpUnavailable(f"MCP server {self.name!r} could not be started: {self.failure}")

    async def _own(self) -> None:
        import httpx2
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        stderr: _StderrLog | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.config.transport == "stdio":
                    stderr = _StderrLog(self.name, self.secrets)
                    params = StdioServerParameters(
                        command=self.config.command,
                        args=self.config.args,
                        env=self.config.env or None,
                        cwd=self.config.cwd or None,
                    )
                    transport: Any = stdio_client(params, errlog=stderr.writer)
                else:
                    http = create_mcp_http_client(
                        headers=self.config.headers or None,
                        timeout=httpx2.Timeout(30.0, read=max(300.0, float(self.config.timeout_s))),
                    )
                    await stack.enter_async_context(http)
                    transport = streamable_http_client(self.config.url, http_client=http)
                client = Client(transport, read_timeout_seconds=float(self.config.timeout_s), cache=None)
                await stack.enter_async_context(client)
                if stderr is not None:
                    stderr.spawned()
                self.client = client
                self.ready.set()
                log.info("mcp_server_started", server=self.name, transport=self.config.transport)
                await self.stop.wait()
        except BaseException as exc:  # the owner must never raise: it runs detached
            self.failure = clip(_first_line(exc), 500, self.secrets)
            if self.client is not None and not isinstance(exc, asyncio.CancelledError):
                log.warning("mcp_server_connection_ended", server=self.name, error=self.failure)
        finally:
            self.dead = True
            self.client = None
            self.ready.set()
            if stderr is not None:
                stderr.close()

    async def close(self) -> None:
        self.dead = True
        self.stop.set()
        owner = self.owner
        if owner is None or owner.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(owner), CLOSE_TIMEOUT_S)
        except (TimeoutError, asyncio.CancelledError):
            owner.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(owner, CLOSE_TIMEOUT_S)


class McpPool:
    """The worker's connections to its configured MCP servers (see the module docstring)."""

    def __init__(self, config: McpConfig, secrets: tuple[str, ...] = (), settings: Settings | None = None) -> None:
        """``settings`` resolve a ``per_run`` server's ``${secret:NAME}`` values (for the run's tenant)."""
        self.config = config
        self.settings = settings or Settings()
        self._secrets = tuple(dict.fromkeys([*config.secrets, *secrets]))
        self._connections: dict[tuple[str, str], _Connection] = {}
        self._starting: dict[tuple[str, str], asyncio.Lock] = {}
        self._closed = False

    def server(self, name: str) -> McpServerConfig | None:
        return self.config.server(name)

    async def list_tools(self, server: str, run: str = "", tenant: str = "") -> list[Tool]:
        """The server's tools (every page, at most ``MAX_TOOLS_PER_SERVER``); ``McpUnavailable`` if it cannot answer.

        A ``per_run`` server is started for ``run`` of ``tenant`` (its ``${secret:NAME}`` values are that tenant's).
        """
        from mcp.shared.exceptions import MCPError

        async with self._session(server, run, tenant) as connection:
            assert connection.client is not None
            tools: list[Tool] = []
            cursor: str | None = None
            timeout = connection.config.startup_timeout_s
            try:
                while len(tools) < MAX_TOOLS_PER_SERVER:
                    page = await asyncio.wait_for(connection.client.list_tools(cursor=cursor), timeout)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
            except (MCPError, TimeoutError, OSError) as exc:
                await self._drop(connection)
                raise McpUnavailable(f"MCP server {server!r} did not list its tools: {_first_line(exc)}") from None
            return tools[:MAX_TOOLS_PER_SERVER]

    async def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        timeout_s: float,
        meta: dict[str, Any] | None = None,
        run: str = "",
        tenant: str = "",
        check_alive: bool = False,
    ) -> CallToolResult:
        """Call ``tool``; ``McpUnavailable`` when nothing was sent, ``McpCallLost`` when the outcome is unknown.

        With ``check_alive`` (side effects), the connection is pinged first, so that a server that died
        while idle is restarted before the request instead of turning the call's outcome unknown.
        """
        import httpx2
        from mcp.shared.exceptions import MCPError

        async with self._session(server, run, tenant, check_alive=check_alive) as connection:
            assert connection.client is not None
            try:
                result = await asyncio.wait_for(
                    connection.client.call_tool(tool, arguments, read_timeout_seconds=timeout_s, meta=cast(Any, meta)),
                    timeout_s + PING_TIMEOUT_S,
                )
            except TimeoutError:
                raise McpCallTimedOut(f"MCP tool {server}.{tool} did not answer within {timeout_s:g} s") from None
            except MCPError as exc:
                if exc.code == REQUEST_TIMEOUT:
                    raise McpCallTimedOut(f"MCP tool {server}.{tool} did not answer within {timeout_s:g} s") from None
                if exc.code == CONNECTION_CLOSED:
                    await self._drop(connection)
                    raise McpCallLost(
                        f"MCP server {server!r} went away during the call ({connection.failure or exc.error.message})"
                    ) from None
                raise  # a protocol error the server answered with: the caller turns it into a tool error
            except (OSError, httpx2.HTTPError) as exc:
                await self._drop(connection)
                raise McpCallLost(
                    f"MCP server {server!r} connection failed during the call: {_first_line(exc)}"
                ) from None
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # the activity itself is being cancelled
                # The SDK's Streamable HTTP transport cancels an in-flight call when the server
                # disconnects (python-sdk #1577) instead of raising: the connection is gone.
                await self._drop(connection)
                raise McpCallLost(f"MCP server {server!r} disconnected during the call") from None
            return result

    @contextlib.asynccontextmanager
    async def _session(
        self, server: str, run: str, tenant: str, *, check_alive: bool = False
    ) -> AsyncIterator[_Connection]:
        config = self.config.server(server)
        if config is None:
            raise McpUnavailable(f"MCP server {server!r} is not configured on this worker")
        key = (server, run if config.per_run else "")
        connection = await self._connection(key, config, tenant)
        if check_alive and not await self._alive(connection):
            await self._drop(connection)
            connection = await self._connection(key, config, tenant)
        connection.last_used = time.monotonic()
        yield connection

    async def _alive(self, connection: _Connection) -> bool:
        import httpx2
        from mcp.shared.exceptions import MCPError

        if connection.dead or connection.client is None:
            return False
        try:
            # ``ping`` is gone from the 2026-07-28 protocol; listing tools is the cheapest request every server answers.
            await asyncio.wait_for(connection.client.list_tools(), PING_TIMEOUT_S)
        except (MCPError, TimeoutError, OSError, httpx2.HTTPError):
            return False
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return False
        return True

    async def _connection(self, key: tuple[str, str], config: McpServerConfig, tenant: str) -> _Connection:
        if self._closed:
            raise McpUnavailable("the worker is shutting down")
        lock = self._starting.setdefault(key, asyncio.Lock())
        async with lock:  # one start per server (and run) at a time, however many calls arrive
            existing = self._connections.get(key)
            if existing is not None and not existing.dead:
                return existing
            await self._reap_idle()
            secrets = self._secrets
            if config.per_run:  # started with its run's tenant's credentials (none without a run)
                try:
                    config, used = for_tenant(config, self.settings, tenant)
                except SecretUnavailable as exc:
                    raise McpUnavailable(f"MCP server {key[0]!r} could not be started: {exc}") from None
                secrets = (*secrets, *used)
            connection = _Connection(key[0], config, secrets)
            await connection.start()
            self._connections[key] = connection
            return connection

    async def _drop(self, connection: _Connection) -> None:
        for key, known in list(self._connections.items()):
            if known is connection:
                del self._connections[key]
                lock = self._starting.get(key)
                if key[1] and lock is not None and not lock.locked():
                    del self._starting[key]  # one lock per run would otherwise stay for good
        await connection.close()

    async def _reap_idle(self) -> None:
        """Stop per-run servers idle for ``PER_RUN_IDLE_S``, and the least recently used beyond the cap."""
        now = time.monotonic()
        per_run = sorted(
            ((key, c) for key, c in self._connections.items() if key[1]), key=lambda item: item[1].last_used
        )
        excess = max(0, len(per_run) - MAX_PER_RUN_CONNECTIONS + 1)
        for index, (_key, connection) in enumerate(per_run):
            if index < excess or now - connection.last_used > PER_RUN_IDLE_S:
                await self._drop(connection)

    async def release_run(self, run: str) -> int:
        """Stop the per-run servers of ``run``; how many were running."""
        mine = [c for key, c in self._connections.items() if key[1] == run]
        for connection in mine:
            await self._drop(connection)
        return len(mine)

    def running(self) -> list[tuple[str, str]]:
        """(server, run) of every live connection ("" for shared ones)."""
        return [key for key, c in self._connections.items() if not c.dead]

    async def aclose(self) -> None:
        """Stop every server (bounded by ``CLOSE_TIMEOUT_S`` each, concurrently)."""
        self._closed = True
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)


class _StderrLog:
    """A stdio server's stderr, one structured log line per line, tagged with the server, redacted and bounded."""

    def __init__(self, server: str, secrets: tuple[str, ...]) -> None:
        self.server = server
        self.secrets = secrets
        read_fd, write_fd = os.pipe()
        self.writer = cast(TextIO, os.fdopen(write_fd, "w"))
        self._reader = os.fdopen(read_fd, "r", errors="replace")
        self._thread = threading.Thread(target=self._pump, name=f"mcp-stderr-{server}", daemon=True)
        self._thread.start()

    def spawned(self) -> None:
        # The child holds its own copy; closing ours lets the reader see EOF when the child exits.
        with contextlib.suppress(OSError):
            self.writer.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()

    def _pump(self) -> None:
        window_start, in_window, dropped = time.monotonic(), 0, 0
        try:
            while True:
                line = self._reader.readline(STDERR_LINE_CHARS)
                if not line:
                    break
                now = time.monotonic()
                if now - window_start > 60:
                    if dropped:
                        log.warning("mcp_server_stderr_dropped", server=self.server, lines=dropped)
                    window_start, in_window, dropped = now, 0, 0
                in_window += 1
                if in_window > STDERR_LINES_PER_MINUTE:
                    dropped += 1
                    continue
                text = clip(line.rstrip("\n"), STDERR_LINE_CHARS, self.secrets)
                if text:
                    log.info("mcp_server_stderr", server=self.server, line=text)
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                self._reader.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _first_line(exc.exceptions[0])
    return (text.splitlines() or [""])[0][:500] or type(exc).__name__
