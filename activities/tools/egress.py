"""Where ``http_request`` may connect: canonical URLs, the allow list, and the always-denied endpoints.

Three layers, applied to one URL, the canonical one, which is also the URL requested (layers 1 and 2
are :mod:`activities.tools.urls`; this module is layer 3, the guard, and the HTTP client's network
backend that enforces it):

1. :func:`~activities.tools.urls.canonical_url` (run by ``HttpRequestArgs`` when the model's call is
   validated, so policy rules, approvals, idempotency keys and the request all
   see the same string): scheme and host lower-cased, IDNA host, numeric IPv4
   spellings (``2130706433``, ``0x7f.1``) as dotted quads, IPv6 compressed, the
   port only when it is not the scheme's default (RFC 3986 6.2.3, so existing
   rules anchored on ``https://host/`` keep matching), percent-encoded
   unreserved characters decoded, ``\\`` read as ``/`` (as browsers do),
   dot-segments removed, no fragment. URLs with ``user:password@`` are refused.
2. :func:`~activities.tools.urls.host_allowed`: ``AGENT_HTTP_ALLOW`` entries are ``host`` (ports 80 and
   443 only), ``host:port`` or ``host:low-high``; a host is matched by name, so
   ``127.0.0.1`` does not allow ``localhost``.
3. :class:`EgressGuard`: endpoints no allow list can open: the worker's Temporal
   frontend, its HTTP API (``TEMPORAL_HTTP_PORT``, and the frontend port + 10
   that Temporal uses by default) and its Web UI (which proxies that API), the
   worker's metrics port, a PostgreSQL run store, and link-local / cloud
   metadata addresses (169.254.0.0/16, fe80::/10, fd00:ec2::254,
   100.100.100.200). Loopback, ``0.0.0.0`` and the worker's own addresses count
   as one host, so ``127.0.0.2:9464`` is the metrics port too. The guard runs
   twice: statically on the URL (names and literals, no DNS) before any approval
   is asked, and at connect time inside the HTTP client's network backend, on
   the addresses the name resolved to, for the first request and every
   redirect. The connection is then made to exactly those checked addresses
   (TLS still verifies the certificate against the host name), so a DNS answer
   that changes between check and connect (rebinding) cannot slip through.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpcore
import httpx

from activities.settings import Settings
from activities.store_urls import conninfo
from activities.tools.urls import DEFAULT_PORTS, canonical_host

RESOLVE_TIMEOUT_S = 10.0
TEMPORAL_HTTP_PORT_OFFSET = 10  # Temporal's frontend serves its HTTP API on the gRPC port + 10 by default
POSTGRES_PORT = 5432
LOCAL = "(this host)"  # the key every local address (loopback, 0.0.0.0, the worker's own) shares

_METADATA_NETWORKS = tuple(
    ipaddress.ip_network(net) for net in ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_ZERO_NET = ipaddress.ip_network("0.0.0.0/8")


class EgressRefused(Exception):
    """A connection the guard refused; ``http_request`` turns it into an error the model reads."""


# --- always denied ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Protected:
    host: str  # canonical host name, IP address (no brackets) or LOCAL
    port: int
    what: str


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def _is_metadata(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return any(address.version == net.version and address in net for net in _METADATA_NETWORKS)


def _host_port(address: str, default_port: int) -> tuple[str, int] | None:
    """``host:port`` / ``[v6]:port`` / ``host`` -> (canonical host, port)."""
    parts = urlsplit(f"//{address.strip()}")
    try:
        port = parts.port or default_port
        return canonical_host(parts.hostname or ""), port
    except ValueError:
        return None


def _conninfo_endpoints(params: dict[str, str]) -> list[tuple[str, int]]:
    ports = [p.strip() for p in params.get("port", "").split(",")]
    pairs = []
    for key in ("host", "hostaddr"):
        for i, host in enumerate(h.strip() for h in params.get(key, "").split(",")):
            if not host or host.startswith("/"):  # a directory is a Unix socket, not reachable over HTTP
                continue
            port = ports[i] if i < len(ports) and ports[i].isdigit() else ports[0]
            try:
                pairs.append((canonical_host(host), int(port) if port.isdigit() else POSTGRES_PORT))
            except ValueError:
                continue
    return pairs or [("localhost", POSTGRES_PORT)]


def protected_endpoints(settings: Settings) -> list[Protected]:
    """Every endpoint of the worker's own infrastructure, from its settings."""
    found: list[Protected] = []
    temporal = _host_port(settings.temporal.address, 7233)
    if temporal is not None:
        host, port = temporal
        found.append(Protected(host, port, "the worker's Temporal frontend"))
        http_ports = {port + TEMPORAL_HTTP_PORT_OFFSET}
        if settings.temporal.http_port:
            http_ports.add(settings.temporal.http_port)
        found += [Protected(host, p, "the worker's Temporal HTTP API") for p in sorted(http_ports) if p <= 65535]
    ui = urlsplit(settings.temporal.ui_url)
    if ui.scheme in DEFAULT_PORTS and ui.hostname:
        with contextlib.suppress(ValueError):
            found.append(
                Protected(canonical_host(ui.hostname), ui.port or DEFAULT_PORTS[ui.scheme], "the Temporal Web UI")
            )
    if settings.observability.metrics_port:
        found.append(Protected(LOCAL, settings.observability.metrics_port, "the worker's metrics endpoint"))
    if settings.worker.health_port:
        found.append(Protected(LOCAL, settings.worker.health_port, "the worker's health endpoint"))
    for host, port in postgres_endpoints(settings.store_url):
        found.append(Protected(host, port, "the run store (PostgreSQL)"))
    return found


