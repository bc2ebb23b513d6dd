"""The sandbox egress proxy: a sandboxed tool reaches only the hosts its token grants.

A sandbox has an empty network namespace; its only way out is this proxy, listening on
a unix socket that is bind-mounted into that one sandbox (and/or on ``127.0.0.1:0`` for
tools isolated as plain processes). Each listener is an :class:`EgressSession` opened
with an :class:`EgressGrant`: the invocation, its tenant and the hosts of the token's
``network_permissions``. One :class:`EgressProxy` serves many sessions.

The proxy speaks just enough HTTP/1.1: ``CONNECT host:port`` opens a tunnel (HTTPS and
any other TCP protocol), and a request with an absolute ``http://`` URI is forwarded
(hop-by-hop headers and ``Proxy-Authorization`` stripped, ``Connection: close`` on both
sides: one request per client connection). Anything else gets a short refusal:

    400  malformed request (the proxy keeps serving other connections)
    403  not_granted      the token names no such host and port
    403  private_address  the name resolves only to private, loopback, link-local,
                          multicast or metadata addresses the grant does not name
    429  too_many_connections
    502  unresolvable / connect_failed, 504 connect_timeout

Grant entries (``network_permissions``), case-insensitive::

    api.example.com           ports 80 and 443
    api.example.com:8443      that port only (``:*``: any port)
    *.example.com             any name under example.com, not example.com itself
    *                         any public host (private addresses stay refused)
    93.184.216.34, [2001:db8::1]:443, 10.0.0.0/8:5432   addresses and networks

SSRF: a name is resolved once, only after the grant admitted it (a DNS query for a
host not granted is itself a leak), every address is checked, and the proxy connects to
an address it checked (no second resolution, so DNS rebinding cannot swap it). A
non-public address is reachable only when an address entry of the grant covers it:
granting a name alone never reaches loopback or the cloud metadata service.

Every refusal is an :class:`EgressRecord` for the :class:`EgressAudit` port (allowed
connections too unless :attr:`EgressLimits.audit_allowed` is off); records carry the
invocation, tenant, host, port, method, decision and reason, never a header, a path or a
body. :meth:`EgressSession.usage` counts connections, refusals and bytes each way.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import socket
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Literal, Protocol

from toolfleet.errors import PermissionDenied

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Host = str | IPAddress
"""A normalized target host: a lower-case name without trailing dot, or an address."""

WEB_PORTS = frozenset({80, 443})
"""The ports a grant entry without a port admits."""
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
"""Cloud metadata services (also covered by the link-local / private checks)."""
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
"""Headers that concern one hop and are never forwarded. ``Transfer-Encoding`` is kept:
the body is relayed as received, in the same coding."""

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_MAX_HEADERS = 100
_LINGER_S = 1.0


class EgressDecision(StrEnum):
    """What the proxy did with one request."""

    ALLOWED = "allowed"
    """Connected to the upstream."""
    REFUSED = "refused"
    """Refused by policy or limits (the sandbox got a 4xx)."""
    FAILED = "failed"
    """Admitted, but the upstream could not be resolved or reached (5xx)."""


class EgressReason(StrEnum):
    """Why; stable values for audit consumers."""

    GRANTED = "granted"
    NOT_GRANTED = "not_granted"
    PRIVATE_ADDRESS = "private_address"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    MALFORMED_REQUEST = "malformed_request"
    UNRESOLVABLE = "unresolvable"
    CONNECT_FAILED = "connect_failed"
    CONNECT_TIMEOUT = "connect_timeout"


class InvalidNetworkPermission(PermissionDenied):
    """A ``network_permissions`` entry of the token cannot be read: nothing is granted."""


# --- grants ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class HostRule:
    """One parsed ``network_permissions`` entry."""

    kind: Literal["name", "suffix", "any", "address"]
    name: str = ""
    """``name``: the host; ``suffix``: ``.example.com`` for ``*.example.com``."""
    network: IPNetwork | None = None
    """``address``: the address or network granted."""
    ports: frozenset[int] | None = WEB_PORTS
    """Ports admitted; ``None``: any."""

    def admits(self, host: Host, port: int) -> bool:
        if self.ports is not None and port not in self.ports:
            return False
        if self.kind == "any":
            return True
        if self.kind == "name":
            return host == self.name
        if self.kind == "suffix":
            return isinstance(host, str) and host.endswith(self.name)
        return not isinstance(host, str) and self.network is not None and host in self.network

    def unlocks(self, address: IPAddress, port: int) -> bool:
        """Whether this entry names ``address`` literally (so it may be non-public)."""
        return (
            self.network is not None
            and address in self.network
            and (self.ports is None or port in self.ports)
        )


def parse_permission(entry: str) -> HostRule:
    """One grant entry (see the module docstring), or :class:`ValueError`."""
    text = entry.strip().lower()
    host_text, port_text = _split_host_port(text)
    if port_text is None:
        ports: frozenset[int] | None = WEB_PORTS
    elif port_text == "*":
        ports = None
    else:
        ports = frozenset({_port(port_text)})
    if host_text == "*":
        return HostRule(kind="any", ports=ports)
    if host_text.startswith("*."):
        return HostRule(kind="suffix", name="." + _name(host_text[2:]), ports=ports)
    try:
        network = ipaddress.ip_network(host_text, strict=True)
    except ValueError:
        return HostRule(kind="name", name=_name(host_text), ports=ports)
    return HostRule(kind="address", network=network, ports=ports)


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressGrant:
    """What one invocation may reach: the token's ``network_permissions``, parsed."""

    invocation_id: str
    tenant_id: str
    rules: tuple[HostRule, ...] = ()
    """Empty: no network at all."""

    @classmethod
    def from_permissions(
        cls, *, invocation_id: str, tenant_id: str, network_permissions: Iterable[str]
    ) -> EgressGrant:
        """Parse the token's entries; one unreadable entry refuses the whole grant.

        Raises :class:`InvalidNetworkPermission` naming the entry's position (not its text).
        """
        rules = []
        for index, entry in enumerate(network_permissions):
            try:
                rules.append(parse_permission(entry))
            except ValueError:
                raise InvalidNetworkPermission(
                    f"network_permissions entry {index} is malformed"
                ) from None
        return cls(invocation_id=invocation_id, tenant_id=tenant_id, rules=tuple(rules))

    @property
    def allows_network(self) -> bool:
        """False when the token names no host: run the sandbox without any session."""
        return bool(self.rules)

    def admits(self, host: Host, port: int) -> bool:
        """Whether an entry names this host (or address) and port."""
        return any(rule.admits(host, port) for rule in self.rules)

    def reachable(self, addresses: Sequence[IPAddress], port: int) -> tuple[IPAddress, ...]:
        """Of a name's addresses, those it may connect to: public ones, and non-public
        ones an address entry names literally."""
        return tuple(
            a
            for a in addresses
            if is_public_address(a) or any(r.unlocks(a, port) for r in self.rules)
        )


