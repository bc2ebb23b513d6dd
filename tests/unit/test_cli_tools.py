"""``toolfleet tools``: what an operator reads in the list and sends when deprecating
(the API is a twin answering fixed bodies; the real server is in test_cli_remote)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from toolfleet.auth.keys import generate_key_pair
from toolfleet.cli import tools as tools_cli
from toolfleet.cli.main import app

pytestmark = pytest.mark.unit


def _version(version: str, state: str, **dates: str | None) -> dict[str, Any]:
    return {
        "version": version,
        "lifecycle_state": state,
        "deprecated": state != "active",
        "effect": "read_only",
        "requires_approval": False,
        "deprecation_date": None,
        "sunset_date": None,
        "deprecated_in_favor_of": None,
        **dates,
    }


TOOL = {
    "tool_id": "acme__report",
    "tool_name": "report",
    "description": "Monthly report.",
    "category": "data",
    "tags": [],
    "latest_version": "3.0.0",
    "requires_approval": False,
    "versions": [
        _version("3.0.0", "active"),
        _version(
            "2.0.0",
            "active",
            deprecation_date="2027-03-01T00:00:00Z",
            sunset_date="2027-06-01T00:00:00Z",
        ),
        _version(
            "1.1.0",
            "deprecated",
            deprecation_date="2026-11-02T10:00:00Z",
            sunset_date="2027-01-31T00:00:00Z",
            deprecated_in_favor_of="3.0.0",
        ),
        _version(
            "1.0.0",
            "sunset",
            deprecation_date="2026-01-01T00:00:00Z",
            sunset_date="2026-06-01T00:00:00Z",
        ),
    ],
}


class _Session:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        self.sent.append((method, path, kwargs))
        return self.body


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> _Session:
    twin = _Session({"items": [TOOL], "total": 1, "page": 1, "page_size": 200})
    monkeypatch.setattr(tools_cli, "_session", lambda token: twin)
    return twin


def test_list_shows_each_versions_state_and_dates(session: _Session) -> None:
    result = CliRunner().invoke(app, ["tools", "list"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    lines = result.stdout
    assert "3.0.0 active" in lines
    assert "2.0.0 active, deprecated from 2027-03-01, sunset on 2027-06-01" in lines
    assert "1.1.0 deprecated since 2026-11-02, sunset on 2027-01-31, use 3.0.0" in lines
    assert re.search(r"1\.0\.0 sunset since 2026-06-01 ", lines)


LONG = {
    **TOOL,
    "tool_id": "acme__quarterly_revenue_report_generator",
    "requires_approval": True,
    "description": "Builds the quarterly revenue report from the ledger, by region.",
}


def _fits(output: str, width: int) -> None:
    assert "…" not in output, output
    assert max(len(line.rstrip()) for line in output.splitlines()) <= width, output
    for fact in (
        "3.0.0 active",
        "2.0.0 active",
        "deprecated from 2027-03-01",
        "sunset on 2027-06-01",
        "1.1.0 deprecated since 2026-11-02",
        "sunset on 2027-01-31",
        "use 3.0.0",
        "1.0.0 sunset since 2026-06-01",
        "read_only (approval)",
    ):
        assert fact in output, (fact, output)


def test_list_fits_an_80_column_terminal_with_every_lifecycle_fact(session: _Session) -> None:
    session.body = {"items": [TOOL, LONG], "total": 2, "page": 1, "page_size": 200}
    result = CliRunner().invoke(app, ["tools", "list"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    _fits(result.stdout, 80)
    assert "Monthly report." in result.stdout
    assert "acme__quarterly_revenue_report_generator" in result.stdout.replace("\n", "")


def test_search_fits_an_80_column_terminal(session: _Session) -> None:
    strong = {**TOOL, "score": 0.61, "low_relevance": False}
    weak = {**LONG, "score": 0.2, "low_relevance": True}
    session.body = {"items": [strong, weak], "total": 2, "page": 1, "page_size": 5}
    result = CliRunner().invoke(app, ["tools", "search", "report"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    _fits(result.stdout, 80)
    assert re.search(r"2 +0\.20 \(weak\)", result.stdout)


@pytest.fixture
def key_env(tmp_path: Path) -> dict[str, str]:
    pair = generate_key_pair()
    private, public = tmp_path / "private.pem", tmp_path / "public.pem"
    private.write_bytes(pair.private_pem)
    public.write_bytes(pair.public_pem)
    return {
        "TOOLFLEET_JWT_PRIVATE_KEY_FILE": str(private),
        "TOOLFLEET_JWT_PUBLIC_KEY_FILE": str(public),
        # Nothing listens there: the command fails after choosing its identity.
        "TOOLFLEET_API_URL": "http://127.0.0.1:9",
    }


def test_without_a_token_the_cli_says_it_acts_as_admin(key_env: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["tools", "list"], env={**key_env, "COLUMNS": "200"})
    assert result.exit_code == 1
    assert "acting as admin (did:toolfleet:cli, every tenant)" in result.stderr
    assert "no --token or TOOLFLEET_TOKEN" in result.stderr
    assert "acting as" not in result.stdout  # --json output stays clean


def test_with_a_token_the_cli_does_not_claim_admin(key_env: dict[str, str]) -> None:
    for extra, env in (
        (["--token", "a-token"], {}),
        ([], {"TOOLFLEET_TOKEN": "a-token"}),
    ):
        result = CliRunner().invoke(app, ["tools", "list", *extra], env={**key_env, **env})
        assert result.exit_code == 1
        assert "cannot reach the toolfleet API" in result.stderr
        assert "acting as admin" not in result.output


def test_deprecate_sends_the_deprecation_and_sunset_dates(session: _Session) -> None:
    session.body = {
        "tool_id": "acme__report",
        "version": "2.0.0",
        "previous_state": "active",
        "lifecycle_state": "active",
        "deprecation_date": "2027-03-01T00:00:00+00:00",
        "sunset_date": "2027-06-01T00:00:00+00:00",
        "deprecated_in_favor_of": "3.0.0",
        "changed_by": "ops",
    }
    result = CliRunner().invoke(
        app,
        [
            "tools",
            "deprecate",
            "acme__report@2.0.0",
            "--deprecation-date",
            "2027-03-01",
            "--date",
            "2027-06-01",
            "--in-favor-of",
            "3.0.0",
        ],
        env={"COLUMNS": "250"},
    )
    assert result.exit_code == 0, result.output
    ((method, path, kwargs),) = session.sent
    assert (method, path) == ("PATCH", "/v1/tools/acme__report/versions/2.0.0")
    assert kwargs["json"] == {
        "lifecycle_state": "deprecated",
        "deprecation_date": "2027-03-01T00:00:00+00:00",
        "sunset_date": "2027-06-01T00:00:00+00:00",
        "deprecated_in_favor_of": "3.0.0",
    }
    assert "active → active (deprecated from 2027-03-01" in result.stdout


def test_a_malformed_deprecation_date_names_its_option(session: _Session) -> None:
    result = CliRunner().invoke(
        app, ["tools", "deprecate", "acme__report@2.0.0", "--deprecation-date", "soon"]
    )
    assert result.exit_code == 1
    assert "--deprecation-date 'soon'" in result.stderr
    assert session.sent == []


def test_search_shows_each_score_and_marks_weak_matches(session: _Session) -> None:
    strong = {**TOOL, "score": 0.61, "low_relevance": False}
    weak = {**TOOL, "tool_id": "acme__other", "score": 0.2, "low_relevance": True}
    session.body = {"items": [strong, weak], "total": 2, "page": 1, "page_size": 5}
    result = CliRunner().invoke(app, ["tools", "search", "report"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert re.search(r"1 .*0\.61 .*acme__report", result.stdout)
    assert re.search(r"2 .*0\.20 \(weak\) .*acme__other", result.stdout)


def test_a_search_nothing_matches_says_so(session: _Session) -> None:
    session.body = {"items": [], "total": 0, "page": 1, "page_size": 5}
    result = CliRunner().invoke(app, ["tools", "search", "banana"])
    assert result.exit_code == 0, result.output
    assert "no tool this token may call matches that" in result.stdout
