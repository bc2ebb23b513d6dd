"""The faust-streaming adapter: ``toolfleet worker analytics``.

One faust app (its id and consumer group: ``{prefix}analytics``) reads
``toolfleet.audit``, hands every event to :class:`~.service.AnalyticsService` inside
the stream, publishes the anomaly events it returns (structured mode, acknowledged
before the offset can be committed), and writes snapshots from a timer. The tables
are faust tables in memory, each backed by a changelog topic
(``{prefix}analytics-{table}-changelog``) from which a restarted app restores them.

faust settings: at-least-once processing, like every consumer of the fleet (an audit
event seen twice after a rebalance is counted by its id once), producer ``acks=all``,
no standby replicas (each worker holds only its own partitions, so its snapshots never
mix in a stale copy), and commits every second. Group timing follows the broker
profile: ``kafka`` uses the fleet's session timeout (``TOOLFLEET_SESSION_TIMEOUT_MS``)
for the session and the rebalance, with a heartbeat every third of it, like every
worker; the ``dev`` profile keeps 10 s and a heartbeat every second, so the app of a
dev fleet that restarts often rejoins at once (faust's defaults wait a minute). The
dev profile's broker has no transactions (``toolfleet.devstack.broker_profile``), and
no profile asks faust for them.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import faust
import mode
from faust.types.transports import ProducerBufferT

from toolfleet.analytics.engine import AnalyticsTables, Analyzer
from toolfleet.analytics.metrics import AnalyticsCollector
from toolfleet.analytics.service import AnalyticsService
from toolfleet.analytics.settings import AnalyticsSettings
from toolfleet.analytics.snapshot import RedisSnapshots
from toolfleet.analytics.windows import HOUR, MINUTE, Window
from toolfleet.errors import InvalidEvent, ToolfleetError
from toolfleet.events.codec import ContentMode, decode, encode
from toolfleet.events.types import TopicName, topic
from toolfleet.observability.logs import configure_logging
from toolfleet.storage.redis import connect_redis

log = logging.getLogger(__name__)

#: How long windows stay in the tables after they close (event time).
MINUTE_RETENTION = timedelta(minutes=10)
HOUR_RETENTION = timedelta(hours=2)


class FaustWindowTable:
    """:class:`~.engine.WindowTable` on a windowed faust table, keyed ``(key, window)``
    like faust's own windowed keys, so faust expires closed windows."""

    def __init__(self, wrapper: Any) -> None:
        self._table = wrapper.table

    def get(self, key: str, window: Window) -> dict[str, Any] | None:
        value = self._table.get((key, window))
        return value if isinstance(value, dict) else None

    def set(self, key: str, window: Window, value: dict[str, Any]) -> None:
        self._table[(key, window)] = value

    def entries(self) -> Iterator[tuple[str, Window, dict[str, Any]]]:
        for (key, window), value in list(self._table.items()):
            yield key, (float(window[0]), float(window[1])), value


class FaustKeyTable:
    """:class:`~.engine.KeyTable` on a faust table."""

    def __init__(self, table: Any) -> None:
        self._table = table

    def get(self, key: str) -> dict[str, Any] | None:
        value = self._table.get(key)
        return value if isinstance(value, dict) else None

    def set(self, key: str, value: dict[str, Any]) -> None:
        self._table[key] = value


def faust_settings(settings: AnalyticsSettings, data_dir: Path) -> dict[str, Any]:
    """The faust app's configuration (see the module docstring)."""
    if settings.kafka_security_protocol != "PLAINTEXT":
        raise ToolfleetError(
            "toolfleet worker analytics supports TOOLFLEET_KAFKA_SECURITY_PROTOCOL=PLAINTEXT "
            f"only so far, not {settings.kafka_security_protocol}"
        )
    return {
        "broker": [f"kafka://{host.strip()}" for host in settings.kafka_bootstrap.split(",")],
        "store": "memory://",
        "datadir": str(data_dir),
        "processing_guarantee": "at_least_once",
        "topic_partitions": settings.topic_partitions,
        "topic_replication_factor": settings.topic_replication,
        "table_standby_replicas": 0,
        "producer_acks": -1,  # all in-sync replicas
        **_group_timing(settings),
        "broker_commit_interval": 1.0,
        "broker_client_id": "toolfleet-analytics",
        "consumer_auto_offset_reset": "earliest",
        "table_cleanup_interval": 30.0,
        "web_enabled": False,
    }


def _group_timing(settings: AnalyticsSettings) -> dict[str, float]:
    """Session, rebalance and heartbeat of the app's consumer group, by broker profile."""
    if settings.broker_profile == "dev":
        session_s, heartbeat_s = 10.0, 1.0
    else:
        session_s = settings.session_timeout_ms / 1000
        heartbeat_s = max(0.5, session_s / 3)
    return {
        "broker_session_timeout": session_s,
        "broker_rebalance_timeout": session_s,
        "broker_heartbeat_interval": heartbeat_s,
    }


