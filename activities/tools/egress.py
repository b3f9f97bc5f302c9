"""Where ``http_request`` may connect: canonical URLs, the allow list, and the always-denied endpoints.

Three layers, applied to one URL, the canonical one, which is also the URL requested:

1. :func:`canonical_url` (run by ``HttpRequestArgs`` when the model's call is
   validated, so policy rules, approvals, idempotency keys and the request all
   see the same string): scheme and host lower-cased, IDNA host, numeric IPv4
   spellings (``2130706433``, ``0x7f.1``) as dotted quads, IPv6 compressed, the
   port only when it is not the scheme's default (RFC 3986 6.2.3, so existing
   rules anchored on ``https://host/`` keep matching), percent-encoded
   unreserved characters decoded, ``\\`` read as ``/`` (as browsers do),
   dot-segments removed, no fragment. URLs with ``user:password@`` are refused.
2. :func:`host_allowed`: ``AGENT_HTTP_ALLOW`` entries are ``host`` (ports 80 and
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
import re
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

DEFAULT_PORTS = {"http": 80, "https": 443}
PORTLESS_PORTS = frozenset({80, 443})  # what an allow-list entry without a port opens
MAX_URL_CHARS = 8192
RESOLVE_TIMEOUT_S = 10.0
TEMPORAL_HTTP_PORT_OFFSET = 10  # Temporal's frontend serves its HTTP API on the gRPC port + 10 by default
POSTGRES_PORT = 5432
LOCAL = "(this host)"  # the key every local address (loopback, 0.0.0.0, the worker's own) shares

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)")
_METADATA_NETWORKS = tuple(
    ipaddress.ip_network(net) for net in ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_ZERO_NET = ipaddress.ip_network("0.0.0.0/8")


class EgressRefused(Exception):
    """A connection the guard refused; ``http_request`` turns it into an error the model reads."""


# --- canonical URLs ---------------------------------------------------------------------------------------------


def canonical_url(raw: str) -> str:
    """The canonical form of an absolute http(s) URL; ``ValueError`` (one readable line) when there is none."""
    if len(raw) > MAX_URL_CHARS:
        raise ValueError(f"the URL is longer than {MAX_URL_CHARS} characters")
    try:
        url = httpx.URL(raw.strip())
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(f"invalid URL {raw!r}: {exc}") from None
    if url.scheme not in DEFAULT_PORTS or not url.raw_host:
        raise ValueError(f"{raw!r} is not an absolute http:// or https:// URL")
    if url.userinfo:
        raise ValueError("URLs with credentials (user:password@host) are refused; send credentials in a header")
    host = canonical_host(url.raw_host.decode("ascii"))
    port = DEFAULT_PORTS[url.scheme] if url.port is None else url.port
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is out of range (1-65535)")
    path, _, query = url.raw_path.decode("ascii").partition("?")
    path = _remove_dot_segments(_normalize_percent(path.replace("\\", "/")) or "/")
    netloc = host if port == DEFAULT_PORTS[url.scheme] else f"{host}:{port}"
    text = f"{url.scheme}://{netloc}{path}" + (f"?{_normalize_percent(query)}" if query else "")
    # what httpx will request must be this very string, or policy and request could disagree
    again = httpx.URL(text)
    if again.raw_path.decode("ascii") != path + (f"?{_normalize_percent(query)}" if query else "") or (
        again.raw_host.decode("ascii") != host.strip("[]")
    ):
        raise ValueError(f"{raw!r} has no stable canonical form")
    return text


def canonical_host(host: str) -> str:
    """Lower-case name without a trailing dot, dotted-quad IPv4 or ``[compressed IPv6]``; ``ValueError`` else."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        if "%" in host:
            raise ValueError(f"IPv6 zone identifiers are not supported ({host!r})")
        try:
            return f"[{ipaddress.IPv6Address(host).compressed}]"
        except ValueError:
            raise ValueError(f"invalid IPv6 address {host!r}") from None
    host = host.rstrip(".")
    if not host:
        raise ValueError("the URL has no host")
    if _NUMERIC_LABEL.fullmatch(host.rsplit(".", 1)[-1]):  # a name ending in a number is an IPv4 address
        return str(_parse_ipv4(host))
    if not _HOST_NAME.fullmatch(host):
        raise ValueError(f"invalid host name {host!r}")
    return host


