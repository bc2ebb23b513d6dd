"""One name, one meaning: the package's class names, its twins and its documented layout.

A reader who meets ``Checkpoint`` in one file must not find a different ``Checkpoint``
in another; an in-memory twin of a port is always ``Memory<Port>``; and the layout on
the architecture page names every package there is.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

import toolfleet

pytestmark = pytest.mark.unit

PACKAGE = Path(toolfleet.__file__).parent
ARCHITECTURE = PACKAGE.parents[1] / "docs" / "architecture.md"


def public_classes(root: Path) -> dict[str, list[str]]:
    """Class name -> the modules defining it (public names only: ``_Row`` is local)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(str(path.relative_to(root)))
    return found


def test_no_class_name_is_defined_twice() -> None:
    twice = {name: where for name, where in public_classes(PACKAGE).items() if len(where) > 1}
    assert twice == {}


def test_the_check_sees_a_name_defined_twice(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("class Checkpoint: ...\n")
    (tmp_path / "b.py").write_text("def f() -> None:\n    class Checkpoint: ...\n")
    assert public_classes(tmp_path)["Checkpoint"] == ["a.py", "b.py"]


def test_twins_have_one_prefix() -> None:
    other = sorted(
        name for name in public_classes(PACKAGE) if re.match(r"(InMemory|Fake|Stub)[A-Z]", name)
    )
    assert other == [], "an in-memory twin is Memory<Port>"


def _layout_block() -> str:
    text = ARCHITECTURE.read_text("utf-8")
    section = text.split("## Layout\n", 1)[1]
    return section.split("```\n", 2)[1]


def test_the_documented_layout_names_every_package_and_top_module() -> None:
    layout = _layout_block()
    packages = sorted(
        p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    )
    missing = [name for name in packages if not re.search(rf"^\s+{name}/", layout, re.M)]
    assert missing == []
    modules = ["worker.py", "errors.py", "settings.py", "json_text.py", "coalescing.py"]
    assert [m for m in modules if m not in layout] == []