def is_public_address(address: IPAddress) -> bool:
    """False for private, loopback, link-local, multicast, reserved and metadata
    addresses, including IPv4 ones embedded in IPv6 (:func:`embedded_ipv4`), and for
    the local-use NAT64 prefix ``64:ff9b:1::/48``."""
    candidates: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address in _LOCAL_NAT64:
            return False
        candidates += embedded_ipv4(address)
    return not any(a.is_multicast or not a.is_global or a in METADATA_ADDRESSES for a in candidates)


def embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address carries, in every form that may deliver to
    them: IPv4-compatible (``::127.0.0.1``, deprecated but still routed by some stacks),
    IPv4-mapped (``::ffff:127.0.0.1``), IPv4-translated (``::ffff:0:127.0.0.1``), NAT64
    (``64:ff9b::7f00:1``), 6to4 (``2002:7f00:1::``), Teredo (server and client) and an
    ISATAP interface id (``...:0:5efe:7f00:1``). An address is judged as each of them too.
    """
    value = int(address)
    low32 = ipaddress.IPv4Address(value & 0xFFFFFFFF)
    found: list[ipaddress.IPv4Address] = []
    if value >> 32 == 0 or value >> 32 == 0xFFFF or value >> 32 == 0xFFFF0000:
        found.append(low32)  # compatible (``::`` and ``::1`` included), mapped, translated
    if address in _NAT64:
        found.append(low32)
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found += address.teredo
    if (value >> 32) & 0xFDFFFFFF == 0x5EFE:
        found.append(low32)  # ISATAP: ``0000:5efe`` or ``0200:5efe`` before the IPv4
    return tuple(found)


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
"""RFC 8215: NAT64 inside one network, the IPv4 anywhere from bit 48 on; never public."""


def parse_host(text: str) -> Host:
    """A target host as sent (``Example.COM.``, ``[::1]``, ``10.0.0.1``), normalized;
    :class:`ValueError` when it is neither a DNS name nor an address."""
    if text.startswith("[") and text.endswith("]"):
        address = ipaddress.ip_address(text[1:-1])
        if not isinstance(address, ipaddress.IPv6Address):
            raise ValueError("brackets hold IPv6 addresses only")
        return address
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return _name(text)


def _name(text: str) -> str:
    name = text.lower().removesuffix(".")
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError("not a DNS name")
    # 127.1, 0x7f.1 or 2130706433 are addresses to some resolvers: never names here.
    if labels[-1].isdigit() or labels[-1].startswith("0x"):
        raise ValueError("numeric top-level label")
    return name


def _split_host_port(text: str) -> tuple[str, str | None]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("unclosed bracket")
        rest = text[end + 1 :]
        if (rest and not rest.startswith(":")) or ":" not in text[:end]:
            raise ValueError("brackets hold IPv6 addresses only")
        return text[1:end], (rest[1:] if rest else None)
    if text.count(":") > 1:  # a bare IPv6 address (or network): no port
        return text, None
    host, sep, port = text.partition(":")
    return host, (port if sep else None)


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 5:
        raise ValueError("bad port")
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError("port out of range")
    return port


# --- ports: resolver and audit --------------------------------------------------------


class Resolver(Protocol):
    """Name to addresses (the system resolver: :class:`SystemResolver`)."""

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        """The name's addresses, in preference order; ``()`` when it has none."""
        ...


