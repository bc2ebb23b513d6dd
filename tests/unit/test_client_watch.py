"""What the Kafka client's watcher parses of the records on the topics it watches.

It reads every record of ``invoke.results`` and ``invoke.events``: a call's outcome, the
executor's ``invoked``, a long tool's checkpoints. It parses a record only when someone
here waits for it: an awaited call's outcome, or any event of a call whose progress
someone follows.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from toolfleet.auth.grants import ensure_grant_key
from toolfleet.auth.outcomes import OutcomeSigner
from toolfleet.bus.profile import KafkaProfile
from toolfleet.client import publisher as publisher_module
from toolfleet.client.handles import Progress
from toolfleet.client.publisher import KafkaPublisher
from toolfleet.events.codec import ContentMode, WireMessage, encode
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.events.outcomes import outcome_event
from toolfleet.events.types import EventType, Source
from toolfleet.settings import FleetSettings

TENANT = "t_acme"


@pytest.fixture
def settings(tmp_path: Path) -> FleetSettings:
    key = tmp_path / "grant.key"
    ensure_grant_key(key)
    return FleetSettings(grant_key_file=key)


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The types of the records the watcher parsed, in order."""
    seen: list[str] = []
    real = publisher_module.decode

    def counting(**wire: Any) -> Envelope:
        envelope = real(**wire)
        seen.append(envelope.type)
        return envelope

    monkeypatch.setattr(publisher_module, "decode", counting)
    return seen


def _awaiting(
    settings: FleetSettings,
) -> tuple[KafkaPublisher, str, asyncio.Future[ToolOutcome]]:
    """A client waiting for one call's outcome: what ``expect``/``wait`` register, with
    no broker to watch."""
    client = KafkaPublisher(settings, profile=KafkaProfile(settings))
    call = str(uuid.uuid4())
    future: asyncio.Future[ToolOutcome] = asyncio.get_running_loop().create_future()
    client._outcomes[call] = future
    client._tenants[call] = TENANT
    return client, call, future


def _event(event_type: EventType, invocation_id: str, **data: Any) -> Envelope:
    return new_event(
        event_type=event_type,
        source=Source.EXECUTOR,
        data={"invocation_id": invocation_id, **data},
        tenant_id=TENANT,
        invocation_id=invocation_id,
    )


def _outcome(settings: FleetSettings, invocation_id: str) -> Envelope:
    outcome = ToolOutcome(
        invocation_id=uuid.UUID(invocation_id),
        status=InvocationStatus.SUCCESS,
        agent_did="did:agent:a",
        tenant_id=TENANT,
        tool_id="core__echo",
        tool_version="1.0.0",
        result={"message": "hi"},
    )
    parent = _event(EventType.INVOKE_REQUESTED, invocation_id)
    return OutcomeSigner.from_settings(settings).seal(
        outcome_event(parent, Source.VALIDATOR, outcome)
    )


def _deliver(client: KafkaPublisher, wire: WireMessage) -> None:
    client._route(wire.key, wire.value, list(wire.headers))


async def test_an_awaited_calls_lifecycle_events_are_skipped_unparsed_and_its_outcome_ends_it(
    settings: FleetSettings, parsed: list[str]
) -> None:
    client, call, future = _awaiting(settings)
    for event_type in (EventType.INVOKED, EventType.CHECKPOINT_CREATED, EventType.INVOKED):
        _deliver(client, encode(_event(event_type, call, progress_percent=50.0)))
    assert parsed == []
    assert not future.done()

    _deliver(client, encode(_outcome(settings, call)))
    assert parsed == [EventType.SUCCEEDED]
    assert future.result().status is InvocationStatus.SUCCESS


async def test_a_followed_calls_progress_is_parsed_and_reported(
    settings: FleetSettings, parsed: list[str]
) -> None:
    client, call, _ = _awaiting(settings)
    reported: list[Progress] = []
    client._progress[call] = reported.append
    _deliver(client, encode(_event(EventType.CHECKPOINT_CREATED, call, progress_percent=40.0)))
    assert parsed == [EventType.CHECKPOINT_CREATED]
    assert [p.progress_percent for p in reported] == [40.0]


async def test_records_it_cannot_judge_by_their_headers_are_parsed(
    settings: FleetSettings, parsed: list[str]
) -> None:
    client, call, future = _awaiting(settings)
    # Structured mode: the type is in the value, not in a header.
    _deliver(client, encode(_outcome(settings, call), ContentMode.STRUCTURED))
    assert parsed == [EventType.SUCCEEDED]
    assert future.result().status is InvocationStatus.SUCCESS


async def test_an_outcome_relabelled_in_its_headers_is_skipped_and_the_real_one_still_counts(
    settings: FleetSettings, parsed: list[str]
) -> None:
    """A producer with topic access relabels an outcome (``ce_type`` says ``invoked``):
    skipped, it ends nothing; the real outcome still does."""
    client, call, future = _awaiting(settings)
    wire = encode(_outcome(settings, call))
    relabelled = [
        (name, EventType.INVOKED.encode() if name == "ce_type" else value)
        for name, value in wire.headers
    ]
    client._route(wire.key, wire.value, relabelled)
    assert parsed == []
    assert not future.done()

    _deliver(client, wire)
    assert future.result().status is InvocationStatus.SUCCESS


async def test_another_calls_records_are_never_parsed(
    settings: FleetSettings, parsed: list[str]
) -> None:
    client, _, _ = _awaiting(settings)
    other = str(uuid.uuid4())
    _deliver(client, encode(_outcome(settings, other)))
    _deliver(client, encode(_event(EventType.INVOKED, other)))
    assert parsed == []
