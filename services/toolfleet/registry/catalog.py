"""The tools one executor can run: built-ins, entry points and configured modules."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback
from collections.abc import Iterable, Iterator
from importlib.metadata import entry_points
from types import ModuleType

from toolfleet.errors import RegistrationError
from toolfleet.tools.spec import ToolFunction, ToolSpec, is_tool, spec_of

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "toolfleet.tools"


class ToolCatalog:
    """In-process tools by ``(tool_id, version)``; a collision fails at registration."""

    def __init__(self, tools: Iterable[ToolFunction | ToolSpec] = ()) -> None:
        self._specs: dict[tuple[str, str], ToolSpec] = {}
        for declared in tools:
            self.add(declared)

    def add(self, declared: ToolFunction | ToolSpec) -> None:
        """Add a ``@tool`` function (or its spec)."""
        spec = spec_of(declared)
        existing = self._specs.get(spec.key)
        if existing is not None and existing.fn is not spec.fn:
            raise RegistrationError(
                f"{spec.tool_id}@{spec.version} is defined twice "
                f"({_where(existing)} and {_where(spec)})"
            )
        self._specs[spec.key] = spec

    def get(self, tool_id: str, version: str) -> ToolSpec | None:
        return self._specs.get((tool_id, version))

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(sorted(self._specs.values(), key=lambda s: s.key))

    def __len__(self) -> int:
        return len(self._specs)


def _where(spec: ToolSpec) -> str:
    return f"{spec.fn.__module__}.{spec.fn.__qualname__}"


def specs_in(module: ModuleType) -> list[ToolSpec]:
    """The tools a module lists in ``TOOLS``, else every ``@tool`` function at its top level."""
    found = getattr(module, "TOOLS", None)
    if found is not None:
        return [spec_of(declared) for declared in found]
    return [spec_of(value) for value in vars(module).values() if is_tool(value)]


def discover(tool_modules: Iterable[str] = ()) -> ToolCatalog:
    """Built-ins, then the ``toolfleet.tools`` entry-point group, then ``tool_modules``."""
    catalog = ToolCatalog()
    modules: list[ModuleType] = [importlib.import_module("toolfleet.sdk.builtin")]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        loaded = ep.load()
        if isinstance(loaded, ModuleType):
            modules.append(loaded)
        elif is_tool(loaded):
            catalog.add(loaded)
        else:
            raise RegistrationError(f"entry point {ep.name!r} is neither a module nor a tool")
    modules.extend(import_tool_modules(tool_modules))
    for module in modules:
        for spec in specs_in(module):
            catalog.add(spec)
    log.info("tools discovered", extra={"tools": [f"{s.tool_id}@{s.version}" for s in catalog]})
    return catalog


def import_tool_modules(names: Iterable[str]) -> list[ModuleType]:
    """Import the ``TOOLFLEET_TOOL_MODULES`` modules, found as ``python -m`` finds them:
    the working directory first, then the installed packages.

    Raises:
        RegistrationError: a module is not found (the message names it and the path
            searched) or fails to import: the message names the module, the place in
            the user's own code (``file:line``) and the error, not toolfleet's frames.
    """
    wanted = list(names)
    if wanted:
        _working_directory_on_path()
    modules: list[ModuleType] = []
    for name in wanted:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(f"{exc.name}.")):
                searched = os.pathsep.join(entry or os.getcwd() for entry in sys.path)
                raise RegistrationError(
                    f"tool module {name!r} (TOOLFLEET_TOOL_MODULES) not found; searched {searched}"
                ) from None
            raise RegistrationError(
                f"tool module {name!r} (TOOLFLEET_TOOL_MODULES) could not be imported: "
                f"{_cause(exc)}"
            ) from exc
        except Exception as exc:  # the user's code may raise anything while imported
            raise RegistrationError(
                f"tool module {name!r} (TOOLFLEET_TOOL_MODULES) could not be imported: "
                f"{_cause(exc)}"
            ) from exc
    return modules


_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The ``toolfleet`` package folder: frames in it are not the user's code."""


def _cause(exc: Exception) -> str:
    """``file:line: Error: message`` at the deepest frame of the user's own code."""
    what = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f"{exc.filename}:{exc.lineno}: {type(exc).__name__}: {exc.msg}"
    theirs = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith(("<", _OURS + os.sep))
        and "importlib" not in frame.filename
    ]
    if not theirs:
        return what
    return f"{theirs[-1].filename}:{theirs[-1].lineno}: {what}"


def _working_directory_on_path() -> None:
    """Put the working directory first on ``sys.path``, as ``python -m`` does; a console
    script such as ``toolfleet`` starts with its own folder there instead."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
        importlib.invalidate_caches()
