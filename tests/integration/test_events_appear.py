"""Reads of a call not yet in the status projection wait for it (real API, Redis,
Postgres and the real status store): woken by the projection's own notification, not by
polling. ``GET /v1/invocations/{id}/events`` waits for any id, the same for a missing id
and another tenant's; ``GET /v1/invocations/{id}`` only for a call the API accepted for
the caller's tenant, and answers any other id at once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.support.lifecycle import Lifecycle
from toolfleet.api.appearing import AppearWait, appear_wait
from toolfleet.api.resources import ApiResources
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.contract.http import InvocationView
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import CallKey
from toolfleet.status.service import StatusProjector
from toolfleet.status.store import PostgresProjection

pytestmark = pytest.mark.integration


def _res(app: FastAPI) -> ApiResources:
    res = app.state.resources
    assert isinstance(res, ApiResources)
    return res


def _bearer(issuer: TokenIssuer, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {issuer.issue(tenant_id=tenant, agent_did='did:a:1')}"}


def _tenant() -> str:
    return f"t_{uuid.uuid4().hex[:8]}"


class Reads:
    """Counts the route's projection reads of one id; ``first`` is set after the first."""

    def __init__(self, app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[InvocationView | None] = []
        self.first = asyncio.Event()
        queries = _res(app).invocations
        original = queries.get

        async def get(invocation_id: uuid.UUID, *, tenant_id: str | None) -> InvocationView | None:
            view = await original(invocation_id, tenant_id=tenant_id)
            self.seen.append(view)
            self.first.set()
            return view

        monkeypatch.setattr(queries, "get", get)

    @property
    def while_awaited(self) -> int:
        """Reads until the row was found (all of them if it never was)."""
        found = [i for i, view in enumerate(self.seen) if view is not None]
        return found[0] + 1 if found else len(self.seen)


SetWait = Callable[[float, float], None]


@pytest.fixture
def waiting(app: FastAPI) -> Iterator[SetWait]:
    """Sets the routes' wait for this test: ``waiting(wait_s, fallback_s)``."""

    def set_wait(wait_s: float, fallback_s: float) -> None:
        wait = AppearWait(wait_s=wait_s, fallback_s=fallback_s)
        app.dependency_overrides[appear_wait] = lambda: wait

    yield set_wait
    app.dependency_overrides.pop(appear_wait, None)


async def _project(app: FastAPI, *events: Envelope) -> None:
    projector = StatusProjector(projection=PostgresProjection(_res(app).pool))
    for event in events:
        assert await projector.on_event(event)


async def test_a_call_written_during_the_wait_streams_as_soon_as_the_projection_notifies(
    app: FastAPI,
    http: httpx.AsyncClient,
    issuer: TokenIssuer,
    waiting: SetWait,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No fallback read within the wait: only the projection's notification can wake it.
    waiting(5.0, 30.0)
    life = Lifecycle(tenant=_tenant())
    reads = Reads(app, monkeypatch)
    written_at: list[float] = []

    async def write_once_awaited() -> None:
        await asyncio.wait_for(reads.first.wait(), 5)  # the route read: no row yet
        await _project(app, life.requested(), life.outcome())  # the real status store
        written_at.append(time.monotonic())

    writer = asyncio.create_task(write_once_awaited())
    answer = await http.get(
        f"/v1/invocations/{life.invocation_id}/events",
        headers=_bearer(issuer, life.tenant),
        timeout=10,
    )
    answered_at = time.monotonic()
    await writer

    assert answer.status_code == 200, answer.text
    assert "event: tool_call_start" in answer.text
    assert "event: tool_call_result" in answer.text
    assert reads.seen[0] is None, "the row existed before the route looked"
    took = answered_at - written_at[0]
    # Woken by the notice (~0.1 s), not by the end of the 5 s wait: the margin is for a
    # loaded machine, and still far from the wait.
    assert took < 3.0, f"answered {took:.2f} s after the write"
    # Old code: a read every 0.2 s; now the first read, then one per notification.
    assert reads.while_awaited <= 3, reads.seen


@pytest.mark.parametrize("whose", ["missing", "another_tenants"])
async def test_a_missing_and_another_tenants_id_both_404_after_the_whole_wait(
    app: FastAPI,
    http: httpx.AsyncClient,
    issuer: TokenIssuer,
    waiting: SetWait,
    monkeypatch: pytest.MonkeyPatch,
    whose: str,
) -> None:
    wait_s = 0.6
    waiting(wait_s, 0.25)
    owner, prober = _tenant(), _tenant()
    life = Lifecycle(tenant=owner)
    if whose == "another_tenants":
        await _project(app, life.requested())  # exists, but not the prober's
    reads = Reads(app, monkeypatch)

    async def touch_during_the_wait() -> None:
        # The owner's call changes while the prober waits: its notice must not end the
        # prober's wait early (nor answer anything but 404).
        await asyncio.wait_for(reads.first.wait(), 5)
        if whose == "another_tenants":
            await _project(app, life.authorized())

    toucher = asyncio.create_task(touch_during_the_wait())
    started = time.monotonic()
    answer = await http.get(
        f"/v1/invocations/{life.invocation_id}/events",
        headers=_bearer(issuer, prober),
        timeout=10,
    )
    took = time.monotonic() - started
    await toucher

    assert answer.status_code == 404, answer.text
    assert answer.json()["code"] == "not_found"
    assert took >= wait_s, f"404 after {took:.2f} s, before the {wait_s} s wait"
    assert took < wait_s + 3.0  # about the wait, not a stream left open (margin: load)
    assert all(view is None for view in reads.seen)
    assert _res(app).feed.waiting == 0  # the wait let go of its id


# --- GET /v1/invocations/{id}: only a call the API accepted is awaited ----------------


def _invoke_body(life: Lifecycle) -> dict[str, Any]:
    return {
        "invocation_id": life.invocation_id,
        "tool_id": life.tool_id,
        "agent_context": {"agent_did": life.agent, "tenant_id": life.tenant},
        "parameters": life.parameters,
    }


async def _timed_get(
    http: httpx.AsyncClient, invocation_id: str, headers: dict[str, str]
) -> tuple[httpx.Response, float]:
    """``GET /v1/invocations/{id}``, and how long it took to answer."""
    started = time.monotonic()
    answer = await http.get(f"/v1/invocations/{invocation_id}", headers=headers, timeout=10)
    return answer, time.monotonic() - started


async def _accept(http: httpx.AsyncClient, issuer: TokenIssuer, life: Lifecycle) -> None:
    accepted = await http.post(
        "/v1/invocations", json=_invoke_body(life), headers=_bearer(issuer, life.tenant)
    )
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["invocation_id"] == life.invocation_id


@pytest.mark.parametrize("reader", ["owner", "admin"])
async def test_a_read_right_after_the_202_waits_for_the_projection_and_finds_the_call(
    app: FastAPI,
    http: httpx.AsyncClient,
    issuer: TokenIssuer,
    waiting: SetWait,
    monkeypatch: pytest.MonkeyPatch,
    reader: str,
) -> None:
    # No fallback read within the wait: only the projection's notification can wake it.
    waiting(5.0, 30.0)
    life = Lifecycle(tenant=_tenant())
    await _accept(http, issuer, life)  # nothing projects it: this test's writer will
    reads = Reads(app, monkeypatch)
    written_at: list[float] = []

    async def write_once_awaited() -> None:
        await asyncio.wait_for(reads.first.wait(), 5)  # the route read: no row yet
        await _project(app, life.requested())
        written_at.append(time.monotonic())

    headers = _bearer(issuer, life.tenant)
    if reader == "admin":
        token = issuer.issue(tenant_id="ops", agent_did="did:user:ops", scopes=["admin"])
        headers = {"Authorization": f"Bearer {token}"}
    writer = asyncio.create_task(write_once_awaited())
    answer = await http.get(f"/v1/invocations/{life.invocation_id}", headers=headers, timeout=10)
    answered_at = time.monotonic()
    await writer

    assert answer.status_code == 200, answer.text
    assert answer.json()["invocation_id"] == life.invocation_id
    assert answer.json()["status"] == "pending"
    assert reads.seen[0] is None, "the row existed before the route looked"
    took = answered_at - written_at[0]
    assert took < 3.0, f"answered {took:.2f} s after the write (woken by the notice, ~0.1 s)"
    assert reads.while_awaited <= 3, reads.seen
    assert _res(app).feed.waiting == 0


@pytest.mark.parametrize("whose", ["missing", "another_tenants", "another_tenants_unprojected"])
async def test_an_id_the_caller_did_not_submit_is_a_404_at_once(
    app: FastAPI,
    http: httpx.AsyncClient,
    issuer: TokenIssuer,
    waiting: SetWait,
    monkeypatch: pytest.MonkeyPatch,
    whose: str,
) -> None:
    # A wait long enough that answering within it can only mean "not awaited".
    waiting(30.0, 0.25)
    owner, prober = _tenant(), _tenant()
    life = Lifecycle(tenant=owner)
    if whose != "missing":
        await _accept(http, issuer, life)  # the owner's call, accepted a moment ago
    if whose == "another_tenants":
        await _project(app, life.requested())
    reads = Reads(app, monkeypatch)

    answer = await http.get(
        f"/v1/invocations/{life.invocation_id}", headers=_bearer(issuer, prober), timeout=10
    )

    assert answer.status_code == 404, answer.text
    assert answer.json()["code"] == "not_found"
    assert owner not in answer.text
    assert reads.seen == [None]  # one read, no wait: as for any id the prober never sent
    assert _res(app).feed.waiting == 0


async def test_an_accepted_call_the_projection_never_shows_is_a_404_after_the_wait(
    app: FastAPI,
    http: httpx.AsyncClient,
    issuer: TokenIssuer,
    waiting: SetWait,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wait_s = 0.6
    waiting(wait_s, 0.25)
    life = Lifecycle(tenant=_tenant())
    await _accept(http, issuer, life)
    reads = Reads(app, monkeypatch)

    answer, took = await _timed_get(http, life.invocation_id, _bearer(issuer, life.tenant))

    assert answer.status_code == 404, answer.text
    assert took >= wait_s, f"404 after {took:.2f} s, before the {wait_s} s wait"
    assert len(reads.seen) >= 3  # the first read, then the fallback's while awaited
    assert _res(app).feed.waiting == 0


async def test_a_tenant_that_submits_another_tenants_id_waits_for_its_own_call_only(
    app: FastAPI,
    http: httpx.AsyncClient,
    issuer: TokenIssuer,
    waiting: SetWait,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The attacker learned the victim's invocation id and submits a call under it: its
    # reads must neither show the victim's call nor be ended by the victim's changes.
    wait_s = 0.8
    waiting(wait_s, 0.25)
    victim = Lifecycle(tenant=_tenant())
    await _accept(http, issuer, victim)
    await _project(app, victim.requested())
    attacker = Lifecycle(tenant=_tenant(), invocation_id=victim.invocation_id)
    await _accept(http, issuer, attacker)
    reads = Reads(app, monkeypatch)

    async def victim_changes_during_the_wait() -> None:
        await asyncio.wait_for(reads.first.wait(), 5)
        await _project(app, victim.authorized())

    toucher = asyncio.create_task(victim_changes_during_the_wait())
    answer, took = await _timed_get(http, victim.invocation_id, _bearer(issuer, attacker.tenant))
    await toucher

    assert answer.status_code == 404, answer.text
    assert victim.tenant not in answer.text
    assert took >= wait_s
    assert all(view is None for view in reads.seen)
    # The victim still reads its own call, untouched by the attacker's.
    mine = await http.get(
        f"/v1/invocations/{victim.invocation_id}", headers=_bearer(issuer, victim.tenant)
    )
    assert mine.status_code == 200
    assert mine.json()["tenant_id"] == victim.tenant


async def test_a_202_stands_when_the_accepted_note_cannot_be_written(
    app: FastAPI,
    http: httpx.AsyncClient,
    issuer: TokenIssuer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The call is on the broker already: failing the POST would make the client publish
    # it twice. The only loss is the wait: its reads are 404 until the row exists.
    async def refuse(call: CallKey) -> None:
        raise RedisConnectionError("redis is down")

    monkeypatch.setattr(_res(app).accepted, "accept", refuse)
    life = Lifecycle(tenant=_tenant())
    with caplog.at_level("WARNING", logger="toolfleet.api.invoking"):
        await _accept(http, issuer, life)
    assert "could not note an accepted call" in caplog.text
    answer = await http.get(
        f"/v1/invocations/{life.invocation_id}", headers=_bearer(issuer, life.tenant)
    )
    assert answer.status_code == 404
