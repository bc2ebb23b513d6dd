"""Several services in one worker process (``toolfleet worker audit+status``): observers
of the same topics read them once, in a group of their own; everything else is kept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from tests.support.lifecycle import Lifecycle
from toolfleet.auth.grants import ensure_grant_key
from toolfleet.bus.producer import Outbound
from toolfleet.bus.runtime import ByBatch, EventConsumer, Inbound
from toolfleet.events import routing
from toolfleet.events.envelope import Envelope
from toolfleet.settings import FleetSettings
from toolfleet.worker import Resources, load_build, share_fetches, worker_services


def resources(grant_key: Path) -> Resources:
    unused = cast(Any, None)  # building consumers touches no client
    ensure_grant_key(grant_key)  # the validator refuses to start without it
    return Resources(
        settings=FleetSettings(topic_prefix="p.", max_in_flight=100, grant_key_file=grant_key),
        producer=unused,
        redis=unused,
        pool=unused,
        worker_id="w1",
    )


def test_names_join_known_services_once_each() -> None:
    assert worker_services("audit") == ("audit",)
    assert worker_services("status+audit") == ("status", "audit")
    for bad in ("bogus", "audit+audit", "audit+", "analytics+audit"):
        with pytest.raises(ValueError, match="unknown or repeated"):
            worker_services(bad)


@pytest.mark.parametrize("name", ["audit+status", "status+audit"])
async def test_audit_and_status_share_one_consumer_in_a_group_of_their_own(
    name: str, tmp_path: Path
) -> None:
    res = resources(tmp_path / "grant.key")
    (shared,) = await load_build(name)(res)

    audit = res.observer_spec(routing.AUDIT_CONSUMER)
    assert shared.spec.service == "audit+status"  # whatever order the process was named in
    assert shared.spec.group_id == "p.audit+status"
    assert sorted(shared.spec.topics) == sorted(audit.topics)
    assert shared.spec.max_in_flight == audit.max_in_flight
    assert shared.spec.fetch_max_wait_ms == audit.fetch_max_wait_ms
    assert isinstance(shared.handler, ByBatch)
    assert shared.deduplicates  # audit's markers; status is idempotent in Postgres anyway


async def test_services_that_share_no_topics_keep_their_consumers(tmp_path: Path) -> None:
    res = resources(tmp_path / "grant.key")
    alone = [c.spec.group_id for c in await load_build("validator")(res)]
    alone += [c.spec.group_id for c in await load_build("audit")(res)]
    together = [c.spec.group_id for c in await load_build("validator+audit")(res)]
    assert sorted(together) == sorted(alone) == ["p.audit", "p.validator"]


async def test_observers_of_the_same_topics_at_another_pace_keep_their_consumers(
    tmp_path: Path,
) -> None:
    res = resources(tmp_path / "grant.key")
    calls: list[str] = []
    audit = _observer(res, "audit", calls)
    slower = replace(audit.spec, service="status", group_id="p.status", fetch_max_wait_ms=500)
    status = res.consumer(slower, audit.handler)
    kept = share_fetches([audit, status], res)
    assert [c.spec.group_id for c in kept] == ["p.audit", "p.status"]


def _observer(res: Resources, name: str, calls: list[str], *, fail: bool = False) -> EventConsumer:
    async def handle(events: Sequence[Inbound]) -> Sequence[Outbound]:
        calls.append(f"{name}:{len(events)}")
        if fail:
            raise ConnectionError(f"{name} is down")
        return [Outbound(envelope=e.envelope, topic=f"{name}-out") for e in events]

    spec = replace(
        res.observer_spec(routing.AUDIT_CONSUMER), service=name, group_id=res.group(name)
    )
    return res.consumer(spec, ByBatch(handle), dedupe=False)


async def test_a_fetch_goes_to_each_handler_and_is_published_once_all_have_handled_it(
    tmp_path: Path,
) -> None:
    res = resources(tmp_path / "grant.key")
    calls: list[str] = []
    per_record = res.consumer(res.spec(routing.VALIDATOR_CONSUMER), lambda _: _never())
    consumers = [_observer(res, "status", calls), per_record, _observer(res, "audit", calls)]
    kept = share_fetches(consumers, res)

    assert kept[0] is per_record
    shared = kept[1]
    assert (shared.spec.service, shared.spec.group_id) == ("audit+status", "p.audit+status")
    assert not shared.deduplicates  # neither asked for markers
    lc = Lifecycle()
    events = [inbound(e) for e in (lc.requested(), lc.authorized())]
    handle = cast(ByBatch, shared.handler).handle
    outputs = await handle(events)
    assert calls == ["audit:2", "status:2"]
    assert [o.topic for o in outputs] == ["audit-out", "audit-out", "status-out", "status-out"]


async def test_when_one_handler_fails_nothing_of_the_fetch_is_published(tmp_path: Path) -> None:
    res = resources(tmp_path / "grant.key")
    calls: list[str] = []
    consumers = [_observer(res, "audit", calls), _observer(res, "status", calls, fail=True)]
    (shared,) = share_fetches(consumers, res)
    lc = Lifecycle()
    with pytest.raises(ConnectionError, match="status is down"):  # the runtime retries it
        await cast(ByBatch, shared.handler).handle([inbound(lc.requested())])
    assert calls == ["audit:1", "status:1"]


def inbound(envelope: Envelope) -> Inbound:
    return Inbound(envelope=envelope, topic="t", partition=0, offset=0, key=None)


async def _never() -> Sequence[Outbound]:
    raise AssertionError("a per-record handler is not called here")
