"""Offline CLI behaviour: ``token issue``, friendly errors, audit line formatting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolfleet.auth.keys import generate_key_pair
from toolfleet.auth.tokens import TokenVerifier
from toolfleet.cli.audit import audit_line
from toolfleet.cli.fleet import WorkerName
from toolfleet.cli.main import app
from toolfleet.events.codec import ContentMode, encode
from toolfleet.events.envelope import new_event
from toolfleet.events.types import EventType, Source
from toolfleet.worker import AUXILIARY, SERVICES

pytestmark = pytest.mark.unit


@pytest.fixture
def key_env(tmp_path: Path) -> dict[str, str]:
    pair = generate_key_pair()
    private, public = tmp_path / "private.pem", tmp_path / "public.pem"
    private.write_bytes(pair.private_pem)
    public.write_bytes(pair.public_pem)
    return {
        "TOOLFLEET_JWT_PRIVATE_KEY_FILE": str(private),
        "TOOLFLEET_JWT_PUBLIC_KEY_FILE": str(public),
        "TOOLFLEET_JWT_ISSUER": "iss-test",
        "TOOLFLEET_JWT_AUDIENCE": "aud-test",
    }


def test_token_issue_prints_a_verifiable_token_alone(key_env: dict[str, str]) -> None:
    result = CliRunner().invoke(
        app,
        [
            "token",
            "issue",
            "--tenant",
            "tenant_acme",
            "--agent",
            "did:agent:x",
            "--tool",
            "core__echo",
            "--version",
            "^1.0.0",
            "--ttl",
            "120",
        ],
        env=key_env,
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    verifier = TokenVerifier.from_file(
        Path(key_env["TOOLFLEET_JWT_PUBLIC_KEY_FILE"]), issuer="iss-test", audience="aud-test"
    )
    capability = verifier.verify(lines[0])
    assert capability.tenant_id == "tenant_acme"
    assert capability.agent_did == "did:agent:x"
    assert capability.tool_id == "core__echo"
    assert capability.tool_version == "^1.0.0"
    assert not capability.is_admin
    assert capability.claims["exp"] - capability.claims["iat"] == 120


def test_token_issue_admin_scope(key_env: dict[str, str]) -> None:
    result = CliRunner().invoke(
        app,
        ["token", "issue", "--tenant", "t", "--agent", "did:a", "--tool", "*", "--admin"],
        env=key_env,
    )
    assert result.exit_code == 0, result.output
    verifier = TokenVerifier.from_file(
        Path(key_env["TOOLFLEET_JWT_PUBLIC_KEY_FILE"]), issuer="iss-test", audience="aud-test"
    )
    assert verifier.verify(result.stdout.strip()).is_admin


def test_token_issue_approver_scope(key_env: dict[str, str]) -> None:
    base = ["token", "issue", "--tenant", "t", "--agent", "did:user:alice", "--tool", "*"]
    result = CliRunner().invoke(app, [*base, "--scope", "approver"], env=key_env)
    assert result.exit_code == 0, result.output
    verifier = TokenVerifier.from_file(
        Path(key_env["TOOLFLEET_JWT_PUBLIC_KEY_FILE"]), issuer="iss-test", audience="aud-test"
    )
    capability = verifier.verify(result.stdout.strip())
    assert capability.scopes == frozenset({"approver"})
    assert not capability.is_admin

    unknown = CliRunner().invoke(app, [*base, "--scope", "root"], env=key_env)
    assert unknown.exit_code == 1
    assert "unknown scope 'root'" in unknown.stderr
    assert unknown.stdout == ""


def test_missing_key_is_a_friendly_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["token", "issue", "--tenant", "t", "--agent", "did:a", "--tool", "x"]
    )
    assert result.exit_code == 1
    assert "TOOLFLEET_JWT_PRIVATE_KEY_FILE" in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""

    missing = CliRunner().invoke(
        app,
        ["token", "issue", "--tenant", "t", "--agent", "did:a", "--tool", "x"],
        env={
            "TOOLFLEET_JWT_PRIVATE_KEY_FILE": str(tmp_path / "nope.pem"),
            "TOOLFLEET_JWT_PUBLIC_KEY_FILE": str(tmp_path / "nope.pub"),
        },
    )
    assert missing.exit_code == 1
    assert "not found" in missing.stderr


def test_unreachable_api_is_a_friendly_error(key_env: dict[str, str]) -> None:
    env = {**key_env, "TOOLFLEET_API_URL": "http://127.0.0.1:9"}
    result = CliRunner().invoke(app, ["status", "00000000-0000-0000-0000-000000000000"], env=env)
    assert result.exit_code == 1
    assert "cannot reach the toolfleet API" in result.stderr
    assert "Traceback" not in result.output


def test_bad_setting_names_the_variable() -> None:
    result = CliRunner().invoke(
        app, ["tools", "list", "--token", "x"], env={"TOOLFLEET_REDIS_URL": "http://nope"}
    )
    assert result.exit_code == 1
    assert "TOOLFLEET_REDIS_URL" in result.stderr


def test_worker_names_are_checked() -> None:
    assert {name.value for name in WorkerName} == {*SERVICES, *AUXILIARY, "analytics"}
    for bad in ("bogus", "audit+bogus", "audit+audit"):
        result = CliRunner().invoke(app, ["worker", bad])
        assert result.exit_code == 2, bad
        assert "unknown or repeated service" in result.stderr, bad


def _audit_event(tenant: str) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    envelope = new_event(
        event_type=EventType.SUCCEEDED,
        source=Source.AUDIT,
        data={"audit_id": "a1", "action": "tool.succeeded"},
        tenant_id=tenant,
        invocation_id="inv-1",
    )
    wire = encode(envelope, ContentMode.STRUCTURED)
    return wire.key, wire.value, wire.headers


def test_audit_line_is_the_whole_structured_event_on_one_line() -> None:
    key, value, headers = _audit_event("tenant_a")
    line = audit_line(key, value, headers)
    assert line is not None
    assert "\n" not in line
    event = json.loads(line)
    assert event["type"] == "ai.agent.tool.succeeded"
    assert event["tenantid"] == "tenant_a"
    assert event["data"] == {"audit_id": "a1", "action": "tool.succeeded"}
    assert audit_line(key, value, headers, tenant="tenant_b") is None
    assert audit_line(key, value, headers, tenant="tenant_a") == line


def test_audit_line_accepts_binary_mode_and_skips_garbage() -> None:
    envelope = new_event(
        event_type=EventType.FAILED,
        source=Source.AUDIT,
        data={"audit_id": "a2"},
        tenant_id="tenant_a",
        invocation_id="inv-2",
    )
    wire = encode(envelope, ContentMode.BINARY)
    line = audit_line(wire.key, wire.value, wire.headers)
    assert line is not None
    assert json.loads(line)["data"] == {"audit_id": "a2"}
    assert audit_line(None, b"not an event", []) is None


def test_a_truncated_outcome_shows_where_the_whole_result_is() -> None:
    from toolfleet.cli import output

    outcome = {
        "result": {"rows": [1]},
        "execution_metadata": {
            "duration_ms": 12,
            "attempts": 1,
            "truncated": True,
            "attachments": [
                {
                    "kind": "blob",
                    "url": "/v1/invocations/abc/attachments/def",
                    "content_type": "application/json",
                    "bytes": 81234,
                }
            ],
        },
    }
    with output.console.capture() as captured:
        output.print_details(outcome)
    text = captured.get()
    assert "result truncated: a preview" in text
    assert "/v1/invocations/abc/attachments/def (81234 bytes, application/json)" in text
