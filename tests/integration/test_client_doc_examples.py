"""The Python examples of ``docs/publishing.md``, ``docs/agent-runner.md`` and
``docs/mcp.md``, run
exactly as printed against a real fleet: every service in process, the API served by
uvicorn on a real port. The pages say what the reader has: the API's URL in
``TOOLFLEET_API_URL``, a token in ``TOKEN`` and the fleet's ``TOOLFLEET_*`` settings in
the environment; that is all this test provides."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.doc_examples import ROOT, examples, run_page
from tests.support.fleet import fleet_env
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from tests.support.servers import served_by_uvicorn
from toolfleet.api import ApiSettings, create_app
from toolfleet.settings import FleetSettings
from toolfleet.worker import SERVICES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PUBLISHING = ROOT / "docs" / "publishing.md"
AGENT_RUNNER = ROOT / "docs" / "agent-runner.md"
MCP = ROOT / "docs" / "mcp.md"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("doc-fleet")
    async with in_process_fleet(fleet_settings(settings, home), SERVICES) as running:
        yield running


@pytest.fixture(scope="module")
async def api_url(fleet: Fleet) -> AsyncIterator[str]:
    """The fleet's API, served by uvicorn as ``toolfleet api`` serves it."""
    settings = fleet.settings.model_dump()
    async with served_by_uvicorn(
        lambda url: create_app(ApiSettings(**{**settings, "api_url": url}))
    ) as url:
        yield url


def reader_environment(
    monkeypatch: pytest.MonkeyPatch, fleet: Fleet, api_url: str, token: str
) -> None:
    """What the pages say the reader has, and nothing else."""
    for name, value in fleet_env(fleet.settings).items():
        if name.startswith("TOOLFLEET_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("TOOLFLEET_API_URL", api_url)
    monkeypatch.setenv("TOKEN", token)


@pytest.mark.parametrize("page", [PUBLISHING, AGENT_RUNNER, MCP], ids=lambda p: p.name)
def test_every_python_example_runs_or_says_why_not(page: Path) -> None:
    found = examples(page)
    assert found, f"{page.name} has no python example"
    assert all(e.not_run is None for e in found), [e.where for e in found if e.not_run]


async def test_publishing_examples_run_as_printed(
    fleet: Fleet,
    api_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    reader_environment(monkeypatch, fleet, api_url, fleet.token("t1", "did:agent:x", "core__*"))
    scope = await run_page(PUBLISHING)
    printed = capsys.readouterr().out
    assert "success {'message': 'hi', 'length': 2}" in printed
    assert "EventKind.TOOL_CALL_RESULT" in printed or "tool_call_result" in printed
    assert printed.count("one shape") == 2
    assert "approve is not supported over kafka" in printed
    assert scope["outcome"].status == "success"


async def test_agent_runner_examples_run_as_printed(
    fleet: Fleet,
    api_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # the replay example writes run.jsonl where it runs
    reader_environment(monkeypatch, fleet, api_url, fleet.token("t1", "did:agent:demo", "core__*"))
    scope = await run_page(AGENT_RUNNER)
    printed = capsys.readouterr().out
    assert "Said hi; it is late." in printed
    run = scope["run"]
    assert run.text == "Said hi; it is late."
    assert [run.tools_by_id[c].status for c in run.tool_order] == ["success", "success"]
    assert (tmp_path / "run.jsonl").read_text().count("\n") >= 2


async def test_mcp_example_runs_as_printed(
    fleet: Fleet,
    api_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    reader_environment(monkeypatch, fleet, api_url, fleet.token("t1", "did:agent:x", "core__echo"))
    scope = await run_page(MCP)
    assert [t.name for t in scope["tools"]] == ["core__echo"]  # the token's catalog only
    assert scope["result"].structured_content == {"message": "hi", "length": 2}
    assert capsys.readouterr().out.startswith("['core__echo'] {")
