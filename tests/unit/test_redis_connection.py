"""The fleet's Redis connections: hiredis packs the bytes redis-py would, no idle PING."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Literal

import hiredis
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError
from redis.exceptions import TimeoutError as RedisTimeoutError

from toolfleet.storage.redis import connect_redis, lean_connection

pytestmark = pytest.mark.unit

ARGUMENT = st.one_of(
    st.text(),
    st.binary(),
    st.integers(),
    st.floats(),  # nan and inf too: both write repr()
)


def both(*args: Any) -> tuple[bytes, bytes]:
    theirs = b"".join(Connection().pack_command(*args))
    ours = b"".join(lean_connection(Connection)().pack_command(*args))
    return ours, theirs


@given(st.lists(ARGUMENT, max_size=12))
def test_any_arguments_pack_to_the_same_bytes(arguments: list[Any]) -> None:
    ours, theirs = both("EVALSHA", *arguments)
    assert ours == theirs


@pytest.mark.parametrize(
    "args",
    [
        ("CONFIG GET", "maxmemory"),  # two words in the name: sent as two arguments
        (b"CLIENT SETNAME", b"toolfleet"),
        ("SET", "k", "é \u2603 \U0001f600", "EX", 30),
        ("SET", "k", 10**30),  # past 64 bits: decimal text like any other integer
        ("SET", "k", memoryview(b"payload")),  # hiredis refuses it; redis-py sends it
        ("SET", "k", bytearray(b"payload")),
        ("SET", "k", "x" * 100_000),  # past redis-py's buffer cut-off
    ],
)
def test_edge_arguments_pack_to_the_same_bytes(args: tuple[Any, ...]) -> None:
    ours, theirs = both(*args)
    assert ours == theirs


@pytest.mark.parametrize("bad", [True, None, object(), "\ud800"])
def test_what_redis_py_refuses_is_still_refused(bad: Any) -> None:
    with pytest.raises((DataError, UnicodeError)) as theirs:
        Connection().pack_command("SET", "k", bad)
    with pytest.raises(theirs.type):
        lean_connection(Connection)().pack_command("SET", "k", bad)


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("redis://127.0.0.1:6379/0", Connection),
        ("rediss://127.0.0.1:6379/0", SSLConnection),
        ("unix:///tmp/redis.sock", UnixDomainSocketConnection),
    ],
)
def test_every_scheme_keeps_its_connection_class(url: str, base: type[Connection]) -> None:
    cls = connect_redis(url).connection_pool.connection_class
    assert issubclass(cls, base)
    assert cls is lean_connection(base)


def test_another_encoding_keeps_redis_pys_packer() -> None:
    cls = connect_redis(
        "redis://127.0.0.1:6379/0?encoding=latin-1"
    ).connection_pool.connection_class
    assert cls is Connection
    assert cls(encoding="latin-1").pack_command("SET", "k", "é")[0].endswith(b"\xe9\r\n")


async def test_a_command_connection_sends_no_health_check_ping() -> None:
    # Idle past the interval, pointed at a port nothing listens on: redis-py's check
    # would connect to send a PING (and fail); ours goes straight to the command.
    conn = lean_connection(Connection)(host="127.0.0.1", port=1, health_check_interval=30)
    conn.next_health_check = asyncio.get_running_loop().time() - 60
    await conn.check_health()
    assert not conn.is_connected
    with pytest.raises(RedisConnectionError):
        await Connection(host="127.0.0.1", port=1, health_check_interval=30).check_health()


class FakeRedis:
    """A Redis that answers ``+OK`` to every command; once ``then`` is set, it answers
    the next batch of commands and reads nothing more (``stall``), or resets the
    connection when the next command arrives (``reset``)."""

    def __init__(self) -> None:
        self.then: Literal["answer", "stall", "reset"] = "answer"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = hiredis.Reader()
        while chunk := await reader.read(65536):
            if self.then == "reset":
                writer.transport.abort()  # an RST, not a FIN
                return
            parser.feed(chunk)
            while parser.gets() is not False:
                writer.write(b"+OK\r\n")
            await writer.drain()
            if self.then == "stall":
                break
        await asyncio.Event().wait()  # holds the socket open, reads nothing more


@pytest.fixture
async def fake_redis() -> AsyncIterator[tuple[FakeRedis, int]]:
    fake = FakeRedis()
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    async with server:
        yield fake, server.sockets[0].getsockname()[1]
        server.close()


BOTH = pytest.mark.parametrize(
    "cls", [Connection, lean_connection(Connection)], ids=["redis-py", "ours"]
)
#: 64 MB outgrow every buffer between the two ends: such a write finishes only if read.
HUGE = b"x" * (64 << 20)


async def past_handshake(
    fake_redis: tuple[FakeRedis, int],
    cls: type[Connection],
    socket_timeout: float,
    then: Literal["stall", "reset"],
) -> Connection:
    """A connection past its handshake whose next command makes the server ``then``."""
    fake, port = fake_redis
    conn = cls(host="127.0.0.1", port=port, socket_timeout=socket_timeout)
    await conn.connect()
    fake.then = then
    await conn.send_command("PING")  # a small write lands in the kernel's buffers
    return conn


@BOTH
async def test_a_write_the_server_never_reads_times_out_as_redis_pys(
    fake_redis: tuple[FakeRedis, int], cls: type[Connection]
) -> None:
    conn = await past_handshake(fake_redis, cls, socket_timeout=0.3, then="stall")
    with pytest.raises(RedisTimeoutError, match=r"^Timeout writing to socket$"):
        await conn.send_command("SET", "k", HUGE)
    assert not conn.is_connected


@BOTH
async def test_a_write_cancelled_midway_drops_the_connection(
    fake_redis: tuple[FakeRedis, int], cls: type[Connection]
) -> None:
    # A command cut midway would leave the stream mid-command for the next one.
    conn = await past_handshake(fake_redis, cls, socket_timeout=30, then="stall")
    write = asyncio.ensure_future(conn.send_command("SET", "k", HUGE))
    await asyncio.sleep(0.1)
    write.cancel()
    with pytest.raises(asyncio.CancelledError):
        await write
    assert not conn.is_connected


@BOTH
async def test_a_write_to_a_reset_connection_fails_as_redis_pys(
    fake_redis: tuple[FakeRedis, int], cls: type[Connection]
) -> None:
    conn = await past_handshake(fake_redis, cls, socket_timeout=5, then="reset")
    with pytest.raises(RedisConnectionError, match=r"^Error .+ while writing to socket\. "):
        await write_until_refused(conn)
    assert not conn.is_connected


async def write_until_refused(conn: Connection) -> None:
    for _ in range(50):  # the reset reaches us between two writes
        await conn.send_command("SET", "k", b"x" * (1 << 20))
        await asyncio.sleep(0.01)
