"""The core install works without ``cloudevents``: the package is a test dependency only.

The codec (``toolfleet.events.codec``) writes the CloudEvents Kafka binding itself;
``tests/unit/test_codec.py`` holds it to the SDK's. Each runtime check runs in a fresh
interpreter (this test process may have imported the SDK already).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import toolfleet

pytestmark = pytest.mark.unit

PACKAGE = Path(toolfleet.__file__).parent
TEST_ONLY = "cloudevents"

#: Refuses ``cloudevents`` as an install without the ``dev`` extra would.
_WITHOUT_CLOUDEVENTS = f"""
import importlib.abc
import sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] == {TEST_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def _run(code: str, *, blocked: bool) -> subprocess.CompletedProcess[str]:
    prelude = _WITHOUT_CLOUDEVENTS if blocked else ""
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _imports_of(tree: ast.AST) -> set[str]:
    """Top-level packages ``tree`` imports, statically or by ``import_module("...")``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in {"import_module", "__import__"}
        ):
            found.add(node.args[0].value)
    return {name.split(".", 1)[0] for name in found}


def test_no_module_of_the_package_imports_cloudevents() -> None:
    importers = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if TEST_ONLY in _imports_of(ast.parse(path.read_text(encoding="utf-8")))
    )
    assert importers == []


@pytest.mark.parametrize(
    "module",
    [
        "toolfleet.events",
        "toolfleet.events.codec",
        "toolfleet.contract.schema_export",
        "toolfleet.client.http",
        "toolfleet.client.requests",
        "toolfleet.sdk",
    ],
)
def test_importing_the_core_does_not_load_cloudevents(module: str) -> None:
    done = _run(
        f"""
        import json, sys
        import {module}
        print(json.dumps(sorted(sys.modules)))
        """,
        blocked=False,
    )
    assert done.returncode == 0, done.stderr
    loaded = {name.split(".", 1)[0] for name in json.loads(done.stdout)}
    assert TEST_ONLY not in loaded


def test_events_round_trip_both_content_modes_without_cloudevents() -> None:
    done = _run(
        """
        from toolfleet.events import ContentMode, EventType, decode, encode, new_event

        sent = new_event(
            event_type=EventType.INVOKE_REQUESTED,
            source="/toolfleet/client",
            data={"a": 1},
            tenant_id="t1",
            invocation_id="i1",
        )
        for mode in ContentMode:
            wire = encode(sent, mode)
            assert decode(key=wire.key, value=wire.value, headers=wire.headers) == sent, mode
        print("ok")
        """,
        blocked=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_blocker_refuses_cloudevents() -> None:
    # The round trip above proves something only if the blocker really hides the SDK.
    done = _run("import cloudevents\n", blocked=True)
    assert done.returncode == 1
    assert "No module named 'cloudevents'" in done.stderr
