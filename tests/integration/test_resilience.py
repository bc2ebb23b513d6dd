"""Retries, circuit breakers and the result cache, through the in-process fleet.

The tools are in ``tests.support.sample_tools``; they count their runs in this process.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.support import sample_tools
from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.events.models import CircuitChanged, InvocationStatus, ToolOutcome
from toolfleet.events.types import EventType, TopicName
from toolfleet.executor.circuits.store import CHANGES_CHANNEL, state_key
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

AGENT = "did:agent:test"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("resilience")
    client = Redis.from_url(settings.redis_url)
    try:  # circuits are shared state: start this module's from closed
        await client.delete(*(state_key(n) for n in ("test.flaky", "test.fatal", "test.breaker")))
    finally:
        await client.aclose()
    async with in_process_fleet(fleet_settings(settings, home)) as running:
        yield running


@pytest.fixture
async def redis(settings: FleetSettings) -> AsyncIterator[Redis]:
    client = Redis.from_url(settings.redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def call(
    fleet: Fleet, tool_id: str, params: dict[str, Any] | None = None, **kw: Any
) -> ToolOutcome:
    return await fleet.client.call(
        tool_id,
        params or {},
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=fleet.token("t1"),
        timeout=30,
        **kw,
    )


async def test_retries_until_success_and_resumes_from_the_checkpoint(fleet: Fleet) -> None:
    outcome = await call(fleet, "test__flaky", {"fail_times": 2})
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.execution_metadata.attempts == 3
    assert outcome.result == {"attempt": 3, "resumed_from_attempt": 2}
    assert sample_tools.RUNS[f"flaky:{outcome.invocation_id}"] == 3


async def test_gives_up_after_max_attempts(fleet: Fleet) -> None:
    outcome = await call(fleet, "test__flaky", {"fail_times": 5})
    assert outcome.status is InvocationStatus.ERROR
    assert outcome.error is not None
    assert outcome.error.code == "external_api_error"
    assert outcome.execution_metadata.attempts == 3


async def test_non_retryable_error_is_not_retried(fleet: Fleet) -> None:
    outcome = await call(fleet, "test__fatal")
    assert outcome.error is not None
    assert outcome.error.code == "tool_execution_error"
    assert outcome.execution_metadata.attempts == 1
    assert sample_tools.RUNS[f"fatal:{outcome.invocation_id}"] == 1


async def test_circuit_opens_fails_fast_then_closes(fleet: Fleet, redis: Redis) -> None:
    async with redis.pubsub() as changes:
        await changes.subscribe(CHANGES_CHANNEL)
        # window 4, minimum 3 calls, 50 % failures: three failures open it.
        for _ in range(3):
            failed = await call(fleet, "test__breaker", {"fail": True})
            assert failed.error is not None
            assert failed.error.code == "external_api_error"

        refused = await call(fleet, "test__breaker", {"fail": False})
        assert refused.status is InvocationStatus.ERROR
        assert refused.error is not None
        assert refused.error.code == "circuit_breaker_open"
        assert refused.error.retryable
        assert refused.error.retry_after_s is not None
        assert 0 < refused.error.retry_after_s <= 2.0
        assert refused.execution_metadata.attempts == 0

        async def opened() -> list[CircuitChanged]:
            events = await fleet.read(TopicName.EVENTS)
            return [
                e.data_as(CircuitChanged)
                for e in events
                if e.type == EventType.CIRCUIT_OPENED
                and e.data_as(CircuitChanged).circuit_name == "test.breaker"
            ]

        [opened_event] = await eventually(opened)
        assert opened_event.state == "open"
        assert opened_event.retry_after_s == 2.0

        # After open_s (2 s) two successful half-open trials close it.
        async def half_open_success() -> ToolOutcome | None:
            outcome = await call(fleet, "test__breaker", {"fail": False})
            return outcome if outcome.status is InvocationStatus.SUCCESS else None

        await eventually(half_open_success, timeout=10, interval=0.3)
        second = await call(fleet, "test__breaker", {"fail": False})
        assert second.status is InvocationStatus.SUCCESS

        async def closed() -> bool:
            events = await fleet.read(TopicName.EVENTS)
            return any(
                e.type == EventType.CIRCUIT_CLOSED
                and e.data_as(CircuitChanged).circuit_name == "test.breaker"
                for e in events
            )

        await eventually(closed)
        published: list[str] = []

        async def drained() -> bool:
            message = await changes.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is not None:
                published.append(message["data"].decode())
            return any('"closed"' in m for m in published)

        await eventually(drained)
        assert any('"open"' in m for m in published)
        assert any('"half_open"' in m for m in published)


async def test_cache_hit_runs_nothing(fleet: Fleet, redis: Redis) -> None:
    key = uuid.uuid4().hex
    first = await call(fleet, "test__cached", {"key": key})
    assert first.status is InvocationStatus.SUCCESS, first.error
    assert first.execution_metadata.cached is False
    second = await call(fleet, "test__cached", {"key": key})
    assert second.status is InvocationStatus.SUCCESS
    assert second.execution_metadata.cached is True
    assert second.result == first.result == {"value": 1}
    assert sample_tools.RUNS[f"cached:{key}"] == 1
    # Another tenant never sees this tenant's entry.
    other = await fleet.client.call(
        "test__cached",
        {"key": key},
        tenant_id="t2",
        agent_did=AGENT,
        capability_token=fleet.token("t2"),
        timeout=30,
    )
    assert other.execution_metadata.cached is False
    assert sample_tools.RUNS[f"cached:{key}"] == 2
