"""``toolfleet agent replay FILE`` on a bundle recorded on the fleet twin."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.support.agent_fixtures import EchoIn, manifest
from toolfleet.agent import (
    BundleHeader,
    BundleWriter,
    MemoryFleet,
    ModelRequest,
    OpenAIChat,
    ToolRunner,
    run_agent,
)
from toolfleet.cli.main import app

pytestmark = pytest.mark.unit


async def _record(path: Path) -> None:
    fleet = MemoryFleet()

    async def echo(params: dict[str, Any]) -> dict[str, Any]:
        return {"value": params["message"]}

    fleet.add_tool(manifest("core__echo", EchoIn), echo)
    runner = await ToolRunner.open(fleet, run_id="cli-run")
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "core__echo", "arguments": '{"message": "x"}'},
    }
    script = [
        {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]},
        {"choices": [{"message": {"role": "assistant", "content": "done"}}]},
    ]

    async def model(request: ModelRequest) -> dict[str, Any]:
        return script[request.turn]

    writer = BundleWriter(
        path,
        BundleHeader(
            run_id="cli-run",
            adapter="openai-chat",
            max_iterations=5,
            max_tool_calls=5,
            manifests=await fleet.catalog(),
        ),
    )
    await run_agent(model, runner=runner, adapter=OpenAIChat(), messages=[], recorder=writer)
    writer.close()


def test_replay_reproduces_and_shows_divergence(tmp_path: Path) -> None:
    bundle = tmp_path / "run.jsonl"
    asyncio.run(_record(bundle))
    same = CliRunner().invoke(app, ["agent", "replay", str(bundle)])
    assert same.exit_code == 0, same.output
    assert "reproduced" in same.output

    denied = CliRunner().invoke(app, ["agent", "replay", str(bundle), "--allow", "acme__*"])
    assert denied.exit_code == 1
    # Piped, each line stays whole (at any width), so the documented line can be grepped.
    lines = denied.output.splitlines()
    assert any(
        line.startswith(
            "diverges at turn 0 call 0 (core__echo): recorded success, replay permission_denied"
            ": tool 'core__echo' is not in this run's catalog"
        )
        for line in lines
    ), lines

    bumped = tmp_path / "manifests.json"
    bumped.write_text(
        json.dumps([manifest("core__echo", EchoIn, version="1.1.0").model_dump(mode="json")])
    )
    changed = CliRunner().invoke(
        app, ["agent", "replay", str(bundle), "--manifests", str(bumped), "--json"]
    )
    assert changed.exit_code == 1
    report = json.loads(changed.output)
    assert report["reproduced"] is False
    assert "would run version 1.1.0" in report["divergences"][0]["reason"]


def test_a_file_that_is_not_a_bundle_is_a_friendly_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"kind": "turn"}\n')
    result = CliRunner().invoke(app, ["agent", "replay", str(junk)])
    assert result.exit_code != 0
    assert "not a replay bundle" in " ".join(result.output.split())
