"""Encryption at rest of raw results: transfer blobs and result-cache entries.

Both hold what a tool returned *before* the validator applied its allowlist and
sanitization, so they are sealed with AES-256-GCM under a key derived from the fleet
key (the execution-grant keys of ``TOOLFLEET_GRANT_KEY_FILE``) with HKDF-SHA256, one key
per purpose (``transfer-blob``, ``result-cache``): a key of one purpose opens nothing of
another, and the grant HMAC never sees the derived keys.

A sealed value is ``MAGIC | kid (12 bytes) | nonce (12 bytes) | ciphertext+tag``. The
``kid`` is :func:`toolfleet.auth.grants.grant_kid` of the fleet key that sealed it, so
after ``toolfleet keys rotate``-style rotation (a new first line in the key file) new
values are sealed with the new key and old ones still open while their key is listed.
The caller's associated data binds a value to its place (tenant, invocation, blob id or
cache key): a value copied to another row or key does not open.

``MAGIC`` starts with a NUL byte, which no JSON document does, so a reader tells a
sealed value from a plaintext one written before the upgrade.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from toolfleet.auth.grants import fleet_grant_keys, grant_kid
from toolfleet.settings import FleetSettings

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC: Final = b"\x00tfae1"
_KID_BYTES = 12
_NONCE_BYTES = 12
_HEADER = len(MAGIC) + _KID_BYTES + _NONCE_BYTES
_INFO = b"toolfleet/at-rest/v1/"

TRANSFER_BLOB: Final = "transfer-blob"
RESULT_CACHE: Final = "result-cache"


def is_sealed(data: bytes) -> bool:
    """Whether ``data`` is a sealed value (else: plaintext from before encryption)."""
    return data.startswith(MAGIC)


class AtRestCipher:
    """Seals and opens values of one purpose with keys derived from the fleet keys.

    The first key seals; every key opens (rotation). cryptography is loaded and the keys
    derived at the first value sealed or opened: the executor and the validator hold
    ciphers for large results and cached ones only, the rare calls, and cryptography is
    about 6 MB of resident memory per worker (issue 36: a worker stays within 80 MB).
    """

    def __init__(self, fleet_keys: Sequence[bytes], *, purpose: str) -> None:
        if not fleet_keys:
            raise ValueError("an at-rest cipher needs at least one fleet key")
        self.purpose = purpose
        self._fleet_keys: dict[bytes, bytes] = {}
        for key in fleet_keys:
            self._fleet_keys.setdefault(grant_kid(key).encode(), key)
        self._kid = grant_kid(fleet_keys[0]).encode()

    @classmethod
    def from_settings(cls, settings: FleetSettings, *, purpose: str) -> AtRestCipher:
        """The cipher of ``TOOLFLEET_GRANT_KEY_FILE``; a
        :class:`~toolfleet.auth.grants.GrantKeyError` when it is unset: a worker refuses
        to start rather than store raw results in plaintext."""
        return cls(fleet_grant_keys(settings), purpose=purpose)

    @property
    def kid(self) -> str:
        """Id of the fleet key new values are sealed with."""
        return self._kid.decode()

    def seal(self, plaintext: bytes, *, aad: bytes) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._ciphers[self._kid].encrypt(nonce, plaintext, self._aad(aad))
        return MAGIC + self._kid + nonce + sealed

    def open(self, data: bytes, *, aad: bytes) -> bytes | None:
        """The plaintext, or ``None`` when the key is no longer listed or ``data`` was
        altered or moved (the tag does not verify)."""
        if not is_sealed(data) or len(data) < _HEADER:
            return None
        kid = data[len(MAGIC) : len(MAGIC) + _KID_BYTES]
        aead = self._ciphers.get(kid)
        if aead is None:
            return None
        from cryptography.exceptions import InvalidTag  # loaded with the ciphers already

        nonce = data[len(MAGIC) + _KID_BYTES : _HEADER]
        try:
            return aead.decrypt(nonce, data[_HEADER:], self._aad(aad))
        except InvalidTag:
            return None

    @functools.cached_property
    def _ciphers(self) -> Mapping[bytes, AESGCM]:
        return _derive_all(self._fleet_keys, self.purpose)

    def _aad(self, aad: bytes) -> bytes:
        return self.purpose.encode() + b"\x1f" + aad


def _derive_all(fleet_keys: Mapping[bytes, bytes], purpose: str) -> dict[bytes, AESGCM]:
    """An AES-GCM cipher per kid, with the key derived for ``purpose``."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return {
        kid: AESGCM(
            HKDF(
                algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO + purpose.encode()
            ).derive(key)
        )
        for kid, key in fleet_keys.items()
    }
