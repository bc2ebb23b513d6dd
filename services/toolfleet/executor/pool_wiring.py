"""The executor's pools at run time: a consumer per pool, its presence, its sweeper.

``TOOLFLEET_EXECUTOR_POOLS`` (``toolfleet worker executor --pool NAME``) names the pools
an executor serves. For each it reads the pool's topic in the pool's consumer group
(:func:`~toolfleet.events.routing.pool_group`: ``executor`` for ``default``, so a fleet
without pools runs as before), creating the topic first if it is missing. It announces
what it serves every heartbeat and on every rebalance
(:class:`~toolfleet.storage.pools.ExecutorPresence`), hands calls whose tool it lacks to
an executor of the pool that has it, and sweeps queued calls
(:mod:`toolfleet.executor.pools`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from aiokafka import AIOKafkaProducer

from toolfleet.bus.admin import ensure_pool_topics
from toolfleet.bus.offsets import Partition
from toolfleet.bus.producer import Outbound, producer_kwargs
from toolfleet.bus.runtime import ConsumerSpec
from toolfleet.bus.topics import TopicAdminError
from toolfleet.events.codec import encode
from toolfleet.events.envelope import Emitted, Envelope
from toolfleet.events.routing import EXECUTOR_RUNS, pool_group
from toolfleet.events.types import DEFAULT_POOL, pool_topic
from toolfleet.executor.leasing.leases import Leases
from toolfleet.executor.pools import PoolRouter, QueueSweeper
from toolfleet.registry.catalog import ToolCatalog
from toolfleet.settings import FleetSettings
from toolfleet.storage.cancel_flags import RedisCancelFlags
from toolfleet.storage.pools import (
    ExecutorPresence,
    RedisPoolPresence,
    RedisQueuedCalls,
    run_heartbeat,
)
from toolfleet.worker import Resources

__all__ = ["ExecutorPools", "KafkaPartitionSender"]

log = logging.getLogger(__name__)


class KafkaPartitionSender:
    """Sends an event to one partition (the producer of the process sends by key only):
    a producer of its own, started on the first hand-over (rare: a misconfigured pool)."""

    def __init__(self, settings: FleetSettings, res: Resources) -> None:
        self._settings = settings
        self._res = res
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def send(self, topic: str, partition: int, envelope: Envelope) -> None:
        async with self._lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    **producer_kwargs(self._settings, client_id="toolfleet-executor-handover")
                )
                await producer.start()
                self._producer = producer
        message = encode(envelope)
        sent = await self._producer.send_and_wait(
            topic,
            value=message.value,
            key=message.key,
            headers=message.headers,
            partition=partition,
        )
        traffic = self._res.producer.traffic
        if traffic is not None:  # the dev profile's doorbell: the new owner fetches now
            traffic.announce(topic, sent.partition, sent.offset)

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


@dataclass(kw_only=True)
class ExecutorPools:
    """What one executor serves, and everything that keeps other processes told."""

    res: Resources
    pools: list[str]
    catalog: ToolCatalog
    leases: Leases
    sender: KafkaPartitionSender
    partitions: dict[str, set[int]] = field(default_factory=dict)
    """Per pool, the partitions of its topic this executor holds (from rebalances)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set on a rebalance: the heartbeat announces the new partitions at once."""

    @classmethod
    async def start(
        cls, res: Resources, pools: list[str], catalog: ToolCatalog, leases: Leases
    ) -> ExecutorPools:
        """Make sure the pools' topics exist, say which loaded tools nobody here serves,
        and start the heartbeat and the sweeper (background jobs of ``res``)."""
        try:
            await ensure_pool_topics(res.settings, pools)
        except TopicAdminError as exc:
            # Subscribing to a missing topic reads nothing until an operator creates it.
            log.error("cannot create the topics of pools %s: %s", pools, exc)
        elsewhere: dict[str, list[str]] = {}
        for spec in catalog:
            # toolfleet's built-ins are loaded everywhere: only the operator's tools count.
            if spec.pool not in pools and not spec.fn.__module__.startswith("toolfleet."):
                elsewhere.setdefault(spec.pool, []).append(f"{spec.tool_id}@{spec.version}")
        for pool, tools in sorted(elsewhere.items()):
            log.warning(
                "tools loaded here belong to pool %r, which this executor does not serve: "
                "their calls go to executors started with --pool %s",
                pool,
                pool,
                extra={"tools": tools, "pools": pools},
            )
        wiring = cls(
            res=res,
            pools=pools,
            catalog=catalog,
            leases=leases,
            sender=KafkaPartitionSender(res.settings, res),
        )
        res.background(wiring.heartbeat)
        res.background(wiring.sweep)
        log.info("executor pools served", extra={"pools": pools})
        return wiring

    def topic_of(self, pool: str) -> str:
        return pool_topic(self.res.settings.topic_prefix, pool)

    def presence(self) -> ExecutorPresence:
        return ExecutorPresence(
            worker_id=self.res.worker_id,
            pools=tuple(self.pools),
            tools=tuple(f"{s.tool_id}@{s.version}" for s in self.catalog),
            partitions={pool: tuple(sorted(parts)) for pool, parts in self.partitions.items()},
        )

    def router(self) -> PoolRouter:
        return PoolRouter(
            worker_id=self.res.worker_id,
            presence=RedisPoolPresence(self.res.redis, topic_prefix=self.res.settings.topic_prefix),
            queued=RedisQueuedCalls(self.res.redis, topic_prefix=self.res.settings.topic_prefix),
            sender=self.sender,
            topic_of=self.topic_of,
        )

    def specs(self, base: ConsumerSpec) -> list[tuple[str, ConsumerSpec]]:
        """The spec of each pool's consumer, from the executor's (``base``)."""
        return [
            (
                pool,
                replace(
                    base,
                    service=base.service if pool == DEFAULT_POOL else f"{base.service}.{pool}",
                    group_id=self.res.group(pool_group(EXECUTOR_RUNS.group, pool)),
                    topics=[self.topic_of(pool)],
                    on_assign=self._on_assign(pool),
                ),
            )
            for pool in self.pools
        ]

    def _on_assign(self, pool: str) -> Callable[[Sequence[Partition]], None]:
        def assigned(parts: Sequence[Partition]) -> None:
            self.partitions[pool] = {p.partition for p in parts}
            self.changed.set()

        return assigned

    async def heartbeat(self, stop: asyncio.Event) -> None:
        presence = RedisPoolPresence(self.res.redis, topic_prefix=self.res.settings.topic_prefix)
        await run_heartbeat(presence, self.presence, stop, changed=self.changed)

    async def sweep(self, stop: asyncio.Event) -> None:
        prefix = self.res.settings.topic_prefix

        async def publish(emitted: list[Emitted]) -> None:
            await self.res.producer.send_all(
                [Outbound(envelope=env, topic=self.res.topic(name)) for name, env in emitted]
            )

        sweeper = QueueSweeper(
            worker_id=self.res.worker_id,
            queued=RedisQueuedCalls(self.res.redis, topic_prefix=prefix),
            leases=self.leases,
            presence=RedisPoolPresence(self.res.redis, topic_prefix=prefix),
            sender=self.sender,
            topic_of=self.topic_of,
            publish=publish,
            pools=frozenset(self.pools),
            cancels=RedisCancelFlags(self.res.redis),
        )
        try:
            await sweeper.run(stop)
        finally:
            with contextlib.suppress(Exception):
                await self.sender.close()
