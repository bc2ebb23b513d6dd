"""``toolfleet doctor``'s ``keys`` check: present, usable, owner-only, and never shown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolfleet.auth.grants import ensure_grant_key
from toolfleet.auth.keys import generate_key_pair
from toolfleet.doctor.keys import check_keys
from toolfleet.doctor.results import CheckStatus
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def pem_pair() -> tuple[bytes, bytes]:
    pair = generate_key_pair()
    return pair.private_pem, pair.public_pem


@pytest.fixture
def fleet_keys(tmp_path: Path, pem_pair: tuple[bytes, bytes]) -> FleetSettings:
    """Keys as ``toolfleet dev`` writes them: secrets 0600, the public key 0644."""
    grant = tmp_path / "grant.key"
    ensure_grant_key(grant)
    private, public = tmp_path / "jwt_private.pem", tmp_path / "jwt_public.pem"
    private.write_bytes(pem_pair[0])
    private.chmod(0o600)
    public.write_bytes(pem_pair[1])
    public.chmod(0o644)
    return FleetSettings(
        grant_key_file=grant, jwt_private_key_file=private, jwt_public_key_file=public
    )


def test_keys_as_the_dev_stack_writes_them_pass(fleet_keys: FleetSettings) -> None:
    result = check_keys(fleet_keys)
    assert result.status is CheckStatus.OK, result.detail
    assert result.detail.startswith("grant key, JWT private key, JWT public key")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_secret_readable_beyond_its_owner_fails(fleet_keys: FleetSettings, mode: int) -> None:
    assert fleet_keys.grant_key_file is not None
    fleet_keys.grant_key_file.chmod(mode)
    result = check_keys(fleet_keys)
    assert result.status is CheckStatus.FAIL
    assert f"grant key {fleet_keys.grant_key_file}: mode {mode:04o}, want 0600 or 0400" in (
        result.detail
    )


def test_read_only_secrets_pass(fleet_keys: FleetSettings) -> None:
    assert fleet_keys.grant_key_file is not None
    assert fleet_keys.jwt_private_key_file is not None
    fleet_keys.grant_key_file.chmod(0o400)
    fleet_keys.jwt_private_key_file.chmod(0o400)
    assert check_keys(fleet_keys).status is CheckStatus.OK


def test_a_secret_of_another_user_fails(fleet_keys: FleetSettings) -> None:
    result = check_keys(fleet_keys, uid=os.geteuid() + 1)
    assert result.status is CheckStatus.FAIL
    assert f"owned by uid {os.geteuid()}, not by this user ({os.geteuid() + 1})" in result.detail
    assert "JWT public key" not in result.detail  # public files may belong to anyone


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own a file as root")
def test_a_secret_volume_readable_by_the_pods_group_only_passes(fleet_keys: FleetSettings) -> None:
    """Kubernetes mounts a Secret owned by root, group the pod's fsGroup, mode 0440."""
    assert fleet_keys.grant_key_file is not None
    assert fleet_keys.jwt_private_key_file is not None
    gid = fleet_keys.grant_key_file.stat().st_gid
    pod_user = 10001
    for secret in (fleet_keys.grant_key_file, fleet_keys.jwt_private_key_file):
        secret.chmod(0o440)
    assert check_keys(fleet_keys, uid=pod_user, groups=frozenset({gid})).status is CheckStatus.OK
    # Not in that group, or the file readable by others, or writable by the group: FAIL.
    assert check_keys(fleet_keys, uid=pod_user, groups=frozenset()).status is CheckStatus.FAIL
    fleet_keys.grant_key_file.chmod(0o444)
    assert check_keys(fleet_keys, uid=pod_user, groups=frozenset({gid})).status is CheckStatus.FAIL
    fleet_keys.grant_key_file.chmod(0o460)
    assert check_keys(fleet_keys, uid=pod_user, groups=frozenset({gid})).status is CheckStatus.FAIL


def test_a_verification_key_others_can_rewrite_fails(fleet_keys: FleetSettings) -> None:
    assert fleet_keys.jwt_public_key_file is not None
    fleet_keys.jwt_public_key_file.chmod(0o666)
    result = check_keys(fleet_keys)
    assert result.status is CheckStatus.FAIL
    assert "mode 0666, writable by group or others" in result.detail


def test_missing_keys_fail_with_how_to_fix(fleet_keys: FleetSettings, tmp_path: Path) -> None:
    unset = FleetSettings(jwt_public_key_file=fleet_keys.jwt_public_key_file)
    result = check_keys(unset)
    assert result.status is CheckStatus.FAIL
    assert "TOOLFLEET_GRANT_KEY_FILE is not set" in result.detail
    assert "toolfleet keys grant PATH" in result.detail
    nowhere = fleet_keys.model_copy(update={"grant_key_file": tmp_path / "absent.key"})
    assert f"grant key {tmp_path / 'absent.key'}: no such file" in check_keys(nowhere).detail


def test_no_verification_key_fails(fleet_keys: FleetSettings) -> None:
    result = check_keys(FleetSettings(grant_key_file=fleet_keys.grant_key_file))
    assert result.status is CheckStatus.FAIL
    assert "no token verification key" in result.detail
    assert "no JWT private key (tokens are issued elsewhere)" not in result.detail


def test_a_private_key_whose_tokens_nobody_accepts_fails(
    fleet_keys: FleetSettings, tmp_path: Path
) -> None:
    other = tmp_path / "other_public.pem"
    other.write_bytes(generate_key_pair().public_pem)
    result = check_keys(fleet_keys.model_copy(update={"jwt_public_key_file": other}))
    assert result.status is CheckStatus.FAIL
    assert "its public key is not among the verification keys" in result.detail


def test_no_private_key_is_fine_where_tokens_are_not_issued(fleet_keys: FleetSettings) -> None:
    result = check_keys(fleet_keys.model_copy(update={"jwt_private_key_file": None}))
    assert result.status is CheckStatus.OK
    assert "no JWT private key (tokens are issued elsewhere)" in result.detail


def test_unusable_keys_fail_without_showing_a_byte_of_them(
    fleet_keys: FleetSettings, pem_pair: tuple[bytes, bytes], tmp_path: Path
) -> None:
    assert fleet_keys.grant_key_file is not None
    assert fleet_keys.jwt_private_key_file is not None
    grant_secret = "short-but-secret-grant"
    fleet_keys.grant_key_file.write_text(grant_secret + "\n")
    fleet_keys.grant_key_file.chmod(0o644)
    # A private key that does not parse: its first line, minus a byte.
    garbled = pem_pair[0][:-40]
    fleet_keys.jwt_private_key_file.write_bytes(garbled)
    fleet_keys.jwt_private_key_file.chmod(0o644)
    password = tmp_path / "sasl.password"
    password.write_text("hunter2-sasl-password\n")
    password.chmod(0o644)
    settings = fleet_keys.model_copy(
        update={
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "SCRAM-SHA-512",
            "kafka_sasl_username": "fleet",
            "kafka_sasl_password_file": password,
        }
    )
    result = check_keys(settings)
    assert result.status is CheckStatus.FAIL
    assert "at least 32 bytes" in result.detail
    assert "not an unencrypted PEM RSA key" in result.detail
    assert f"Kafka SASL password file {password}: mode 0644" in result.detail
    for secret in (grant_secret, "hunter2", *garbled.decode().splitlines()[1:3]):
        assert secret not in result.detail
