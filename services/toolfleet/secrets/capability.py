"""The invocation-scoped credential capability, and the leak check on what a tool returns.

For a tool that declares credentials, the executor resolves each one for the call's
tenant and ``connection_id`` just before the tool runs (:func:`resolve_credentials`)
and hands the tool a :class:`CredentialCapability`: ``ctx.credential(name)`` returns a
:class:`Secret` for a declared name and nothing else, and stops working once the call
has returned (:meth:`CredentialCapability.revoke`).

Whatever the tool returns is then checked by a :class:`LeakDetector` before anything
is emitted: the result, the error message and details, and every checkpoint. If any
string in them contains a resolved value, its standard or URL-safe base64 (at any
alignment), or if a :class:`Secret` object itself is in there, the call fails with
``redaction_failed`` and the offending output is dropped. The check is a substring
scan, so it catches a credential pasted into a message or encoded in base64; it does
not catch one transformed some other way (reversed, split, hashed), which is why
tools must never return what ``reveal()`` gives them.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from pydantic import BaseModel

from toolfleet.errors import PermissionDenied, RedactionFailed
from toolfleet.secrets.store import Secret, SecretStore

#: Base64 fragments shorter than this would match ordinary text by chance.
_MIN_FRAGMENT: Final = 6


class CredentialCapability:
    """The credentials of one tool call, by declared name; revoked when the call returns."""

    def __init__(self, secrets: Mapping[str, Secret], *, tool_id: str) -> None:
        self._secrets: dict[str, Secret] = dict(secrets)
        self._tool_id = tool_id
        self._revoked = False

    def get(self, name: str) -> Secret:
        """The credential ``name``; only names the tool declared, only during the call."""
        if self._revoked:
            raise PermissionDenied("credentials are only usable while the call runs")
        secret = self._secrets.get(name)
        if secret is None:
            raise PermissionDenied(
                f"{self._tool_id} did not declare credential {name[:64]!r} in @tool(credentials=)"
            )
        return secret

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._secrets)

    def detector(self) -> LeakDetector:
        """A leak check for these credentials' values; it outlives :meth:`revoke`."""
        return LeakDetector(self._secrets.values())

    def revoke(self) -> None:
        """Forget every credential: later ``get`` calls fail."""
        self._revoked = True
        self._secrets.clear()

    def __repr__(self) -> str:
        state = "revoked" if self._revoked else "live"
        return f"CredentialCapability({self._tool_id}, {sorted(self._secrets)}, {state})"


async def resolve_credentials(
    store: SecretStore,
    *,
    tenant_id: str,
    connection_id: str,
    names: Sequence[str],
    tool_id: str,
) -> CredentialCapability:
    """Resolve every declared credential now; the first one missing fails the call."""
    resolved = {name: await store.resolve(tenant_id, connection_id, name) for name in names}
    return CredentialCapability(resolved, tool_id=tool_id)


def encodings(value: str) -> set[str]:
    """The forms of ``value`` the leak check looks for: itself and its base64.

    A value base64-encoded inside a longer text is encoded differently for each of the
    three byte alignments it can start at; the part of each encoding that depends on
    the value alone is included (standard and URL-safe alphabets, no padding).
    """
    raw = value.encode()
    found = {value}
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        start = -(-4 * offset // 3)  # characters that still carry bits of the prefix
        end = (4 * (offset + len(raw))) // 3  # characters made of the value's bits only
        fragment = encoded[start:end]
        if len(fragment) >= _MIN_FRAGMENT:
            found.add(fragment)
            found.add(fragment.translate(str.maketrans("+/", "-_")))
    return found


class LeakDetector:
    """Finds resolved credential values (or :class:`Secret` objects) in tool output."""

    def __init__(self, secrets: Iterable[Secret]) -> None:
        self._needles: tuple[str, ...] = tuple(
            sorted({form for s in secrets if s.reveal() for form in encodings(s.reveal())})
        )

    def __bool__(self) -> bool:
        return bool(self._needles)

    def __repr__(self) -> str:
        return f"LeakDetector({len(self._needles)} forms)"

    def leaks(self, value: object) -> bool:
        """Whether ``value`` (JSON-like: dicts, lists, scalars) carries a credential."""
        stack: list[object] = [value]
        while stack:  # iterative: hostile nesting depth cannot overflow the stack
            node = stack.pop()
            if isinstance(node, Secret):
                return True
            if isinstance(node, BaseModel):
                stack.extend(dict(node).values())
            elif isinstance(node, Mapping):
                stack.extend(node.keys())
                stack.extend(node.values())
            elif isinstance(node, list | tuple | set | frozenset):
                stack.extend(node)
            elif isinstance(node, str | int | float | bytes) and not isinstance(node, bool):
                text = node.decode(errors="replace") if isinstance(node, bytes) else str(node)
                if any(needle in text for needle in self._needles):
                    return True
        return False


def withheld_output(leaks: LeakDetector, tool_id: str, output: object) -> RedactionFailed | None:
    """The error that replaces a tool's ``output`` carrying a credential; None if clean.

    The executor and ``toolfleet.sdk.testing`` both call it, so a local run withholds
    exactly what the fleet withholds.
    """
    if leaks and leaks.leaks(output):
        return RedactionFailed(f"{tool_id} put a credential in its output; the output was withheld")
    return None
