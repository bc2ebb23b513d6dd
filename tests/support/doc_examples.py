"""The docs' Python examples, run exactly as printed.

Every fenced ````python`` block of a page is an example, unless the line before its
fence is an HTML comment saying why not (``<!-- not run: needs a Vault -->``): a page
cannot grow an example that no test runs without saying so. The blocks of one page run
in order in one namespace, as a reader pastes them one after another; a block may
``await`` at top level (as in ``python -m asyncio``).
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from types import CodeType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Example:
    """One ``python`` block of a page."""

    page: Path
    line: int
    """The line of its opening fence (1-based)."""
    code: str
    not_run: str | None
    """Why the page says it is not run; None for an example that runs."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def compiled(self) -> CodeType:
        return compile(
            self.code, self.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
        )


def examples(page: Path) -> list[Example]:
    """The ``python`` blocks of ``page``, in order."""
    lines = page.read_text("utf-8").splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None or not fence["lang"]:
            i += 1
            continue
        indent, start = len(fence["indent"]), i
        i += 1
        body: list[str] = []
        while i < len(lines) and not re.match(rf"^ {{{indent}}}```\s*$", lines[i]):
            body.append(lines[i][indent:])
            i += 1
        i += 1
        if fence["lang"] != "python":
            continue
        before = _NOT_RUN.match(lines[start - 1]) if start > 0 else None
        found.append(
            Example(
                page=page,
                line=start + 1,
                code="\n".join(body) + "\n",
                not_run=before["reason"] if before else None,
            )
        )
    return found


async def run_page(page: Path, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the examples of ``page`` that run, in order, in one namespace (returned).
    A block that fails raises with its page and line in the traceback."""
    scope: dict[str, Any] = {"__name__": f"docs_example_{page.stem.replace('-', '_')}"}
    scope.update(namespace or {})
    for example in examples(page):
        if example.not_run is not None:
            continue
        result = eval(example.compiled(), scope)  # noqa: S307 - the docs' own examples
        if inspect.iscoroutine(result):  # a block with top-level await
            await result
    return scope
