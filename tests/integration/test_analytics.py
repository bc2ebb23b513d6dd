"""The analytics app (``toolfleet worker analytics``, faust) against the real broker.

A scripted audit stream in event time: the window counts it produces, a denial spike
that yields exactly one anomaly event, and tables that continue across a restart of
the app in the middle of the stream (restored from their changelog topics).
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from redis.asyncio import Redis

from tests.support.eventually import eventually
from tests.support.fleet import fleet_env
from tests.support.servers import kill_quietly
from toolfleet.analytics.snapshot import RedisSnapshots, TenantSnapshot
from toolfleet.audit.records import audit_event
from toolfleet.bus.admin import ensure_topics
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.devstack.children import child_preexec
from toolfleet.events.codec import ContentMode, decode
from toolfleet.events.envelope import new_event
from toolfleet.events.types import EventType, Source, TopicName, topic
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

AGENT = "did:agent:prober"
SPIKE = 5


@pytest.fixture
async def analytics_settings(settings: FleetSettings) -> FleetSettings:
    """A fleet of its own topics, so the app reads only this test's audit stream."""
    own = FleetSettings(
        **{**settings.model_dump(exclude_unset=True), "topic_prefix": f"an{uuid.uuid4().hex[:8]}."}
    )
    await ensure_topics(own)
    return own


class AnalyticsProcess:
    """``toolfleet worker analytics`` as a child process that can be restarted."""

    def __init__(self, settings: FleetSettings, log_dir: Path) -> None:
        self.env = fleet_env(
            settings,
            TOOLFLEET_ANALYTICS_SNAPSHOT_INTERVAL_S="0.3",
            TOOLFLEET_ANALYTICS_DENIAL_SPIKE=str(SPIKE),
            TOOLFLEET_LOG_FORMAT="console",
        )
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = (self.log_dir / f"analytics-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolfleet", "worker", "analytics"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=child_preexec,
        )

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            kill_quietly(self.proc)
            raise

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.log_dir.glob("analytics-*.log"), reverse=True)  # restart first
        )


@pytest.fixture
def analytics(analytics_settings: FleetSettings, tmp_path: Path) -> Iterator[AnalyticsProcess]:
    app = AnalyticsProcess(analytics_settings, tmp_path)
    app.start()
    yield app
    if app.proc is not None and app.proc.poll() is None:
        kill_quietly(app.proc)


@pytest.fixture
async def producer(analytics_settings: FleetSettings) -> AsyncIterator[EventProducer]:
    producer = EventProducer(analytics_settings)
    await producer.start()
    yield producer
    await producer.stop()


class Script:
    """Builds lifecycle events at scripted times and publishes their audit events."""

    def __init__(self, settings: FleetSettings, producer: EventProducer, tenant: str) -> None:
        self.audit_topic = topic(settings.topic_prefix, TopicName.AUDIT)
        self.producer = producer
        self.tenant = tenant

    async def publish(self, event_type: EventType, data: dict[str, Any], at: float) -> None:
        invocation = data.setdefault("invocation_id", str(uuid.uuid4()))
        parent = new_event(
            event_type=event_type,
            source=Source.POLICY,
            data=data,
            tenant_id=self.tenant,
            invocation_id=invocation,
        ).model_copy(update={"time": datetime.fromtimestamp(at, UTC)})
        audit = audit_event(parent, topic="lifecycle", now=datetime.now(UTC))
        await self.producer.send(
            Outbound(envelope=audit, topic=self.audit_topic, mode=ContentMode.STRUCTURED)
        )

    async def request(self, tool: str, at: float) -> None:
        context = {"agent_did": AGENT, "tenant_id": self.tenant}
        data = {"tool_id": tool, "agent_context": context, "parameters": {}}
        await self.publish(EventType.INVOKE_REQUESTED, data, at)

    async def success(self, tool: str, duration_ms: int, at: float) -> None:
        meta = {"duration_ms": duration_ms, "cpu_used_millicore_seconds": 2, "memory_peak_mb": 64}
        data = self._outcome(tool, "success") | {"execution_metadata": meta}
        await self.publish(EventType.SUCCEEDED, data, at)

    async def denial(self, tool: str, at: float) -> None:
        data = self._outcome(tool, "permission_denied") | {
            "error": {"code": "permission_denied", "message": "no", "retryable": False}
        }
        await self.publish(EventType.FAILED, data, at)

    def _outcome(self, tool: str, status: str) -> dict[str, Any]:
        return {"status": status, "agent_did": AGENT, "tenant_id": self.tenant, "tool_id": tool}


