"""A hostile stdio MCP server (``tests/support/hostile_source.py``) against the sources
store, registry and the executor's session pool: it cannot vouch for its own tools, and
one huge message costs it its session, not the executor its loop."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import pytest

from tests.integration import test_mcp_sources
from tests.integration.test_mcp_sources import Fleet, text_of
from tests.support.eventually import eventually
from tests.support.source_servers import sandbox_state
from toolfleet.errors import ErrorCode
from toolfleet.sources.models import SourceDefinition, SourceKind
from toolfleet.sources.rules import with_effect

pytestmark = pytest.mark.integration

fleet = test_mcp_sources.fleet  # the sources store, registry and session pool over Postgres


def hostile_source(state: Path) -> SourceDefinition:
    sandbox_state(state)
    return SourceDefinition(
        name=f"h{uuid.uuid4().hex[:8]}",
        kind=SourceKind.MCP_STDIO,
        target=f"{sys.executable} -m tests.support.hostile_source {state}",
        filesystem_permissions=[f"rw:{state}"],
    )


async def test_a_read_only_hint_is_shown_never_trusted(fleet: Fleet, tmp_path: Path) -> None:
    source = hostile_source(tmp_path / "hostile")
    added = {t.remote_name: t for t in await fleet.add(source)}
    wipe = added["wipe"]
    # Before: the server's readOnlyHint became the tool's effect.
    assert wipe.effect == "external_side_effect"
    assert wipe.hints["readOnlyHint"] is True
    [manifest] = await fleet.registry.versions(wipe.tool_id)
    assert manifest.effect.value == "external_side_effect"

    # The operator vouches for it (``sources configure NAME wipe --effect read_only``).
    await fleet.store.update(source.name, lambda s: with_effect(s, "wipe", "read_only"))
    await fleet.store.restate_rules(source.name)
    [manifest] = await fleet.registry.versions(wipe.tool_id)
    assert manifest.effect.value == "read_only"
    [stored] = [t for t in await fleet.store.tools(source.name) if t.remote_name == "wipe"]
    assert stored.effect == "read_only"
    # A relisting keeps the operator's word; and taking it back restores the default.
    await fleet.catalog.refresh(source)
    await fleet.store.update(source.name, lambda s: with_effect(s, "wipe", None))
    await fleet.store.restate_rules(source.name)
    [manifest] = await fleet.registry.versions(wipe.tool_id)
    assert manifest.effect.value == "external_side_effect"


async def test_a_64_mib_message_fails_typed_and_restarts_the_session(
    fleet: Fleet, tmp_path: Path
) -> None:
    state = tmp_path / "hostile"
    source = hostile_source(state)
    added = {t.remote_name: t for t in await fleet.add(source)}
    assert text_of(await fleet.call(added["add"].tool_id, {"a": 1, "b": 2})) == "sum=3"
    starts = len((state / "starts").read_text().split())

    flood = asyncio.create_task(fleet.call(added["flood"].tool_id, {}, timeout_s=60))

    async def flooding() -> bool:
        return (state / "flooding").exists()

    assert await eventually(flooding, timeout=20)
    # 8 MiB of one message are in: the loop is free (another call of the executor runs).
    assert not flood.done()
    (state / "release").write_text("yes")
    outcome = await asyncio.wait_for(flood, timeout=20)
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == (ErrorCode.RESULT_TOO_LARGE, False)
    assert outcome.error.details["max_bytes"] == source.max_response_bytes

    (state / "release").unlink()
    assert text_of(await fleet.call(added["add"].tool_id, {"a": 2, "b": 2})) == "sum=4"
    assert len((state / "starts").read_text().split()) == starts + 1
