"""Executor pools' shared state: which executors serve which pool, and the calls waiting.

A tool belongs to a pool (its manifest's ``pool``, default ``default``); policy publishes
its calls on that pool's topic (:func:`toolfleet.events.types.pool_topic`) and only the
executors started for the pool (``toolfleet worker executor --pool NAME``) read it.

**Presence.** Every executor announces itself every :data:`HEARTBEAT_INTERVAL_S` with
an :class:`ExecutorPresence`: the pools it serves, the tools it has loaded and the
partitions of each pool's topic the consumer group gave it. The record lives for
:data:`PRESENCE_TTL_S` (three heartbeats): an executor killed without a word drops out
of :func:`live_executors` that long after its last heartbeat. A stopping one withdraws
at once.

**Queued calls.** A call whose pool has no live executor (policy's view when it
publishes it), or that reached an executor of its pool lacking its tool while no live
one has it, waits: its status is ``queued``, and it is indexed here under its deadline
(the authorization time plus its timeout) so that an executor's sweeper
(:mod:`toolfleet.executor.pools`) ends it ``timeout`` then if nothing ran it. A call an
executor could not run (the tool is not loaded there) is *parked* here with its
authorized event, and handed to an executor of the pool that has the tool as soon as
one is live.

Keys, every one in the fleet's Redis Cluster slot (the topic prefix as hash tag):

- ``pools:{<prefix>}:executors`` (set of worker ids) and
  ``pools:{<prefix>}:executor:<worker_id>`` (its presence, JSON, with a TTL);
- ``pools:{<prefix>}:queued`` (sorted set: call -> deadline, ms),
  ``pools:{<prefix>}:queued:calls`` (hash: call -> :class:`QueuedCall` JSON) and
  ``pools:{<prefix>}:parked`` (sorted set: call -> when it was parked, ms).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, Protocol, cast

import asyncpg
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from toolfleet.events.envelope import Emitted, Envelope, derived_event_id, new_event
from toolfleet.events.identity import CallKey
from toolfleet.events.models import InvokeAuthorized, InvokeQueued
from toolfleet.events.types import DEFAULT_POOL, EventType, Source, TopicName
from toolfleet.storage.lua import LuaScript

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "PRESENCE_TTL_S",
    "ExecutorPresence",
    "MemoryPoolPresence",
    "MemoryQueuedCalls",
    "PoolPresence",
    "QueuedCall",
    "QueuedCalls",
    "RedisPoolPresence",
    "RedisQueuedCalls",
    "deadline_of",
    "live_counts",
    "live_executors",
    "pools_in_use",
    "queued_call",
    "queued_notification",
    "run_heartbeat",
]

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S: Final = 2.0
"""How often an executor announces itself."""
PRESENCE_TTL_S: Final = 3 * HEARTBEAT_INTERVAL_S
"""How long an announcement counts: an executor silent for three heartbeats is gone."""


def _tag(topic_prefix: str) -> str:
    """The hash tag of a fleet's pool keys: its topic prefix (braces are not in one)."""
    return "{" + topic_prefix.replace("{", "").replace("}", "") + "}"


# --- presence -------------------------------------------------------------------------


class ExecutorPresence(BaseModel):
    """What one live executor serves, as it announces it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    worker_id: str = Field(min_length=1, max_length=256)
    pools: tuple[str, ...]
    """The pools whose topics it reads."""
    tools: tuple[str, ...] = ()
    """The tools it has loaded, as ``tool_id@version`` (tool sources not included: every
    executor serves those)."""
    partitions: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    """Per pool, the partitions of the pool's topic its consumer holds now."""

    def has(self, tool_id: str, version: str) -> bool:
        return f"{tool_id}@{version}" in self.tools


class PoolPresence(Protocol):
    """Executors' announcements (:class:`RedisPoolPresence`, :class:`MemoryPoolPresence`)."""

    async def announce(self, presence: ExecutorPresence) -> None: ...
    async def withdraw(self, worker_id: str) -> None: ...
    async def live(self) -> list[ExecutorPresence]: ...


def live_counts(executors: list[ExecutorPresence]) -> dict[str, int]:
    """Pool -> live executors serving it (pools nobody serves are absent)."""
    counts: Counter[str] = Counter(pool for e in executors for pool in set(e.pools))
    return dict(sorted(counts.items()))


