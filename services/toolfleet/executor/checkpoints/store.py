"""Checkpoints, hot and cold.

Hot: Redis, ``checkpoint:tool:{<tenant_id>}:<invocation_id>:latest`` (contract section 5,
scoped by the call's tenant: :mod:`toolfleet.storage.call_keys`), the latest checkpoint
of every kind, with a TTL. Cold: Postgres ``tool_checkpoints``
(:mod:`toolfleet.executor.checkpoints.cold`), the durable ones (``macro``, ``named``)
with their history. :class:`TieredCheckpointStore` writes both and reads hot first,
falling back to the newest durable checkpoint when the hot one expired or was lost.

A write may be fenced with the writer's lease epoch (:mod:`toolfleet.executor.leasing.fencing`):
the store applies it only while that epoch is the newest, else raises
:class:`~toolfleet.executor.leasing.fencing.StaleLease`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis
from redis.exceptions import RedisError

from toolfleet.errors import CheckpointFailed
from toolfleet.events.identity import CallKey
from toolfleet.executor.checkpoints.schedule import CheckpointType, is_durable
from toolfleet.executor.leasing.fencing import (
    FENCE_CHECK_LUA,
    Fence,
    StaleLease,
    checkpoint_key,
    epoch_key,
)
from toolfleet.storage.lua import LuaScript
from toolfleet.storage.redis import CoalescedCommands
from toolfleet.storage.retrying import Backoff, retry_until_stopped

log = logging.getLogger(__name__)


class Checkpoint(BaseModel):
    """The stored JSON: the contract's fields, then what the tiers add to them."""

    model_config = ConfigDict(frozen=True)

    checkpoint_id: str
    invocation_id: str
    state: dict[str, Any]
    progress_percent: float
    current_phase: str
    timestamp: datetime
    tenant_id: str | None = None
    """Owner of the invocation; a checkpoint is never handed to another tenant."""
    checkpoint_type: CheckpointType = "micro"
    name: str | None = None
    """The tool's name for a ``named`` checkpoint."""

    @property
    def call(self) -> CallKey:
        """The call this checkpoint belongs to.

        Raises:
            CheckpointFailed: it names no tenant (stored checkpoints always do).
        """
        if self.tenant_id is None:
            raise CheckpointFailed("a checkpoint needs the tenant of its call")
        return CallKey(tenant_id=self.tenant_id, invocation_id=self.invocation_id)


#: KEYS[1] epoch key, KEYS[2] checkpoint key; ARGV[1] epoch, ARGV[2] JSON, ARGV[3] TTL.
_FENCED_SET = LuaScript(
    "checkpoint_fenced_set",
    source=FENCE_CHECK_LUA
    + """
redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[3]))
return 1
""",
)


class RedisCheckpointStore:
    """The hot tier: the latest checkpoint of an invocation, whatever its kind."""

    def __init__(self, redis: Redis, *, ttl_s: int = 3600) -> None:
        self._redis = redis
        self._reads = CoalescedCommands(redis)
        self._ttl_s = ttl_s

    async def save(self, checkpoint: Checkpoint, *, fence: Fence | None = None) -> None:
        """Write the hot copy; with ``fence``, in one script that checks the epoch first.

        Raises:
            StaleLease: ``fence`` is no longer the newest epoch; nothing was written.
            CheckpointFailed: Redis could not be reached, or the checkpoint is not of the
                fenced call.
        """
        call = checkpoint.call
        if fence is not None and fence.call != call:
            raise CheckpointFailed("a checkpoint is fenced with its own call's lease only")
        key = checkpoint_key(call)
        try:
            if fence is None:
                await self._redis.set(key, checkpoint.model_dump_json(), ex=self._ttl_s)
                return
            written = await _FENCED_SET(
                self._redis,
                keys=[epoch_key(fence.call), key],
                args=[fence.epoch, checkpoint.model_dump_json(), self._ttl_s],
            )
        except RedisError as exc:
            raise CheckpointFailed(f"checkpoint could not be saved: {type(exc).__name__}") from None
        if int(written) != 1:
            raise StaleLease(fence)

    async def latest(self, call: CallKey) -> Checkpoint | None:
        key = checkpoint_key(call)
        raw = await self._reads.run(lambda pipe: pipe.get(key))
        return None if raw is None else Checkpoint.model_validate_json(raw)


class CheckpointStore(Protocol):
    """Hot and durable checkpoints, as the run sees them (:class:`TieredCheckpointStore`).

    ``save`` with a ``fence`` raises :class:`~toolfleet.executor.leasing.fencing.StaleLease`
    when the epoch is stale; ``latest`` reads hot, then durable; ``get`` finds a durable one.
    """

    async def save(
        self, checkpoint: Checkpoint, *, fence: Fence | None = None
    ) -> CheckpointType: ...
    async def latest(self, call: CallKey) -> Checkpoint | None: ...
    async def get(self, checkpoint_id: str) -> Checkpoint | None: ...


class ColdCheckpoints(Protocol):
    """The durable tier (:class:`toolfleet.executor.checkpoints.cold.PostgresCheckpointStore`)."""

    async def save(self, checkpoint: Checkpoint, *, fence: Fence | None = None) -> None: ...
    async def latest(self, call: CallKey) -> Checkpoint | None: ...
    async def get(self, checkpoint_id: str) -> Checkpoint | None: ...


