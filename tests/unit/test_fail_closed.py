"""No check turns itself off because the grant key is missing: whatever needs it refuses
to start, with one line saying how to create one (issue 32, "fail closed")."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolfleet.api.resources import require_grant_key
from toolfleet.api.settings import ApiSettings
from toolfleet.auth.grants import (
    MISSING_GRANT_KEY,
    GrantKeyError,
    GrantSigner,
    GrantVerifier,
    load_grant_keys,
)
from toolfleet.cli.main import app as cli
from toolfleet.executor.runner import run_tool
from toolfleet.settings import FleetSettings
from toolfleet.sources import http_tools
from toolfleet.sources.models import HttpOperation, SourceDefinition, SourceKind, SourceTool
from toolfleet.sources.provider import SourceToolProvider
from toolfleet.storage.at_rest import RESULT_CACHE, TRANSFER_BLOB, AtRestCipher
from toolfleet.tools.context import ToolContext
from toolfleet.worker import require_keys

pytestmark = pytest.mark.unit


def test_the_message_is_one_line_naming_the_command_that_creates_a_key() -> None:
    assert "\n" not in MISSING_GRANT_KEY
    assert "TOOLFLEET_GRANT_KEY_FILE" in MISSING_GRANT_KEY
    assert "toolfleet keys grant" in MISSING_GRANT_KEY


@pytest.mark.parametrize("service", ["policy", "executor", "validator", "status", "audit+executor"])
def test_keyed_workers_refuse_to_start_without_the_grant_key(service: str) -> None:
    with pytest.raises(GrantKeyError) as refused:
        require_keys(service, FleetSettings())
    assert refused.value.message == MISSING_GRANT_KEY


def test_keyed_workers_start_with_a_key_and_the_others_need_none(tmp_path: Path) -> None:
    key = tmp_path / "grant.key"
    result = CliRunner().invoke(cli, ["keys", "grant", str(key)])
    assert result.exit_code == 0, result.output
    require_keys("policy+executor+validator+status", FleetSettings(grant_key_file=key))
    require_keys("audit", FleetSettings())


def test_an_unreadable_key_file_refuses_too(tmp_path: Path) -> None:
    with pytest.raises(GrantKeyError, match="cannot read"):
        require_keys("executor", FleetSettings(grant_key_file=tmp_path / "absent.key"))


def test_no_grant_signer_verifier_or_at_rest_cipher_without_the_key() -> None:
    """Before, each was ``None``: no grant minted, none checked, raw results in plaintext."""
    settings = FleetSettings()
    with pytest.raises(GrantKeyError):
        GrantSigner.from_settings(settings)
    with pytest.raises(GrantKeyError):
        GrantVerifier.from_settings(settings)
    for purpose in (TRANSFER_BLOB, RESULT_CACHE):
        with pytest.raises(GrantKeyError):
            AtRestCipher.from_settings(settings, purpose=purpose)


def test_the_api_refuses_to_serve_without_the_key_it_signs_decisions_with() -> None:
    with pytest.raises(GrantKeyError) as refused:
        require_grant_key(ApiSettings())
    assert refused.value.message == MISSING_GRANT_KEY


def test_keys_grant_creates_keeps_and_rotates_the_key(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "grant.key"
    runner = CliRunner()
    created = runner.invoke(cli, ["keys", "grant", str(key)])
    assert created.exit_code == 0, created.output
    assert f"TOOLFLEET_GRANT_KEY_FILE={key}" in created.output
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    [first] = load_grant_keys(key)
    kept = runner.invoke(cli, ["keys", "grant", str(key)])
    assert kept.exit_code == 0, kept.output
    assert load_grant_keys(key) == [first]
    rotated = runner.invoke(cli, ["keys", "grant", str(key), "--rotate"])
    assert rotated.exit_code == 0, rotated.output
    new, old = load_grant_keys(key)
    assert old == first != new


class _OneTool:
    def __init__(self, tool: SourceTool, source: SourceDefinition) -> None:
        self.found = (tool, source)

    async def tool(self, tool_id: str, version: str) -> tuple[SourceTool, SourceDefinition]:
        return self.found


async def test_an_http_tool_without_a_grant_reaches_no_host() -> None:
    """Before, no grant (no verifier) meant no host check and no pin: the request went
    wherever the operation's URL pointed (here: a closed port, external_api_error)."""
    source = SourceDefinition(
        name="pets",
        kind=SourceKind.HTTP,
        target="http://127.0.0.1:9",
        operations=[HttpOperation(operation_id="list", url="/pets")],
    )
    tool = http_tools.source_tool(source, source.operations[0])
    provider = SourceToolProvider(lookup=_OneTool(tool, source))  # no network_permissions
    spec = await provider.spec(tool.tool_id, tool.version)
    assert spec is not None
    ctx = ToolContext(
        tenant_id="t1",
        agent_did="did:agent:a",
        invocation_id=str(uuid.uuid4()),
        tool_id=tool.tool_id,
        tool_version=tool.version,
    )
    try:
        result = await run_tool(spec, {}, ctx, timeout_s=5)
    finally:
        await provider.close()
    assert result.error is not None
    assert result.error.code == "permission_denied", result.error
