"""Services running in-process against the real broker, Redis and Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from toolfleet.auth.grants import ensure_grant_key
from toolfleet.auth.keys import ensure_key_pair
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.bus.admin import ensure_topics
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.client.publisher import KafkaPublisher
from toolfleet.events.codec import ContentMode, decode
from toolfleet.events.envelope import Envelope
from toolfleet.events.types import TopicName, topic
from toolfleet.settings import FleetSettings
from toolfleet.worker import Resources, load_build, open_resources

DEFAULT_POLICY: dict[str, Any] = {
    "tenants": {
        "*": {"allow_tools": ["core__*", "test__*"]},
        "t_denied": {"allow_tools": []},
        "t_approval": {
            "allow_tools": ["core__*", "test__*"],
            "approval_effects": ["external_side_effect"],
        },
    }
}


@dataclass
class Fleet:
    settings: FleetSettings
    issuer: TokenIssuer
    client: KafkaPublisher
    producer: EventProducer

    def token(self, tenant: str, agent: str = "did:agent:test", tool: str = "*", **kw: Any) -> str:
        return self.issuer.issue(tenant_id=tenant, agent_did=agent, tool_id=tool, **kw)

    def topic(self, name: TopicName) -> str:
        return topic(self.settings.topic_prefix, name)

    async def publish(self, envelope: Envelope, *, mode: ContentMode = ContentMode.BINARY) -> None:
        await self.producer.send(
            Outbound(envelope=envelope, topic=self.topic(TopicName.REQUESTED), mode=mode)
        )

    async def read(self, name: TopicName, *, invocation_id: str | None = None) -> list[Envelope]:
        """Everything on a topic so far (optionally for one invocation)."""
        consumer = AIOKafkaConsumer(
            self.topic(name),
            **connection_kwargs(self.settings),
            auto_offset_reset="earliest",
            fetch_max_wait_ms=5,
        )
        await consumer.start()
        found: list[Envelope] = []
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=300)
                if not batch:
                    break
                for records in batch.values():
                    for r in records:
                        env = decode(key=r.key, value=r.value, headers=list(r.headers))
                        if invocation_id is None or env.invocationid == invocation_id:
                            found.append(env)
        finally:
            await consumer.stop()
        return found


def fleet_settings(base: FleetSettings, home: Path, **overrides: Any) -> FleetSettings:
    private, public = home / "jwt_private.pem", home / "jwt_public.pem"
    ensure_key_pair(private, public)
    grant_key = home / "grant.key"
    ensure_grant_key(grant_key)
    policy = home / "policy.json"
    policy.write_text(json.dumps(overrides.pop("policy", DEFAULT_POLICY)))
    values = {
        **base.model_dump(exclude_unset=True),
        "topic_prefix": f"{base.topic_prefix}{uuid.uuid4().hex[:6]}.",
        "jwt_private_key_file": private,
        "jwt_public_key_file": public,
        "policy_file": policy,
        "grant_key_file": grant_key,
        "tool_modules": "tests.support.sample_tools",
        **overrides,
    }
    return FleetSettings(**values)


@contextlib.asynccontextmanager
async def running_services(
    settings: FleetSettings, services: Sequence[str]
) -> AsyncIterator[list[Resources]]:
    """Build and run the named services' consumers in this process until the block ends."""
    await ensure_topics(settings)
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        resources, consumers = [], []
        for name in services:
            res = await stack.enter_async_context(open_resources(settings, service=name))
            resources.append(res)
            consumers.extend(await load_build(name)(res))
        tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
        tasks += [asyncio.create_task(job(stop)) for res in resources for job in res.jobs]
        await asyncio.wait_for(asyncio.gather(*(c.assigned.wait() for c in consumers)), 60)
        try:
            yield resources
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)


class TeardownWatch:
    """Prints every task's stack to stderr if a teardown outlasts ``after_s`` (pytest
    shows it with the test that then times out): a stop that hangs says where."""

    def __init__(self, what: str, after_s: float = 45.0) -> None:
        self._what = what
        self._after_s = after_s
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> TeardownWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def arm(self) -> None:
        """The teardown begins: report if it is still going ``after_s`` from now."""
        self._timer = asyncio.get_running_loop().call_later(self._after_s, self._report)

    def _report(self) -> None:
        print(f"{self._what} still running after {self._after_s} s; tasks:", file=sys.stderr)
        for task in asyncio.all_tasks():
            print(f"--- {task!r}", file=sys.stderr)
            task.print_stack(file=sys.stderr)


@contextlib.asynccontextmanager
async def in_process_fleet(
    settings: FleetSettings, services: Sequence[str] = ("policy", "executor", "validator")
) -> AsyncIterator[Fleet]:
    async with contextlib.AsyncExitStack() as stack:
        watch = stack.enter_context(TeardownWatch("the in-process fleet's teardown"))
        await stack.enter_async_context(running_services(settings, services))
        client = await stack.enter_async_context(KafkaPublisher(settings))
        producer = EventProducer(settings)
        await producer.start()
        assert settings.jwt_private_key_file
        assert settings.jwt_public_key_file
        issuer = TokenIssuer.from_files(
            settings.jwt_private_key_file,
            settings.jwt_public_key_file,
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
        )
        try:
            yield Fleet(settings=settings, issuer=issuer, client=client, producer=producer)
        finally:
            watch.arm()
            await producer.stop()