async def anomalies(settings: FleetSettings, tenant: str) -> list[dict[str, Any]]:
    """Every anomaly event of ``tenant`` on the audit topic so far."""
    consumer = AIOKafkaConsumer(
        topic(settings.topic_prefix, TopicName.AUDIT),
        **connection_kwargs(settings),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    found = []
    try:
        while batch := await consumer.getmany(timeout_ms=500):
            for records in batch.values():
                for record in records:
                    env = decode(key=record.key, value=record.value, headers=record.headers)
                    if env.type == EventType.ANOMALY and env.tenantid == tenant:
                        found.append(env.model_dump(mode="json"))
    finally:
        await consumer.stop()
    return found


async def test_windows_count_a_scripted_stream_and_a_denial_spike_fires_once_across_a_restart(
    analytics_settings: FleetSettings,
    analytics: AnalyticsProcess,
    producer: EventProducer,
) -> None:
    tenant = f"t_{uuid.uuid4().hex[:8]}"
    script = Script(analytics_settings, producer, tenant)
    snapshots = RedisSnapshots(Redis.from_url(analytics_settings.redis_url))
    # Minutes in the past: windows follow event time, whatever the wall clock says (but
    # well within the 10 minutes faust keeps a closed minute window, by the wall clock).
    t0 = math.floor(time.time() / 60) * 60 - 120

    async def counted(outcomes: int) -> TenantSnapshot | None:
        """The snapshot once minute ``t0`` has ``outcomes`` outcomes and the next minute
        its request (the last event published)."""
        snap = await snapshots.read(tenant)
        if snap is None or len(snap.minutes) < 2:
            return None
        row = next((m for m in snap.minutes if m.start.timestamp() == t0), None)
        return snap if row is not None and row.totals.outcomes >= outcomes else None

    try:
        for i, ms in enumerate((100, 200, 300)):
            await script.request("core__echo", t0 + i)
            await script.success("core__echo", ms, t0 + i + 0.5)
        for i in range(SPIKE - 1):
            await script.denial("core__secret", t0 + 10 + i)
        await script.request("core__echo", t0 + 70)  # the next minute
        first = await eventually(lambda: counted(3 + SPIKE - 1), timeout=90)
        minute = next(m for m in first.minutes if m.start.timestamp() == t0)
        assert minute.totals.calls == 3
        assert minute.totals.outcomes == 3 + SPIKE - 1
        assert minute.totals.by_status == {"success": 3, "permission_denied": SPIKE - 1}
        assert minute.totals.by_error_code == {"permission_denied": SPIKE - 1}
        assert minute.totals.denials == SPIKE - 1
        assert minute.totals.p50_ms is not None
        assert 200 <= minute.totals.p50_ms <= 220
        assert minute.totals.cpu_millicore_s == 6
        assert minute.totals.memory_peak_mb == 64
        assert minute.tools["core__echo"].outcomes == 3
        assert first.hour is not None
        assert first.hour.totals.calls == 4
        assert first.anomalies == []

        assert analytics.stop() == 0  # mid-stream: a graceful restart
        analytics.start()

        for i in range(3):
            await script.denial("core__secret", t0 + 20 + i)

        after = await eventually(lambda: counted(3 + SPIKE + 2), timeout=90)
        minute = next(m for m in after.minutes if m.start.timestamp() == t0)
        # Counted on top of the restored tables, not from zero.
        assert minute.totals.outcomes == 3 + SPIKE + 2
        assert minute.totals.by_status["permission_denied"] == SPIKE + 2
        assert [a.kind for a in after.anomalies] == ["denial_spike"]

        found = await eventually(lambda: anomalies(analytics_settings, tenant), timeout=30)
        assert len(found) == 1, found
        event = found[0]
        assert event["source"] == "/toolfleet/analytics"
        assert event["data"]["kind"] == "denial_spike"
        assert event["data"]["agent_did"] == AGENT
        assert event["data"]["observed"] == SPIKE
        assert event["data"]["ocsf"]["class_uid"] == 2004
        assert event["data"]["ocsf"]["finding_info"]["uid"] == event["id"]
    except BaseException:
        print(analytics.logs())
        last = await snapshots.read(tenant)
        print("last snapshot:", last.model_dump_json(indent=1) if last else None)
        raise
    finally:
        await snapshots._redis.aclose()