def _parse_ipv4(host: str) -> ipaddress.IPv4Address:
    """IPv4 in any spelling ``inet_aton`` (and so the resolver) accepts: ``127.1``, ``0x7f.0.0.1``, ``0177.0.0.1``."""
    parts = host.split(".")
    if len(parts) > 4:
        raise ValueError(f"invalid IPv4 address {host!r}")
    numbers = []
    for part in parts:
        try:
            if part.startswith("0x"):
                numbers.append(int(part[2:] or "0", 16))
            elif len(part) > 1 and part.startswith("0"):
                numbers.append(int(part, 8))
            else:
                numbers.append(int(part, 10))
        except ValueError:
            raise ValueError(f"invalid IPv4 address {host!r}") from None
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        raise ValueError(f"invalid IPv4 address {host!r}")
    value = last
    for index, n in enumerate(head):
        value += n << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _normalize_percent(text: str) -> str:
    """Decode percent-encoded unreserved characters (``%61`` -> ``a``, ``%2E`` -> ``.``); upper-case the rest."""

    def fix(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else "%" + match.group(1).upper()

    return _PERCENT.sub(fix, text)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4 on an absolute path: ``/a/./b/../c`` -> ``/a/c``; never climbs above ``/``."""
    out: list[str] = []
    segments = path.split("/")[1:]
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment in (".", ".."):
            if segment == ".." and out:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(segment)
    return "/" + "/".join(out)


# --- the allow list ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllowEntry:
    host: str  # canonical (IPv6 in brackets)
    low: int
    high: int

    def allows(self, host: str, port: int) -> bool:
        if host != self.host:
            return False
        if (self.low, self.high) == (0, 0):
            return port in PORTLESS_PORTS
        return self.low <= port <= self.high


def parse_allow_entry(entry: str) -> AllowEntry:
    """``host`` (ports 80/443), ``host:port``, ``host:low-high``, ``[v6]:port`` or a bare IPv6; ``ValueError``."""
    text = entry.strip().lower()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"invalid AGENT_HTTP_ALLOW entry {entry!r}")
        ports = rest[1:]
    elif text.count(":") == 1:
        host, _, ports = text.partition(":")
    else:  # a plain host name, or a bare IPv6 address
        host, ports = text, ""
    host = canonical_host(host)
    if not ports:
        return AllowEntry(host, 0, 0)
    low, sep, high = ports.partition("-")
    if not low.isdigit() or (sep and not high.isdigit()):
        raise ValueError(f"invalid port in AGENT_HTTP_ALLOW entry {entry!r}")
    first, last = int(low), int(high) if sep else int(low)
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"invalid port range in AGENT_HTTP_ALLOW entry {entry!r}")
    return AllowEntry(host, first, last)


def allow_entries(allow: Iterable[str]) -> list[AllowEntry]:
    """The valid entries; an invalid one allows nothing (fail closed)."""
    entries = []
    for entry in allow:
        try:
            entries.append(parse_allow_entry(entry))
        except ValueError:
            continue
    return entries


def url_host_port(url: httpx.URL) -> tuple[str, int]:
    """The canonical host and the port a URL connects to."""
    port = DEFAULT_PORTS.get(url.scheme, -1) if url.port is None else url.port
    return canonical_host(url.raw_host.decode("ascii")), port


def host_allowed(url: httpx.URL, allow: Iterable[str]) -> bool:
    """Whether ``url``'s host and port match an ``AGENT_HTTP_ALLOW`` entry; an empty list allows nothing."""
    try:
        host, port = url_host_port(url)
    except ValueError:
        return False
    return any(entry.allows(host, port) for entry in allow_entries(allow))


def not_allowed_message(host: str, port: int, allow: Iterable[str]) -> str:
    listed = ", ".join(allow) or "empty: no host is allowed"
    return (
        f"host {host}:{port} is not allowed: outbound HTTP is limited to the hosts in AGENT_HTTP_ALLOW "
        f"({listed}; an entry without a port allows only ports 80 and 443); ask the operator to add it"
    )


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
