"""Credentials end to end in-process: resolved at execution time, never emitted.

Policy checks that the token grants the ``connection_id`` before the executor resolves
anything; the tokens here grant ``conn1`` unless a test says otherwise.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.events.types import TopicName
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

AGENT = "did:agent:test"
TENANT = "t1"
VALUE = f"tfsec-{secrets.token_urlsafe(24)}"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("secrets")
    with pytest.MonkeyPatch.context() as env:
        # The executor reads its own settings (and the env backend its values) from here.
        env.setenv("TOOLFLEET_SECRET_BACKEND", "env")
        env.setenv("TOOLFLEET_SECRET__T1__CONN1__API_KEY", VALUE)
        async with in_process_fleet(fleet_settings(settings, home)) as running:
            yield running


async def call(
    fleet: Fleet, tool_id: str, params: dict[str, Any] | None = None, **kw: Any
) -> ToolOutcome:
    token_options = kw.pop("token_options", {"connections": ["conn1"]})
    return await fleet.client.call(
        tool_id,
        params or {},
        tenant_id=TENANT,
        agent_did=AGENT,
        capability_token=fleet.token(TENANT, **token_options),
        timeout=30,
        **kw,
    )


def forms(value: str) -> list[str]:
    return [value, base64.b64encode(value.encode()).decode().rstrip("=")]


async def assert_nowhere_on_the_topics(fleet: Fleet) -> None:
    for name in (TopicName.REQUESTED, TopicName.EXECUTED, TopicName.RESULTS, TopicName.EVENTS):
        for env in await fleet.read(name):
            text = env.model_dump_json()
            assert not any(form in text for form in forms(VALUE)), name


async def test_tool_uses_its_credential(fleet: Fleet) -> None:
    outcome = await call(fleet, "test__secret_user", connection_id="conn1")
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result == {
        "fingerprint": hashlib.sha256(VALUE.encode()).hexdigest()[:12],
        "length": len(VALUE),
    }
    assert VALUE not in outcome.model_dump_json()


async def test_missing_connection_is_permission_denied(fleet: Fleet) -> None:
    outcome = await call(fleet, "test__secret_user")
    assert outcome.status is InvocationStatus.PERMISSION_DENIED
    assert outcome.error is not None
    assert outcome.error.code == "permission_denied"
    assert "connection" in outcome.error.message


async def test_unknown_connection_is_permission_denied_safely(fleet: Fleet) -> None:
    outcome = await call(
        fleet,
        "test__secret_user",
        connection_id="conn2",
        token_options={"connections": ["conn1", "conn2"]},
    )
    assert outcome.status is InvocationStatus.PERMISSION_DENIED
    assert outcome.error is not None
    assert "TOOLFLEET_SECRET" not in outcome.error.message


@pytest.mark.parametrize("how", ["raw", "base64", "error", "checkpoint"])
async def test_leaking_tool_fails_with_redaction_failed(fleet: Fleet, how: str) -> None:
    outcome = await call(fleet, "test__secret_leaker", {"how": how}, connection_id="conn1")
    assert outcome.status is InvocationStatus.ERROR
    assert outcome.error is not None
    assert outcome.error.code == "redaction_failed"
    assert outcome.result is None
    assert VALUE not in outcome.model_dump_json()
    await assert_nowhere_on_the_topics(fleet)


async def test_token_must_grant_the_connection(fleet: Fleet) -> None:
    outcome = await call(
        fleet, "test__secret_user", connection_id="conn1", token_options={"connections": []}
    )
    assert outcome.status is InvocationStatus.PERMISSION_DENIED
    assert VALUE not in outcome.model_dump_json()
