"""The sandbox egress proxy over real sockets: local upstreams granted by address.

Each test runs its own upstream (a TCP echo server or a small HTTP server that reports
what it received), opens an egress session for a grant and talks to it the way a
sandboxed tool does: ``CONNECT`` or an absolute ``http://`` request, over the loopback
listener or the unix socket meant to be bind-mounted into a sandbox.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import random
import socket
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.eventually import eventually
from toolfleet.isolation.egress import (
    EgressDecision,
    EgressGrant,
    EgressLimits,
    EgressProxy,
    EgressReason,
    EgressRecord,
    EgressSession,
    IPAddress,
    MemoryEgressAudit,
    Resolver,
    StaticResolver,
    SystemResolver,
)

pytestmark = pytest.mark.integration

SECRET = "c2VjcmV0LXByb3h5LXBhc3N3b3Jk"


# --- upstreams ---------------------------------------------------------------------------


@dataclass
class Upstream:
    server: asyncio.Server
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        while await reader.readuntil(b"\r\n") != b"\r\n":
            pass
        return body
    return await reader.readexactly(int(headers.get("content-length", "0")))


def _parse(head: bytes) -> tuple[str, dict[str, str]]:
    first, *lines = head.decode("latin-1").split("\r\n")[:-2]
    fields: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return first, fields


@asynccontextmanager
async def echo_server() -> AsyncIterator[Upstream]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    async with server:
        yield Upstream(server)


@asynccontextmanager
async def http_server() -> AsyncIterator[Upstream]:
    """Answers every request with JSON naming what it received (a chunked response for
    ``/chunked``)."""
    seen: list[dict[str, Any]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
            line, headers = _parse(raw)
            method, target, _ = line.split(" ")
            body = await _read_body(reader, headers)
            seen.append(
                {"method": method, "target": target, "headers": headers, "body": body, "raw": raw}
            )
            payload = json.dumps({"method": method, "target": target, "size": len(body)}).encode()
            if target == "/chunked":
                writer.write(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=9\r\n"
                    b"Connection: keep-alive\r\n\r\n"
                    b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
                )
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
                )
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield Upstream(server, seen)


# --- clients -----------------------------------------------------------------------------


async def open_client(session: EgressSession) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if session.tcp_address is not None:
        return await asyncio.open_connection(*session.tcp_address)
    assert session.unix_path is not None
    return await asyncio.open_unix_connection(str(session.unix_path))


async def response_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    line, headers = _parse(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10))
    return int(line.split(" ")[1]), headers


async def request(session: EgressSession, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw`` on a fresh connection; the status, headers and body of the answer."""
    reader, writer = await open_client(session)
    try:
        writer.write(raw)
        await writer.drain()
        status, headers = await response_head(reader)
        body = await asyncio.wait_for(reader.read(), 10)
        return status, headers, body
    finally:
        writer.close()


