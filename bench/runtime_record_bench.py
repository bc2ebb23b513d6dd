"""Micro-benchmark of the consumer runtime's own cost per record (no Kafka, no handler work).

    python bench/runtime_record_bench.py [--n 12000] [--fetch 200] [--mode record|batch]
    python bench/runtime_record_bench.py --profile /tmp/runtime.prof   # cProfile: ~5x slower
    python bench/runtime_record_bench.py --no-dedupe
    python bench/runtime_record_bench.py --gc default   # CPython's collector settings

Feeds :class:`~toolfleet.bus.runtime.EventConsumer` fetches of real invoke records (the
bytes a producer publishes: key, ``ce_*`` headers, JSON value), as its poll loop hands
them over, with a handler that answers each record with one event and a producer twin
whose acks are already done; dedupe markers go to Redis (``TOOLFLEET_REDIS_URL``) as a
worker's do. What is left is the runtime's part of a record: decoding, the task, the
dedupe question and mark, the log context, the span, the retry frame, offsets, metrics.
The collector is set up as a worker sets it up (:func:`toolfleet.worker.settle_heap`:
startup's objects frozen, young collections every 10k allocations) once the records are
built; ``--gc default`` leaves CPython's defaults, under which full collections of the
records it holds took about a third of the bench's CPU, far more than in a worker.
Reports this process's CPU (user + system) per record, best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition

from e2e_bench import sample_message, tenant_of
from toolfleet.bus.dedupe import RedisProcessedEvents
from toolfleet.bus.producer import Outbound
from toolfleet.bus.runtime import ByBatch, ConsumerSpec, EventConsumer, Inbound
from toolfleet.events.envelope import new_event
from toolfleet.events.types import EventType, Source
from toolfleet.observability.logs import configure_logging
from toolfleet.observability.tracing import configure_tracing
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis
from toolfleet.worker import settle_heap


class _Acked:
    """The producer's twin: every event is acknowledged at once (nothing is encoded)."""

    def __init__(self) -> None:
        self.sent = 0

    async def send_all(self, outbounds: Sequence[Outbound]) -> None:
        self.sent += len(outbounds)


class _Assigned:
    """What the runtime asks of its aiokafka consumer while dispatching a fetch."""

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("bench.requested", 0)}


def records(n: int, partitions: int = 12) -> list[ConsumerRecord[bytes, bytes]]:
    out: list[ConsumerRecord[bytes, bytes]] = []
    for i in range(n):
        key, value, headers, _ = sample_message(tenant_of(i, 50))
        out.append(
            ConsumerRecord(
                topic="bench.requested",
                partition=i % partitions,
                offset=i // partitions,
                timestamp=0,
                timestamp_type=0,
                key=key,
                value=value,
                checksum=None,
                serialized_key_size=len(key or b""),
                serialized_value_size=len(value),
                headers=tuple(headers),
            )
        )
    return out


async def one_round(args: argparse.Namespace, fed: list[ConsumerRecord[bytes, bytes]]) -> float:
    settings = FleetSettings()
    redis = connect_redis(settings.redis_url)
    producer = _Acked()

    async def handle(event: Inbound) -> Sequence[Outbound]:
        env = event.envelope
        answer = new_event(
            event_type=EventType.INVOKE_AUTHORIZED,
            source=Source.POLICY,
            data=env.data,
            tenant_id=env.tenantid or "",
            invocation_id=env.invocationid,
            traceparent=env.traceparent,
        )
        return [Outbound(envelope=answer, topic="bench.authorized")]

    async def handle_all(events: Sequence[Inbound]) -> Sequence[Outbound]:
        return [out for event in events for out in await handle(event)]

    group = f"bench-runtime-{uuid.uuid4().hex[:8]}"
    consumer = EventConsumer(
        ConsumerSpec(
            service="bench",
            source="/bench",
            group_id=group,
            topics=["bench.requested"],
            max_in_flight=args.fetch,
        ),
        ByBatch(handle_all) if args.mode == "batch" else handle,
        settings=settings,
        producer=producer,  # type: ignore[arg-type]
        processed=(None if args.no_dedupe else RedisProcessedEvents(redis, group=group, ttl_s=600)),
        dlq_topic="bench.dlq",
    )
    fake: Any = _Assigned()
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    started = time.process_time()
    if profiler is not None:
        profiler.enable()
    for at in range(0, len(fed), args.fetch):
        fetch = fed[at : at + args.fetch]
        by_partition: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
        for record in fetch:
            by_partition.setdefault(TopicPartition(record.topic, record.partition), []).append(
                record
            )
        consumer._dispatch_batch(fake, by_partition)
        while consumer._core.tasks:
            await asyncio.wait(list(consumer._core.tasks))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    elapsed = time.process_time() - started
    assert producer.sent == len(fed), producer.sent
    keys = [k async for k in redis.scan_iter(f"dedupe:{group}:*", count=1000)]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()
    return elapsed / len(fed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=12_000)
    parser.add_argument("--fetch", type=int, default=200, help="records per fetch")
    parser.add_argument("--mode", choices=("record", "batch"), default="record")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="write a cProfile of the last round here")
    parser.add_argument(
        "--no-dedupe", action="store_true", help="no dedupe markers (the runtime without them)"
    )
    parser.add_argument(
        "--gc",
        choices=("worker", "default"),
        default="worker",
        help="the collector as a worker sets it (default) or CPython's defaults",
    )
    args = parser.parse_args()
    configure_logging(service="bench", level="WARNING", fmt="json")
    configure_tracing(service="bench", exporter="none")
    fed = records(args.n)
    if args.gc == "worker":
        settle_heap()
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # pragma: no cover
        run = asyncio.run
    best = float("inf")
    for i in range(args.rounds):
        per = run(one_round(args, fed))
        # The round's consumer, client and loop are garbage now, in cycles that a
        # worker's collector settings (young collections every 10k net allocations)
        # leave for long: a worker builds its consumers once, this bench once a round.
        gc.collect()
        best = min(best, per)
        print(f"round {i + 1}: {per * 1e6:.1f} us CPU per record ({args.mode})")
    print(f"best: {best * 1e6:.1f} us CPU per record ({args.mode}, {args.fetch} per fetch)")


if __name__ == "__main__":
    os.environ.setdefault("TOOLFLEET_LOG_LEVEL", "WARNING")
    main()
