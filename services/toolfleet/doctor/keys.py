"""``keys``: the key files a fleet needs are there, usable, and kept by their owner.

Who needs which (:data:`toolfleet.worker.KEYED`, :func:`toolfleet.worker.require_keys`):
policy, the executor, the validator, status and the API refuse to start without the
grant key; policy and the API verify capability tokens (JWKS file or URL, else the PEM
public key); the private key signs tokens and belongs only where they are issued
(``toolfleet token issue``), so its absence is fine. Secrets (the grant key, the private
key, the Kafka client key and SASL password) must be readable by their owner only, and
that owner is the user running the check; public files must not be writable by others:
whoever can rewrite a verification key decides which tokens are accepted.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from toolfleet.auth.grants import GrantKeyError, load_grant_keys
from toolfleet.auth.keyring import FileKeySource, KeySourceError
from toolfleet.auth.keys import key_id, load_rsa_private_key, public_pem_of
from toolfleet.doctor.results import CheckResult, CheckStatus, Problem, result_of
from toolfleet.settings import FleetSettings

NAME = "keys"
_FAIL = CheckStatus.FAIL


@dataclass(frozen=True, kw_only=True)
class KeyFile:
    """One configured file the check looks at."""

    label: str
    """What it is, as the output names it (``grant key``)."""
    path: Path
    secret: bool
    """Owner-only (``0600``/``0400``, owned by the checking user), else not writable by
    group or others."""


def configured_files(settings: FleetSettings) -> list[KeyFile]:
    """Every key, certificate or password file the settings name."""
    named = [
        ("grant key", settings.grant_key_file, True),
        ("JWT private key", settings.jwt_private_key_file, True),
        ("JWT public key", settings.jwt_public_key_file, False),
        ("JWKS file", settings.jwks_file, False),
        ("Kafka client key", settings.kafka_ssl_key_file, True),
        ("Kafka SASL password file", settings.kafka_sasl_password_file, True),
        ("Kafka client certificate", settings.kafka_ssl_cert_file, False),
        ("Kafka CA file", settings.kafka_ssl_ca_file, False),
    ]
    return [
        KeyFile(label=label, path=path.expanduser(), secret=secret)
        for label, path, secret in named
        if path is not None
    ]


def _secret_volume(info: os.stat_result, mode: int, *, groups: frozenset[int]) -> bool:
    """A file as a Kubernetes Secret volume mounts it: owned by root, readable by the
    pod's ``fsGroup`` (a group of this process) and by nobody else (``0440``/``0400``)."""
    return info.st_uid == 0 and info.st_gid in groups and not mode & 0o037


def file_problems(
    key: KeyFile, *, uid: int, groups: frozenset[int] = frozenset()
) -> tuple[list[Problem], bool]:
    """What is wrong with one file's presence, owner and mode, and whether its content
    can be read (and so checked) at all. ``groups``: the process's groups, for a secret
    mounted root-owned and group-readable (a Kubernetes Secret volume)."""
    where = f"{key.label} {key.path}"
    try:
        info = key.path.stat()
    except FileNotFoundError:
        return [(_FAIL, f"{where}: no such file")], False
    except OSError as exc:
        return [(_FAIL, f"{where}: cannot stat it ({exc.strerror or type(exc).__name__})")], False
    if not stat.S_ISREG(info.st_mode):
        return [(_FAIL, f"{where}: not a regular file")], False
    mode = stat.S_IMODE(info.st_mode)
    found: list[Problem] = []
    if key.secret and not (info.st_uid != uid and _secret_volume(info, mode, groups=groups)):
        if info.st_uid != uid:
            found.append((_FAIL, f"{where}: owned by uid {info.st_uid}, not by this user ({uid})"))
        if mode & 0o077:
            found.append((_FAIL, f"{where}: mode {mode:04o}, want 0600 or 0400 (owner only)"))
    if not key.secret and mode & 0o022:
        found.append((_FAIL, f"{where}: mode {mode:04o}, writable by group or others"))
    readable = os.access(key.path, os.R_OK)
    if not readable:
        found.append((_FAIL, f"{where}: not readable by this user"))
    return found, readable


def _content_problems(settings: FleetSettings, readable: set[Path]) -> list[Problem]:
    """The keys in the files parse, and the private key's public half verifies tokens.
    Messages name files and kinds, never key material."""
    found: list[Problem] = []
    grant = settings.grant_key_file
    if grant is not None and grant.expanduser() in readable:
        try:
            load_grant_keys(grant.expanduser())
        except GrantKeyError as exc:
            found.append((_FAIL, exc.message))
    verification: set[str] | None = None
    configured: list[tuple[Path | None, Literal["jwks", "pem"]]] = [
        (settings.jwks_file, "jwks"),  # wins, as in TokenVerifier.from_settings
        (settings.jwt_public_key_file, "pem"),
    ]
    sources = [
        FileKeySource(path=path.expanduser(), format=fmt)
        for path, fmt in configured
        if path is not None and path.expanduser() in readable
    ]
    for source in sources:
        try:
            kids = set(source.read())
        except KeySourceError as exc:
            found.append((_FAIL, exc.message))
            continue
        if verification is None:
            verification = kids
    private = settings.jwt_private_key_file
    if private is not None and private.expanduser() in readable:
        try:
            pem = private.expanduser().read_bytes()
            load_rsa_private_key(pem)
            kid = key_id(public_pem_of(pem))
        except (OSError, ValueError, TypeError):
            found.append((_FAIL, f"JWT private key {private}: not an unencrypted PEM RSA key"))
        else:
            if verification is not None and kid not in verification:
                found.append(
                    (
                        _FAIL,
                        f"JWT private key {private}: its public key is not among the "
                        "verification keys, so tokens it signs are refused",
                    )
                )
    return found


def check_keys(
    settings: FleetSettings, *, uid: int | None = None, groups: frozenset[int] | None = None
) -> CheckResult:
    """The ``keys`` check (``uid``, ``groups``: whose files they should be; default: this
    process's user and groups)."""
    owner = os.geteuid() if uid is None else uid
    if groups is None:  # a given uid is someone else: their groups are not this process's
        groups = frozenset({os.getegid(), *os.getgroups()}) if uid is None else frozenset()
    files = configured_files(settings)
    problems: list[Problem] = []
    readable: set[Path] = set()
    for key in files:
        found, can_read = file_problems(key, uid=owner, groups=groups)
        problems += found
        if can_read:
            readable.add(key.path)
    if settings.grant_key_file is None:
        problems.append(
            (
                _FAIL,
                "TOOLFLEET_GRANT_KEY_FILE is not set: policy, the executor, the validator, "
                "status and the API refuse to start (`toolfleet keys grant PATH` makes one)",
            )
        )
    if (
        settings.jwks_file is None
        and settings.jwks_url is None
        and settings.jwt_public_key_file is None
    ):
        problems.append(
            (
                _FAIL,
                "no token verification key (TOOLFLEET_JWKS_FILE, TOOLFLEET_JWKS_URL or "
                "TOOLFLEET_JWT_PUBLIC_KEY_FILE): policy denies every call, the API does not start",
            )
        )
    problems += _content_problems(settings, readable)
    labels = [key.label for key in files]
    if settings.jwks_url is not None:
        labels.append("JWKS URL (not fetched)")
    if settings.jwt_private_key_file is None:
        labels.append("no JWT private key (tokens are issued elsewhere)")
    return result_of(NAME, problems, ok=", ".join(labels) + ": present, owner-only where secret")
