"""Product code outside the dev broker profile touches no private part of aiokafka.

The production path (the ``kafka`` broker profile) uses aiokafka's public API only, so an
aiokafka release cannot silently change what it does. The dev broker's workarounds that
replace private parts (the fetcher's request task, the coordinator's LeaveGroup) live in
``toolfleet/devstack/broker_profile/``, which this check leaves out.

Flagged, in every module under ``services/toolfleet`` outside ``devstack/broker_profile/``:

- an import of an aiokafka module outside its public API (:data:`PUBLIC_MODULES`,
  :data:`PUBLIC_PACKAGES`), or of a private name from one;
- ``obj._name`` where ``_name`` is private in aiokafka's own source (defined there: a
  method, a class attribute, an attribute it assigns) and toolfleet does not define it
  itself (on ``self``/``cls``, as a function, a class attribute);
- ``getattr``/``setattr``/``hasattr``/``delattr`` with such a name as a string.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiokafka
import pytest

import toolfleet

pytestmark = pytest.mark.unit

ROOT = Path(toolfleet.__file__).parent
EXEMPT = ROOT / "devstack" / "broker_profile"
"""The dev broker profile: its workarounds are the only private uses allowed."""

PUBLIC_MODULES = frozenset(
    {
        "aiokafka",  # its __all__: the clients, the structs, the rebalance listener
        "aiokafka.abc",
        "aiokafka.errors",
        "aiokafka.structs",
        "aiokafka.helpers",
        "aiokafka.admin",
        # Not re-exported by aiokafka.admin, but the type AIOKafkaAdminClient's
        # describe_configs/alter_configs take.
        "aiokafka.admin.config_resource",
        # The producer's documented ``partitioner`` argument: its default is this
        # module's DefaultPartitioner (murmur2 of the key, as the Java client).
        "aiokafka.partitioner",
    }
)
PUBLIC_PACKAGES = ("aiokafka.protocol",)
"""The wire's request and response structs: what ``AIOKafkaClient.send`` (exported by
``aiokafka``) takes and the admin client returns; aiokafka's API docs list them."""
ACCESSORS = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _public(module: str) -> bool:
    return module in PUBLIC_MODULES or any(
        module == p or module.startswith(f"{p}.") for p in PUBLIC_PACKAGES
    )


def _defined_names(tree: ast.AST, *, own_only: bool) -> set[str]:
    """Private names ``tree`` defines: functions, classes, class- and module-level names,
    and attributes it assigns (``own_only``: on ``self``/``cls`` only, so a patch of
    another object's attribute defines nothing)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            receiver = node.value
            own = isinstance(receiver, ast.Name) and receiver.id in {"self", "cls"}
            if own or not own_only:
                found.add(node.attr)
    return {name for name in found if _private(name)}


@functools.cache
def aiokafka_private_names() -> frozenset[str]:
    """Every private name aiokafka's installed source defines."""
    names: set[str] = set()
    for path in Path(aiokafka.__file__).parent.rglob("*.py"):
        names |= _defined_names(ast.parse(path.read_text("utf-8")), own_only=False)
    return frozenset(names)


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    what: str


def violations(paths: Iterable[Path]) -> list[Violation]:
    """What :mod:`this check <tests.unit.test_no_private_aiokafka>` flags in ``paths``."""
    trees = {path: ast.parse(path.read_text("utf-8"), filename=str(path)) for path in paths}
    ours: set[str] = set()
    for tree in trees.values():
        ours |= _defined_names(tree, own_only=True)
    theirs = aiokafka_private_names() - ours
    found: list[Violation] = []
    for path, tree in trees.items():
        found.extend(_in_tree(path, tree, theirs))
    return found


def _in_tree(path: Path, tree: ast.AST, theirs: frozenset[str]) -> Iterator[Violation]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "aiokafka" and not _public(alias.name):
                    yield Violation(path, node.lineno, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "aiokafka":
                continue
            if not _public(node.module):
                yield Violation(path, node.lineno, f"imports from {node.module}")
            for alias in node.names:
                if _private(alias.name):
                    yield Violation(path, node.lineno, f"imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr in theirs:
            yield Violation(path, node.lineno, f"uses .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ACCESSORS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in theirs
        ):
            yield Violation(path, node.lineno, f"{node.func.id}(..., {node.args[1].value!r})")


def product_modules() -> list[Path]:
    return [path for path in ROOT.rglob("*.py") if EXEMPT not in path.parents]


def test_product_code_outside_the_dev_stack_touches_no_private_aiokafka_attribute() -> None:
    found = [
        f"{v.path.relative_to(ROOT)}:{v.line}: {v.what}" for v in violations(product_modules())
    ]
    assert found == []


def test_aiokafka_private_names_are_collected_from_its_source() -> None:
    names = aiokafka_private_names()
    # What the dev profile patches, and what a careless fix would reach for.
    assert {"_fetcher", "_coordinator", "_proc_fetch_request", "_maybe_leave_group"} <= names
    assert "getmany" not in names


def test_the_check_catches_what_the_dev_profile_does(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from aiokafka.consumer.fetcher import Fetcher\n"
        "import aiokafka.conn\n"
        "from aiokafka.errors import _iter_subclasses\n"
        "def patch(consumer, coordinator):\n"
        "    fetcher = consumer._fetcher\n"
        "    send = fetcher._proc_fetch_request\n"
        "    coordinator._maybe_leave_group = send\n"
        "    return getattr(consumer, '_coordinator', None)\n"
    )
    found = {(v.line, v.what) for v in violations([planted])}
    assert found == {
        (1, "imports from aiokafka.consumer.fetcher"),
        (2, "imports aiokafka.conn"),
        (3, "imports aiokafka.errors._iter_subclasses"),
        (5, "uses ._fetcher"),
        (6, "uses ._proc_fetch_request"),
        (7, "uses ._maybe_leave_group"),
        (8, "getattr(..., '_coordinator')"),
    }


def test_the_check_leaves_public_use_and_toolfleets_own_attributes_alone(tmp_path: Path) -> None:
    clean = tmp_path / "clean.py"
    clean.write_text(
        "from aiokafka import AIOKafkaConsumer, TopicPartition\n"
        "from aiokafka.admin import AIOKafkaAdminClient\n"
        "from aiokafka.errors import KafkaError\n"
        "class Adapter:\n"
        "    def __init__(self, client: AIOKafkaAdminClient) -> None:\n"
        "        self._client = client  # toolfleet's own attribute, named like aiokafka's\n"
        "    async def fetch(self, consumer: AIOKafkaConsumer) -> None:\n"
        "        consumer.pause(TopicPartition('t', 0))\n"
        "        await consumer.getmany(timeout_ms=500)\n"
        "        await self._client.close()\n"
    )
    assert violations([clean]) == []
