"""The URLs ``http_request`` sees: one canonical spelling of each, and the ``AGENT_HTTP_ALLOW`` list they meet.

Layers 1 and 2 of :mod:`activities.tools.egress` (which also holds the endpoints no allow list opens).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

DEFAULT_PORTS = {"http": 80, "https": 443}
PORTLESS_PORTS = frozenset({80, 443})  # what an allow-list entry without a port opens
MAX_URL_CHARS = 8192

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)")


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