def postgres_endpoints(store_url: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` pairs of a ``postgresql://`` store URL (several hosts, ``?host=``/``?port=`` too) or of
    a conninfo store URL (``host=``, ``hostaddr=``, ``port=``)."""
    params = conninfo(store_url)
    if params is not None:
        return _conninfo_endpoints(params)
    if not store_url.startswith(("postgresql://", "postgres://")):
        return []
    rest = store_url.split("://", 1)[1]
    netloc = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    query = store_url.partition("?")[2]
    params = dict(parse_qsl(query))
    pairs = []
    for item in netloc.split(","):
        if not item:
            continue
        found = _host_port(item, int(params["port"]) if params.get("port", "").isdigit() else POSTGRES_PORT)
        if found is not None:
            pairs.append(found)
    for host in params.get("host", "").split(","):
        if host and not host.startswith("/"):  # a directory is a Unix socket, not reachable over HTTP
            port = int(params["port"]) if params.get("port", "").isdigit() else POSTGRES_PORT
            try:
                pairs.append((canonical_host(host), port))
            except ValueError:
                continue
    return pairs or [("localhost", POSTGRES_PORT)]


_own_addresses: tuple[float, frozenset[str]] = (0.0, frozenset())


async def own_addresses() -> frozenset[str]:
    """The worker's own addresses (its host name resolved), refreshed every minute; best effort."""
    global _own_addresses
    stamp, addresses = _own_addresses
    if time.monotonic() - stamp < 60:
        return addresses
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM),
            timeout=2.0,
        )
        addresses = frozenset(str(_ip(str(info[4][0]))) for info in infos)
    except (OSError, TimeoutError):
        addresses = frozenset()
    _own_addresses = (time.monotonic(), addresses)
    return addresses


def _key(address: ipaddress.IPv4Address | ipaddress.IPv6Address, own: frozenset[str]) -> str:
    if address.is_loopback or address.is_unspecified or address in _ZERO_NET or str(address) in own:
        return LOCAL
    return str(address)


class EgressGuard:
    """The always-denied endpoints of one worker (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.protected = protected_endpoints(settings)

    def static_refusal(self, host: str, port: int) -> str | None:
        """A reason to refuse ``host:port`` known without DNS (a literal address, ``localhost``, a protected name)."""
        key = self._static_key(host)
        address = _ip(host)
        if address is not None and _is_metadata(address):
            return _metadata_message(host, address)
        for endpoint in self.protected:
            if (self._static_key(endpoint.host), endpoint.port) == (key, port):
                return _protected_message(host, port, endpoint)
        return None

    async def checked_addresses(self, host: str, port: int) -> list[str]:
        """The addresses ``host`` resolves to, every one checked; :class:`EgressRefused` if any is denied."""
        reason = self.static_refusal(canonical_host(host), port)
        if reason:
            raise EgressRefused(reason)
        own = await own_addresses()
        addresses = await _resolve(host, port)
        protected: dict[tuple[str, int], Protected] = {}
        for endpoint in self.protected:
            for key in await self._keys(endpoint.host, own):
                protected.setdefault((key, endpoint.port), endpoint)
        for text in addresses:
            address = _ip(text)
            if address is None:
                raise EgressRefused(f"{host} resolved to {text!r}, which is not an IP address")
            if _is_metadata(address):
                raise EgressRefused(_metadata_message(f"{host} ({text})", address))
            hit = protected.get((_key(address, own), port))
            if hit is not None:
                raise EgressRefused(_protected_message(f"{host} ({text})", port, hit))
        return addresses

    async def _keys(self, host: str, own: frozenset[str]) -> set[str]:
        literal = _ip(host)
        if literal is not None:
            return {_key(literal, own)}
        keys = {self._static_key(host)}
        if keys == {LOCAL}:
            return keys
        try:
            addresses = await _resolve(host, 0)
        except (OSError, TimeoutError, httpcore.ConnectError):
            return keys  # an unresolvable infrastructure name still matches by name
        for text in addresses:
            address = _ip(text)
            if address is not None:
                keys.add(_key(address, own))
        return keys

    @staticmethod
    def _static_key(host: str) -> str:
        if host == LOCAL or host == "localhost" or host.endswith(".localhost"):
            return LOCAL
        address = _ip(host)
        if address is None:
            return host
        if address.is_loopback or address.is_unspecified or address in _ZERO_NET:
            return LOCAL
        return str(address)


def _metadata_message(host: str, address: Any) -> str:
    return f"{host} is a link-local / cloud metadata address ({address}): always denied, whatever AGENT_HTTP_ALLOW says"


def _protected_message(host: str, port: int, endpoint: Protected) -> str:
    return f"{host}:{port} is {endpoint.what}: always denied, whatever AGENT_HTTP_ALLOW says"


async def _resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (a literal is itself), in the resolver's order."""
    bare = host.strip("[]")
    if _ip(bare) is not None:
        return [bare]
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(bare, port, type=socket.SOCK_STREAM), timeout=RESOLVE_TIMEOUT_S)
    except socket.gaierror as exc:
        raise httpcore.ConnectError(f"cannot resolve {host}: {exc.strerror or exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# --- the HTTP client's network backend --------------------------------------------------------------------------


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves and checks every connection's host, then connects to the checked addresses only."""

    def __init__(self, guard: EgressGuard) -> None:
        self._guard = guard
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self._guard.checked_addresses(host, port)
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise EgressRefused("Unix sockets are never reachable from http_request")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport (no proxies, no environment), its connections made through the guard."""

    def __init__(self, guard: EgressGuard) -> None:
        super().__init__(trust_env=False)
        if not isinstance(getattr(self, "_pool", None), httpcore.AsyncConnectionPool):
            raise RuntimeError("httpx's transport changed shape: the egress guard cannot be installed")
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False), network_backend=_GuardedBackend(guard)
        )
