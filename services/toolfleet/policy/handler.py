"""Kafka adapter of policy: requests, control and results in; decisions out.

Besides its consumer, policy runs six background jobs: the ``policy:updates``,
``token:revocations`` and registry (``tool_versions_changed``) listeners (cache
invalidation within a second), the
approval-expiry sweeper, the policy-file watcher that re-seeds file-managed tenants
when the file changes, and the view of which executor pools have a live executor.

An authorized call goes on its pool's topic (:func:`~toolfleet.events.types.pool_topic`);
before the first call of a pool other than ``default``, policy makes sure the topic
exists (:func:`~toolfleet.bus.admin.ensure_pool_topics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Sequence
from pathlib import Path

from toolfleet.auth.control import ControlVerifier
from toolfleet.auth.grants import GrantSigner
from toolfleet.auth.outcomes import OutcomeVerifier
from toolfleet.auth.tokens import open_verifier
from toolfleet.bus.producer import Outbound
from toolfleet.bus.runtime import ByBatch, EventConsumer, Inbound
from toolfleet.errors import InvalidEvent
from toolfleet.events import routing
from toolfleet.events.envelope import Emitted, Envelope
from toolfleet.events.types import DEFAULT_POOL, EventType, TopicName, pool_topic
from toolfleet.policy.approval_expiry import expiry_outcome, run_expiry_sweeper
from toolfleet.policy.cache import RedisPolicyCache, run_invalidation_listener
from toolfleet.policy.claims import DEFAULT_CLAIM_TTL_S, RedisInvocationClaims
from toolfleet.policy.documents import load_policy
from toolfleet.policy.pools import PoolLiveness
from toolfleet.policy.postgres_policies import PolicyStore, seed_from_document
from toolfleet.policy.provider import PolicyProvider
from toolfleet.policy.redis_stores import (
    RedisAdmission,
    RedisApprovalStore,
    RedisIdempotencyStore,
    RedisRateLimiter,
)
from toolfleet.policy.schemas import ManifestSchemas
from toolfleet.policy.service import PendingApproval, PolicyService
from toolfleet.policy.settings import PolicySettings
from toolfleet.registry.lookup import ToolLookup
from toolfleet.registry.store import RegistryStore
from toolfleet.storage.cancel_flags import RedisCancelFlags
from toolfleet.storage.pools import RedisPoolPresence, RedisQueuedCalls
from toolfleet.storage.revocation import CachedRevocationList
from toolfleet.tools.limits import FleetLimits
from toolfleet.worker import Resources

log = logging.getLogger(__name__)


async def build(res: Resources) -> list[EventConsumer]:
    settings = PolicySettings(**res.settings.model_dump(exclude_unset=True))
    store = PolicyStore(res.pool)
    cache = RedisPolicyCache(res.redis)
    provider = PolicyProvider(store, shared=cache)
    await seed_from_document(store, load_policy(settings.policy_file), announce=cache.announce)
    approvals = RedisApprovalStore(res.redis)
    revocations = CachedRevocationList.from_settings(res.redis, settings)
    limiter, idempotency = RedisRateLimiter(res.redis), RedisIdempotencyStore(res.redis)
    prefix = res.settings.topic_prefix
    pools = PoolLiveness(RedisPoolPresence(res.redis, topic_prefix=prefix))
    lookup = ToolLookup(RegistryStore(res.pool), ttl_s=settings.registry_cache_ttl_s)
    service = PolicyService(
        lookup=lookup,
        verifier=await open_verifier(settings),
        policies=provider,
        schemas=ManifestSchemas(),
        approvals=approvals,
        cancels=RedisCancelFlags(res.redis),
        limiter=limiter,
        idempotency=idempotency,
        admission=RedisAdmission(limiter, idempotency),
        revocations=revocations,
        grants=GrantSigner.from_settings(settings),
        control=ControlVerifier.from_settings(settings),
        outcomes=OutcomeVerifier.from_settings(settings),
        approval_ttl_s=settings.approval_ttl_s,
        fleet_limits=FleetLimits(
            memory_mb=settings.isolation_memory_mb,
            cpu_millicores=settings.isolation_cpu_millicores,
        ),
        claims=RedisInvocationClaims(res.redis),
        claim_ttl_s=max(DEFAULT_CLAIM_TTL_S, settings.approval_ttl_s),
        pools=pools,
        queued=RedisQueuedCalls(res.redis, topic_prefix=prefix),
    )
    pool_topics: set[str] = {DEFAULT_POOL}

    async def topic_of(name: TopicName, envelope: Envelope) -> str:
        if name is not TopicName.AUTHORIZED:
            return res.topic(name)
        # Set by policy itself from the registry (InvokeAuthorized.pool), never by a request.
        pool = str(envelope.data.get("pool") or DEFAULT_POOL)
        if pool not in pool_topics:
            # Imported at the first call of a new pool: the Kafka admin client is resident
            # memory (about 0.4 MB) a fleet of the default pool never uses (issue 36).
            from toolfleet.bus.admin import ensure_pool_topics
            from toolfleet.bus.topics import TopicAdminError

            try:
                await ensure_pool_topics(res.settings, [pool])
            except TopicAdminError as exc:
                # Sends to it wait (transient) until the topic exists: an operator's job.
                log.error("cannot create the topic of pool %r: %s", pool, exc)
            pool_topics.add(pool)
        return pool_topic(prefix, pool)

    async def outbound(emitted: Sequence[Emitted]) -> list[Outbound]:
        return [Outbound(envelope=env, topic=await topic_of(name, env)) for name, env in emitted]

    async def handle(event: Inbound) -> Sequence[Outbound]:
        if event.envelope.type == EventType.INVOKE_REQUESTED:
            emitted = await service.on_requested(event.envelope, event.key)
        elif event.topic == res.topic(TopicName.CONTROL):
            emitted = await service.on_control(event.envelope, event.key)
        else:
            raise InvalidEvent(f"policy does not accept {event.envelope.type!r} on {event.topic}")
        return await outbound(emitted)

    async def answer_waiters(events: Sequence[Inbound]) -> Sequence[Outbound]:
        return await outbound(await service.on_results([event.envelope for event in events]))

    async def expire(pending: PendingApproval) -> None:
        name, envelope = expiry_outcome(pending)
        await res.producer.send(Outbound(envelope=envelope, topic=await topic_of(name, envelope)))

    async def watch_policy_file(path: Path, stop: asyncio.Event) -> None:
        seen = _mtime(path)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            current = _mtime(path)
            if current == seen:
                continue
            seen = current
            try:
                applied = await seed_from_document(
                    store, load_policy(path), announce=cache.announce
                )
            except Exception:  # a broken edit keeps the stored policies
                log.exception("policy file is invalid; stored policies unchanged")
                continue
            if applied:
                log.info("policy file re-applied", extra={"tenants": sorted(applied)})

    res.background(lambda stop: run_invalidation_listener(res.redis, provider, stop))
    res.background(lambda stop: lookup.listen(res.settings.database_url, stop))
    res.background(lambda stop: revocations.listen(res.redis, stop))
    res.background(lambda stop: run_expiry_sweeper(approvals, expire, stop))
    if settings.policy_file is not None:
        # Only then: a background job that returns ends the worker (serve), and a
        # watcher with no file to watch returned at once, stopping a policy worker run
        # without TOOLFLEET_POLICY_FILE right after it started.
        res.background(functools.partial(watch_policy_file, settings.policy_file))
    res.background(pools.run)
    spec = res.spec(
        routing.POLICY_CONSUMER,
        max_in_flight=settings.max_in_flight,
        starts_traces=True,  # the first service to read a request
    )
    # Outcomes are read off the critical path, a fetch at a time: the few that answer
    # waiting duplicates are found in one round trip for the whole fetch. An outcome
    # read twice finds its waiters already taken (``finish`` is atomic) and emits
    # nothing: no dedupe marker per outcome.
    outcomes = res.observer_spec(routing.POLICY_OUTCOMES, scale=1)
    return [
        res.consumer(spec, handle),
        res.consumer(outcomes, ByBatch(answer_waiters), dedupe=False),
    ]


def _mtime(path: object) -> float | None:
    from pathlib import Path

    try:
        return Path(str(path)).stat().st_mtime
    except OSError:
        return None
