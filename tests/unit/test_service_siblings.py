"""No pipeline service imports another: what two of them share lives below them all."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import toolfleet

pytestmark = pytest.mark.unit

SIBLINGS = ("policy", "executor", "validator", "audit", "status")
ROOT = Path(toolfleet.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from toolfleet import audit`` names the package in the alias.
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("service", SIBLINGS)
def test_a_service_imports_none_of_its_siblings(service: str) -> None:
    others = {f"toolfleet.{s}" for s in SIBLINGS if s != service}
    crossings = sorted(
        f"{path.relative_to(ROOT)} imports {module}"
        for path in (ROOT / service).rglob("*.py")
        for module in imported_modules(path)
        if any(module == o or module.startswith(f"{o}.") for o in others)
    )
    assert crossings == []


def test_the_check_sees_an_import_of_a_sibling(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from toolfleet.policy.stores import X\nimport toolfleet.audit.records\n")
    assert {"toolfleet.policy.stores", "toolfleet.audit.records"} <= imported_modules(module)


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f() -> None:\n    from toolfleet.status import store\n")
    assert "toolfleet.status.store" in imported_modules(module)


def test_the_check_sees_a_package_imported_from_its_parent(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from toolfleet import audit\n")
    assert "toolfleet.audit" in imported_modules(module)