class SystemResolver:
    """``getaddrinfo`` on the event loop's executor."""

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except socket.gaierror:
            return ()
        found: dict[IPAddress, None] = {}
        for *_, sockaddr in infos:
            found.setdefault(ipaddress.ip_address(str(sockaddr[0]).partition("%")[0]))
        return tuple(found)


@dataclass(frozen=True, kw_only=True)
class StaticResolver:
    """In-memory twin of :class:`Resolver`: a fixed table of names."""

    table: Mapping[str, Sequence[str]]

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        return tuple(ipaddress.ip_address(a) for a in self.table.get(name, ()))


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressRecord:
    """One egress decision, for the audit trail. Never a header, a path or a body."""

    invocation_id: str
    tenant_id: str
    host: str
    """The target host as normalized; empty when the request could not be read."""
    port: int
    """The target port; 0 when the request could not be read."""
    method: str
    """``CONNECT`` or the forwarded request's method; empty when unreadable."""
    decision: EgressDecision
    reason: EgressReason
    address: str | None = None
    """The address connected to, or the non-public one refused."""
    at: datetime


class EgressAudit(Protocol):
    """Where egress records go (the executor turns them into audit events)."""

    async def record(self, entry: EgressRecord) -> None:
        """Keep ``entry``; an exception here is logged and never breaks the proxy."""
        ...


@dataclass(kw_only=True)
class InMemoryEgressAudit:
    """In-memory twin of :class:`EgressAudit`."""

    records: list[EgressRecord] = field(default_factory=list)

    async def record(self, entry: EgressRecord) -> None:
        self.records.append(entry)


# --- limits and usage -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressLimits:
    """Per-session limits (the executor builds these from its settings)."""

    connect_timeout_s: float = 10.0
    """Resolving and connecting to the upstream, together."""
    idle_timeout_s: float = 60.0
    """A connection with no byte in either direction for this long is closed."""
    head_timeout_s: float = 10.0
    """Time a client has to send its request head."""
    max_tunnels: int = 16
    """Upstream connections (tunnels and forwarded requests) open at once."""
    max_clients: int = 64
    """Client connections open at once, including those still sending a head."""
    max_head_bytes: int = 32 * 1024
    audit_allowed: bool = True
    """Also audit allowed connections (refusals are always audited)."""
    max_audited_refusals: int = 256
    """Refusals audited one by one per session; beyond that only counted in usage,
    so a tool looping on a refused host cannot flood the audit trail."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressUsage:
    """A session's network usage so far."""

    connections: int = 0
    """Upstream connections opened."""
    refused: int = 0
    """Requests refused (4xx) or failed (5xx)."""
    bytes_sent: int = 0
    """Bytes sent upstream (tunnel payload, forwarded heads and bodies)."""
    bytes_received: int = 0
    """Bytes relayed back from upstreams."""


# --- HTTP heads -----------------------------------------------------------------------


