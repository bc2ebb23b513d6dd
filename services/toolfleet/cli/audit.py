"""``toolfleet audit tail``: follow the audit topic, one JSON event per line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from toolfleet.bus.connection import connection_kwargs
from toolfleet.cli.config import load_settings
from toolfleet.cli.errors import friendly, reaching_fleet
from toolfleet.errors import InvalidEvent
from toolfleet.events.codec import STRUCTURED_CONTENT_TYPE, decode
from toolfleet.events.types import TopicName, topic
from toolfleet.settings import FleetSettings

app = typer.Typer(help="The audit trail.", no_args_is_help=True)


def audit_line(
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes]],
    *,
    tenant: str | None = None,
) -> str | None:
    """The event as one line of structured CloudEvent JSON, or ``None`` to skip it."""
    event: dict[str, Any] | None = None
    content_type = dict(headers).get("content-type", b"").decode("latin-1")
    if value and content_type.startswith(STRUCTURED_CONTENT_TYPE):
        with contextlib.suppress(ValueError):
            loaded = json.loads(value)
            event = loaded if isinstance(loaded, dict) else None
    if event is None:  # binary mode (or odd producers): rebuild the structured form
        try:
            envelope = decode(key=key, value=value, headers=headers)
        except InvalidEvent:
            return None
        event = envelope.model_dump(mode="json", exclude_none=True)
    if tenant is not None and event.get("tenantid") != tenant:
        return None
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


async def _tail(
    settings: FleetSettings,
    *,
    from_beginning: bool,
    tenant: str | None,
    emit: Callable[[str], None],
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    from aiokafka import AIOKafkaConsumer  # the fleet extra: imported on use

    from toolfleet.bus.profile import PacingInput, open_profile

    audit = topic(settings.topic_prefix, TopicName.AUDIT)
    profile = open_profile(settings, doorbell=False)  # a tail reads at its own pace
    pacing = profile.pacing(
        PacingInput(
            topics=frozenset({audit}),
            fetch_max_wait_ms=max(settings.fetch_max_wait_ms, 100),
            poll_timeout_ms=200,
        )
    )
    consumer = AIOKafkaConsumer(
        audit,
        **connection_kwargs(settings),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        fetch_max_wait_ms=pacing.broker_wait_ms,
        client_id="toolfleet-audit-tail",
    )
    try:
        await consumer.start()
        pacing.after_start(consumer)
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=pacing.poll_timeout_ms)
            for records in batch.values():
                for record in records:
                    line = audit_line(record.key, record.value, list(record.headers), tenant=tenant)
                    if line is not None:
                        emit(line)
    finally:
        pacing.close()
        await consumer.stop()
        await profile.aclose()


def _write_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@app.command("tail")
@friendly
def tail(
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest retained event.")
    ] = False,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
) -> None:
    """Print audit events as they arrive, one JSON object per line (Ctrl-C stops)."""
    settings = load_settings(FleetSettings)
    try:
        with reaching_fleet(settings):
            asyncio.run(
                _tail(settings, from_beginning=from_beginning, tenant=tenant, emit=_write_line)
            )
    except BrokenPipeError:  # `| head`: the reader is gone, which is fine
        with contextlib.suppress(OSError):
            sys.stdout.close()
