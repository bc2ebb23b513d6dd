"""Runs one service as a process: clients up, consumers running, SIGTERM drains.

Each service package exposes ``async def build(res: Resources) -> list[EventConsumer]``
in its ``handler.py``; :func:`run_worker` does the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, cast

# isort: split
# First, before anything imports redis: it then leaves the OpenTelemetry metrics SDK out.
import toolfleet.observability.redis_metrics  # noqa: F401

# isort: split
import asyncpg
from redis.asyncio import Redis

from toolfleet.auth.grants import fleet_grant_keys
from toolfleet.auth.outcomes import OutcomeSigner
from toolfleet.bus.dedupe import RedisProcessedEvents
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.profile import BrokerProfile, Job, open_profile
from toolfleet.bus.runtime import ByBatch, ConsumerSpec, EventConsumer, Handler, Inbound
from toolfleet.events import routing
from toolfleet.events.envelope import Envelope
from toolfleet.events.types import TopicName, topic
from toolfleet.observability.health import WorkerHealth, serve_endpoints
from toolfleet.observability.logs import configure_logging
from toolfleet.observability.tracing import configure_tracing, shutdown_tracing
from toolfleet.settings import FleetSettings
from toolfleet.storage.postgres import create_pool
from toolfleet.storage.redis import connect_redis

log = logging.getLogger(__name__)

SERVICES = ("policy", "executor", "validator", "audit", "status")
"""The pipeline services, each one ``toolfleet worker NAME`` can run; how they are laid
out in processes is :data:`DEFAULT_LAYOUT`."""
DEFAULT_LAYOUT = ("policy", "executor", "validator", "audit+status")
"""The fleet's worker processes, one ``toolfleet worker NAME`` each, wherever the fleet is
laid out (``toolfleet dev``, docker-compose.yml, the Kubernetes manifests, the e2e bench):
every pipeline service in a process of its own, but audit and status together. The two
observers read the same topics, so in one process they read each lifecycle record once
(:func:`share_fetches`): 12% less CPU per call and 16% more calls/s than apart
(bench/HISTORY.md). Split them (``audit`` and ``status``, the :data:`SERVICES` layout)
where the audit trail must not wait for Postgres: together, a status that cannot write
stalls audit too, and a record status cannot project is dead-lettered unaudited."""
AUXILIARY = ("maintenance",)
"""Workers beside the pipeline, run on demand: ``maintenance`` prunes old rows."""
KEYED = ("policy", "executor", "validator", "status")
"""Services that refuse to start without the fleet's grant key: policy signs grants and
checks control signatures, the executor checks grants and cancels and seals raw results,
the validator opens them, status verifies the outcomes it projects. None of them runs
with a check turned off instead."""

OBSERVER_IN_FLIGHT_SCALE = 2
"""Audit and status hold twice the records of a critical-path consumer in flight: they see
five records of each call (requested, authorized, invoked, executed, the outcome). At
one ``max_in_flight`` they ended a saturated run 2.1 to 2.3 s behind the outcomes (the
bench's "caught up" figure), at twice that 0.9 to 2.0 s, at five times 0.7 to 0.9 s; what a
saturated run leaves the audit+status worker holding grows with it: 73 to 75, 76 to 81 and
86 to 91 MB (``bench/PROFILE.md``, thirty-first pass). Five times was set while a consumer at
its bound dropped what aiokafka had fetched for it and fetched it again (fixed in
:class:`~toolfleet.bus.runtime.EventConsumer`), when one ``max_in_flight`` left the
observers 15 s behind."""


@dataclass(frozen=True, kw_only=True)
class Resources:
    """The clients a service holds for its lifetime (built at start, closed at stop).

    Services read their own knobs as ``XSettings(**res.settings.model_dump(exclude_unset=True))``:
    shared values come from here, the service's own ones from the environment.
    """

    settings: FleetSettings
    producer: EventProducer
    redis: Redis
    pool: asyncpg.Pool
    worker_id: str
    broker: BrokerProfile | None = None
    """The broker profile its consumers run (:mod:`toolfleet.bus.profile`); None: the
    ``kafka`` profile's, which the settings must then name."""
    jobs: list[Job] = field(default_factory=list)
    """Background jobs of the service (listeners, sweepers), run until the worker stops."""

    def background(self, job: Job) -> None:
        """Run ``job(stop)`` beside the consumers; it must return once ``stop`` is set."""
        self.jobs.append(job)

    def topic(self, name: TopicName) -> str:
        return topic(self.settings.topic_prefix, name)

    def group(self, name: str) -> str:
        """Consumer group id, prefixed like the topics so fleets sharing a cluster stay apart."""
        return f"{self.settings.topic_prefix}{name}"

    def spec(self, route: routing.Consumer, **options: Any) -> ConsumerSpec:
        """The :class:`ConsumerSpec` of ``route``, a consumer of the routing table
        (:mod:`toolfleet.events.routing`): its name, source, group and topics from the
        table, with this fleet's prefix (a consumer of every pool's topic subscribes by
        pattern); ``options`` are the other ``ConsumerSpec`` fields."""
        party = routing.party_of(route)
        assert party.source is not None  # only parties of the fleet have consumers
        group = f"{route.group}-{self.worker_id}" if route.per_worker else route.group
        options.setdefault(
            "pattern", routing.subscription_pattern(route, self.settings.topic_prefix)
        )
        return ConsumerSpec(
            service=route.name,
            source=party.source,
            group_id=self.group(group),
            topics=[self.topic(name) for name in route.topics],
            auto_offset_reset=route.auto_offset_reset,
            **options,
        )

    def observer_spec(
        self, route: routing.Consumer, *, scale: int = OBSERVER_IN_FLIGHT_SCALE
    ) -> ConsumerSpec:
        """The spec of an observer (audit, status, policy's reading of outcomes): off
        the critical path (its broker profile may fetch for it less eagerly), it holds
        ``scale`` times the records of a critical consumer in flight
        (:data:`OBSERVER_IN_FLIGHT_SCALE`)."""
        return self.spec(route, max_in_flight=self.settings.max_in_flight * scale, observer=True)

    def consumer(
        self, spec: ConsumerSpec, handler: Handler | ByBatch, *, dedupe: bool = True
    ) -> EventConsumer:
        processed = (
            RedisProcessedEvents(self.redis, group=spec.group_id, ttl_s=self.settings.dedupe_ttl_s)
            if dedupe
            else None
        )
        return EventConsumer(
            spec,
            handler,
            settings=self.settings,
            producer=self.producer,
            processed=processed,
            dlq_topic=self.topic(TopicName.DLQ),
            profile=self.broker,
        )


_ENDS_CALLS: frozenset[str] = frozenset(
    party.name
    for party in routing.ROUTING
    if party.source is not None and any(r.topic is TopicName.RESULTS for r in party.sends)
)
"""The services that write outcomes (policy, executor, validator)."""


def _outcome_sealer(settings: FleetSettings, service: str) -> Callable[[Envelope], Envelope] | None:
    """What signs the outcomes ``service`` sends (:mod:`toolfleet.auth.outcomes`): each
    one as it is sent, whichever path built it, in every service the routing table
    names as a writer of ``invoke.results``; ``None`` for the others."""
    if not any(name in _ENDS_CALLS for name in worker_services(service)):
        return None
    return OutcomeSigner.from_settings(settings).seal


def worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@asynccontextmanager
async def open_resources(settings: FleetSettings, *, service: str) -> AsyncIterator[Resources]:
    before_send = _outcome_sealer(settings, service)  # before anything is opened
    async with AsyncExitStack() as stack:  # closed in reverse: producer, broker, redis, pool
        pool = await create_pool(settings.database_url)
        stack.push_async_callback(pool.close)
        redis = connect_redis(settings.redis_url)
        stack.push_async_callback(redis.aclose)
        broker = open_profile(settings, redis=redis)
        stack.push_async_callback(broker.aclose)
        producer = EventProducer(
            settings,
            client_id=f"toolfleet-{service}",
            traffic=broker.announcer,
            before_send=before_send,
        )
        stack.push_async_callback(producer.stop)
        await producer.start()
        res = Resources(
            settings=settings,
            producer=producer,
            redis=redis,
            pool=pool,
            worker_id=worker_id(),
            broker=broker,
        )
        for job in broker.background():
            res.background(job)
        yield res


async def serve(
    consumers: list[EventConsumer], stop: asyncio.Event, jobs: list[Job] | None = None
) -> None:
    """Run consumers and jobs until ``stop``; one that dies stops the whole process."""
    tasks = [asyncio.create_task(c.run(stop), name=c.spec.group_id) for c in consumers]
    tasks += [asyncio.create_task(job(stop)) for job in jobs or []]
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    stopper.cancel()
    for task in done:
        if task is not stopper and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


BuildFn = Callable[[Resources], Awaitable[list[EventConsumer]]]


PROCESS_NAMES: Mapping[str, str] = {"audit+status": "observers"}
"""What a layout calls a worker process whose ``NAME`` would not do as a name there:
Kubernetes and Compose names cannot hold a ``+``."""


def process_name(worker: str) -> str:
    """The name of ``toolfleet worker WORKER``'s process in a layout (the dev stack's
    logs, a Compose service, a Kubernetes Deployment): ``observers`` for
    ``audit+status``, else ``WORKER`` itself."""
    return PROCESS_NAMES.get(worker, worker)


def worker_services(name: str) -> tuple[str, ...]:
    """The services one worker process runs: ``NAME``, or ``NAME+NAME...`` for several
    in one process (``audit+status``: see :func:`share_fetches`)."""
    names = tuple(name.split("+"))
    known = SERVICES + AUXILIARY
    unknown = [n for n in names if n not in known]
    if unknown or len(set(names)) != len(names):
        raise ValueError(
            f"unknown or repeated service in {name!r}; choose from {', '.join(known)}, "
            "several joined by '+'"
        )
    return names


def require_keys(service: str, settings: FleetSettings) -> None:
    """Refuse to start ``service`` (a name, or several joined by ``+``) without the keys
    it needs, before any connection is made.

    Raises:
        GrantKeyError: one of its services is :data:`KEYED` and the grant key is unset
            or unusable; the message is one line saying how to create one.
    """
    if any(name in KEYED for name in worker_services(service)):
        fleet_grant_keys(settings)


def load_build(service: str) -> BuildFn:
    """The build of ``service`` (a name, or several joined by ``+``)."""
    builds = [
        cast(BuildFn, importlib.import_module(f"toolfleet.{name}.handler").build)
        for name in worker_services(service)
    ]
    if len(builds) == 1:
        return builds[0]

    async def build_all(res: Resources) -> list[EventConsumer]:
        consumers: list[EventConsumer] = []
        for build in builds:
            consumers.extend(await build(res))
        return share_fetches(consumers, res)

    return build_all


def share_fetches(consumers: Sequence[EventConsumer], res: Resources) -> list[EventConsumer]:
    """The consumers of a process that runs several services, where those that observe
    the same topics (``ByBatch``: audit and status read every lifecycle topic) read
    them once: one consumer in a group of their own (``audit+status``) hands each fetch
    to each of their handlers in turn and publishes what they return once all of them
    have handled it. A transient failure of one retries the fetch for all (each handler
    is idempotent per record already); a record one of them cannot handle is
    dead-lettered for all. Observers that read the same topics at a different pace (or
    otherwise differently) keep their own consumers, as does every other consumer."""
    kept: list[EventConsumer] = []
    observers: dict[ConsumerSpec, list[EventConsumer]] = {}
    for consumer in consumers:
        if isinstance(consumer.handler, ByBatch):
            observers.setdefault(_how_it_reads(consumer.spec), []).append(consumer)
        else:
            kept.append(consumer)
    for group in observers.values():
        # Named in a fixed order (audit+status, however the process was named).
        group.sort(key=lambda consumer: consumer.spec.service)
        kept.append(group[0] if len(group) == 1 else _sharing(group, res))
    return kept


def _how_it_reads(spec: ConsumerSpec) -> ConsumerSpec:
    """What consumers must agree on to share one: the topics (in any order) and every
    setting but their names and the ones :func:`_sharing` combines."""
    return replace(
        spec,
        service="",
        source="",
        group_id="",
        topics=tuple(sorted(spec.topics)),
        max_in_flight=0,
        commit_interval_s=0.0,
        extra_transient=(),
    )


def _sharing(consumers: Sequence[EventConsumer], res: Resources) -> EventConsumer:
    handlers = [cast(ByBatch, c.handler).handle for c in consumers]

    async def handle(events: Sequence[Inbound]) -> Sequence[Outbound]:
        outputs: list[Outbound] = []
        for handler in handlers:
            outputs.extend(await handler(events))
        return outputs

    name = "+".join(c.spec.service for c in consumers)
    specs = [c.spec for c in consumers]
    spec = replace(
        specs[0],
        service=name,
        group_id=res.group(name),
        max_in_flight=max(s.max_in_flight for s in specs),
        commit_interval_s=min(s.commit_interval_s for s in specs),
        extra_transient=tuple(dict.fromkeys(t for s in specs for t in s.extra_transient)),
    )
    return res.consumer(spec, ByBatch(handle), dedupe=any(c.deduplicates for c in consumers))


def _log_tasks() -> None:
    """SIGUSR1: log where every asyncio task of the worker is waiting (for a stuck worker)."""
    for task in asyncio.all_tasks():
        chain: list[str] = []
        awaited: Any = task.get_coro()
        while awaited is not None and len(chain) < 40:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        log.warning("task %s waits at %s", task.get_name(), " -> ".join(chain) or "?")


async def _main(service: str, settings: FleetSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _log_tasks)
    health = WorkerHealth(stopping=stop.is_set)
    endpoints: contextlib.AbstractAsyncContextManager[object] = (
        serve_endpoints(health, host=settings.metrics_host, port=settings.metrics_port)
        if settings.metrics_port
        else contextlib.nullcontext()
    )
    build = load_build(service)
    async with endpoints, open_resources(settings, service=service) as res:
        consumers = await build(res)
        health.serving((c.spec.group_id, c.joined.is_set) for c in consumers)
        settle_heap(young_threshold=young_gc_threshold(service))
        if res.broker is not None:
            log.info(res.broker.summary())
        log.info("worker started", extra={"worker_id": res.worker_id})
        await serve(consumers, stop, res.jobs)
        log.info("worker stopped", extra={"worker_id": res.worker_id})


#: Container allocations between two young-generation collections (CPython: 700). A
#: worker allocates and frees thousands of short-lived objects per record (envelopes,
#: models, protocol structs); at 700 it collected every few records. 10k holds at most
#: a few MB of young garbage (worker RSS moved by 1-4 MB in the e2e bench). The
#: executor keeps it: it runs tools' code in its process, whose garbage (a parsed
#: document's tree, say) is cyclic and is not ours to bound.
GC_YOUNG_THRESHOLD = 10_000
#: The same for a process running only toolfleet's own code (policy, validator, the
#: observers), which makes almost no cyclic garbage (100-2,000 objects freed by the
#: collector over a saturated run of 4,000 calls). The count CPython checks is allocations
#: less deallocations, so at 10k the observers' batches of decoded events reached it
#: 40 times a run, each collection walking the whole batch (4-5 ms of CPU); at 50k they
#: reach it once or twice: these workers' collections went from 0.19-0.20 s to
#: 0.015-0.07 s of CPU a run (0.03-0.04 ms of the fleet's 3.4 ms per call), RSS within
#: its noise (``bench/PROFILE.md``, twenty-first pass). What a producer can make such a
#: worker hold is still bounded by the threshold: records that each end in an exception
#: kept with its traceback (a cycle) peaked at 5.6 MB of garbage before a collection,
#: against 2.3 MB at 10k (measured with 300,000 of them).
GC_YOUNG_THRESHOLD_OWN_CODE = 50_000


def young_gc_threshold(service: str) -> int:
    """The young-generation threshold of a worker process running ``service`` (a name,
    or several joined by ``+``): :data:`GC_YOUNG_THRESHOLD` where tools run."""
    if "executor" in worker_services(service):
        return GC_YOUNG_THRESHOLD
    return GC_YOUNG_THRESHOLD_OWN_CODE


def settle_heap(*, young_threshold: int = GC_YOUNG_THRESHOLD) -> None:
    """Once the worker is built: move what startup made (modules, schemas, catalogs,
    about 100k objects) out of the collector's reach, and collect the young generation
    less often (every ``young_threshold`` container allocations net of deallocations).
    Measured in the e2e bench, the collector took a fifth of every worker's CPU, full
    collections 100-200 ms each, mostly walking objects that live forever."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``TOOLFLEET_EVENT_LOOP`` asks for (None: the standard library's;
    settings refused ``uvloop`` already if it is not installed)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_worker(service: str, settings: FleetSettings | None = None) -> None:
    """Entry point of ``toolfleet worker NAME``."""
    settings = settings or FleetSettings()
    require_keys(service, settings)
    configure_logging(service=service, level=settings.log_level, fmt=settings.log_format)
    configure_tracing(
        service=service, exporter=settings.otel_exporter, endpoint=settings.otel_endpoint
    )
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle(f"toolfleet worker {service}")
    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
            runner.run(_main(service, settings))
    finally:
        shutdown_tracing()  # the last spans of a stopping worker are exported, not dropped
