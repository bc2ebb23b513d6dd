"""Tool ids and versions of source tools, and the untrusted-by-default rule (pure logic).

A source tool is untrusted because of where it comes from (its registered
``source_type``, mcp or http), not because of its name: an HTTP tool keeps its manifest
id (``acme__get_pet``), so callers say ``source_tool=True`` for it. The ``mcp__`` and
``http__`` prefixes are untrusted as well, whatever a caller says (defence in depth).

A source tool's version is derived from its schema: ``1.0.0+h<12 hex>`` (semver build
metadata), so the same schema is the same version on every executor and a changed
schema is a new version; the store deprecates the older one, so ``*`` resolves to the
current schema.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Collection, Iterable
from typing import Any

MCP_PREFIX = "mcp__"
HTTP_PREFIX = "http__"
_NOT_ID = re.compile(r"[^a-z0-9_]+")


def id_part(name: str) -> str:
    """``name`` as a tool-id part: lower-case, runs of other characters become ``_``."""
    part = _NOT_ID.sub("_", name.lower()).strip("_")
    part = re.sub(r"__+", "_", part)
    return part or "tool"


def mcp_tool_id(server: str, tool: str) -> str:
    return f"{MCP_PREFIX}{id_part(server)}__{id_part(tool)}"


def http_tool_id(source: str, operation_id: str) -> str:
    return f"{HTTP_PREFIX}{id_part(source)}__{id_part(operation_id)}"


def schema_version(input_schema: dict[str, Any], output_schema: dict[str, Any]) -> str:
    """The version of a tool with these schemas: equal schemas, equal versions."""
    canonical = json.dumps(
        {"in": input_schema, "out": output_schema}, sort_keys=True, separators=(",", ":")
    )
    return f"1.0.0+h{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


def is_untrusted(tool_id: str, *, source_tool: bool = False) -> bool:
    """Tools from sources: no glob allows them, only a policy naming them exactly.

    ``source_tool``: the tool is registered from an MCP or HTTP source (its manifest's
    ``source_type``), whatever its id.
    """
    return source_tool or tool_id.startswith((MCP_PREFIX, HTTP_PREFIX))


def pattern_allows(
    tool_id: str, pattern: str, *, glob_matches: bool, source_tool: bool = False
) -> bool:
    """Whether an *allow* pattern admits ``tool_id``: untrusted ids need their exact name."""
    if is_untrusted(tool_id, source_tool=source_tool):
        return pattern == tool_id
    return glob_matches


def glob_warnings(
    allow_patterns: Iterable[tuple[str, str]],
    known: Collection[str],
    *,
    source_tools: Collection[str] = (),
) -> list[str]:
    """Why an allow glob does less than it seems: it never allows a source tool.

    ``allow_patterns`` are ``(location, pattern)`` pairs of a policy's allow lists;
    ``known`` the registered tool ids, ``source_tools`` those of them registered from
    sources. A glob that matches registered source tools (``acme__*`` over an HTTP
    tool ``acme__get_pet``), or that is written for them (``mcp__*``,
    ``http__pets__*``), gets one warning naming a few of the ids it leaves out.
    """
    warnings = []
    sourced = set(source_tools)
    untrusted = sorted(t for t in known if is_untrusted(t, source_tool=t in sourced))
    for where, pattern in allow_patterns:
        if not any(c in pattern for c in "*?["):
            continue
        missed = [t for t in untrusted if fnmatch.fnmatchcase(t, pattern)]
        if not missed and not pattern.startswith((MCP_PREFIX, HTTP_PREFIX)):
            continue
        shown = ", ".join(missed[:3]) + (f" and {len(missed) - 3} more" if len(missed) > 3 else "")
        warnings.append(
            f"{where} {pattern!r} allows no MCP or HTTP source tool: those are allowed only "
            "by their exact id" + (f" (it does not allow {shown})" if missed else "")
        )
    return warnings
