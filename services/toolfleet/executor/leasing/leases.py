"""Execution leases with fencing epochs, and the outcome record they guard.

The executor running an invocation holds ``lease:tool:{<tenant_id>}:<invocation_id>``
(owner, epoch)
with a TTL it renews by heartbeat. Taking the lease increments the invocation's epoch
(:mod:`toolfleet.executor.leasing.fencing`), so every owner writes under a larger number than
the one before, and its run number (``lease:tool:{<tenant_id>}:<invocation_id>:runs``), which
``execution_metadata.attempts`` and the ``invoked`` event's ``attempt`` report. A worker
paused past its lease (SIGSTOP, a long GC, a partition) wakes up with a stale epoch: its
heartbeat, its checkpoints and its outcome are all refused by the store, atomically, and
the worker that took over carries on from the last checkpoint.

The outcome itself is claimed here before it is published: ``finish`` stores the
outgoing events under ``lease:tool:{<tenant_id>}:<invocation_id>:done`` only if the epoch
is still the newest, and drops the lease. A redelivery of a finished invocation (the worker died
between the claim and the broker's ack, or after the ack but before its offset commit)
finds that record and publishes the very same events again (same ids, so every consumer
treats them as duplicates) instead of running the tool a second time.

Every script touches the keys of one call only, all in its tenant's Redis Cluster slot
(:mod:`toolfleet.storage.call_keys`), and times leases on Redis' clock (a new epoch
counter starts at the worker's clock). A call is ``(tenant_id, invocation_id)``: another
tenant naming the same invocation id takes, finishes and replays nothing of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis

from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import CallKey
from toolfleet.events.types import TopicName
from toolfleet.executor.leasing.fencing import (
    FENCE_CHECK_LUA,
    Fence,
    checkpoint_key,
    epoch_key,
    lease_key,
    runs_key,
)
from toolfleet.storage.call_keys import call_key
from toolfleet.storage.cancel_flags import cancel_key
from toolfleet.storage.lua import CoalescedScripts, LuaScript

#: How long the epoch counter and the outcome record outlive the last write: long
#: enough for any redelivery of the invocation's events to find them.
RECORD_TTL_S = 24 * 3600


def done_key(call: CallKey) -> str:
    """The finished call's outgoing events (JSON), written by ``finish``."""
    return call_key("lease:tool", call, "done")


# KEYS: lease, epoch, done, runs, cancel flag, hot checkpoint.
# ARGV: owner, ttl_ms, record_ttl_s, now_ms.
# -> {1, epoch, run, cancel flag (0/1), hot checkpoint or nil} taken
#  | {0, pttl_ms, owner} held by someone else | {2, done} finished
_ACQUIRE = LuaScript(
    "lease_acquire",
    source="""
local done = redis.call('GET', KEYS[3])
if done then
  return {2, done}
end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1]), owner}
end
local epoch = redis.call('INCR', KEYS[2])
if epoch == 1 then
  -- A new counter (first run, or Redis lost the old one): start above every epoch
  -- issued before it, which Postgres may still hold on durable checkpoints.
  redis.call('SET', KEYS[2], ARGV[4])
  epoch = tonumber(ARGV[4])
end
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
local run = redis.call('INCR', KEYS[4])
redis.call('EXPIRE', KEYS[4], tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', redis.call('GET', KEYS[2]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return {1, epoch, run, redis.call('EXISTS', KEYS[5]), redis.call('GET', KEYS[6])}
""",
)

# KEYS: epoch, lease. ARGV: epoch, owner, ttl_ms. -> 1 renewed | 0 stale
_RENEW = LuaScript(
    "lease_renew",
    source=FENCE_CHECK_LUA
    + """
redis.call('HSET', KEYS[2], 'owner', ARGV[2], 'epoch', ARGV[1])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
return 1
""",
)

# KEYS: epoch, lease. ARGV: epoch. -> 1 released | 0 stale
_RELEASE = LuaScript(
    "lease_release",
    source=FENCE_CHECK_LUA
    + """
redis.call('DEL', KEYS[2])
return 1
""",
)

# KEYS: epoch, lease, done. ARGV: epoch, record, record_ttl_s. -> 1 finished | 0 stale
_FINISH = LuaScript(
    "lease_finish",
    source=FENCE_CHECK_LUA
    + """
redis.call('SET', KEYS[3], ARGV[2], 'EX', tonumber(ARGV[3]))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
redis.call('DEL', KEYS[2])
return 1
""",
)


class OutgoingEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    topic: TopicName
    envelope: Envelope


class FinishedRecord(BaseModel):
    """What a finished invocation published: replayed as is on a redelivery."""

    model_config = ConfigDict(frozen=True)

    epoch: int
    events: list[OutgoingEvent]


@dataclass(frozen=True, slots=True)
class Seen:
    """What a run reads first about its invocation, read with its lease in one script.

    The same answers the run's own reads would give a moment later: the cancel flag is
    read as the lease is taken, and the hot checkpoint is written only under the newest
    epoch, which is this run's from then on.
    """

    cancel_requested: bool
    """The invocation's cancel flag (:func:`toolfleet.storage.cancel_flags.cancel_key`)."""
    hot_checkpoint: bytes | None
    """The JSON of its hot checkpoint (:func:`~toolfleet.executor.leasing.fencing.
    checkpoint_key`), or None."""


@dataclass(frozen=True, slots=True)
class Taken:
    fence: Fence
    seen: Seen | None = field(default=None, compare=False)
    """Read with the lease (None: not read; the run asks its ports)."""


@dataclass(frozen=True, slots=True)
class Held:
    owner: str
    expires_in_s: float


@dataclass(frozen=True, slots=True)
class Finished:
    record: FinishedRecord


