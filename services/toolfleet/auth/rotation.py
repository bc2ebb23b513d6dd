"""Operator key rotation: a new signing key, old keys still verifying for a while.

Files, all in the key directory (the directory of ``TOOLFLEET_JWT_PRIVATE_KEY_FILE``):

* the private key file: the current signing key, replaced atomically;
* ``jwt_private.<kid>.pem.old``: each previous signing key, kept while its public
  key is still published (removed once it is retired);
* ``TOOLFLEET_JWKS_FILE`` (default ``jwks.json`` there): the published public keys,
  newest first, at most ``keep``;
* ``TOOLFLEET_JWT_PUBLIC_KEY_FILE`` (default ``jwt_public.pem`` there): the same keys
  as concatenated PEM, for verifiers configured with a PEM file (``toolfleet dev``).

Order matters for a live fleet: the new public key is published before the private
key is replaced, so no token signed with the new key exists before verifiers can
learn it. Verifiers pick the new key up on their next refresh (or on the first token
with the unknown ``kid``).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from toolfleet.auth.jwks import dump_jwks, parse_jwks
from toolfleet.auth.keys import (
    generate_key_pair,
    kid_of,
    load_pem_public_keys,
    load_rsa_private_key,
    load_rsa_public_key,
    write_atomically,
)
from toolfleet.settings import FleetSettings

DEFAULT_KEEP = 3
"""Published keys after a rotation: the new one and the two before it."""


@dataclass(frozen=True, kw_only=True)
class KeyFiles:
    """Where the fleet's signing and verification keys live."""

    private: Path
    public: Path
    jwks: Path

    @classmethod
    def from_settings(cls, settings: FleetSettings) -> KeyFiles:
        """The configured files; ``ValueError`` when no private key file is configured."""
        private = settings.jwt_private_key_file
        if private is None:
            raise ValueError("TOOLFLEET_JWT_PRIVATE_KEY_FILE is not set")
        private = private.expanduser()
        directory = private.parent
        return cls(
            private=private,
            public=(settings.jwt_public_key_file or directory / "jwt_public.pem").expanduser(),
            jwks=(settings.jwks_file or directory / "jwks.json").expanduser(),
        )

    def backup(self, kid: str) -> Path:
        """Where the retired private key of ``kid`` is kept."""
        return self.private.with_name(f"{self.private.stem}.{kid}.pem.old")


@dataclass(frozen=True, kw_only=True)
class PublishedKey:
    kid: str
    signing: bool
    """Whether the current private key is this key."""


@dataclass(frozen=True, kw_only=True)
class RotationResult:
    kid: str
    """The new signing key."""
    previous_kid: str | None
    published: tuple[str, ...]
    """Every published kid, newest first."""
    retired: tuple[str, ...]
    """Kids no longer published (their tokens stop verifying)."""


def rotate_keys(files: KeyFiles, *, keep: int = DEFAULT_KEEP, bits: int = 2048) -> RotationResult:
    """Make a new key pair the signing key; publish it with up to ``keep - 1`` old keys."""
    if keep < 2:
        raise ValueError("keep at least 2 keys, or tokens of the previous key stop verifying")
    files.private.parent.mkdir(parents=True, exist_ok=True)
    with _locked(files.private.parent / ".rotate.lock"):
        current = _current_private(files.private)
        published = _published(files)
        pair = generate_key_pair(bits)
        new_public = load_rsa_public_key(pair.public_pem)
        keys: dict[str, rsa.RSAPublicKey] = {pair.kid: new_public}
        previous_kid = None
        if current is not None:
            previous_kid = kid_of(current.public_key())
            keys[previous_kid] = current.public_key()
        for kid, key in published.items():
            keys.setdefault(kid, key)
        kept = dict(list(keys.items())[:keep])
        retired = tuple(kid for kid in keys if kid not in kept)

        if current is not None and previous_kid is not None:
            write_atomically(files.backup(previous_kid), files.private.read_bytes(), mode=0o600)
        # Publish first, then sign with the new key.
        write_atomically(files.jwks, dump_jwks(kept))
        write_atomically(files.public, b"".join(_pem(key) for key in kept.values()))
        write_atomically(files.private, pair.private_pem, mode=0o600)
        for kid in retired:
            files.backup(kid).unlink(missing_ok=True)
    return RotationResult(
        kid=pair.kid, previous_kid=previous_kid, published=tuple(kept), retired=retired
    )


def list_keys(files: KeyFiles) -> list[PublishedKey]:
    """The published keys, newest first, marking the one the private key signs with."""
    current = _current_private(files.private)
    signing = kid_of(current.public_key()) if current is not None else None
    return [PublishedKey(kid=kid, signing=kid == signing) for kid in _published(files)]


def _published(files: KeyFiles) -> dict[str, rsa.RSAPublicKey]:
    """JWKS keys (their order), then PEM-only keys; a missing file is just empty."""
    keys: dict[str, rsa.RSAPublicKey] = {}
    if files.jwks.is_file():
        keys.update(parse_jwks(files.jwks.read_bytes()))
    if files.public.is_file():
        for kid, key in load_pem_public_keys(files.public.read_bytes()).items():
            keys.setdefault(kid, key)
    return keys


def _current_private(path: Path) -> rsa.RSAPrivateKey | None:
    return load_rsa_private_key(path.read_bytes()) if path.is_file() else None


def _pem(key: rsa.RSAPublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One rotation at a time per key directory."""
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
