"""Redis databases of one's own on a shared Redis server (tests and benchmarks).

A fleet is one Redis database; a test session or a benchmark that starts fleets on the
machine's Redis takes a database index nobody else holds and empties it afterwards, so
nothing it writes (dedupe markers live for days) stays behind in anyone's database 0.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit


@contextlib.contextmanager
def claimed_redis_database(server_url: str, *, ttl_s: int = 3 * 3600) -> Iterator[str]:
    """A Redis database index no other session holds, emptied, emptied again and released
    on exit (a test session's fleets, a benchmark's fleet).

    Two sessions on one machine (a developer's and CI's) must never share Redis state: a
    fleet's approval sweeper or rate buckets would act on the other's. The claim is a
    ``SET NX`` in database 0 per index, so it is safe between processes. A database that
    has clients connected is held too, lock or no lock: a worker orphaned by a killed
    session would otherwise sweep this session's approvals into its own (dead) broker.
    """
    import redis

    parts = urlsplit(server_url)
    registry = redis.Redis.from_url(urlunsplit(parts._replace(path="/0")))
    try:
        for index in range(15, 0, -1):
            lock = f"toolfleet:claimed-db:{index}"
            if not registry.set(lock, str(os.getpid()), nx=True, ex=ttl_s):
                continue
            if not any(int(client.get("db", 0)) == index for client in registry.client_list()):
                break
            registry.delete(lock)  # someone is still connected to it: leave it alone
        else:
            raise RuntimeError("every Redis database 1-15 is held by another session")
        url = urlunsplit(parts._replace(path=f"/{index}"))
        database = redis.Redis.from_url(url)
        try:
            database.flushdb()
            yield url
        finally:
            try:
                database.flushdb()
            finally:
                database.close()
                registry.delete(lock)
    finally:
        registry.close()