class TieredCheckpointStore:
    """Hot in Redis, durable kinds in Postgres too; reads hot first, then cold."""

    def __init__(
        self,
        *,
        hot: RedisCheckpointStore,
        cold: ColdCheckpoints,
        cold_retry_delays_s: tuple[float, ...] = (0.1, 0.4, 1.0),
        hot_patience_s: float = 10.0,
        named_patience_s: float = 10.0,
    ) -> None:
        self._hot = hot
        self._cold = cold
        self._cold_retry_delays_s = cold_retry_delays_s
        self._hot_patience_s = hot_patience_s
        self._named_patience_s = named_patience_s

    async def save(self, checkpoint: Checkpoint, *, fence: Fence | None = None) -> CheckpointType:
        """Hot first, then durable kinds to Postgres; returns the kind actually stored.

        Redis holds the newest epoch, so its fenced write is the authoritative check: a
        worker that lost its lease is refused there before it reaches Postgres. A Redis
        that does not answer is waited out for ``hot_patience_s`` (the tool is paused in
        ``ctx.checkpoint()`` meanwhile). A Postgres that does not answer is tried again
        briefly; then a *macro* checkpoint stays hot only (reported as ``micro``; the
        next checkpoint tries Postgres again) rather than stall a long tool over a blip
        of the durable tier. A *named* one was asked for by the tool: it is waited for
        up to ``named_patience_s``, then fails with ``CheckpointFailed``.
        """
        await _patiently(lambda: self._hot.save(checkpoint, fence=fence), self._hot_patience_s)
        if not is_durable(checkpoint.checkpoint_type):
            return checkpoint.checkpoint_type
        if checkpoint.checkpoint_type == "named":
            await _patiently(
                lambda: self._cold.save(checkpoint, fence=fence), self._named_patience_s
            )
            return "named"
        try:
            await retry_until_stopped(
                lambda: self._cold.save(checkpoint, fence=fence),
                what="durable checkpoint not stored; retrying",
                backoff=Backoff.listed(self._cold_retry_delays_s),
                retry_on=(CheckpointFailed,),
                tries=len(self._cold_retry_delays_s) + 1,
            )
        except CheckpointFailed:
            log.warning("durable checkpoint not stored; kept hot only")
            return "micro"
        return checkpoint.checkpoint_type

    async def latest(self, call: CallKey) -> Checkpoint | None:
        """The hot checkpoint, or the newest durable one when Redis lost it."""
        try:
            hot = await self._hot.latest(call)
        except RedisError as exc:
            log.warning("hot checkpoint unreadable, reading Postgres: %s", type(exc).__name__)
            hot = None
        return hot if hot is not None else await self._cold.latest(call)

    async def latest_after(self, call: CallKey, *, hot: bytes | None) -> Checkpoint | None:
        """:meth:`latest`, the hot copy's JSON already read (``hot``; None: there is none).

        ``hot`` must come from this store's Redis (the leases read it with the lease).
        """
        if hot is not None:
            return Checkpoint.model_validate_json(hot)
        return await self._cold.latest(call)

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        """A durable checkpoint by id (the hot one is only ever the latest)."""
        return await self._cold.get(checkpoint_id)


async def _patiently(write: Callable[[], Awaitable[None]], patience_s: float) -> None:
    """``write``, tried again with jittered backoff while it fails with
    ``CheckpointFailed``; the last try is ``patience_s`` after the first (then that
    error is raised)."""
    await retry_until_stopped(
        write,
        what="checkpoint not stored; retrying",
        backoff=Backoff(first_s=0.05, max_s=1.0),
        retry_on=(CheckpointFailed,),
        patience_s=patience_s,
    )


class MemoryCheckpointStore:
    """In-process :class:`CheckpointStore` for tests: both tiers in dicts, fenced too.

    ``epochs`` plays the lease's epoch counter: a write fenced with an older epoch than
    the one recorded for its call raises ``StaleLease``.
    """

    def __init__(self) -> None:
        self.hot: dict[CallKey, Checkpoint] = {}
        self.durable: dict[str, Checkpoint] = {}
        self.epochs: dict[CallKey, int] = {}

    async def save(self, checkpoint: Checkpoint, *, fence: Fence | None = None) -> CheckpointType:
        call = checkpoint.call
        if fence is not None:
            if fence.call != call:
                raise CheckpointFailed("a checkpoint is fenced with its own call's lease only")
            newest = self.epochs.setdefault(fence.call, fence.epoch)
            if newest != fence.epoch:
                raise StaleLease(fence)
        self.hot[call] = checkpoint
        if is_durable(checkpoint.checkpoint_type):
            self.durable[checkpoint.checkpoint_id] = checkpoint
        return checkpoint.checkpoint_type

    async def latest(self, call: CallKey) -> Checkpoint | None:
        hot = self.hot.get(call)
        if hot is not None:
            return hot
        mine = [
            c
            for c in self.durable.values()
            if c.invocation_id == call.invocation_id and c.tenant_id == call.tenant_id
        ]
        return max(mine, key=lambda c: c.timestamp, default=None)

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        return self.durable.get(checkpoint_id)
