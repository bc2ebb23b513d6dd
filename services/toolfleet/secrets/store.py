"""The port every secret backend implements, and :class:`Secret`, the value it returns.

A :class:`Secret` never shows its value by accident: ``repr``, ``str`` and format
specs print ``Secret('***')``, it refuses to be pickled or copied into another
process, and the value comes out only through :meth:`Secret.reveal`. Backends raise
the errors below; none of their messages carries a path or a value.

    PermissionDenied (permission_denied)
    ├── SecretNotFound              no such credential for this tenant and connection
    └── SecretAccessDenied          the store refused access (its own ACL)
    ToolfleetError (internal_error)
    └── SecretStoreError            the store is misconfigured (e.g. a world-readable file)
    ConnectionError
    └── SecretStoreUnavailable      transient: the consumer retries with backoff
"""

from __future__ import annotations

import hmac
import re
from typing import Final, NoReturn, Protocol

from toolfleet.errors import PermissionDenied, ToolfleetError

CREDENTIAL_NAME_PATTERN: Final = r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$"
"""Credential names: lower-case words joined by single underscores (``api_key``)."""
CREDENTIAL_NAME_MAX: Final = 64

_PATH_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,255}$")
_MASK: Final = "Secret('***')"


class Secret:
    """A credential value that does not leak through ``repr``, logs or pickling."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError("a Secret wraps a str")
        self._value = value

    def reveal(self) -> str:
        """The value itself. Use it at the call that needs it; never log or return it."""
        return self._value

    def __repr__(self) -> str:
        return _MASK

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return _MASK

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self._value)

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")

    def __getstate__(self) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")

    def __copy__(self) -> Secret:
        return self  # immutable: a copy is the same secret, still masked

    def __deepcopy__(self, memo: object) -> Secret:
        return self


class SecretStore(Protocol):
    """Where credentials live: one value per ``(tenant, connection, name)``."""

    async def resolve(self, tenant_id: str, connection_id: str, name: str) -> Secret:
        """The credential ``name`` of ``connection_id`` for ``tenant_id``.

        Raises:
            SecretNotFound: there is no such credential.
            SecretAccessDenied: the store refused to give it out.
            SecretStoreError: the store is misconfigured.
            SecretStoreUnavailable: the store cannot be reached right now (transient).
        """
        ...


class SecretNotFound(PermissionDenied):
    """No credential ``name`` for this tenant and connection (or an unusable id)."""

    def __init__(self, connection_id: str, name: str) -> None:
        super().__init__(
            f"credential {name!r} is not available for connection {connection_id[:64]!r}"
        )


class SecretAccessDenied(PermissionDenied):
    """The store exists and answered, but refused this credential."""

    def __init__(self, connection_id: str, name: str) -> None:
        super().__init__(
            f"the secret store refused credential {name!r} of connection {connection_id[:64]!r}"
        )


class SecretStoreError(ToolfleetError):
    """The store is misconfigured; an operator must fix it (not retryable)."""


class SecretStoreUnavailable(ConnectionError):
    """The store cannot be reached; transient, so the consumer retries with backoff."""


def check_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a valid credential name."""
    if len(name) > CREDENTIAL_NAME_MAX or not re.fullmatch(CREDENTIAL_NAME_PATTERN, name):
        raise ValueError(
            f"{name[:80]!r} is not a credential name (lower-case words joined by '_', "
            f"at most {CREDENTIAL_NAME_MAX} characters)"
        )


def is_path_segment(value: str) -> bool:
    """Whether ``value`` can name a directory or a Vault path component as it is.

    Letters, digits, ``_ . : -``, starting with a letter or digit, at most 256
    characters: no ``/``, no ``..``, no NUL, nothing that changes a path's meaning.
    """
    return bool(_PATH_SEGMENT.fullmatch(value)) and ".." not in value