class MalformedRequest(ValueError):
    """The client sent something the proxy will not interpret (answered with 400)."""


_Counter = Literal["connections", "refused", "bytes_sent", "bytes_received"]
Framing = int | Literal["chunked", "eof"]
"""How a body ends: after N bytes, after the last chunk, or when the sender closes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyRequest:
    """A parsed request head: ``CONNECT`` or an absolute-URI request."""

    method: str
    host: Host
    port: int
    target: str = ""
    """Origin-form path and query to forward; empty for ``CONNECT``."""
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def is_connect(self) -> bool:
        return self.method == "CONNECT"

    @property
    def host_text(self) -> str:
        return str(self.host)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if isinstance(self.host, ipaddress.IPv6Address) else self.host_text
        return host if self.port == 80 else f"{host}:{self.port}"

    @property
    def expects_continue(self) -> bool:
        return any(n == "expect" and v.lower() == "100-continue" for n, v in self.headers)

    def framing(self) -> Framing:
        """The request body's framing; :class:`MalformedRequest` when ambiguous."""
        return _framing(self.headers, default=0, strict=True)

    def upstream_head(self) -> bytes:
        """The head sent upstream: origin-form, ``Host`` from the URI, no hop-by-hop."""
        kept = _end_to_end(self.headers, also_drop={"host", "expect"})
        lines = [f"{self.method} {self.target} HTTP/1.1", f"Host: {self.authority}"]
        lines += [f"{name}: {value}" for name, value in kept]
        lines += ["Connection: close", "", ""]
        return "\r\n".join(lines).encode("latin-1")


def parse_request_head(head: bytes) -> ProxyRequest:
    """A request head ending in CRLF CRLF, strictly; :class:`MalformedRequest` otherwise."""
    start, headers = _parse_head(head)
    parts = start.split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise MalformedRequest("malformed request line")
    method, target, _ = parts
    if not _TOKEN.fullmatch(method) or not target.isascii() or not target.isprintable():
        raise MalformedRequest("malformed request line")
    try:
        if method == "CONNECT":
            host_text, port_text = _split_host_port(target)
            if port_text is None:
                raise MalformedRequest("CONNECT needs host:port")
            return ProxyRequest(
                method=method, host=parse_host(host_text), port=_port(port_text), headers=headers
            )
        scheme, sep, rest = target.partition("://")
        if not sep or scheme.lower() != "http":
            raise MalformedRequest("only absolute http:// URIs are forwarded (use CONNECT)")
        rest = rest.partition("#")[0]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        authority, path = rest[:cut], rest[cut:]
        if "@" in authority:
            raise MalformedRequest("credentials in the URI are not forwarded")
        host_text, port_text = _split_host_port(authority)
        port = 80 if port_text is None else _port(port_text)
        host = parse_host(host_text)
    except MalformedRequest:
        raise
    except ValueError:
        raise MalformedRequest("malformed target host or port") from None
    if not path.startswith("/"):
        path = "/" + path
    return ProxyRequest(method=method, host=host, port=port, target=path, headers=headers)


def _parse_head(head: bytes) -> tuple[str, tuple[tuple[str, str], ...]]:
    if not head.endswith(b"\r\n\r\n"):
        raise MalformedRequest("head does not end with an empty line")
    lines = head[:-4].decode("latin-1").split("\r\n")
    if len(lines) > _MAX_HEADERS + 1:
        raise MalformedRequest("too many header fields")
    if any("\r" in line or "\n" in line for line in lines):
        raise MalformedRequest("bare CR or LF in the head")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise MalformedRequest("malformed header field")
        value = value.strip(" \t")
        if _BAD_VALUE.search(value):
            raise MalformedRequest("control character in a header value")
        headers.append((name.lower(), value))
    return lines[0], tuple(headers)


def _end_to_end(
    headers: Sequence[tuple[str, str]], *, also_drop: Iterable[str] = ()
) -> list[tuple[str, str]]:
    named = {
        token.strip().lower()
        for name, value in headers
        if name == "connection"
        for token in value.split(",")
    }
    drop = HOP_BY_HOP | named | set(also_drop)
    return [(name, value) for name, value in headers if name not in drop]


