"""``toolfleet policy apply|get`` offline: file parsing, requests sent, friendly errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from toolfleet.cli.main import app
from toolfleet.cli.remote import ApiSession

pytestmark = pytest.mark.unit


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, Any]]:
    """Record API calls instead of sending them; answer like the API would."""
    calls: list[tuple[str, str, Any]] = []
    versions: dict[str, int] = {}

    def init(self: ApiSession, settings: object, token: str | None) -> None:
        self._token = token or "admin"

    def call(self: ApiSession, method: str, path: str, **kwargs: Any) -> Any:
        calls.append((method, path, kwargs.get("json")))
        tenant = path.rsplit("/", 1)[1]
        versions[tenant] = versions.get(tenant, 0) + 1
        return {
            "tenant_id": tenant,
            "version": versions[tenant],
            "updated_at": "2025-01-01T00:00:00Z",
            "updated_by": "did:toolfleet:cli",
            "policy": kwargs.get("json") or {"allow_tools": ["core__*"]},
            "warnings": [],
        }

    monkeypatch.setattr(ApiSession, "__init__", init)
    monkeypatch.setattr(ApiSession, "call", call)
    return calls


def test_apply_a_document_writes_every_tenant(
    tmp_path: Path, sent: list[tuple[str, str, Any]]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        'tenants:\n  "*": {allow_tools: ["core__*"]}\n'
        "  acme: {allow_tools: [acme__x], budgets: {max_runtime_ms: 5}}\n"
    )
    result = CliRunner().invoke(app, ["policy", "apply", str(path)])
    assert result.exit_code == 0, result.output
    assert [(m, p) for m, p, _ in sent] == [
        ("PUT", "/v1/policies/%2A"),
        ("PUT", "/v1/policies/acme"),
    ]
    assert sent[1][2]["budgets"]["max_runtime_ms"] == 5
    assert "acme: version 1" in result.output


def test_apply_one_tenant_json(tmp_path: Path, sent: list[tuple[str, str, Any]]) -> None:
    path = tmp_path / "acme.json"
    path.write_text(json.dumps({"allow_tools": ["core__echo"]}))
    result = CliRunner().invoke(app, ["policy", "apply", str(path), "--tenant", "acme", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["version"] == 1
    assert sent == [("PUT", "/v1/policies/acme", json.loads(path.read_text()) | sent[0][2])]


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        ("allow_tools: [core__*]\n", [], "no `tenants:`"),
        ("tenants: {acme: {allow_tool: []}}\n", [], "tenants.acme.allow_tool"),
        ("budgets: {max_runtime_ms: -1}\n", ["--tenant", "acme"], "budgets.max_runtime_ms"),
        ("tenants: [\n", [], "not valid YAML"),
    ],
)
def test_invalid_files_fail_before_sending(
    tmp_path: Path, sent: list[tuple[str, str, Any]], text: str, args: list[str], message: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["policy", "apply", str(path), *args])
    assert result.exit_code == 1
    assert message in result.output
    assert sent == []


def test_get_prints_version_and_yaml(sent: list[tuple[str, str, Any]]) -> None:
    result = CliRunner().invoke(app, ["policy", "get", "acme"])
    assert result.exit_code == 0, result.output
    assert sent == [("GET", "/v1/policies/acme", None)]
    assert "acme: version 1" in result.output
    assert "allow_tools:" in result.output
    assert "max_concurrent_per_agent" not in result.output  # defaults left out
