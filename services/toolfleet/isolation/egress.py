"""The sandbox egress proxy: a sandboxed tool reaches only the hosts its token grants.

A sandbox has an empty network namespace; its only way out is this proxy, listening on
a unix socket that is bind-mounted into that one sandbox (and/or on ``127.0.0.1:0`` for
tools isolated as plain processes). Each listener is an :class:`EgressSession` opened
with an :class:`EgressGrant`: the invocation, its tenant and the hosts of the token's
``network_permissions`` (their grammar and the address rules: :mod:`.egress_policy`).
One :class:`EgressProxy` serves many sessions.

HTTP/1.1 is framed by h11 on both sides; this module only decides. ``CONNECT host:port``
opens a byte tunnel after the ``200`` (HTTPS and any other TCP protocol), and a request
with an absolute ``http://`` URI is forwarded: h11 reads the client's request and the
upstream's response and writes what the other side gets, so no byte passes unparsed
(bodies are re-framed, chunk extensions dropped, bytes past a message's end discarded).
One request per client connection, ``Connection: close`` on both sides (bytes
pipelined behind it are never read); hop-by-hop fields and ``Proxy-Authorization`` are
never forwarded. What h11 reads leniently is refused before it acts: bare LF line ends,
obs-fold, both ``Content-Length`` and ``Transfer-Encoding``, control characters in field
values, more than 100 fields, a ``CONNECT`` with a body. Refusals are short answers
with an ``X-Toolfleet-Egress`` field naming the reason:

    400  malformed_request (the proxy keeps serving other connections; 408 for a head
                          too slow, 431 for one too large)
    403  not_granted      the token names no such host and port
    403  private_address  the name resolves only to private, loopback, link-local,
                          multicast or metadata addresses the grant does not name
    429  too_many_connections
    502  unresolvable / connect_failed, 504 connect_timeout

SSRF: a name is resolved once, only after the grant admitted it (a DNS query for a
host not granted is itself a leak), every address is checked, and the proxy connects to
an address it checked (no second resolution, so DNS rebinding cannot swap it).

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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from http import HTTPStatus
from pathlib import Path
from typing import Literal, Protocol

import h11

from toolfleet.isolation.egress_policy import EgressGrant as EgressGrant  # re-exported
from toolfleet.isolation.egress_policy import IPAddress as IPAddress  # re-exported
from toolfleet.isolation.egress_policy import Target, parse_target
from toolfleet.isolation.egress_policy import parse_host as parse_host  # re-exported

log = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"upgrade",
    }
)
"""Fields that concern one hop and are never forwarded, nor are those ``Connection``
names (except the framing fields: they describe the body the proxy relays)."""
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"expect"}
"""Of a request: ``Host`` is rebuilt from the URI, ``Expect`` answered by the proxy."""
_NOT_TRAILERS = _HOP_BY_HOP | _FRAMING | {b"host"}

_HEAD_END = re.compile(rb"\n\r?\n")
"""Where h11 ends a head (it accepts bare LF line ends; :func:`_screen_head` does not)."""
_BARE_LF = re.compile(rb"(?<!\r)\n")
_OBS_FOLD = re.compile(rb"\n[ \t]")
_HOST_FIELD = re.compile(rb"\r\nhost:", re.IGNORECASE)
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_MAX_HEADERS = 100
_READ_SIZE = 65536
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
class MemoryEgressAudit:
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


# --- HTTP: h11 frames, these rules decide ---------------------------------------------


class _Malformed(ValueError):
    """A head the proxy will not relay: 400 for a request, 502 for a response."""


_Counter = Literal["connections", "refused", "bytes_sent", "bytes_received"]
_Fields = Sequence[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True, kw_only=True)
class _ProxyRequest:
    """A request head h11 parsed and :func:`_judge` accepted."""

    method: str
    target: Target
    fields: tuple[tuple[bytes, bytes], ...]
    """As received (original case), h11-validated."""

    @property
    def is_connect(self) -> bool:
        return self.method == "CONNECT"

    @property
    def has_body(self) -> bool:
        return any(n.lower() in _FRAMING and v != b"0" for n, v in self.fields)

    def upstream(self) -> h11.Request:
        """What is sent upstream: origin-form, ``Host`` from the URI, no hop-by-hop."""
        return h11.Request(
            method=self.method,
            target=self.target.path,
            headers=[
                (b"Host", self.target.authority.encode()),
                *_end_to_end(self.fields, drop=_NOT_FORWARDED),
                (b"Connection", b"close"),
            ],
        )


def _screen_head(head: bytes) -> bytes:
    """Refuse what h11 would read leniently, and give it the ``Host`` it insists on.

    A bare LF line end or an obs-fold line is where two parsers disagree on where a
    field ends: refused. A proxy takes its target from the request line and ignores
    ``Host`` (RFC 9112, 3.2.2), so a head without one (many clients' ``CONNECT``) gets an
    empty one here instead of h11's 400.
    """
    if _BARE_LF.search(head) or _OBS_FOLD.search(head):
        raise _Malformed("bare LF or obs-fold in the request head")
    if _HOST_FIELD.search(head):
        return head
    line_end = head.find(b"\r\n") + 2
    return head[:line_end] + b"Host: \r\n" + head[line_end:]


def _judge(event: h11.Request) -> _ProxyRequest:
    """What this proxy refuses of a head h11 accepted, and the target it names."""
    fields = tuple(event.headers.raw_items())
    names = {name.lower() for name, _ in fields}
    if event.http_version not in (b"1.0", b"1.1"):
        raise _Malformed("only HTTP/1.0 and HTTP/1.1 are spoken")
    if sum(name.lower() != b"host" for name, _ in fields) > _MAX_HEADERS:
        raise _Malformed("too many header fields")
    _check_values(fields)
    if names >= _FRAMING:
        raise _Malformed("both Content-Length and Transfer-Encoding")
    method = event.method.decode("ascii")
    try:
        target = parse_target(method, event.target.decode("ascii"))
    except ValueError as exc:
        raise _Malformed(f"malformed target: {exc}") from None
    request = _ProxyRequest(method=method, target=target, fields=fields)
    if request.is_connect and request.has_body:
        raise _Malformed("a CONNECT request has no body")
    return request


def _check_values(fields: _Fields) -> None:
    if any(_BAD_VALUE.search(value) for _, value in fields):
        raise _Malformed("control character in a header value")


def _end_to_end(fields: _Fields, *, drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    named = {
        token.strip().lower()
        for name, value in fields
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    dropped = drop | (named - _FRAMING)
    return [(name, value) for name, value in fields if name.lower() not in dropped]


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


@dataclass(eq=False, kw_only=True)
class _Side:
    """One connection of an exchange: its streams and the h11 state machine framing them."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    http: h11.Connection
    method: bytes = b""
    """The client's request method once h11 read it (a ``HEAD`` answer has no body)."""


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
        client = _Side(reader=reader, writer=writer, http=self._http(h11.SERVER))
        try:
            if self._closed:  # accepted just before the listener closed
                return
            if self._clients >= self._limits.max_clients:
                await self._refuse(client, None, _too_many("client connections"))
                return
            self._clients += 1
            try:
                await self._serve(client)
            finally:
                self._clients -= 1
        except (OSError, TimeoutError, h11.RemoteProtocolError, _Malformed):
            pass  # the client or the upstream went away or misbehaved mid-stream
        except Exception as exc:  # a bug here must not take the executor down
            log.warning("egress connection failed (%s)", type(exc).__name__)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1):
                    await writer.wait_closed()

    def _http(self, role: type[h11.CLIENT] | type[h11.SERVER]) -> h11.Connection:
        return h11.Connection(role, max_incomplete_event_size=self._limits.max_head_bytes)

    async def _serve(self, client: _Side) -> None:
        request: _ProxyRequest | None = None
        try:
            request = await self._read_request(client)
            if request is None:
                return
            upstream, address = await self._open(request.target)
        except _Refusal as refusal:
            await self._refuse(client, request, refusal)
            return
        try:
            self._usage["connections"] += 1
            if self._limits.audit_allowed:
                await self._audit(request, EgressDecision.ALLOWED, EgressReason.GRANTED, address)
            log.debug(
                "egress allowed invocation=%s host=%s port=%d",
                self.grant.invocation_id,
                request.target.host_text,
                request.target.port,
            )
            if request.is_connect:
                established = h11.Response(
                    status_code=200, reason=b"Connection Established", headers=[]
                )
                await self._emit(client, established)
                # What the client sent right behind its CONNECT head (a TLS hello) is the
                # tunnel's first payload.
                await self._send(upstream.writer, client.http.trailing_data[0], "bytes_sent")
                await self._tunnel(client, upstream)
            else:
                await self._forward(request, client, upstream)
        finally:
            self._tunnels -= 1
            upstream.writer.close()

    async def _read_request(self, client: _Side) -> _ProxyRequest | None:
        """Read and judge one request head; ``None`` when the client left before one."""
        try:
            async with asyncio.timeout(self._limits.head_timeout_s):
                received = await self._read_head(client.reader)
        except TimeoutError:
            raise _Refusal(408, EgressReason.MALFORMED_REQUEST, "request head too slow") from None
        if received is None:
            return None
        head, rest = received
        try:
            client.http.receive_data(_screen_head(head) + rest)
            event = client.http.next_event()
            if not isinstance(event, h11.Request):  # h11 has the whole head: a Request or an error
                raise _Malformed("no request head")
            client.method = event.method
            request = _judge(event)
            if request.is_connect:
                client.http.next_event()  # its EndOfMessage (no body): h11 now awaits the 200
        except (_Malformed, h11.RemoteProtocolError) as exc:
            message = str(exc) if isinstance(exc, _Malformed) else "malformed request head"
            raise _Refusal(400, EgressReason.MALFORMED_REQUEST, message) from None
        return request

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
        """The bytes up to the end of the request head and those already read after it;
        ``None`` when the client closes first."""
        limit = self._limits.max_head_bytes
        received = bytearray()
        while (end := _HEAD_END.search(received)) is None:
            if len(received) > limit:
                break
            data = await reader.read(_READ_SIZE)
            if not data:
                return None
            received += data
        if end is None or end.end() > limit:
            raise _Refusal(431, EgressReason.MALFORMED_REQUEST, "request head too large")
        return bytes(received[: end.end()]), bytes(received[end.end() :])

    async def _open(self, target: Target) -> tuple[_Side, IPAddress]:
        """Judge the target, then resolve once and connect to an address that passed."""
        if not self.grant.admits(target.host, target.port):
            raise _Refusal(
                403,
                EgressReason.NOT_GRANTED,
                f"egress to {target.host_text}:{target.port} is not granted",
            )
        if self._tunnels >= self._limits.max_tunnels:
            raise _too_many("connections")
        self._tunnels += 1
        try:
            async with asyncio.timeout(self._limits.connect_timeout_s):
                reader, writer, address = await self._connect(target)
        except TimeoutError:
            self._tunnels -= 1
            raise _Refusal(
                504,
                EgressReason.CONNECT_TIMEOUT,
                f"connecting to {target.host_text}:{target.port} timed out",
                decision=EgressDecision.FAILED,
            ) from None
        except BaseException:
            self._tunnels -= 1
            raise
        return _Side(reader=reader, writer=writer, http=self._http(h11.CLIENT)), address

    async def _connect(
        self, target: Target
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, IPAddress]:
        host, port = target.host, target.port
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
                f"{target.host_text} resolves to a non-public address the grant does not name",
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
            f"could not connect to {target.host_text}:{port}",
            decision=EgressDecision.FAILED,
            address=reachable[0],
        )

    async def _refuse(
        self, client: _Side, request: _ProxyRequest | None, refusal: _Refusal
    ) -> None:
        self._usage["refused"] += 1
        log.info(
            "egress %s invocation=%s host=%s port=%s reason=%s",
            refusal.decision,
            self.grant.invocation_id,
            request.target.host_text if request else "-",
            request.target.port if request else "-",
            refusal.reason,
        )
        if self._audited_refusals < self._limits.max_audited_refusals:
            self._audited_refusals += 1
            await self._audit(request, refusal.decision, refusal.reason, refusal.address)
        egress = (b"X-Toolfleet-Egress", refusal.reason.encode())
        with contextlib.suppress(OSError, TimeoutError):
            await self._answer(client, refusal.status, refusal.message, egress)
            await _linger(client.reader, client.writer)

    async def _answer(
        self, client: _Side, status: int, message: str, *fields: tuple[bytes, bytes]
    ) -> None:
        """A short ``text/plain`` answer of the proxy's own, closing the connection."""
        body = f"{message}\n".encode()
        head = h11.Response(
            status_code=status,
            reason=HTTPStatus(status).phrase.encode(),
            headers=[
                (b"Content-Type", b"text/plain; charset=utf-8"),
                (b"Content-Length", str(len(body)).encode()),
                *fields,
                (b"Connection", b"close"),
            ],
        )
        if client.method == b"HEAD":  # the same head, no body
            await self._emit(client, head, h11.EndOfMessage())
        else:
            await self._emit(client, head, h11.Data(data=body), h11.EndOfMessage())

    async def _audit(
        self,
        request: _ProxyRequest | None,
        decision: EgressDecision,
        reason: EgressReason,
        address: IPAddress | None,
    ) -> None:
        entry = EgressRecord(
            invocation_id=self.grant.invocation_id,
            tenant_id=self.grant.tenant_id,
            host=request.target.host_text if request else "",
            port=request.target.port if request else 0,
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

    # Relaying, each read and write bounded by the idle timeout.

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

    async def _emit(self, side: _Side, *events: h11.Event, count: _Counter | None = None) -> None:
        """Frame ``events`` with ``side``'s h11 state machine and send them."""
        await self._send(side.writer, b"".join(side.http.send(e) or b"" for e in events), count)

    async def _next(self, side: _Side) -> h11.Event:
        """The next event h11 reads from ``side``, reading bytes as it needs them."""
        while True:
            event = side.http.next_event()
            if event is h11.NEED_DATA:
                side.http.receive_data(await self._read(side.reader.read(_READ_SIZE)))
            elif isinstance(event, h11.Event):
                return event
            else:  # PAUSED: the message is over and the proxy reads no further
                raise _Malformed("nothing more is read on this connection")

    async def _tunnel(self, client: _Side, upstream: _Side) -> None:
        last = [self._deps.clock()]

        async def pump(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: _Counter
        ) -> bool:
            """Copy until EOF (True) or idleness / an error (False)."""
            while True:
                try:
                    async with asyncio.timeout(self._limits.idle_timeout_s):
                        data = await src.read(_READ_SIZE)
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
            asyncio.create_task(pump(client.reader, upstream.writer, "bytes_sent")),
            asyncio.create_task(pump(upstream.reader, client.writer, "bytes_received")),
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

    async def _forward(self, request: _ProxyRequest, client: _Side, upstream: _Side) -> None:
        if not request.has_body:
            client.http.next_event()  # its EndOfMessage, read with the head
            await self._emit(upstream, request.upstream(), h11.EndOfMessage(), count="bytes_sent")
            await self._relay_response(client, upstream)
        elif not await self._forward_with_body(request, client, upstream):
            return
        if client.http.trailing_data[0]:
            await _linger(client.reader, client.writer)  # pipelined: never read, never sent

    async def _forward_with_body(
        self, request: _ProxyRequest, client: _Side, upstream: _Side
    ) -> bool:
        """Relay the body and the response side by side; False when the client's body
        was broken (both sides are cut) or left unread."""
        await self._emit(upstream, request.upstream(), count="bytes_sent")
        if client.http.client_is_waiting_for_100_continue:
            await self._emit(client, h11.InformationalResponse(status_code=100, headers=[]))
        body = asyncio.create_task(self._relay_body(client, upstream))
        response = asyncio.create_task(self._relay_response(client, upstream))
        try:
            done, _ = await asyncio.wait({body, response}, return_when=asyncio.FIRST_COMPLETED)
            if response in done:
                response.result()  # answered (perhaps early): the rest of the body is moot
            elif isinstance(body.exception(), h11.RemoteProtocolError):
                return False  # the client's body is broken: cut both sides
            else:
                # Sent, or the upstream stopped reading (it may be answering 413): relay.
                await response
            if body.done() and body.exception() is None:
                return True
            body.cancel()
            await asyncio.gather(body, return_exceptions=True)
            await _linger(client.reader, client.writer)  # let the client read the answer
            return False
        finally:
            for task in (body, response):
                task.cancel()
            await asyncio.gather(body, response, return_exceptions=True)

    async def _relay_body(self, client: _Side, upstream: _Side) -> None:
        """The request body, re-framed by h11 (chunk extensions do not pass)."""
        while isinstance(event := await self._next(client), h11.Data):
            await self._emit(upstream, event, count="bytes_sent")
        if not isinstance(event, h11.EndOfMessage):
            raise _Malformed("request body cut short")
        trailers = _end_to_end(event.headers.raw_items(), drop=_NOT_TRAILERS)
        await self._emit(upstream, h11.EndOfMessage(headers=trailers), count="bytes_sent")

    async def _relay_response(self, client: _Side, upstream: _Side) -> None:
        try:
            head = await self._response_head(client, upstream)
        except (_Malformed, h11.RemoteProtocolError, OSError):
            with contextlib.suppress(OSError, TimeoutError):
                await self._answer(client, 502, "malformed response from the upstream")
            return
        kept = _end_to_end(head.headers.raw_items(), drop=_HOP_BY_HOP)
        relayed = h11.Response(
            status_code=head.status_code,
            reason=head.reason,
            headers=[*kept, (b"Connection", b"close")],
        )
        await self._emit(client, relayed, count="bytes_received")
        # h11 frames the body for the client: Content-Length as the upstream said, else
        # chunked (HTTP/1.1) or until close (HTTP/1.0); only chunked carries trailers.
        while isinstance(event := await self._next(upstream), h11.Data):
            await self._emit(client, event, count="bytes_received")
        if not isinstance(event, h11.EndOfMessage):
            raise _Malformed("response body cut short")
        chunked = client.http.their_http_version == b"1.1"
        trailers = _end_to_end(event.headers.raw_items(), drop=_NOT_TRAILERS) if chunked else []
        await self._emit(client, h11.EndOfMessage(headers=trailers), count="bytes_received")

    async def _response_head(self, client: _Side, upstream: _Side) -> h11.Response:
        """The upstream's final response head; 1xx ones passed on to HTTP/1.1 clients
        (but ``100``: the proxy answered ``Expect`` itself)."""
        while True:
            event = await self._next(upstream)
            if not isinstance(event, h11.InformationalResponse | h11.Response):
                raise _Malformed("no response head")
            fields = event.headers.raw_items()
            # h11 bounds only a head still incomplete: one read can bring a larger one.
            if (
                sum(len(name) + len(value) + 4 for name, value in fields)
                > self._limits.max_head_bytes
            ):
                raise _Malformed("response head too large")
            _check_values(fields)
            if isinstance(event, h11.Response):
                return event
            if event.status_code != 100 and client.http.their_http_version == b"1.1":
                informational = h11.InformationalResponse(
                    status_code=event.status_code,
                    reason=event.reason,
                    headers=_end_to_end(event.headers.raw_items(), drop=_HOP_BY_HOP),
                )
                await self._emit(client, informational, count="bytes_received")


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then read and drop what the client still sends (a request body we
    refused) for a moment: closing a socket with unread bytes resets it, and the reset
    can destroy the refusal before the client reads it."""
    if not writer.can_write_eof():
        return
    writer.write_eof()
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(_LINGER_S):
            while await reader.read(_READ_SIZE):
                pass


def _too_many(what: str) -> _Refusal:
    return _Refusal(429, EgressReason.TOO_MANY_CONNECTIONS, f"too many concurrent {what}")


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