def _framing(headers: Sequence[tuple[str, str]], *, default: Framing, strict: bool) -> Framing:
    codings = [v.strip().lower() for n, v in headers if n == "transfer-encoding"]
    lengths = {v.strip() for n, v in headers if n == "content-length"}
    if codings:
        if strict and (codings != ["chunked"] or lengths):
            raise MalformedRequest("only a lone Transfer-Encoding: chunked is accepted")
        return "chunked" if codings[-1].endswith("chunked") else "eof"
    if not lengths:
        return default
    if len(lengths) > 1 or not all(v.isascii() and v.isdigit() and len(v) < 19 for v in lengths):
        raise MalformedRequest("malformed Content-Length")
    return int(lengths.pop())


# --- the proxy ------------------------------------------------------------------------


class _Refusal(Exception):
    def __init__(
        self,
        status: int,
        reason: EgressReason,
        message: str,
        *,
        decision: EgressDecision = EgressDecision.REFUSED,
        address: IPAddress | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.decision = decision
        self.address = address


_STATUS_TEXT = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    504: "Gateway Timeout",
}


@dataclass(frozen=True, kw_only=True)
class _Deps:
    audit: EgressAudit
    resolver: Resolver
    limits: EgressLimits
    clock: Callable[[], float]
    now: Callable[[], datetime]


