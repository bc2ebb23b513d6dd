"""The public keys capability tokens may be signed with, by ``kid``, kept fresh.

A :class:`KeyRing` holds a snapshot (lookups are pure CPU, no I/O) and refreshes it
from a :class:`KeySource`: a PEM file (several keys allowed), a JWKS file, or a JWKS
URL. Refreshes happen only in :meth:`KeyRing.refresh` / :meth:`KeyRing.refresh_for_kid`
(async): periodically, and when a token names a ``kid`` the ring does not know, at
most once per ``unknown_kid_interval_s`` so forged kids cannot hammer the source. A
failed refresh keeps the previous keys; a source that yields no usable key counts as
a failure, so a bad publish never empties the ring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from cryptography.hazmat.primitives.asymmetric import rsa

from toolfleet.auth.jwks import MAX_JWKS_BYTES, JwksError, parse_jwks
from toolfleet.auth.keys import load_pem_public_keys
from toolfleet.errors import ToolfleetError

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

PublicKeys = Mapping[str, rsa.RSAPublicKey]
DEFAULT_REFRESH_S = 300.0
UNKNOWN_KID_INTERVAL_S = 30.0
FETCH_TIMEOUT_S = 5.0


class KeySourceError(ToolfleetError):
    """Verification keys could not be loaded; the message names the source, never a key."""


class KeySource(Protocol):
    """Where verification keys come from."""

    @property
    def description(self) -> str:
        """Safe text naming the source in logs and errors (no credentials)."""
        ...

    async def fetch(self) -> dict[str, rsa.RSAPublicKey]:
        """Every usable key by ``kid``; raises :class:`KeySourceError`."""
        ...


@dataclass(frozen=True, kw_only=True)
class FileKeySource:
    """A PEM file (one or more public keys) or a JWKS file."""

    path: Path
    format: Literal["pem", "jwks"]

    @property
    def description(self) -> str:
        return f"{self.format.upper()} file {self.path}"

    def read(self) -> dict[str, rsa.RSAPublicKey]:
        """The keys now in the file (synchronous; used at start-up)."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise KeySourceError(
                f"cannot read {self.description} ({exc.strerror or type(exc).__name__})"
            ) from None
        try:
            keys = parse_jwks(data) if self.format == "jwks" else load_pem_public_keys(data)
        except (JwksError, ValueError, TypeError) as exc:
            detail = str(exc) if isinstance(exc, JwksError) else "not PEM RSA public keys"
            raise KeySourceError(f"{self.description} is unusable: {detail}") from None
        return _non_empty(keys, self.description)

    async def fetch(self) -> dict[str, rsa.RSAPublicKey]:
        return await asyncio.to_thread(self.read)


@dataclass(frozen=True, kw_only=True)
class UrlJwksSource:
    """A JWKS served over HTTP(S); redirects are not followed."""

    url: str
    timeout_s: float = FETCH_TIMEOUT_S
    transport: httpx.AsyncBaseTransport | None = None
    """Test seam (``httpx.MockTransport``)."""

    @property
    def description(self) -> str:
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return f"JWKS URL {urlunsplit((parts.scheme, netloc, parts.path, '', ''))}"

    async def fetch(self) -> dict[str, rsa.RSAPublicKey]:
        # Imported here: httpx is ~20 MB that a fleet verifying tokens from a key file
        # (and every executor, which reads no JWKS) never needs.
        import httpx

        try:
            async with (
                httpx.AsyncClient(
                    transport=self.transport, timeout=self.timeout_s, follow_redirects=False
                ) as client,
                client.stream("GET", self.url, headers={"Accept": "application/json"}) as resp,
            ):
                if resp.status_code != 200:
                    raise KeySourceError(f"{self.description} answered HTTP {resp.status_code}")
                body = bytearray()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_JWKS_BYTES:
                        raise KeySourceError(f"{self.description} sent a too large document")
        except httpx.HTTPError as exc:
            raise KeySourceError(
                f"cannot fetch {self.description} ({type(exc).__name__})"
            ) from None
        try:
            keys = parse_jwks(bytes(body))
        except JwksError as exc:
            raise KeySourceError(f"{self.description} is unusable: {exc}") from None
        return _non_empty(keys, self.description)


class KeyRing:
    """A snapshot of verification keys by ``kid``, refreshed from an optional source."""

    def __init__(
        self,
        keys: PublicKeys | None = None,
        *,
        source: KeySource | None = None,
        refresh_s: float = DEFAULT_REFRESH_S,
        unknown_kid_interval_s: float = UNKNOWN_KID_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keys: dict[str, rsa.RSAPublicKey] = dict(keys or {})
        self._source = source
        self._refresh_s = refresh_s
        self._unknown_interval_s = unknown_kid_interval_s
        self._clock = clock
        self._last_attempt: float | None = clock() if self._keys else None
        self._last_unknown: float | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_pems(cls, public_pems: list[bytes]) -> KeyRing:
        """A static ring of PEM public keys (each item may hold several)."""
        keys: dict[str, rsa.RSAPublicKey] = {}
        for item in public_pems:
            for kid, key in load_pem_public_keys(item).items():
                keys.setdefault(kid, key)
        return cls(keys)

    @classmethod
    def from_file(
        cls,
        source: FileKeySource,
        *,
        refresh_s: float = DEFAULT_REFRESH_S,
        unknown_kid_interval_s: float = UNKNOWN_KID_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> KeyRing:
        """A ring loaded now from ``source`` and reloaded from it on refresh."""
        return cls(
            source.read(),
            source=source,
            refresh_s=refresh_s,
            unknown_kid_interval_s=unknown_kid_interval_s,
            clock=clock,
        )

    def get(self, kid: str) -> rsa.RSAPublicKey | None:
        return self._keys.get(kid)

    def only_key(self) -> rsa.RSAPublicKey | None:
        """The key, when the ring holds exactly one (tokens without a ``kid``)."""
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    @property
    def refresh_due(self) -> bool:
        if self._source is None:
            return False
        return self._last_attempt is None or self._clock() - self._last_attempt >= self._refresh_s

    async def refresh(self, *, force: bool = False, strict: bool = False) -> bool:
        """Reload the keys when due (or ``force``); ``True`` when they were replaced.

        A failure is logged and the previous keys stay, unless ``strict``, which raises
        :class:`KeySourceError` (use it at start-up to fail fast).
        """
        if self._source is None or not (force or self.refresh_due):
            return False
        async with self._lock:
            if not (force or self.refresh_due):
                return False  # another task refreshed while this one waited
            return await self._reload(strict=strict)

    async def refresh_for_kid(self, kid: str) -> bool:
        """Reload when ``kid`` is unknown (throttled) or the periodic refresh is due."""
        if self._source is None:
            return False
        if kid in self._keys:
            return await self.refresh()
        async with self._lock:
            if kid in self._keys:
                return False
            now = self._clock()
            if (
                self._last_unknown is not None
                and now - self._last_unknown < self._unknown_interval_s
            ):
                return False
            self._last_unknown = now
            return await self._reload(strict=False)

    async def _reload(self, *, strict: bool) -> bool:
        assert self._source is not None
        self._last_attempt = self._clock()
        try:
            keys = await self._source.fetch()
        except KeySourceError as exc:
            if strict:
                raise
            log.warning("keeping the current token verification keys: %s", exc.message)
            return False
        self._keys = keys
        return True


def _non_empty(keys: dict[str, rsa.RSAPublicKey], description: str) -> dict[str, rsa.RSAPublicKey]:
    if not keys:
        raise KeySourceError(f"{description} holds no RS256 signature key")
    return keys
