"""The docs' configuration table (docs/configuration.md) is generated from the settings
classes."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolfleet.config_doc import END, START, main, render_table

pytestmark = pytest.mark.unit

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_docs_configuration_table_matches_the_settings() -> None:
    text = PAGE.read_text()
    assert (text.count(START), text.count(END)) == (1, 1), "one table, between its markers"
    table = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert table == render_table(), "run: python -m toolfleet.config_doc docs/configuration.md"


def test_every_variable_is_documented() -> None:
    table = render_table()
    for name in (
        "TOOLFLEET_KAFKA_BOOTSTRAP",
        "TOOLFLEET_REDIS_URL",
        "TOOLFLEET_DATABASE_URL",
        "TOOLFLEET_API_URL",
        "TOOLFLEET_POLICY_FILE",
        "TOOLFLEET_TOOL_MODULES",
        "TOOLFLEET_FETCH_MAX_WAIT_MS",
        "TOOLFLEET_LINGER_MS",
        "TOOLFLEET_HOME",
    ):
        assert f"`{name}`" in table
    assert "|  |" not in table  # every variable has a description


def test_the_generator_rewrites_the_page_it_is_given_and_explains_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "configuration.md"
    page.write_text(f"# Configuration\n\n{START}\nstale\n{END}\n\nAfter.\n")
    main([str(page)])
    assert page.read_text() == f"# Configuration\n\n{START}\n{render_table()}\n{END}\n\nAfter.\n"

    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "usage: python -m toolfleet.config_doc" in capsys.readouterr().out