class RedisPoolPresence:
    """Announcements in Redis, each a key with a TTL, indexed by one set."""

    def __init__(self, redis: Redis, *, topic_prefix: str, ttl_s: float = PRESENCE_TTL_S) -> None:
        self._redis = redis
        tag = _tag(topic_prefix)
        self._index = f"pools:{tag}:executors"
        self._record = f"pools:{tag}:executor:"
        self._ttl_ms = max(1, int(ttl_s * 1000))

    async def announce(self, presence: ExecutorPresence) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._record + presence.worker_id, presence.model_dump_json(), px=self._ttl_ms)
            pipe.sadd(self._index, presence.worker_id)
            await pipe.execute()

    async def withdraw(self, worker_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._record + worker_id)
            pipe.srem(self._index, worker_id)
            await pipe.execute()

    async def live(self) -> list[ExecutorPresence]:
        """Every executor whose announcement has not expired (expired ones leave the index)."""
        members = sorted(_text(m) for m in await self._redis.smembers(self._index))
        if not members:
            return []
        records = await self._redis.mget([self._record + m for m in members])
        live: list[ExecutorPresence] = []
        gone: list[str] = []
        for member, raw in zip(members, records, strict=True):
            if raw is None:
                gone.append(member)
                continue
            try:
                live.append(ExecutorPresence.model_validate_json(raw))
            except ValidationError:
                log.warning("unreadable executor presence", extra={"worker_id": member})
        if gone:
            await self._redis.srem(self._index, *gone)
        return live