LeaseState = Taken | Held | Finished


class Leases(Protocol):
    """Execution leases with fencing epochs (:class:`RedisLeases`, :class:`MemoryLeases`)."""

    ttl_s: float

    async def acquire(self, call: CallKey, owner: str) -> LeaseState: ...
    async def renew(self, fence: Fence, owner: str) -> bool: ...
    async def release(self, fence: Fence) -> None: ...
    async def finish(self, fence: Fence, events: list[OutgoingEvent]) -> bool: ...
    async def finished(self, call: CallKey) -> FinishedRecord | None: ...


class RedisLeases:
    def __init__(self, redis: Redis, *, ttl_s: float, record_ttl_s: int = RECORD_TTL_S) -> None:
        self._redis = redis
        # The leases of the records of one fetch are taken (and released) together, in a
        # batch of their own rather than with the client's other scripts: the layout the
        # fleet was measured fastest with (bench/PROFILE.md, nineteenth pass).
        self._scripts = CoalescedScripts(redis)
        self.ttl_s = ttl_s
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._record_ttl_s = record_ttl_s

    async def acquire(self, call: CallKey, owner: str) -> LeaseState:
        """Take the lease (a new epoch), or say who holds it, or that the call is done."""
        reply = await self._scripts.run(
            _ACQUIRE,
            keys=[
                lease_key(call),
                epoch_key(call),
                done_key(call),
                runs_key(call),
                cancel_key(call),
                checkpoint_key(call),
            ],
            args=[owner, self._ttl_ms, self._record_ttl_s, time.time_ns() // 1_000_000],
        )
        status = int(reply[0])
        if status == 1:
            hot = reply[4] if len(reply) > 4 else None
            return Taken(
                Fence(call, int(reply[1]), run=int(reply[2])),
                seen=Seen(cancel_requested=bool(reply[3]), hot_checkpoint=hot),
            )
        if status == 2:
            return Finished(FinishedRecord.model_validate_json(reply[1]))
        owner_of = reply[2].decode() if isinstance(reply[2], bytes) else str(reply[2])
        return Held(owner=owner_of, expires_in_s=max(0, int(reply[1])) / 1000)

    async def renew(self, fence: Fence, owner: str) -> bool:
        """Extend the lease; False once a newer epoch exists (this worker lost the call)."""
        renewed = await self._scripts.run(
            _RENEW,
            keys=[epoch_key(fence.call), lease_key(fence.call)],
            args=[fence.epoch, owner, self._ttl_ms],
        )
        return bool(renewed)

    async def release(self, fence: Fence) -> None:
        """Give the lease up early (a clean hand-over), if it is still this epoch's."""
        await self._scripts.run(
            _RELEASE,
            keys=[epoch_key(fence.call), lease_key(fence.call)],
            args=[fence.epoch],
        )

    async def finish(self, fence: Fence, events: list[OutgoingEvent]) -> bool:
        """Claim the outcome for this epoch; False if another worker owns the call now."""
        record = FinishedRecord(epoch=fence.epoch, events=events)
        finished = await self._scripts.run(
            _FINISH,
            keys=[
                epoch_key(fence.call),
                lease_key(fence.call),
                done_key(fence.call),
            ],
            args=[fence.epoch, record.model_dump_json(), self._record_ttl_s],
        )
        return bool(finished)

    async def finished(self, call: CallKey) -> FinishedRecord | None:
        """The finished call's record, if it finished (a read: takes nothing)."""
        raw = await self._redis.get(done_key(call))
        return None if raw is None else FinishedRecord.model_validate_json(raw)


@dataclass(frozen=True, slots=True)
class _Lease:
    owner: str
    epoch: int
    expires_at: float


class MemoryLeases:
    """In-process :class:`Leases` for tests: the Redis scripts' rules over dicts.

    Leases expire on ``clock`` (seconds); outcome records never do. ``take_over``
    plays another worker that took the call with a newer epoch.
    """

    def __init__(self, *, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self.leases: dict[CallKey, _Lease] = {}
        self.epochs: dict[CallKey, int] = {}
        self.runs: dict[CallKey, int] = {}
        self.done: dict[CallKey, FinishedRecord] = {}

    async def acquire(self, call: CallKey, owner: str) -> LeaseState:
        if call in self.done:
            return Finished(self.done[call])
        now = self._clock()
        lease = self.leases.get(call)
        if lease is not None and lease.expires_at > now and lease.owner != owner:
            return Held(owner=lease.owner, expires_in_s=lease.expires_at - now)
        epoch = self.take_over(call)
        self.leases[call] = _Lease(owner, epoch, now + self.ttl_s)
        self.runs[call] = run = self.runs.get(call, 0) + 1
        return Taken(Fence(call, epoch, run=run))

    def take_over(self, call: CallKey) -> int:
        """Issue the call's next epoch (what another worker's acquire does)."""
        self.epochs[call] = epoch = self.epochs.get(call, 0) + 1
        return epoch

    def _current(self, fence: Fence) -> bool:
        return self.epochs.get(fence.call) == fence.epoch

    async def renew(self, fence: Fence, owner: str) -> bool:
        if not self._current(fence):
            return False
        self.leases[fence.call] = _Lease(owner, fence.epoch, self._clock() + self.ttl_s)
        return True

    async def release(self, fence: Fence) -> None:
        if self._current(fence):
            self.leases.pop(fence.call, None)

    async def finish(self, fence: Fence, events: list[OutgoingEvent]) -> bool:
        if not self._current(fence):
            return False
        self.done[fence.call] = FinishedRecord(epoch=fence.epoch, events=events)
        self.leases.pop(fence.call, None)
        return True

    async def finished(self, call: CallKey) -> FinishedRecord | None:
        return self.done.get(call)
