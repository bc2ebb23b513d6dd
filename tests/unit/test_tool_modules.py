"""``TOOLFLEET_TOOL_MODULES``: modules are found as ``python -m`` finds them (the working
directory first), and one that cannot be imported is a one-line error, not a traceback."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolfleet.auth.grants import ensure_grant_key
from toolfleet.cli.main import app
from toolfleet.errors import RegistrationError
from toolfleet.registry.catalog import discover

pytestmark = pytest.mark.unit

MODULE = "acme_tools_from_cwd"

_SOURCE = textwrap.dedent(
    """
    from pydantic import BaseModel

    from toolfleet.sdk import ToolContext, tool


    class Text(BaseModel):
        text: str


    @tool(id="acme__echo", version="1.0.0", effect="read_only", redaction_allowlist=["text"])
    async def echo(params: Text, ctx: ToolContext) -> Text:
        \"\"\"Echo the text back.\"\"\"
        return params
    """
)


@pytest.fixture
def module_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder holding a tool module, as the working directory of a console script
    (whose ``sys.path`` starts with its own folder, not the working directory)."""
    (tmp_path / f"{MODULE}.py").write_text(_SOURCE)
    (tmp_path / "broken_tools.py").write_text("import a_dependency_not_installed\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in {"", str(tmp_path)}])
    yield tmp_path
    for name in (MODULE, "broken_tools"):
        sys.modules.pop(name, None)


def test_a_tool_module_in_the_working_directory_is_found(module_folder: Path) -> None:
    catalog = discover([MODULE])
    assert catalog.get("acme__echo", "1.0.0") is not None


def test_a_missing_tool_module_names_itself_and_the_path_searched(module_folder: Path) -> None:
    with pytest.raises(RegistrationError) as raised:
        discover(["no_such_tools"])
    message = raised.value.message
    assert "'no_such_tools'" in message
    assert "TOOLFLEET_TOOL_MODULES" in message
    assert str(module_folder) in message
    assert "\n" not in message


def test_a_tool_module_whose_import_fails_says_why(module_folder: Path) -> None:
    with pytest.raises(RegistrationError) as raised:
        discover(["broken_tools"])
    assert "'broken_tools'" in raised.value.message
    assert "a_dependency_not_installed" in raised.value.message


def test_the_executor_worker_reports_a_missing_tool_module_in_one_line(
    module_folder: Path,
) -> None:
    grant_key = module_folder / "grant.key"
    ensure_grant_key(grant_key)
    result = CliRunner().invoke(
        app,
        ["worker", "executor"],
        env={"TOOLFLEET_TOOL_MODULES": "no_such_tools", "TOOLFLEET_GRANT_KEY_FILE": str(grant_key)},
    )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "tool module 'no_such_tools' (TOOLFLEET_TOOL_MODULES) not found" in result.stderr
