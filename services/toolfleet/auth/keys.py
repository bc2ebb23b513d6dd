"""RSA signing keys: generation, PEM loading (several keys per file), key ids.

Key ids (``kid``) are derived from the public key itself, so the same key always has
the same id whether it comes from a PEM file or a JWKS document.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

MIN_RSA_BITS = 2048
"""Smaller RSA keys are refused wherever keys are loaded."""
_PEM_END = b"-----END PUBLIC KEY-----"


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM-encoded RSA key pair (PKCS#8 private, SubjectPublicKeyInfo public)."""

    private_pem: bytes
    public_pem: bytes

    @property
    def kid(self) -> str:
        """The key id of this pair."""
        return key_id(self.public_pem)


def generate_key_pair(bits: int = 2048) -> KeyPair:
    """A fresh RSA key pair."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    return KeyPair(
        private_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        public_pem=_public_pem(key.public_key()),
    )


def ensure_key_pair(private_path: Path, public_path: Path) -> None:
    """Create the pair once; later calls keep the existing keys."""
    if private_path.exists() and public_path.exists():
        return
    pair = generate_key_pair()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    private_path.write_bytes(pair.private_pem)
    private_path.chmod(0o600)
    public_path.write_bytes(pair.public_pem)


def key_id(public_pem: bytes) -> str:
    """A stable ``kid``: SHA-256 of the DER public key, base64url, 16 chars."""
    return kid_of(load_rsa_public_key(public_pem))


def kid_of(public: rsa.RSAPublicKey) -> str:
    """The ``kid`` of a loaded public key (same value as :func:`key_id`)."""
    der = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).decode()[:16]


def load_rsa_public_key(pem: bytes) -> rsa.RSAPublicKey:
    """One PEM public key; ``ValueError`` unless it is RSA of at least 2048 bits."""
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, rsa.RSAPublicKey):
        raise ValueError("not an RSA public key")
    if key.key_size < MIN_RSA_BITS:
        raise ValueError(f"RSA keys must have at least {MIN_RSA_BITS} bits")
    return key


def load_rsa_private_key(pem: bytes) -> rsa.RSAPrivateKey:
    """An unencrypted PEM RSA private key; ``ValueError`` otherwise."""
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("not an RSA private key")
    if key.key_size < MIN_RSA_BITS:
        raise ValueError(f"RSA keys must have at least {MIN_RSA_BITS} bits")
    return key


def public_pem_of(private_pem: bytes) -> bytes:
    """The PEM public key matching a PEM private key."""
    return _public_pem(load_rsa_private_key(private_pem).public_key())


def split_pems(data: bytes) -> list[bytes]:
    """The PEM public keys of a file that may hold several, in file order."""
    return [p.strip() + b"\n" + _PEM_END + b"\n" for p in data.split(_PEM_END) if p.strip()]


def load_pem_public_keys(data: bytes) -> dict[str, rsa.RSAPublicKey]:
    """Every RSA public key of a PEM file, by ``kid`` (``ValueError`` on a bad one)."""
    keys = {}
    for pem in split_pems(data):
        key = load_rsa_public_key(pem)
        keys[kid_of(key)] = key
    return keys


def write_atomically(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _public_pem(public: rsa.RSAPublicKey) -> bytes:
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