class MemoryPoolPresence:
    """In-process :class:`PoolPresence` for tests: announcements expire on ``clock``."""

    def __init__(
        self, *, ttl_s: float = PRESENCE_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self.records: dict[str, tuple[ExecutorPresence, float]] = {}

    async def announce(self, presence: ExecutorPresence) -> None:
        self.records[presence.worker_id] = (presence, self._clock() + self._ttl_s)

    async def withdraw(self, worker_id: str) -> None:
        self.records.pop(worker_id, None)

    async def live(self) -> list[ExecutorPresence]:
        now = self._clock()
        for worker_id in [w for w, (_, until) in self.records.items() if until <= now]:
            del self.records[worker_id]
        return [presence for presence, _ in sorted(self.records.values(), key=_by_worker)]


def _by_worker(entry: tuple[ExecutorPresence, float]) -> str:
    return entry[0].worker_id


async def live_executors(redis: Redis, *, topic_prefix: str) -> dict[str, int]:
    """Pool -> how many executors serving it are live now (pools nobody serves are absent).

    Raises:
        RedisError: Redis is unreachable.
    """
    return live_counts(await RedisPoolPresence(redis, topic_prefix=topic_prefix).live())


async def pools_in_use(pg: asyncpg.Pool) -> set[str]:
    """The pools named by registered tool versions that are not removed, and ``default``."""
    rows = await pg.fetch(
        "SELECT DISTINCT pool FROM tool_versions WHERE lifecycle_state <> 'removed'"
    )
    return {DEFAULT_POOL, *(str(r["pool"]) for r in rows)}


async def run_heartbeat(
    presence: PoolPresence,
    current: Callable[[], ExecutorPresence],
    stop: asyncio.Event,
    *,
    interval_s: float = HEARTBEAT_INTERVAL_S,
    changed: asyncio.Event | None = None,
) -> None:
    """Announce ``current()`` every ``interval_s`` (and at once when ``changed`` is set,
    e.g. on a rebalance) until ``stop``; then withdraw. A failed announcement is logged
    and tried again at the next beat: the executor keeps working meanwhile."""
    wake = changed or asyncio.Event()
    worker_id = current().worker_id
    while not stop.is_set():
        wake.clear()
        try:
            await presence.announce(current())
        except (RedisError, OSError) as exc:
            log.warning("pool presence not announced: %s", type(exc).__name__)
        await _first_of(stop.wait(), wake.wait(), timeout_s=interval_s)
    with contextlib.suppress(RedisError, OSError):
        await presence.withdraw(worker_id)


async def _first_of(*waits: Awaitable[object], timeout_s: float) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


# --- queued calls ---------------------------------------------------------------------


QueueReason = Literal["no_live_executor", "tool_not_loaded"]


class QueuedCall(BaseModel):
    """A call waiting for an executor of its pool, as the index keeps it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    tenant_id: str
    invocation_id: str
    pool: str
    tool_id: str
    tool_version: str
    deadline: datetime
    """When it ends ``timeout`` unless an executor has started it."""
    reason: QueueReason
    event: Envelope
    """The call's ``invoke.authorized`` event (grant included): what a sweeper answers
    with the timeout, and what is handed to an executor of the pool for a parked call."""
    parked: bool = False
    """An executor of the pool took it off the topic (it lacks the tool): it is handed
    to one that has the tool once one is live."""
    parked_by: str | None = None
    """The executor that lacked the tool."""

    @property
    def call(self) -> CallKey:
        return CallKey(tenant_id=self.tenant_id, invocation_id=self.invocation_id)


def deadline_of(event: Envelope, call: InvokeAuthorized) -> datetime:
    """When a call nobody started ends ``timeout``: its authorization plus its timeout
    (``event`` is its ``invoke.authorized``, whose ``time`` policy set)."""
    authorized_at = event.time or call.requested_at
    return authorized_at + timedelta(seconds=call.timeout_seconds)


def queued_call(
    event: Envelope,
    call: InvokeAuthorized,
    *,
    pool: str,
    reason: QueueReason,
    parked_by: str | None = None,
) -> QueuedCall:
    """The index entry of ``call`` (its authorized ``event``), waiting for ``pool``; with
    ``parked_by``, parked by that executor (it lacks the tool)."""
    return QueuedCall(
        tenant_id=call.agent_context.tenant_id,
        invocation_id=str(call.invocation_id),
        pool=pool,
        tool_id=call.tool_id,
        tool_version=call.tool_version,
        deadline=deadline_of(event, call),
        reason=reason,
        event=event,
        parked=parked_by is not None,
        parked_by=parked_by,
    )


def queued_notification(queued: QueuedCall, *, source: Source) -> Emitted:
    """The ``ai.agent.tool.invoke.queued`` event of ``queued`` (what status shows as
    ``queued`` with ``execution_metadata.pool``), answering its authorized event."""
    call = queued.event.data_as(InvokeAuthorized)
    data = InvokeQueued(
        invocation_id=call.invocation_id,
        tenant_id=queued.tenant_id,
        agent_did=call.agent_context.agent_did,
        tool_id=call.tool_id,
        tool_version=call.tool_version,
        pool=queued.pool,
        reason=queued.reason,
        worker_id=queued.parked_by,
        deadline=queued.deadline,
        at=datetime.now(UTC),
    )
    parent = queued.event
    return (
        TopicName.EVENTS,
        new_event(
            event_type=EventType.INVOKE_QUEUED,
            source=source,
            data=data,
            tenant_id=queued.tenant_id,
            invocation_id=queued.invocation_id,
            event_id=derived_event_id(parent, EventType.INVOKE_QUEUED, queued.parked_by or ""),
            parent=parent,
        ),
    )


class QueuedCalls(Protocol):
    """The waiting calls (:class:`RedisQueuedCalls`, :class:`MemoryQueuedCalls`)."""

    async def add(self, queued: QueuedCall) -> None:
        """Index ``queued`` (a second add keeps the first deadline; a parked one is parked)."""
        ...

    async def claim_due(self, now: datetime, *, limit: int, lease_s: float) -> list[QueuedCall]:
        """Calls whose deadline passed, each hidden from other sweepers for ``lease_s``
        (one that is not dropped by then is handed out again)."""
        ...

    async def parked(self, *, limit: int) -> list[QueuedCall]:
        """Parked calls, oldest first."""
        ...

    async def unpark(self, call: CallKey) -> bool:
        """No longer parked (it is being handed to an executor); False if it was not
        parked (another sweeper took it first)."""
        ...

    async def due_now(self, call: CallKey) -> None:
        """Make a queued call due at once (a cancel came): the next sweep ends it. Nothing
        for a call that is not queued."""
        ...

    async def drop(self, call: CallKey) -> None:
        """Forget the call (it ran, ended, or timed out)."""
        ...


def _member(call: CallKey) -> str:
    return f"{call.tenant_id}\x1f{call.invocation_id}"


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


# KEYS: queued (zset), calls (hash). ARGV: now_ms, limit, lease_ms.
# -> {member, record, ...} of the calls due, each rescheduled to now + lease.
_CLAIM_DUE = LuaScript(
    "pools_claim_due",
    source="""
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, member in ipairs(due) do
  local record = redis.call('HGET', KEYS[2], member)
  if record then
    redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[1]) + tonumber(ARGV[3]), member)
    out[#out + 1] = member
    out[#out + 1] = record
  else
    redis.call('ZREM', KEYS[1], member)
  end
end
return out
""",
)


class RedisQueuedCalls:
    """The index in Redis: a sorted set by deadline, a hash of records, a parked set."""

    def __init__(self, redis: Redis, *, topic_prefix: str) -> None:
        self._redis = redis
        tag = _tag(topic_prefix)
        self._queued = f"pools:{tag}:queued"
        self._calls = f"pools:{tag}:queued:calls"
        self._parked = f"pools:{tag}:parked"

    async def add(self, queued: QueuedCall) -> None:
        member = _member(queued.call)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._calls, member, queued.model_dump_json())
            pipe.zadd(self._queued, {member: _ms(queued.deadline)}, nx=True)
            if queued.parked:
                pipe.zadd(self._parked, {member: int(time.time() * 1000)}, nx=True)
            await pipe.execute()

    async def claim_due(self, now: datetime, *, limit: int, lease_s: float) -> list[QueuedCall]:
        reply = await _CLAIM_DUE(
            self._redis,
            keys=[self._queued, self._calls],
            args=[_ms(now), limit, max(1, int(lease_s * 1000))],
        )
        return _records(reply[1::2])

    async def parked(self, *, limit: int) -> list[QueuedCall]:
        members = cast(list[bytes], await self._redis.zrange(self._parked, 0, limit - 1))
        if not members:
            return []
        records = await self._redis.hmget(self._calls, members)
        return _records([r for r in records if r is not None])

    async def unpark(self, call: CallKey) -> bool:
        return bool(await self._redis.zrem(self._parked, _member(call)))

    async def due_now(self, call: CallKey) -> None:
        await self._redis.zadd(self._queued, {_member(call): 0}, xx=True)

    async def drop(self, call: CallKey) -> None:
        member = _member(call)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self._queued, member)
            pipe.zrem(self._parked, member)
            pipe.hdel(self._calls, member)
            await pipe.execute()


def _records(raw: list[bytes | str]) -> list[QueuedCall]:
    found: list[QueuedCall] = []
    for record in raw:
        try:
            found.append(QueuedCall.model_validate_json(record))
        except ValidationError:
            log.warning("unreadable queued call dropped from a sweep")
    return found


class MemoryQueuedCalls:
    """In-process :class:`QueuedCalls` for tests: the Redis rules over dicts."""

    def __init__(self) -> None:
        self.calls: dict[CallKey, QueuedCall] = {}
        self.due_at: dict[CallKey, float] = {}
        """Call -> when a sweep may take it (its deadline, then each lease's end), epoch s."""
        self.parked_at: dict[CallKey, int] = {}
        self._order = 0

    async def add(self, queued: QueuedCall) -> None:
        call = queued.call
        self.calls[call] = queued
        self.due_at.setdefault(call, queued.deadline.timestamp())
        if queued.parked and call not in self.parked_at:
            self._order += 1
            self.parked_at[call] = self._order

    async def claim_due(self, now: datetime, *, limit: int, lease_s: float) -> list[QueuedCall]:
        at = now.timestamp()
        due = sorted(((when, _member(c)), c) for c, when in self.due_at.items() if when <= at)[
            :limit
        ]
        for _, call in due:
            self.due_at[call] = at + lease_s
        return [self.calls[call] for _, call in due]

    async def parked(self, *, limit: int) -> list[QueuedCall]:
        oldest = sorted(self.parked_at, key=self.parked_at.__getitem__)[:limit]
        return [self.calls[call] for call in oldest]

    async def unpark(self, call: CallKey) -> bool:
        return self.parked_at.pop(call, None) is not None

    async def due_now(self, call: CallKey) -> None:
        if call in self.due_at:
            self.due_at[call] = 0.0

    async def drop(self, call: CallKey) -> None:
        self.calls.pop(call, None)
        self.due_at.pop(call, None)
        self.parked_at.pop(call, None)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
