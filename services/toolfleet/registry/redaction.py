"""The redaction allowlist: clients see only the result fields a tool declared.

Paths are dotted (``user.name``); naming a field allows its whole subtree, and a list
is traversed element by element. Every other leaf is replaced by ``"[REDACTED]"``
so the result keeps its shape (pure logic).
"""

from __future__ import annotations

from typing import Any

REDACTED = "[REDACTED]"


def _tree(allowlist: list[str] | tuple[str, ...]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in allowlist:
        node = tree
        parts = [p for p in path.split(".") if p]
        for i, part in enumerate(parts):
            if node.get(part) is True:
                break
            if i == len(parts) - 1:
                node[part] = True
            else:
                node = node.setdefault(part, {})
    return tree


def redact(result: Any, allowlist: list[str] | tuple[str, ...]) -> Any:
    """``result`` with everything outside ``allowlist`` replaced by ``[REDACTED]``."""
    return _apply(result, _tree(allowlist))


def _apply(value: Any, allowed: dict[str, Any] | bool) -> Any:
    if allowed is True:
        return value
    if isinstance(value, list):
        return [_apply(item, allowed) for item in value]
    if isinstance(value, dict):
        tree = allowed if isinstance(allowed, dict) else {}
        return {k: _apply(v, tree.get(k, False)) for k, v in value.items()}
    return REDACTED
