"""Kafka adapter of the executor: runs ``invoke.authorized``, listens for cancels."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING

from toolfleet.auth.control import ControlVerifier, is_signed_cancel
from toolfleet.auth.grants import GrantVerifier
from toolfleet.bus.offsets import Partition
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.runtime import EventConsumer, Inbound
from toolfleet.documents.cache import CHANNEL as DOCUMENT_UPDATES
from toolfleet.documents.cache import DocumentCache, RedisCacheStore
from toolfleet.documents.pins import TieredPinBook
from toolfleet.events import routing
from toolfleet.events.envelope import Envelope
from toolfleet.events.types import EventType, TopicName, pool_of_topic
from toolfleet.executor.cache import RedisResultCache
from toolfleet.executor.checkpoints.cold import PostgresCheckpointStore
from toolfleet.executor.checkpoints.store import RedisCheckpointStore, TieredCheckpointStore
from toolfleet.executor.circuits.breaker import CircuitBreaker
from toolfleet.executor.circuits.store import RedisCircuitStore
from toolfleet.executor.concurrency import RedisAgentSlots
from toolfleet.executor.isolated import EgressEvents, build_runtime, stdio_sandbox
from toolfleet.executor.leasing.guard import LeaseGuard, LeaseLost
from toolfleet.executor.leasing.leases import RedisLeases
from toolfleet.executor.pool_wiring import ExecutorPools
from toolfleet.executor.registration import register_catalog
from toolfleet.executor.result_transfer import ResultTransfer
from toolfleet.executor.scheduling import placement
from toolfleet.executor.service import ExecutorConfig, ExecutorPorts, ExecutorService
from toolfleet.executor.settings import ExecutorSettings, SecretBackend
from toolfleet.isolation.runtime import IsolationRuntime
from toolfleet.registry.catalog import discover
from toolfleet.secrets.env import EnvSecretStore
from toolfleet.secrets.file import FileSecretStore
from toolfleet.secrets.store import SecretStore
from toolfleet.sources.pool import SessionPool
from toolfleet.sources.provider import (
    EventSourceAudit,
    SourceCatalog,
    SourceToolProvider,
    listing_job,
    secret_credentials,
)
from toolfleet.sources.store import SourceStore
from toolfleet.storage.at_rest import RESULT_CACHE, TRANSFER_BLOB, AtRestCipher
from toolfleet.storage.blobs import PostgresBlobStore
from toolfleet.storage.cancel_flags import RedisCancelFlags
from toolfleet.storage.invalidation import run_invalidation_listener
from toolfleet.storage.revocation import CachedRevocationList
from toolfleet.tools.limits import FleetLimits
from toolfleet.worker import Resources

if TYPE_CHECKING:
    from toolfleet.documents.mcp_source import McpDocumentSource


class _ProducerEmitter:
    def __init__(self, producer: EventProducer, res: Resources) -> None:
        self._producer = producer
        self._res = res

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]:
        return await self._producer.enqueue(
            Outbound(envelope=envelope, topic=self._res.topic(topic))
        )


def secret_store(settings: ExecutorSettings) -> SecretStore:
    """The backend ``TOOLFLEET_SECRET_BACKEND`` names (settings validated the rest)."""
    if settings.secret_backend is SecretBackend.FILE:
        assert settings.secret_dir is not None
        return FileSecretStore(settings.secret_dir)
    if settings.secret_backend is SecretBackend.VAULT:
        # Imported here: hvac (and requests under it) is ~20 MB a worker without Vault never needs.
        from toolfleet.secrets.vault import VaultConfig, VaultSecretStore

        assert settings.vault_addr is not None
        assert settings.vault_token_file is not None
        return VaultSecretStore(
            VaultConfig(
                addr=settings.vault_addr,
                token_file=settings.vault_token_file,
                mount=settings.vault_mount,
                timeout_s=settings.vault_timeout_s,
            )
        )
    return EnvSecretStore()


def source_tools(res: Resources, secrets: SecretStore) -> SourceToolProvider:
    """MCP and HTTP tool sources; a server's ``list_changed`` registers its new tools,
    and the listings the API asks for are done in the background (the API starts none)."""
    store = SourceStore(res.pool)
    pool = SessionPool(credentials=secret_credentials(secrets))
    audit = EventSourceAudit(emitter=_ProducerEmitter(res.producer, res))
    catalog = SourceCatalog(store=store, pool=pool, audit=audit)
    pool.on_tools_changed = catalog.on_tools_changed
    res.background(listing_job(catalog, res.pool, res.worker_id))
    return SourceToolProvider(lookup=store, pool=pool)


async def _close_at_stop(stop: asyncio.Event, sources: SourceToolProvider) -> None:
    await stop.wait()
    await sources.close()


async def build(res: Resources) -> list[EventConsumer]:
    settings = ExecutorSettings(**res.settings.model_dump(exclude_unset=True))
    catalog = discover(settings.tool_module_list)
    await register_catalog(res.pool, catalog)
    revocations = CachedRevocationList.from_settings(res.redis, settings)
    documents: McpDocumentSource | None = None
    if settings.document_source:
        # Imported here: the MCP SDK (starlette, uvicorn, httpx2 under it) is tens of MB an
        # executor without a document source never needs.
        from toolfleet.documents.mcp_source import McpDocumentSource

        documents = McpDocumentSource(
            settings.document_source, timeout_s=settings.document_timeout_s
        )
    document_cache = DocumentCache(
        RedisCacheStore(res.redis),
        source=settings.document_source_name,
        ttl_s=settings.document_cache_ttl_s,
    )
    secrets = secret_store(settings)
    sources = source_tools(res, secrets)
    emitter = _ProducerEmitter(res.producer, res)
    lease_guard = LeaseGuard(
        leases=RedisLeases(res.redis, ttl_s=settings.lease_ttl), worker_id=res.worker_id
    )
    pools = await ExecutorPools.start(res, settings.pool_list, catalog, lease_guard.leases)
    egress_events: EgressEvents | None = None
    isolation: IsolationRuntime | None = None
    isolation_limits = FleetLimits()
    if settings.isolation_enabled:
        egress_events = EgressEvents(emitter=emitter)
        isolation, isolation_limits, isolation_job = build_runtime(settings, egress_events)
        sources.pool.launcher = stdio_sandbox(settings, isolation, isolation_limits)
        res.background(isolation_job)
    service = ExecutorService(
        ports=ExecutorPorts(
            catalog=catalog,
            providers=(sources,),
            checkpoints=TieredCheckpointStore(
                hot=RedisCheckpointStore(res.redis, ttl_s=settings.checkpoint_ttl_s),
                cold=PostgresCheckpointStore(
                    res.pool,
                    delta_min_bytes=settings.checkpoint_delta_min_bytes,
                    compress_min_bytes=settings.checkpoint_compress_min_bytes,
                ),
            ),
            cancels=RedisCancelFlags(res.redis),
            emitter=emitter,
            secrets=secrets,
            grants=GrantVerifier.from_settings(settings),
            revocations=revocations,
            slots=RedisAgentSlots(res.redis),
            breaker=CircuitBreaker(store=RedisCircuitStore(res.redis), clock=time.time),
            cache=RedisResultCache(
                res.redis, cipher=AtRestCipher.from_settings(settings, purpose=RESULT_CACHE)
            ),
            results=ResultTransfer(
                blobs=PostgresBlobStore(
                    res.pool, cipher=AtRestCipher.from_settings(settings, purpose=TRANSFER_BLOB)
                ),
                inline_bytes=settings.result_inline_limit,
                max_bytes=settings.max_result_blob_bytes,
            ),
            documents=documents,
            document_cache=document_cache,
            document_pins=TieredPinBook(res.redis, res.pool, ttl_s=settings.checkpoint_ttl_s),
            lease_guard=lease_guard,
            isolation=isolation,
            egress_events=egress_events,
            pool_router=pools.router(),
        ),
        config=ExecutorConfig(
            worker_id=res.worker_id,
            cancel_grace_s=settings.cancel_grace_s,
            document_source_name=settings.document_source_name,
            trust_lease_reads=True,  # leases, cancel flags and hot checkpoints: res.redis
            isolation_limits=isolation_limits,
        ),
    )
    sources.network_permissions = lambda ctx: service.network_permissions(ctx.invocation_id)

    async def suspend_at_stop(stop: asyncio.Event) -> None:
        await stop.wait()
        service.suspend()

    res.background(suspend_at_stop)
    res.background(lambda stop: _close_at_stop(stop, sources))
    res.background(lambda stop: revocations.listen(res.redis, stop))
    res.background(
        lambda stop: run_invalidation_listener(res.redis, DOCUMENT_UPDATES, document_cache, stop)
    )
    if documents is not None:
        res.background(documents.run)

    in_flight: dict[Partition, set[str]] = defaultdict(set)

    async def run(event: Inbound) -> Sequence[Outbound]:
        part, invocation_id = Partition(event.topic, event.partition), event.envelope.invocationid
        in_flight[part].add(invocation_id or "")
        try:
            pool = pool_of_topic(res.settings.topic_prefix, event.topic)
            emitted = await service.on_authorized(event.envelope, pool=pool)
        finally:
            in_flight[part].discard(invocation_id or "")
        return [Outbound(envelope=env, topic=res.topic(name)) for name, env in emitted]

    def on_revoke(parts: Sequence[Partition]) -> None:
        service.suspend_calls({i for p in parts for i in in_flight.get(p, ())})

    signatures = ControlVerifier.from_settings(settings)

    async def control(event: Inbound) -> Sequence[Outbound]:
        # An unsigned or forged cancel stops nothing; policy audits the refusal.
        if event.envelope.type == EventType.CANCEL_REQUESTED and is_signed_cancel(
            signatures, event.envelope
        ):
            await service.on_cancel(event.envelope)
        return []

    executions = res.spec(
        routing.EXECUTOR_RUNS,
        max_in_flight=settings.max_in_flight,
        # Another worker owns the call now: handling it again replays that worker's outcome.
        extra_transient=(LeaseLost,),
        # A rebalance hands running tools over at their next checkpoint, not mid-step.
        on_revoke=on_revoke,
        revoke_grace_s=settings.revoke_grace_s,
        # Read ahead and start by priority, round-robin over tenants, each within its bound.
        schedule=placement,
        max_in_flight_per_tenant=settings.tenant_in_flight,
    )
    # Every executor must see every cancel: its own group, reading from the end.
    cancels = res.spec(routing.EXECUTOR_CANCELS, max_in_flight=64)
    # One consumer per pool served (TOOLFLEET_EXECUTOR_POOLS), each in its pool's group.
    runs = [res.consumer(spec, run) for _, spec in pools.specs(executions)]
    return [*runs, res.consumer(cancels, control, dedupe=False)]