def create_app(
    settings: AnalyticsSettings, *, data_dir: Path
) -> tuple[faust.App, AnalyticsService]:
    """The faust app and the service it feeds (not started)."""
    app = faust.App(f"{settings.topic_prefix}analytics", **faust_settings(settings, data_dir))
    audit_name = topic(settings.topic_prefix, TopicName.AUDIT)
    audit = app.topic(
        audit_name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    tables = AnalyticsTables(
        minute=FaustWindowTable(
            app.Table("minute", default=None).tumbling(MINUTE.size_s, expires=MINUTE_RETENTION)
        ),
        hour=FaustWindowTable(
            app.Table("hour", default=None).hopping(
                HOUR.size_s, HOUR.step_s, expires=HOUR_RETENTION
            )
        ),
        subjects=FaustWindowTable(
            app.Table("subjects", default=None).tumbling(MINUTE.size_s, expires=MINUTE_RETENTION)
        ),
        known=FaustKeyTable(app.Table("known", default=None)),
        seen=FaustWindowTable(
            app.Table("seen", default=None).tumbling(MINUTE.size_s, expires=MINUTE_RETENTION)
        ),
    )
    redis = connect_redis(settings.redis_url)
    service = AnalyticsService(
        analyzer=Analyzer(tables, settings=settings.detectors()),
        tables=tables,
        store=RedisSnapshots(redis),
        clock=lambda: datetime.now(UTC),
    )

    @app.agent(audit)
    async def count(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            try:
                envelope = decode(
                    key=message.key, value=message.value, headers=_headers(message.headers)
                )
            except InvalidEvent as exc:
                log.warning("skipped an undecodable audit message", extra={"error": str(exc)})
                continue
            for anomaly in service.on_audit(envelope):
                wire = encode(anomaly, ContentMode.STRUCTURED)
                sent = await audit.send(key=wire.key, value=wire.value, headers=wire.headers)
                await sent  # acknowledged before this offset can be committed
            await drain(app.producer.buffer)

    @app.timer(settings.analytics_snapshot_interval_s)  # type: ignore[untyped-decorator]
    async def publish() -> None:
        await service.publish()

    @app.service
    class Clients(mode.Service):
        """Closes the Redis client when the app stops."""

        async def on_stop(self) -> None:
            await redis.aclose()

    return app, service


async def drain(buffer: ProducerBufferT) -> None:
    """Until every changelog write the last event made has left faust's producer buffer.

    A table write is queued in faust's buffer (``send_soon``) and handed to the Kafka
    producer by a background task. ``ProducerBuffer.flush()`` gives up when that task has
    not sent a message within 0.1 s (faust-streaming 0.15: ``flush_atmost`` returns on its
    first wait timeout), so on a busy host a commit, which flushes before it commits, could
    commit an event whose table writes were still queued, and a stop then dropped them:
    the restarted app restored a table without them while the ``seen`` table, written
    first, said the event was counted (``tests/unit/test_analytics_app.py``). Draining here,
    before the event is acknowledged, keeps the writes ahead of the commit that covers it;
    the Kafka producer's own flush in that commit then waits for their acks. (The buffer's
    last message leaves the queue as its hand-over to the Kafka producer starts; that
    hand-over waits only for missing topic metadata or a full batch.)
    """
    while buffer.size:
        await buffer.flush()


def _headers(headers: Any) -> list[tuple[str, bytes]]:
    items = headers.items() if isinstance(headers, Mapping) else headers or []
    return [(str(k), bytes(v)) for k, v in items if v is not None]


def run(settings: AnalyticsSettings) -> None:
    """Entry point of ``toolfleet worker analytics``; returns when SIGTERM stopped it."""
    configure_logging(service="analytics", level=settings.log_level, fmt=settings.log_format)
    timing = _group_timing(settings)
    log.info(
        "broker profile: %s (faust at least once, producer acks=all, session %.0f s, "
        "heartbeat %.1f s)",
        settings.broker_profile,
        timing["broker_session_timeout"],
        timing["broker_heartbeat_interval"],
    )
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle("toolfleet worker analytics")
    with contextlib.ExitStack() as stack:
        data_dir = settings.analytics_data_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="toolfleet-analytics-"))
        )
        app, service = create_app(settings, data_dir=data_dir)
        if settings.metrics_port:
            from prometheus_client import REGISTRY, start_http_server

            REGISTRY.register(
                AnalyticsCollector(
                    lambda: service.latest,
                    lambda: service.found,
                    max_tenants=settings.analytics_metrics_max_tenants,
                )
            )
            start_http_server(settings.metrics_port, addr="127.0.0.1")
        worker = faust.Worker(app, loglevel=settings.log_level, override_logging=False, quiet=True)
        with contextlib.suppress(SystemExit):
            worker.execute_from_commandline()
