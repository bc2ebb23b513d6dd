"""The import contracts (``[tool.importlinter]`` in ``pyproject.toml``) catch what they
are for.

``make lint`` runs ``lint-imports`` on the package itself, and CI runs ``make lint``
first. Here the contracts run on a copy of the package, untouched and then with one
import planted the way a change would add it, and each plant must break the contract
that forbids it: an import from a higher floor (at module level, inside a function,
under ``TYPE_CHECKING``), a package no floor names, a cycle inside one package or
between two, a pipeline service importing another, the client importing the server.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import toolfleet

pytestmark = pytest.mark.unit

PACKAGE = Path(toolfleet.__file__).parent
PYPROJECT = PACKAGE.parents[1] / "pyproject.toml"

FLOORS = "Every package imports only from the floors below it"
SERVICES = "The five pipeline services never import each other"
CLIENTS = "The clients never import the server"
ACYCLIC = "No import cycle between the packages or modules of any one package"

_VERDICT = re.compile(r"^(?P<name>.+) (?P<verdict>KEPT|BROKEN)$", re.MULTILINE)


def broken_contracts(root: Path) -> set[str]:
    """The names of the contracts ``lint-imports`` finds broken in ``root/toolfleet``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())",
            str(PYPROJECT),
            "--no-cache",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    verdicts = {m["name"]: m["verdict"] for m in _VERDICT.finditer(run.stdout)}
    assert set(verdicts) == {FLOORS, SERVICES, CLIENTS, ACYCLIC}, run.stdout + run.stderr
    assert (run.returncode != 0) == ("BROKEN" in verdicts.values()), run.stdout
    return {name for name, verdict in verdicts.items() if verdict == "BROKEN"}


def copy_of_the_package(root: Path) -> Path:
    """``root/toolfleet``: the sources as they are (``lint-imports`` reads, never imports)."""
    shutil.copytree(
        PACKAGE, root / "toolfleet", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    return root / "toolfleet"


def test_the_package_keeps_every_contract(tmp_path: Path) -> None:
    copy_of_the_package(tmp_path)
    assert broken_contracts(tmp_path) == set()


def test_the_contracts_are_the_ones_this_test_names() -> None:
    contracts = tomllib.loads(PYPROJECT.read_text("utf-8"))["tool"]["importlinter"]["contracts"]
    assert {c["name"] for c in contracts} == {FLOORS, SERVICES, CLIENTS, ACYCLIC}


def _new_module(package: Path, path: str, text: str) -> None:
    target = package / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, "utf-8")


def _append(package: Path, path: str, text: str) -> None:
    target = package / path
    target.write_text(target.read_text("utf-8") + text, "utf-8")


# Each plant: what it does to the copy, and the contracts it must break (exactly those:
# the package as it is keeps them all).
PLANTS = {
    # The tool definitions sit below the bus: they may not use it.
    "an import from a higher floor": (
        lambda p: _new_module(p, "tools/planted.py", "from toolfleet.bus import topics\n"),
        {FLOORS},
    ),
    "an import from a higher floor, inside a function": (
        lambda p: _new_module(
            p,
            "tools/planted.py",
            "def planted() -> None:\n    from toolfleet.bus import topics  # noqa: F401\n",
        ),
        {FLOORS},
    ),
    "an import from a higher floor, for typing only": (
        lambda p: _new_module(
            p,
            "tools/planted.py",
            "from typing import TYPE_CHECKING\n\n"
            "if TYPE_CHECKING:\n    from toolfleet.bus.topics import TopicSpec\n",
        ),
        {FLOORS},
    ),
    "a package no floor names": (
        lambda p: _new_module(p, "planted/__init__.py", '"""A new package."""\n'),
        {FLOORS},
    ),
    # agent.loop imports agent.records: the floors say nothing inside a package.
    "a cycle inside one package": (
        lambda p: _append(p, "agent/records.py", "\nfrom toolfleet.agent import loop\n"),
        {ACYCLIC},
    ),
    # The tool definitions build on the contract's manifest.
    "a cycle between two packages": (
        lambda p: _new_module(p, "contract/planted.py", "from toolfleet.tools import spec\n"),
        {FLOORS, ACYCLIC},
    ),
    "a pipeline service importing another": (
        lambda p: _new_module(p, "audit/planted.py", "from toolfleet.status import store\n"),
        {SERVICES, FLOORS},
    ),
    # The worker runtime is on a lower floor than the client: only this contract says no.
    "the client importing the server": (
        lambda p: _new_module(p, "client/planted.py", "from toolfleet import worker\n"),
        {CLIENTS},
    ),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_import_breaks_its_contract(plant: str, tmp_path: Path) -> None:
    change, expected = PLANTS[plant]
    change(copy_of_the_package(tmp_path))
    assert broken_contracts(tmp_path) == expected