@asynccontextmanager
async def tunnel(
    session: EgressSession, target: str
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await open_client(session)
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        status, _ = await response_head(reader)
        assert status == 200
        yield reader, writer
    finally:
        writer.close()


async def connect_status(session: EgressSession, target: str) -> tuple[int, dict[str, str]]:
    status, headers, _ = await request(session, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
    return status, headers


async def echo_through(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"ping\n")
    await writer.drain()
    assert await asyncio.wait_for(reader.readline(), 10) == b"ping\n"


# --- fixtures ------------------------------------------------------------------------------


@dataclass
class RecordingResolver:
    """The system resolver, remembering every name it was asked for."""

    inner: Resolver = field(default_factory=SystemResolver)
    asked: list[str] = field(default_factory=list)

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        self.asked.append(name)
        return await self.inner.resolve(name)


@pytest.fixture
def audit() -> MemoryEgressAudit:
    return MemoryEgressAudit()


@pytest.fixture
async def echo() -> AsyncIterator[Upstream]:
    async with echo_server() as upstream:
        yield upstream


@pytest.fixture
async def web() -> AsyncIterator[Upstream]:
    async with http_server() as upstream:
        yield upstream


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A short path: unix socket paths are limited to 107 bytes.
    path = tmp_path_factory.mktemp("egress")
    path.chmod(0o700)
    return path


def make_grant(*entries: str, invocation_id: str = "inv-egress") -> EgressGrant:
    return EgressGrant.from_permissions(
        invocation_id=invocation_id, tenant_id="t1", network_permissions=entries
    )


@asynccontextmanager
async def proxy_session(
    audit: MemoryEgressAudit,
    *entries: str,
    limits: EgressLimits | None = None,
    resolver: Resolver | None = None,
    unix_path: Path | None = None,
) -> AsyncIterator[EgressSession]:
    async with EgressProxy(audit=audit, limits=limits, resolver=resolver) as proxy:
        grant = make_grant(*entries)
        async with proxy.session(grant, unix_path=unix_path, tcp=unix_path is None) as session:
            yield session


def refusals(audit: MemoryEgressAudit) -> list[EgressRecord]:
    return [r for r in audit.records if r.decision is not EgressDecision.ALLOWED]


# --- allowed -------------------------------------------------------------------------------


async def test_a_granted_address_is_reachable_through_connect(
    audit: MemoryEgressAudit, echo: Upstream
) -> None:
    async with proxy_session(audit, f"127.0.0.1:{echo.port}") as session:
        payload = b"x" * 200_000
        async with tunnel(session, f"127.0.0.1:{echo.port}") as (reader, writer):
            writer.write(payload)
            writer.write_eof()
            received = await asyncio.wait_for(reader.read(), 10)
        assert received == payload
        usage = await eventually(
            lambda: _if(session.usage(), lambda u: u.bytes_received == len(payload))
        )
        assert usage.bytes_sent == len(payload)
        assert usage.connections == 1
        assert usage.refused == 0
        await eventually(lambda: _if(session, lambda s: s.active_tunnels == 0))
    [record] = audit.records
    assert (record.invocation_id, record.tenant_id, record.host, record.port) == (
        "inv-egress",
        "t1",
        "127.0.0.1",
        echo.port,
    )
    assert (record.method, record.decision, record.reason, record.address) == (
        "CONNECT",
        EgressDecision.ALLOWED,
        EgressReason.GRANTED,
        "127.0.0.1",
    )


async def test_plain_http_is_forwarded_by_a_real_client(
    audit: MemoryEgressAudit, web: Upstream
) -> None:
    async with proxy_session(audit, f"127.0.0.1:{web.port}") as session:
        assert session.proxy_url is not None
        async with httpx.AsyncClient(proxy=session.proxy_url, timeout=10) as client:
            got = await client.get(f"http://127.0.0.1:{web.port}/v1/items?page=2")
            posted = await client.post(f"http://127.0.0.1:{web.port}/v1/items", content=b"abc")
            chunked = await client.get(f"http://127.0.0.1:{web.port}/chunked")
    assert got.status_code == 200
    assert got.json() == {"method": "GET", "target": "/v1/items?page=2", "size": 0}
    assert posted.json() == {"method": "POST", "target": "/v1/items", "size": 3}
    assert chunked.json() == {"method": "GET", "target": "/chunked", "size": 0}
    assert chunked.headers["connection"] == "close"
    assert "keep-alive" not in chunked.headers
    assert [r["headers"]["host"] for r in web.requests] == [f"127.0.0.1:{web.port}"] * 3
    assert [r.method for r in audit.records] == ["GET", "POST", "GET"]
    assert {r.decision for r in audit.records} == {EgressDecision.ALLOWED}


async def test_hop_by_hop_headers_and_proxy_credentials_never_reach_upstream(
    audit: MemoryEgressAudit, web: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="toolfleet")
    body = b"0123456789" * 1000
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:3000], body[3000:])) + (
        b"0\r\nX-Trailer: t\r\n\r\n"
    )
    raw = (
        f"POST http://127.0.0.1:{web.port}/upload HTTP/1.1\r\n"
        "Host: metadata.internal\r\n"
        f"Proxy-Authorization: Basic {SECRET}\r\n"
        "Proxy-Connection: keep-alive\r\n"
        "Connection: keep-alive, X-Private\r\n"
        "X-Private: hop\r\n"
        "Keep-Alive: timeout=5\r\n"
        "Upgrade: websocket\r\n"
        "Expect: 100-continue\r\n"
        "Authorization: Bearer end-to-end\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode() + chunks
    async with proxy_session(audit, f"127.0.0.1:{web.port}") as session:
        reader, writer = await open_client(session)
        writer.write(raw)
        status, _ = await response_head(reader)
        assert status == 100
        status, headers = await response_head(reader)
        answer = json.loads(await asyncio.wait_for(reader.read(), 10))
        writer.close()
        usage = session.usage()
    assert status == 200
    assert headers["connection"] == "close"
    assert answer == {"method": "POST", "target": "/upload", "size": len(body)}
    [seen] = web.requests
    assert seen["body"] == body
    assert seen["headers"] == {
        "host": f"127.0.0.1:{web.port}",
        "authorization": "Bearer end-to-end",
        "transfer-encoding": "chunked",
        "connection": "close",
    }
    assert usage.bytes_sent > len(body)
    assert SECRET not in repr(audit.records)
    assert SECRET not in caplog.text
    assert "/upload" not in caplog.text  # paths may carry secrets: never logged


async def test_an_early_answer_reaches_the_client_of_an_unread_body(
    audit: MemoryEgressAudit,
) -> None:
    async def refuse_upload(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 4\r\n\r\nbig!")
        await writer.drain()
        await done.wait()  # never reads the body, keeps the connection open
        writer.close()

    done = asyncio.Event()
    server = await asyncio.start_server(refuse_upload, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    body = b"z" * 4_000_000
    head = f"PUT http://127.0.0.1:{port}/big HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n"
    async with server, proxy_session(audit, f"127.0.0.1:{port}") as session:
        reader, writer = await open_client(session)
        writer.write(head.encode() + body)
        status, headers = await response_head(reader)
        assert (status, await reader.readexactly(4)) == (413, b"big!")
        writer.close()
        done.set()
    assert headers["connection"] == "close"


# --- refused -------------------------------------------------------------------------------


async def test_a_host_not_granted_is_refused_unresolved_and_audited(
    audit: MemoryEgressAudit, echo: Upstream, web: Upstream
) -> None:
    resolver = RecordingResolver()
    async with proxy_session(audit, f"127.0.0.1:{echo.port}", resolver=resolver) as session:
        status, headers = await connect_status(session, "exfil.example.net:443")
        assert (status, headers["x-toolfleet-egress"]) == (403, "not_granted")
        other_port = await request(
            session, f"GET http://127.0.0.1:{web.port}/ HTTP/1.1\r\n\r\n".encode()
        )
        assert other_port[0] == 403
        assert b"not granted" in other_port[2]
        # The session keeps serving what is granted.
        async with tunnel(session, f"127.0.0.1:{echo.port}") as (reader, writer):
            await echo_through(reader, writer)
        assert session.usage().refused == 2
    assert resolver.asked == []  # a name not granted is not even looked up
    assert web.requests == []
    first, second = refusals(audit)
    assert (first.host, first.port, first.method, first.reason) == (
        "exfil.example.net",
        443,
        "CONNECT",
        EgressReason.NOT_GRANTED,
    )
    assert (second.host, second.port, second.method, second.reason) == (
        "127.0.0.1",
        web.port,
        "GET",
        EgressReason.NOT_GRANTED,
    )
    assert {(r.invocation_id, r.tenant_id, r.decision) for r in (first, second)} == {
        ("inv-egress", "t1", EgressDecision.REFUSED)
    }


async def test_a_granted_name_resolving_to_loopback_is_refused_unless_loopback_is_granted(
    audit: MemoryEgressAudit, echo: Upstream
) -> None:
    target = f"localhost:{echo.port}"
    async with proxy_session(audit, target) as session:
        status, headers = await connect_status(session, target)
    assert (status, headers["x-toolfleet-egress"]) == (403, "private_address")
    [record] = audit.records
    assert (record.host, record.reason, record.decision) == (
        "localhost",
        EgressReason.PRIVATE_ADDRESS,
        EgressDecision.REFUSED,
    )
    assert record.address in {"127.0.0.1", "::1"}

    granted = proxy_session(audit, target, f"127.0.0.1:{echo.port}")
    async with granted as session, tunnel(session, target) as (reader, writer):
        await echo_through(reader, writer)
    assert audit.records[-1].address == "127.0.0.1"  # the address checked is the one used


async def test_metadata_and_private_addresses_are_refused_to_wildcard_grants(
    audit: MemoryEgressAudit,
) -> None:
    resolver = StaticResolver(
        table={
            "metadata.svc.test": ["169.254.169.254"],
            "rebind.svc.test": ["10.0.0.7", "fd00:ec2::254"],
        }
    )
    async with proxy_session(audit, "*", "*.svc.test:*", resolver=resolver) as session:
        for target in ("metadata.svc.test:80", "rebind.svc.test:443", "169.254.169.254:80"):
            status, headers = await connect_status(session, target)
            assert (status, headers["x-toolfleet-egress"]) == (403, "private_address"), target
        status, _, _ = await request(
            session, b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n"
        )
        assert status == 403
    assert [(r.host, r.address) for r in audit.records] == [
        ("metadata.svc.test", "169.254.169.254"),
        ("rebind.svc.test", "10.0.0.7"),
        ("169.254.169.254", "169.254.169.254"),
        ("169.254.169.254", "169.254.169.254"),
    ]


async def test_ipv6_forms_of_loopback_are_refused_as_loopback(
    audit: MemoryEgressAudit, echo: Upstream
) -> None:
    """Issue 32: ``::127.0.0.1`` passed as public; every IPv6 form embedding loopback
    (literal or resolved) is judged as the IPv4 it carries."""
    forms = [
        "::127.0.0.1",
        "::7f00:1",
        "::ffff:127.0.0.1",
        "::ffff:0:7f00:1",
        "64:ff9b::7f00:1",
        "64:ff9b:1::7f00:1",
        "2002:7f00:1::",
        "2001:0:4136:e378:8000:63bf:80ff:fffe",
    ]
    resolver = StaticResolver(table={"sneaky.svc.test": ["::127.0.0.1", "::ffff:127.0.0.1"]})
    async with proxy_session(audit, "*:*", resolver=resolver) as session:
        for form in forms:
            status, headers = await connect_status(session, f"[{form}]:{echo.port}")
            assert (status, headers["x-toolfleet-egress"]) == (403, "private_address"), form
        status, headers = await connect_status(session, f"sneaky.svc.test:{echo.port}")
        assert (status, headers["x-toolfleet-egress"]) == (403, "private_address")
        status, _, _ = await request(
            session, f"GET http://[::127.0.0.1]:{echo.port}/ HTTP/1.1\r\n\r\n".encode()
        )
        assert status == 403
    assert {r.reason for r in audit.records} == {EgressReason.PRIVATE_ADDRESS}
    assert len(audit.records) == len(forms) + 2


async def test_wildcard_grants(audit: MemoryEgressAudit, echo: Upstream) -> None:
    resolver = StaticResolver(
        table={
            name: ["127.0.0.1"]
            for name in ("api.svc.test", "a.b.svc.test", "svc.test", "api.svc.test.evil.net")
        }
    )
    entries = (f"*.svc.test:{echo.port}", f"127.0.0.1:{echo.port}")
    async with proxy_session(audit, *entries, resolver=resolver) as session:
        for name in ("api.svc.test", "A.B.SVC.TEST."):
            async with tunnel(session, f"{name}:{echo.port}") as (reader, writer):
                await echo_through(reader, writer)
        for target in (
            f"svc.test:{echo.port}",
            f"api.svc.test.evil.net:{echo.port}",
            "api.svc.test:443",
        ):
            status, headers = await connect_status(session, target)
            assert (status, headers["x-toolfleet-egress"]) == (403, "not_granted"), target
    assert [(r.host, r.decision) for r in audit.records] == [
        ("api.svc.test", EgressDecision.ALLOWED),
        ("a.b.svc.test", EgressDecision.ALLOWED),
        ("svc.test", EgressDecision.REFUSED),
        ("api.svc.test.evil.net", EgressDecision.REFUSED),
        ("api.svc.test", EgressDecision.REFUSED),
    ]


async def test_malformed_requests_get_400_and_the_proxy_keeps_serving(
    audit: MemoryEgressAudit, echo: Upstream
) -> None:
    limits = EgressLimits(max_head_bytes=4096)
    bad = [
        b"HELLO\r\n\r\n",
        b"GET /relative HTTP/1.1\r\n\r\n",
        b"GET https://example.com/ HTTP/1.1\r\n\r\n",
        b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        b"POST http://127.0.0.1/ HTTP/1.1\r\nContent-Length: 1\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # TLS sent to the proxy
    ]
    async with proxy_session(audit, f"127.0.0.1:{echo.port}", limits=limits) as session:
        for raw in bad:
            status, headers, _ = await request(session, raw)
            assert (status, headers["x-toolfleet-egress"]) == (400, "malformed_request"), raw
        status, _, _ = await request(session, b"GET http://x/ HTTP/1.1\r\nX: " + b"a" * 5000)
        assert status == 431
        # A client that hangs up mid-head is no refusal, and no crash.
        _, writer = await open_client(session)
        writer.write(b"CONNECT 127.0.0.1:")
        writer.close()
        async with tunnel(session, f"127.0.0.1:{echo.port}") as (reader, writer):
            await echo_through(reader, writer)
    assert [(r.host, r.port, r.method, r.reason) for r in refusals(audit)] == [
        ("", 0, "", EgressReason.MALFORMED_REQUEST)
    ] * (len(bad) + 1)
    assert audit.records[-1].decision is EgressDecision.ALLOWED


async def test_the_concurrent_tunnel_limit(audit: MemoryEgressAudit, echo: Upstream) -> None:
    limits = EgressLimits(max_tunnels=2)
    target = f"127.0.0.1:{echo.port}"
    async with proxy_session(audit, target, limits=limits) as session:
        async with tunnel(session, target) as first, tunnel(session, target) as second:
            status, headers = await connect_status(session, target)
            assert (status, headers["x-toolfleet-egress"]) == (429, "too_many_connections")
            for reader, writer in (first, second):
                await echo_through(reader, writer)  # the open tunnels are untouched
        await eventually(lambda: _if(session, lambda s: s.active_tunnels == 0))
        async with tunnel(session, target) as (reader, writer):
            await echo_through(reader, writer)
    [refused] = refusals(audit)
    assert (refused.reason, refused.port) == (EgressReason.TOO_MANY_CONNECTIONS, echo.port)


async def test_an_unreachable_granted_port_is_a_502(audit: MemoryEgressAudit) -> None:
    async with echo_server() as gone:
        port = gone.port
    async with proxy_session(audit, f"127.0.0.1:{port}") as session:
        status, headers = await connect_status(session, f"127.0.0.1:{port}")
    assert (status, headers["x-toolfleet-egress"]) == (502, "connect_failed")
    [record] = audit.records
    assert (record.decision, record.reason) == (EgressDecision.FAILED, EgressReason.CONNECT_FAILED)


async def test_a_slow_resolution_is_a_504_within_the_connect_timeout(
    audit: MemoryEgressAudit,
) -> None:
    class HangingResolver:
        async def resolve(self, name: str) -> tuple[IPAddress, ...]:
            await asyncio.Event().wait()
            return ()

    limits = EgressLimits(connect_timeout_s=0.2)
    async with proxy_session(
        audit, "slow.example.com", limits=limits, resolver=HangingResolver()
    ) as session:
        status, headers = await connect_status(session, "slow.example.com:443")
        assert session.active_tunnels == 0
    assert (status, headers["x-toolfleet-egress"]) == (504, "connect_timeout")
    [record] = audit.records
    assert (record.decision, record.reason) == (EgressDecision.FAILED, EgressReason.CONNECT_TIMEOUT)


async def test_slow_and_surplus_clients_are_answered(audit: MemoryEgressAudit) -> None:
    limits = EgressLimits(head_timeout_s=0.3, max_clients=2)
    async with proxy_session(audit, "example.com", limits=limits) as session:
        idle = [await open_client(session) for _ in range(2)]
        await eventually(lambda: _if(session, lambda s: s.active_clients == 2))
        status, headers = await connect_status(session, "example.com:443")
        assert (status, headers["x-toolfleet-egress"]) == (429, "too_many_connections")
        for reader, writer in idle:
            writer.write(b"CONNECT example.com:443 HTTP/1.1\r\n")  # and never the end
            assert (await response_head(reader))[0] == 408
            writer.close()
    assert [r.reason for r in audit.records] == [
        EgressReason.TOO_MANY_CONNECTIONS,
        EgressReason.MALFORMED_REQUEST,
        EgressReason.MALFORMED_REQUEST,
    ]


async def test_an_idle_tunnel_is_closed(audit: MemoryEgressAudit, echo: Upstream) -> None:
    limits = EgressLimits(idle_timeout_s=0.3)
    target = f"127.0.0.1:{echo.port}"
    async with proxy_session(audit, target, limits=limits) as session:
        async with tunnel(session, target) as (reader, writer):
            await echo_through(reader, writer)
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the proxy
        assert session.active_tunnels == 0


async def test_closing_the_session_cuts_its_tunnels(
    audit: MemoryEgressAudit, echo: Upstream, socket_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = f"127.0.0.1:{echo.port}"
    path = socket_dir / "cut.sock"
    async with EgressProxy(audit=audit) as proxy:
        async with proxy.session(make_grant(target), unix_path=path) as session:
            reader, writer = await open_client(session)
            writer.write(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
            assert (await response_head(reader))[0] == 200
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
    assert not path.exists()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_the_unix_socket_listener(
    audit: MemoryEgressAudit, echo: Upstream, web: Upstream, socket_dir: Path
) -> None:
    path = socket_dir / "egress.sock"
    entries = (f"127.0.0.1:{echo.port}", f"127.0.0.1:{web.port}")
    async with proxy_session(audit, *entries, unix_path=path) as session:
        assert session.unix_path == path
        assert session.tcp_address is None
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        async with tunnel(session, f"127.0.0.1:{echo.port}") as (reader, writer):
            await echo_through(reader, writer)
        status, _, body = await request(
            session, f"GET http://127.0.0.1:{web.port}/via-unix HTTP/1.1\r\n\r\n".encode()
        )
        assert (status, json.loads(body)["target"]) == (200, "/via-unix")
        status, _ = await connect_status(session, "example.com:443")
        assert status == 403
    assert not path.exists()
    assert [r.decision for r in audit.records] == [
        EgressDecision.ALLOWED,
        EgressDecision.ALLOWED,
        EgressDecision.REFUSED,
    ]


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` talking to a proxy on a unix socket, as a sandboxed tool would."""

    def __init__(self, path: Path) -> None:
        super().__init__("egress-proxy", timeout=10)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self.path))
        self.sock = sock
        if self._tunnel_host:  # type: ignore[attr-defined]
            self._tunnel()  # type: ignore[attr-defined]


def fetch_via_unix(path: Path, port: int, *, tunnel: bool) -> tuple[int, dict[str, Any]]:
    conn = UnixHTTPConnection(path)
    try:
        if tunnel:
            conn.set_tunnel("127.0.0.1", port)
            conn.request("GET", "/through-connect")
        else:
            conn.request("GET", f"http://127.0.0.1:{port}/absolute")
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


async def test_a_stock_http_client_through_the_unix_socket(
    audit: MemoryEgressAudit, web: Upstream, socket_dir: Path
) -> None:
    path = socket_dir / "client.sock"
    async with proxy_session(audit, f"127.0.0.1:{web.port}", unix_path=path):
        tunnelled = await asyncio.to_thread(fetch_via_unix, path, web.port, tunnel=True)
        forwarded = await asyncio.to_thread(fetch_via_unix, path, web.port, tunnel=False)
    assert tunnelled == (200, {"method": "GET", "target": "/through-connect", "size": 0})
    assert forwarded == (200, {"method": "GET", "target": "/absolute", "size": 0})
    assert [r.method for r in audit.records] == ["CONNECT", "GET"]


async def test_one_proxy_serves_sessions_with_their_own_grants(
    audit: MemoryEgressAudit, echo: Upstream, web: Upstream, socket_dir: Path
) -> None:
    async with EgressProxy(audit=audit) as proxy:
        grant_a = make_grant(f"127.0.0.1:{echo.port}", invocation_id="inv-a")
        grant_b = make_grant(f"127.0.0.1:{web.port}", invocation_id="inv-b")
        async with (
            proxy.session(grant_a, unix_path=socket_dir / "a.sock") as a,
            proxy.session(grant_b, unix_path=socket_dir / "b.sock") as b,
        ):
            async with tunnel(a, f"127.0.0.1:{echo.port}") as (reader, writer):
                await echo_through(reader, writer)
            assert (await connect_status(b, f"127.0.0.1:{echo.port}"))[0] == 403
            assert (await connect_status(a, f"127.0.0.1:{web.port}"))[0] == 403
    assert [(r.invocation_id, r.port, r.decision) for r in audit.records] == [
        ("inv-a", echo.port, EgressDecision.ALLOWED),
        ("inv-b", echo.port, EgressDecision.REFUSED),
        ("inv-a", web.port, EgressDecision.REFUSED),
    ]


async def test_refusal_audits_are_capped_per_session_and_counted(
    audit: MemoryEgressAudit,
) -> None:
    limits = EgressLimits(max_audited_refusals=2, audit_allowed=False)
    async with proxy_session(audit, limits=limits) as session:
        for _ in range(5):
            assert (await connect_status(session, "example.com:443"))[0] == 403
        assert session.usage().refused == 5
    assert len(audit.records) == 2


async def test_a_failing_audit_port_breaks_nothing(echo: Upstream) -> None:
    class BrokenAudit:
        async def record(self, entry: EgressRecord) -> None:
            raise ConnectionError("audit topic down")

    target = f"127.0.0.1:{echo.port}"
    async with (
        EgressProxy(audit=BrokenAudit()) as proxy,
        proxy.session(make_grant(target), tcp=True) as session,
    ):
        assert (await connect_status(session, "example.com:443"))[0] == 403
        async with tunnel(session, target) as (reader, writer):
            await echo_through(reader, writer)


# --- HTTP framing: h11 reads both sides, the proxy refuses what h11 tolerates -------------


@asynccontextmanager
async def scripted_server(*answers: bytes) -> AsyncIterator[Upstream]:
    """Reads a request head, sends the next of ``answers`` verbatim and closes."""
    seen: list[dict[str, Any]] = []
    script = iter(answers)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen.append({"raw": await reader.readuntil(b"\r\n\r\n")})
            writer.write(next(script))
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield Upstream(server, seen)


async def exchange(session: EgressSession, raw: bytes) -> bytes:
    """Send ``raw`` and half-close; every byte the proxy answers until it closes."""
    reader, writer = await open_client(session)
    try:
        writer.write(raw)
        writer.write_eof()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


MALFORMED_HEADS = [
    b"GET URL/ HTTP/2.0\r\n\r\n",
    b"GET URL/ http/1.1\r\n\r\n",
    b"GET  URL/ HTTP/1.1\r\n\r\n",
    b"GET URL/\r\n\r\n",
    b"G(ET URL/ HTTP/1.1\r\n\r\n",
    b"GET URL/ HTTP/1.1\r\nBad Name: x\r\n\r\n",
    b"GET URL/ HTTP/1.1\r\nNoColon\r\n\r\n",
    b"GET URL/ HTTP/1.1\r\nX: a\r\n\tfolded\r\n\r\n",  # obs-fold (h11 would unfold it)
    b"GET URL/ HTTP/1.1\r\nX: a\x00b\r\n\r\n",
    b"GET URL/ HTTP/1.1\r\nX: a\x01b\r\n\r\n",  # a control character h11 lets through
    b"GET URL/ HTTP/1.1\r\nX: a\nInjected: b\r\n\r\n",  # bare LF (h11 would accept it)
    b"GET URL/ HTTP/1.1\n\n",
    b"GET URL/ HTTP/1.1\r\nX: a\n\r\nGET URL/smuggled HTTP/1.1\r\n\r\n",
    b"GET URL/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET URL/ HTTP/1.1\r\n" + b"".join(b"X%d: y\r\n" % i for i in range(101)) + b"\r\n",
    b"CONNECT AUTHORITY HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody",
    b"CONNECT AUTHORITY HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"\r\n\r\n",
    b"\xff\xfe\r\n\r\n",
]

AMBIGUOUS_FRAMING = [
    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    b"Content-Length: 5\r\nContent-Length: 6\r\n",
    b"Content-Length: 5, 6\r\n",
    b"Content-Length: -1\r\n",
    b"Content-Length: 0x10\r\n",
    b"Content-Length: +5\r\n",
    b"Transfer-Encoding: gzip\r\n",
    b"Transfer-Encoding: gzip, chunked\r\n",
    b"Transfer-Encoding: chunked, identity\r\n",
    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    b"Transfer-Encoding:\x0bchunked\r\n",
]


async def test_malformed_heads_and_ambiguous_framing_never_reach_the_upstream(
    audit: MemoryEgressAudit, web: Upstream
) -> None:
    authority = b"127.0.0.1:%d" % web.port
    heads = [raw.replace(b"URL", b"http://" + authority) for raw in MALFORMED_HEADS]
    heads = [raw.replace(b"AUTHORITY", authority) for raw in heads]
    heads += [
        b"POST http://%s/ HTTP/1.1\r\n%s\r\n5\r\nhello\r\n0\r\n\r\n" % (authority, fields)
        for fields in AMBIGUOUS_FRAMING
    ]
    async with proxy_session(audit, authority.decode()) as session:
        for raw in heads:
            status, headers, _ = await request(session, raw)
            assert (status, headers["x-toolfleet-egress"]) == (400, "malformed_request"), raw
        assert session.usage().connections == 0
    assert web.requests == []
    assert [r.reason for r in audit.records] == [EgressReason.MALFORMED_REQUEST] * len(heads)


async def test_each_request_body_framing_is_relayed_re_framed(
    audit: MemoryEgressAudit, web: Upstream
) -> None:
    url = f"http://127.0.0.1:{web.port}/b"
    cases = [
        (b"", b"", 0),
        (b"Content-Length: 12\r\n", b"hello world!", 12),
        (b"Content-Length: 12\r\nContent-Length: 12\r\n", b"hello world!", 12),
        (b"Transfer-Encoding: Chunked\r\n", b"5;ext=x\r\nhello\r\n7\r\n world!\r\n0\r\n\r\n", 12),
    ]
    async with proxy_session(audit, f"127.0.0.1:{web.port}") as session:
        for fields, body, size in cases:
            for version in (b"HTTP/1.1", b"HTTP/1.0"):
                raw = b"POST %s %s\r\nTE: trailers\r\n%s\r\n%s" % (
                    url.encode(),
                    version,
                    fields,
                    body,
                )
                status, _, answer = await request(session, raw)
                assert (status, json.loads(answer)["size"]) == (200, size), raw
    assert {r["body"] for r in web.requests} == {b"", b"hello world!"}
    for seen in web.requests:
        head = seen["raw"].lower()
        assert head.startswith(b"post /b http/1.1\r\n")  # always HTTP/1.1 upstream
        assert head.count(b"content-length") + head.count(b"transfer-encoding") <= 1
        assert b"\r\nte:" not in head


async def test_a_request_hidden_in_a_body_stays_body(
    audit: MemoryEgressAudit, web: Upstream
) -> None:
    """``Connection: Content-Length`` must not strip the framing from what is sent on:
    the body would become a second request to the upstream."""
    hidden = b"GET /admin HTTP/1.1\r\nHost: internal\r\n\r\n"
    raw = b"POST http://127.0.0.1:%d/upload HTTP/1.1\r\n" % web.port + (
        b"Connection: Content-Length, Transfer-Encoding\r\nContent-Length: %d\r\n\r\n%s"
        % (len(hidden), hidden)
    )
    async with proxy_session(audit, f"127.0.0.1:{web.port}") as session:
        status, _, answer = await request(session, raw)
    assert (status, json.loads(answer)["size"]) == (200, len(hidden))
    [seen] = web.requests
    assert seen["body"] == hidden
    assert seen["headers"]["content-length"] == str(len(hidden))


async def test_pipelined_requests_after_the_first_are_never_forwarded(
    audit: MemoryEgressAudit, web: Upstream
) -> None:
    first = b"GET http://127.0.0.1:%d/first HTTP/1.1\r\nHost: x\r\n\r\n" % web.port
    second = b"GET http://127.0.0.1:%d/second HTTP/1.1\r\nHost: x\r\n\r\n" % web.port
    third = b"CONNECT exfil.example.net:443 HTTP/1.1\r\n\r\n"
    async with proxy_session(audit, f"127.0.0.1:{web.port}") as session:
        reader, writer = await open_client(session)
        writer.write(first + second + third)
        status, headers = await response_head(reader)
        rest = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert (status, headers["connection"], json.loads(rest)["target"]) == (200, "close", "/first")
    assert [r["target"] for r in web.requests] == ["/first"]
    assert [(r.method, r.decision) for r in audit.records] == [("GET", EgressDecision.ALLOWED)]


async def test_chunk_extensions_and_hop_by_hop_trailers_are_not_sent_on(
    audit: MemoryEgressAudit,
) -> None:
    received: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        received.append(await reader.readuntil(b"\r\n\r\n"))  # the chunked body to its end
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    raw = (
        b"POST http://127.0.0.1:%d/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" % port
        + b'5;ext=evil;x="y"\r\nhello\r\n0;last=1\r\nX-Trailer: kept\r\n'
        + b"Content-Length: 99\r\nConnection: x\r\nHost: internal\r\nTE: trailers\r\n\r\n"
    )
    async with server, proxy_session(audit, f"127.0.0.1:{port}") as session:
        status, _, _ = await request(session, raw)
    assert status == 204
    assert received == [b"5\r\nhello\r\n0\r\nX-Trailer: kept\r\n\r\n"]


async def test_a_response_is_re_framed_for_its_client(audit: MemoryEgressAudit) -> None:
    """Chunk extensions, hop-by-hop fields and trailers stay with the upstream; an
    HTTP/1.1 client gets chunks and the end-to-end trailer, an HTTP/1.0 client the body
    until close; a 1xx reaches only the HTTP/1.1 client."""
    answer = (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n"
        b"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=9\r\n\r\n"
        b"5;ext=1\r\nhello\r\n0\r\nX-Sum: 42\r\nKeep-Alive: 1\r\n\r\n"
    )
    async with (
        scripted_server(answer, answer) as up,
        proxy_session(audit, f"127.0.0.1:{up.port}") as session,
    ):
        got = {
            version: await exchange(
                session, b"GET http://127.0.0.1:%d/ %s\r\n\r\n" % (up.port, version)
            )
            for version in (b"HTTP/1.1", b"HTTP/1.0")
        }
    early, final, body = got[b"HTTP/1.1"].split(b"\r\n\r\n", 2)
    assert early == b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>"
    assert sorted(final.lower().split(b"\r\n")[1:]) == [
        b"connection: close",
        b"transfer-encoding: chunked",
    ]
    assert body == b"5\r\nhello\r\n0\r\nX-Sum: 42\r\n\r\n"
    final, body = got[b"HTTP/1.0"].split(b"\r\n\r\n", 1)
    assert final.lower().split(b"\r\n") == [b"http/1.1 200 ok", b"connection: close"]
    assert body == b"hello"


async def test_a_response_that_lies_about_its_length(audit: MemoryEgressAudit) -> None:
    """Bytes past a response's length never reach the client (they could pose as a
    second response); a body cut short stays visibly short."""
    forged = b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nforged!"
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" + forged,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + forged,
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    ]
    async with (
        scripted_server(*answers) as up,
        proxy_session(audit, f"127.0.0.1:{up.port}") as session,
    ):
        raw = b"GET http://127.0.0.1:%d/ HTTP/1.1\r\n\r\n" % up.port
        got = [(await exchange(session, raw)).lower() for _ in answers]
    assert got[0].endswith(b"content-length: 5\r\nconnection: close\r\n\r\nhello")
    assert got[1].endswith(b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert not any(b"forged" in answer for answer in got)
    assert got[2].endswith(b"content-length: 100\r\nconnection: close\r\n\r\nonly ten b")
    assert got[3].endswith(b"\r\n\r\n5\r\nhello\r\n")  # no last chunk: the client sees the cut


async def test_a_malformed_response_head_is_a_502(audit: MemoryEgressAudit) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nX: a\x01b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",  # no upgrade was asked
        b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 40_000 + b"\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n",
        b"",
    ]
    async with (
        scripted_server(*answers) as up,
        proxy_session(audit, f"127.0.0.1:{up.port}") as session,
    ):
        for answer in answers:
            status, headers, body = await request(
                session, b"GET http://127.0.0.1:%d/ HTTP/1.1\r\n\r\n" % up.port
            )
            assert (status, body) == (502, b"malformed response from the upstream\n"), answer
            assert "x-toolfleet-egress" not in headers


async def test_a_refused_head_request_gets_no_body(audit: MemoryEgressAudit) -> None:
    async with proxy_session(audit, "example.com") as session:
        answer = await exchange(session, b"HEAD http://exfil.example.net/ HTTP/1.1\r\n\r\n")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"\r\nContent-Length: " in head
    assert body == b""


async def test_bytes_sent_with_the_connect_head_open_the_tunnel(
    audit: MemoryEgressAudit, echo: Upstream
) -> None:
    async with proxy_session(audit, f"127.0.0.1:{echo.port}") as session:
        reader, writer = await open_client(session)
        writer.write(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\nping\n" % echo.port)
        assert (await response_head(reader))[0] == 200
        assert await asyncio.wait_for(reader.readline(), 10) == b"ping\n"
        writer.close()


def _mutations(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data))
        choice = rng.random()
        if choice < 0.4:
            data[at] = rng.choice(b"\r\n \t:;,\x00\x01\x7f0aZ")
        elif choice < 0.7:
            data.insert(at, rng.choice(b"\r\n \t:,"))
        else:
            del data[at]
    return bytes(data)


async def test_mutated_requests_reach_the_upstream_only_as_clean_heads(
    audit: MemoryEgressAudit, web: Upstream, echo: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    """Seeded byte mutations of valid requests: whatever the proxy makes of them, the
    upstream gets one canonical head (CRLF lines, no fold, one Host, no proxy
    credentials) or nothing, and the proxy neither fails nor stops serving."""
    authority = f"127.0.0.1:{web.port}".encode()
    valid = [
        b"GET http://%s/a?b=c HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n"
        b"Proxy-Authorization: Basic %s\r\n\r\n" % (authority, SECRET.encode()),
        b"POST http://%s/u HTTP/1.1\r\nContent-Length: 5\r\nConnection: x-a\r\n"
        b"X-A: 1\r\n\r\nhello" % authority,
        b"POST http://%s/u HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;e=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n" % authority,
    ]
    rng = random.Random(34)
    limits = EgressLimits(idle_timeout_s=2.0, head_timeout_s=2.0)
    async with proxy_session(audit, authority.decode(), limits=limits) as session:
        for _ in range(150):
            answer = await exchange(session, _mutations(rng, rng.choice(valid)))
            assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer
        async with tunnel(session, authority.decode()) as (reader, writer):
            writer.write(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await response_head(reader))[0] == 200
    assert web.requests, "some mutations are still valid requests"
    for seen in web.requests:
        head: bytes = seen["raw"]
        assert b"\n" not in head.replace(b"\r\n", b""), head
        assert b"\r\n " not in head, head
        assert b"\r\n\t" not in head, head
        assert head.lower().count(b"\r\nhost: ") == 1, head
        assert b"\r\nproxy-authorization:" not in head.lower(), head
    ours = [r for r in caplog.records if r.name.startswith("toolfleet")]
    assert [r.getMessage() for r in ours if r.levelno >= logging.WARNING] == []


async def _if(value: Any, predicate: Any) -> Any:
    return value if predicate(value) else None
