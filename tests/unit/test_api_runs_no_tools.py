"""The API runs no tool and starts or reaches no tool source: nothing it imports, however
indirectly (function-level imports included), is the executor, the isolation layer or
the sources modules that start servers, reach hosts or run tools. Listing a source's
tools is an executor's job (``toolfleet.sources.listing``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import toolfleet

pytestmark = pytest.mark.unit

ROOT = Path(toolfleet.__file__).parent
FORBIDDEN = (
    "toolfleet.executor",
    "toolfleet.isolation",
    "toolfleet.sources.pool",  # starts stdio servers, opens MCP sessions
    "toolfleet.sources.stdio_client",  # spawns a server process
    "toolfleet.sources.provider",  # runs source tools, lists sources
    "toolfleet.sources.http_tools",  # sends a source's HTTP requests
)
#: Pure modules under a forbidden package, which policy (and so the API) shares: the
#: isolation package's docstring and its limit arithmetic (limits only go down).
PURE = {"toolfleet.isolation": set(), "toolfleet.tools.limits": {"toolfleet.errors"}}


def module_file(module: str, root: Path = ROOT) -> Path | None:
    """The file of ``module`` (a ``toolfleet.*`` name) under ``root``, if it is one."""
    parts = module.split(".")[1:]
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path: Path, root: Path = ROOT) -> str:
    relative = path.relative_to(root).with_suffix("")
    parts = [p for p in relative.parts if p != "__init__"]
    return ".".join(["toolfleet", *parts])


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """The ``toolfleet`` modules ``path`` imports (a name imported from a package counts
    as its submodule when there is one), and the packages each import runs."""
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    package = module_name(path, root)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    modules: set[str] = set()
    for name in found:
        if not name.startswith("toolfleet"):
            continue
        parts = name.split(".")
        # Importing a.b.c runs a/__init__ and a/b/__init__ first.
        modules.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {m for m in modules if module_file(m, root) is not None}


def closure(start: list[str], root: Path = ROOT) -> dict[str, str]:
    """Every module ``start`` imports, transitively: module -> the module importing it."""
    seen: dict[str, str] = dict.fromkeys(start, "")
    todo = list(start)
    while todo:
        current = todo.pop()
        path = module_file(current, root)
        assert path is not None, current
        for imported in imports_of(path, root):
            if imported not in seen:
                seen[imported] = current
                todo.append(imported)
    return seen


def chain(found: dict[str, str], module: str) -> str:
    links = [module]
    while found[links[-1]]:
        links.append(found[links[-1]])
    return " <- ".join(links)


def forbidden_in(found: dict[str, str]) -> list[str]:
    return sorted(
        chain(found, m)
        for m in found
        if m not in PURE and any(m == f or m.startswith(f"{f}.") for f in FORBIDDEN)
    )


def test_the_api_imports_no_tool_runner_and_no_source_starter() -> None:
    api = [module_name(p) for p in sorted((ROOT / "api").rglob("*.py"))]
    assert forbidden_in(closure(api)) == []


@pytest.mark.parametrize("module", sorted(PURE))
def test_what_the_api_may_import_from_the_isolation_package_stays_pure(module: str) -> None:
    path = module_file(module)
    assert path is not None
    imported = imports_of(path) - {"toolfleet"}
    assert imported == PURE[module]


def test_the_check_follows_imports_through_other_modules(tmp_path: Path) -> None:
    pkg = tmp_path / "toolfleet"
    (pkg / "api").mkdir(parents=True)
    (pkg / "sources").mkdir()
    for init in (pkg, pkg / "api", pkg / "sources"):
        (init / "__init__.py").write_text("")
    (pkg / "api" / "route.py").write_text("from toolfleet.sources import catalog\n")
    (pkg / "sources" / "catalog.py").write_text(
        "def listed() -> None:\n    from .pool import SessionPool\n"
    )
    (pkg / "sources" / "pool.py").write_text("class SessionPool: ...\n")
    found = closure(["toolfleet.api.route"], pkg)
    assert forbidden_in(found) == [
        "toolfleet.sources.pool <- toolfleet.sources.catalog <- toolfleet.api.route"
    ]


def test_the_executor_does_reach_them() -> None:
    # The walk is not blind: from the executor's handler it finds the source starters.
    found = closure(["toolfleet.executor.handler"])
    assert {"toolfleet.sources.pool", "toolfleet.sources.stdio_client"} <= set(found)