class EgressSession:
    """One grant's listeners (a unix socket and/or a loopback port) and its counters.

    Opened by :meth:`EgressProxy.session`; every connection to its listeners is judged
    by its grant alone.
    """

    def __init__(self, grant: EgressGrant, deps: _Deps) -> None:
        self.grant = grant
        self.unix_path: Path | None = None
        """The unix socket to bind-mount into the sandbox."""
        self.tcp_address: tuple[str, int] | None = None
        """``(host, port)`` of the loopback listener, when asked for."""
        self._deps = deps
        self._limits = deps.limits
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._clients = 0
        self._tunnels = 0
        self._audited_refusals = 0
        self._closed = False
        self._usage: dict[_Counter, int] = dict.fromkeys(
            ("connections", "refused", "bytes_sent", "bytes_received"), 0
        )

    @property
    def proxy_url(self) -> str | None:
        """``http://127.0.0.1:PORT`` of the loopback listener, if any."""
        if self.tcp_address is None:
            return None
        return f"http://{self.tcp_address[0]}:{self.tcp_address[1]}"

    @property
    def active_clients(self) -> int:
        """Client connections open now (counted against ``max_clients``)."""
        return self._clients

    @property
    def active_tunnels(self) -> int:
        """Upstream connections open now."""
        return self._tunnels

    def usage(self) -> EgressUsage:
        """Connections, refusals and bytes so far (final once the session is closed)."""
        return EgressUsage(**self._usage)

    async def _listen_unix(self, path: Path) -> None:
        server = await asyncio.start_unix_server(
            self._handle, path=os.fspath(path), limit=self._limits.max_head_bytes
        )
        self._servers.append(server)
        # Only the executor's uid (the sandbox's, outside its user namespace) may connect.
        os.chmod(path, 0o600)
        self.unix_path = path

    async def _listen_tcp(self) -> None:
        server = await asyncio.start_server(
            self._handle, host="127.0.0.1", port=0, limit=self._limits.max_head_bytes
        )
        self._servers.append(server)
        host, port = server.sockets[0].getsockname()[:2]
        self.tcp_address = (str(host), int(port))

    async def aclose(self) -> None:
        """Stop listening, cut every connection, remove the socket file. Idempotent."""
        self._closed = True
        for server in self._servers:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        if self.unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.lstat(self.unix_path).st_mode):
                    os.unlink(self.unix_path)

    # One client connection: read a head, judge it, tunnel or forward, close.

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._connection(reader, writer)
        except asyncio.CancelledError:
            # The session is closing. End normally: asyncio's stream server (3.11) logs an
            # error for every connection task that ends cancelled.
            pass
        finally:
            self._tasks.discard(task)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self._closed:  # accepted just before the listener closed
                return
            if self._clients >= self._limits.max_clients:
                await self._refuse(reader, writer, None, _too_many("client connections"))
                return
            self._clients += 1
            try:
                await self._serve(reader, writer)
            finally:
                self._clients -= 1
        except (OSError, asyncio.IncompleteReadError, TimeoutError, MalformedRequest):
            pass  # the client or the upstream went away or misbehaved mid-stream
        except Exception as exc:  # a bug here must not take the executor down
            log.warning("egress connection failed (%s)", type(exc).__name__)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1):
                    await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request: ProxyRequest | None = None
        try:
            request = await self._read_request(reader)
            if request is None:
                return
            upstream_reader, upstream_writer, address = await self._open(request)
        except _Refusal as refusal:
            await self._refuse(reader, writer, request, refusal)
            return
        try:
            self._usage["connections"] += 1
            if self._limits.audit_allowed:
                await self._audit(request, EgressDecision.ALLOWED, EgressReason.GRANTED, address)
            log.debug(
                "egress allowed invocation=%s host=%s port=%d",
                self.grant.invocation_id,
                request.host_text,
                request.port,
            )
            if request.is_connect:
                await self._send(writer, b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await self._tunnel(reader, writer, upstream_reader, upstream_writer)
            else:
                await self._forward(request, reader, writer, upstream_reader, upstream_writer)
        finally:
            self._tunnels -= 1
            upstream_writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> ProxyRequest | None:
        try:
            async with asyncio.timeout(self._limits.head_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None  # closed before a full head: nothing was asked
        except asyncio.LimitOverrunError:
            raise _Refusal(431, EgressReason.MALFORMED_REQUEST, "request head too large") from None
        except TimeoutError:
            raise _Refusal(408, EgressReason.MALFORMED_REQUEST, "request head too slow") from None
        try:
            request = parse_request_head(head)
            if not request.is_connect:
                request.framing()
        except MalformedRequest as exc:
            raise _Refusal(400, EgressReason.MALFORMED_REQUEST, str(exc)) from None
        return request

    async def _open(
        self, request: ProxyRequest
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, IPAddress]:
        """Judge the target, then resolve once and connect to an address that passed."""
        host, port = request.host, request.port
        if not self.grant.admits(host, port):
            raise _Refusal(
                403,
                EgressReason.NOT_GRANTED,
                f"egress to {request.host_text}:{port} is not granted",
            )
        if self._tunnels >= self._limits.max_tunnels:
            raise _too_many("connections")
        self._tunnels += 1
        try:
            async with asyncio.timeout(self._limits.connect_timeout_s):
                return await self._connect(request)
        except TimeoutError:
            self._tunnels -= 1
            raise _Refusal(
                504,
                EgressReason.CONNECT_TIMEOUT,
                f"connecting to {request.host_text}:{port} timed out",
                decision=EgressDecision.FAILED,
            ) from None
        except BaseException:
            self._tunnels -= 1
            raise

    async def _connect(
        self, request: ProxyRequest
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, IPAddress]:
        host, port = request.host, request.port
        if isinstance(host, str):
            addresses = await self._deps.resolver.resolve(host)
            if not addresses:
                raise _Refusal(
                    502,
                    EgressReason.UNRESOLVABLE,
                    f"{host} does not resolve",
                    decision=EgressDecision.FAILED,
                )
        else:
            addresses = (host,)
        reachable = self.grant.reachable(addresses, port)
        if not reachable:
            raise _Refusal(
                403,
                EgressReason.PRIVATE_ADDRESS,
                f"{request.host_text} resolves to a non-public address the grant does not name",
                address=addresses[0],
            )
        for address in reachable:
            with contextlib.suppress(OSError):
                # A literal address: asyncio does no second lookup.
                reader, writer = await asyncio.open_connection(
                    str(address), port, limit=self._limits.max_head_bytes
                )
                return reader, writer, address
        raise _Refusal(
            502,
            EgressReason.CONNECT_FAILED,
            f"could not connect to {request.host_text}:{port}",
            decision=EgressDecision.FAILED,
            address=reachable[0],
        )

    async def _refuse(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: ProxyRequest | None,
        refusal: _Refusal,
    ) -> None:
        self._usage["refused"] += 1
        log.info(
            "egress %s invocation=%s host=%s port=%s reason=%s",
            refusal.decision,
            self.grant.invocation_id,
            request.host_text if request else "-",
            request.port if request else "-",
            refusal.reason,
        )
        if self._audited_refusals < self._limits.max_audited_refusals:
            self._audited_refusals += 1
            await self._audit(request, refusal.decision, refusal.reason, refusal.address)
        body = f"{refusal.message}\n".encode()
        head = (
            f"HTTP/1.1 {refusal.status} {_STATUS_TEXT[refusal.status]}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"X-Toolfleet-Egress: {refusal.reason}\r\n"
            "Connection: close\r\n\r\n"
        )
        with contextlib.suppress(OSError, TimeoutError):
            await self._send(writer, head.encode() + body)
            await _linger(reader, writer)

    async def _audit(
        self,
        request: ProxyRequest | None,
        decision: EgressDecision,
        reason: EgressReason,
        address: IPAddress | None,
    ) -> None:
        entry = EgressRecord(
            invocation_id=self.grant.invocation_id,
            tenant_id=self.grant.tenant_id,
            host=request.host_text if request else "",
            port=request.port if request else 0,
            method=request.method if request else "",
            decision=decision,
            reason=reason,
            address=None if address is None else str(address),
            at=self._deps.now(),
        )
        try:
            await self._deps.audit.record(entry)
        except Exception as exc:  # auditing is the executor's; a failure never breaks egress
            log.warning("egress audit record failed (%s)", type(exc).__name__)

    # Relaying bytes, each read and write bounded by the idle timeout.

    async def _send(
        self, writer: asyncio.StreamWriter, data: bytes, count: _Counter | None = None
    ) -> None:
        writer.write(data)
        if count is not None:
            self._usage[count] += len(data)
        async with asyncio.timeout(self._limits.idle_timeout_s):
            await writer.drain()

    async def _read(self, awaitable: Awaitable[bytes]) -> bytes:
        async with asyncio.timeout(self._limits.idle_timeout_s):
            return await awaitable

    async def _tunnel(
        self,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream_writer: asyncio.StreamWriter,
    ) -> None:
        last = [self._deps.clock()]

        async def pump(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: _Counter
        ) -> bool:
            """Copy until EOF (True) or idleness / an error (False)."""
            while True:
                try:
                    async with asyncio.timeout(self._limits.idle_timeout_s):
                        data = await src.read(65536)
                except TimeoutError:
                    if self._deps.clock() - last[0] < self._limits.idle_timeout_s:
                        continue  # the other direction is busy
                    return False
                except OSError:
                    return False
                if not data:
                    with contextlib.suppress(OSError):
                        if dst.can_write_eof():
                            dst.write_eof()
                    return True
                last[0] = self._deps.clock()
                try:
                    await self._send(dst, data, count)
                except (OSError, TimeoutError):
                    return False

        pumps = {
            asyncio.create_task(pump(client_reader, upstream_writer, "bytes_sent")),
            asyncio.create_task(pump(upstream_reader, client_writer, "bytes_received")),
        }
        try:
            while pumps:
                done, pumps = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                if not all(task.result() for task in done):
                    break
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _forward(
        self,
        request: ProxyRequest,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream_writer: asyncio.StreamWriter,
    ) -> None:
        await self._send(upstream_writer, request.upstream_head(), "bytes_sent")
        if request.expects_continue:
            await self._send(client_writer, b"HTTP/1.1 100 Continue\r\n\r\n")
        body = asyncio.create_task(
            self._copy_body(client_reader, upstream_writer, request.framing(), "bytes_sent")
        )
        response = asyncio.create_task(
            self._relay_response(request, upstream_reader, client_writer)
        )
        try:
            done, _ = await asyncio.wait({body, response}, return_when=asyncio.FIRST_COMPLETED)
            if response in done:
                response.result()  # answered (perhaps early): the rest of the body is moot
            elif isinstance(body.exception(), MalformedRequest | asyncio.IncompleteReadError):
                return  # the client's body is broken: cut both sides
            else:
                # Sent, or the upstream stopped reading (it may be answering 413): relay.
                await response
            if not body.done() or body.exception() is not None:
                body.cancel()
                await asyncio.gather(body, return_exceptions=True)
                await _linger(client_reader, client_writer)  # let the client read the answer
        finally:
            for task in (body, response):
                task.cancel()
            await asyncio.gather(body, response, return_exceptions=True)

    async def _relay_response(
        self,
        request: ProxyRequest,
        upstream: asyncio.StreamReader,
        client: asyncio.StreamWriter,
    ) -> None:
        while True:
            try:
                head = await self._read(upstream.readuntil(b"\r\n\r\n"))
                status_line, headers = _parse_head(head)
                version, _, rest = status_line.partition(" ")
                if not (version.startswith("HTTP/1.") and rest[:3].isdigit()) or rest[3:4] not in (
                    "",
                    " ",
                ):
                    raise MalformedRequest("malformed status line")
                status = int(rest[:3])
                bodiless = request.method == "HEAD" or status in (204, 304)
                framing: Framing = 0 if bodiless else _framing(headers, default="eof", strict=False)
            except (ValueError, OSError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
                with contextlib.suppress(OSError, TimeoutError):
                    await self._send(client, _bad_gateway())
                return
            kept = _end_to_end(headers)
            if any(n == "transfer-encoding" for n, _ in kept):
                kept = [(n, v) for n, v in kept if n != "content-length"]
            lines = [status_line, *(f"{n}: {v}" for n, v in kept)]
            if status >= 200:
                lines.append("Connection: close")
            await self._send(
                client, "\r\n".join([*lines, "", ""]).encode("latin-1"), "bytes_received"
            )
            if status >= 200:
                break
        await self._copy_body(upstream, client, framing, "bytes_received")

    async def _copy_body(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        framing: Framing,
        count: _Counter,
    ) -> None:
        if framing == "eof":
            while data := await self._read(src.read(65536)):
                await self._send(dst, data, count)
        elif framing == "chunked":
            while True:
                line = await self._read(src.readuntil(b"\r\n"))
                size_text = line[:-2].partition(b";")[0].strip()
                if (
                    not size_text
                    or len(size_text) > 15
                    or size_text.strip(b"0123456789abcdefABCDEF")
                ):
                    raise MalformedRequest("malformed chunk size")
                size = int(size_text, 16)
                await self._send(dst, line, count)
                if size == 0:
                    break
                await self._copy_exact(src, dst, size, count)
                if await self._read(src.readexactly(2)) != b"\r\n":
                    raise MalformedRequest("chunk not followed by CRLF")
                await self._send(dst, b"\r\n", count)
            while (line := await self._read(src.readuntil(b"\r\n"))) != b"\r\n":
                await self._send(dst, line, count)  # trailer fields
            await self._send(dst, line, count)
        else:
            await self._copy_exact(src, dst, framing, count)

    async def _copy_exact(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, size: int, count: _Counter
    ) -> None:
        while size > 0:
            data = await self._read(src.read(min(size, 65536)))
            if not data:
                raise asyncio.IncompleteReadError(b"", size)
            size -= len(data)
            await self._send(dst, data, count)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then read and drop what the client still sends (a request body we
    refused) for a moment: closing a socket with unread bytes resets it, and the reset
    can destroy the refusal before the client reads it."""
    if not writer.can_write_eof():
        return
    writer.write_eof()
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(_LINGER_S):
            while await reader.read(65536):
                pass


def _too_many(what: str) -> _Refusal:
    return _Refusal(429, EgressReason.TOO_MANY_CONNECTIONS, f"too many concurrent {what}")


def _bad_gateway() -> bytes:
    body = b"malformed response from the upstream\n"
    return (
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )


class EgressProxy:
    """Serves egress sessions, one per sandboxed invocation.

    Example::

        async with EgressProxy(audit=audit) as proxy:
            grant = EgressGrant.from_permissions(
                invocation_id=iid, tenant_id=tenant, network_permissions=cap.network_permissions
            )
            async with proxy.session(grant, unix_path=workdir / "egress.sock") as session:
                ...  # run the sandbox with the socket bound in
            usage = session.usage()
    """

    def __init__(
        self,
        *,
        audit: EgressAudit,
        limits: EgressLimits | None = None,
        resolver: Resolver | None = None,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._deps = _Deps(
            audit=audit,
            resolver=resolver or SystemResolver(),
            limits=limits or EgressLimits(),
            clock=clock,
            now=now,
        )
        self._sessions: set[EgressSession] = set()

    async def __aenter__(self) -> EgressProxy:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every session still open."""
        sessions, self._sessions = list(self._sessions), set()
        await asyncio.gather(*(s.aclose() for s in sessions))

    @asynccontextmanager
    async def session(
        self, grant: EgressGrant, *, unix_path: Path | None = None, tcp: bool = False
    ) -> AsyncIterator[EgressSession]:
        """Listen for one grant on ``unix_path`` and/or ``127.0.0.1:0`` until exit.

        Put ``unix_path`` in a directory only the executor can write; an existing socket
        file there is replaced.
        """
        if unix_path is None and not tcp:
            raise ValueError("an egress session needs unix_path or tcp=True")
        session = EgressSession(grant, self._deps)
        async with AsyncExitStack() as stack:
            stack.push_async_callback(session.aclose)
            self._sessions.add(session)
            stack.callback(self._sessions.discard, session)
            if unix_path is not None:
                await session._listen_unix(unix_path)
            if tcp:
                await session._listen_tcp()
            yield session
