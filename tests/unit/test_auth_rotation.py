"""JWKS documents, key rings, operator key rotation and the ``keys``/``token`` commands."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from typer.testing import CliRunner

from toolfleet.auth.jwks import JwksError, dump_jwks, parse_jwks, public_jwk
from toolfleet.auth.keyring import FileKeySource, KeyRing, KeySourceError
from toolfleet.auth.keys import generate_key_pair, load_rsa_public_key
from toolfleet.auth.rotation import KeyFiles, list_keys, rotate_keys
from toolfleet.auth.tokens import TokenIssuer, TokenVerifier
from toolfleet.cli.main import app
from toolfleet.errors import PermissionDenied
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit
ISS, AUD = "iss-test", "aud-test"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def key_dir(tmp_path: Path) -> KeyFiles:
    pair = generate_key_pair()
    private, public = tmp_path / "jwt_private.pem", tmp_path / "jwt_public.pem"
    private.write_bytes(pair.private_pem)
    public.write_bytes(pair.public_pem)
    return KeyFiles(private=private, public=public, jwks=tmp_path / "jwks.json")


def _issue(files: KeyFiles, tenant: str = "t1") -> str:
    issuer = TokenIssuer.from_files(files.private, files.public, issuer=ISS, audience=AUD)
    return issuer.issue(tenant_id=tenant, agent_did="did:agent:a", tool_id="*")


def _jwks_verifier(files: KeyFiles) -> TokenVerifier:
    ring = KeyRing.from_file(FileKeySource(path=files.jwks, format="jwks"))
    return TokenVerifier(ring, issuer=ISS, audience=AUD)


# --- JWKS ------------------------------------------------------------------------------


def test_jwks_round_trip_keeps_kids_and_order() -> None:
    pairs = [generate_key_pair(), generate_key_pair()]
    keys = {p.kid: load_rsa_public_key(p.public_pem) for p in pairs}
    doc = json.loads(dump_jwks(keys))
    assert [k["kid"] for k in doc["keys"]] == [p.kid for p in pairs]
    assert all(k["kty"] == "RSA" and k["use"] == "sig" and k["alg"] == "RS256" for k in doc["keys"])
    parsed = parse_jwks(dump_jwks(keys))
    assert list(parsed) == [p.kid for p in pairs]
    assert parsed[pairs[0].kid].public_numbers() == keys[pairs[0].kid].public_numbers()


def test_jwks_skips_other_keys_and_rejects_bad_ones() -> None:
    good = public_jwk(generate_key_pair().public_pem)
    enc = {**public_jwk(generate_key_pair().public_pem), "use": "enc"}
    ec = {"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA", "kid": "ec"}
    ps = {**public_jwk(generate_key_pair().public_pem), "alg": "PS256", "kid": "ps"}
    assert list(parse_jwks(json.dumps({"keys": [good, enc, ec, ps]}))) == [good["kid"]]
    for bad in (
        b"not json",
        b"[]",
        b'{"keys": {}}',
        json.dumps({"keys": [{"kty": "RSA", "kid": "x", "n": "!!", "e": "AQAB"}]}).encode(),
        json.dumps({"keys": [{"kty": "RSA", "kid": "x", "e": "AQAB"}]}).encode(),
    ):
        with pytest.raises(JwksError):
            parse_jwks(bad)


def test_jwks_refuses_short_rsa_keys() -> None:
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()  # noqa: S505 - the point of the test
    with pytest.raises(JwksError, match="2048"):
        parse_jwks(json.dumps({"keys": [public_jwk(small)]}))


# --- Key ring refresh ------------------------------------------------------------------


async def test_file_ring_reloads_on_unknown_kid_at_most_every_30s(key_dir: KeyFiles) -> None:
    first = _issue(key_dir)
    rotate_keys(key_dir)  # writes the JWKS with the new and the old key
    old_only = dict(parse_jwks(key_dir.jwks.read_bytes()).items())
    new_kid, old_kid = list(old_only)
    key_dir.jwks.write_bytes(dump_jwks({old_kid: old_only[old_kid]}))

    clock = FakeClock()
    ring = KeyRing.from_file(FileKeySource(path=key_dir.jwks, format="jwks"), clock=clock)
    verifier = TokenVerifier(ring, issuer=ISS, audience=AUD)
    assert verifier.verify(first).tenant_id == "t1"
    second = _issue(key_dir, "t2")
    with pytest.raises(PermissionDenied, match="unknown key"):
        verifier.verify(second)

    # The new key is published only now; the first unknown-kid refresh saw nothing new.
    assert await ring.refresh_for_kid("forged") is True
    key_dir.jwks.write_bytes(dump_jwks(old_only))
    with pytest.raises(PermissionDenied, match="unknown key"):
        await verifier.verify_fresh(second)  # throttled: within 30 s of the last try
    clock.now += 31
    assert (await verifier.verify_fresh(second)).tenant_id == "t2"
    assert set(ring.kids) == {new_kid, old_kid}


async def test_periodic_refresh_and_failed_refresh_keeps_keys(key_dir: KeyFiles) -> None:
    clock = FakeClock()
    source = FileKeySource(path=key_dir.public, format="pem")
    ring = KeyRing.from_file(source, refresh_s=300, clock=clock)
    token = _issue(key_dir)
    verifier = TokenVerifier(ring, issuer=ISS, audience=AUD)
    assert not ring.refresh_due
    clock.now += 301
    assert ring.refresh_due
    key_dir.public.write_text("garbage")
    assert await ring.refresh() is False  # logged, previous keys kept
    assert verifier.verify(token).tenant_id == "t1"
    with pytest.raises(KeySourceError, match="unusable"):
        await ring.refresh(force=True, strict=True)
    key_dir.public.write_text("")
    with pytest.raises(KeySourceError, match="no RS256"):
        await ring.refresh(force=True, strict=True)


def test_from_settings_prefers_jwks_file_then_pem(key_dir: KeyFiles) -> None:
    token = _issue(key_dir)
    assert TokenVerifier.from_settings(FleetSettings(jwt_issuer=ISS, jwt_audience=AUD)) is None
    pem = TokenVerifier.from_settings(
        FleetSettings(jwt_public_key_file=key_dir.public, jwt_issuer=ISS, jwt_audience=AUD)
    )
    assert pem is not None
    assert pem.verify(token).tenant_id == "t1"
    with pytest.raises(KeySourceError, match="cannot read"):
        TokenVerifier.from_settings(
            FleetSettings(
                jwks_file=key_dir.jwks,
                jwt_public_key_file=key_dir.public,
                jwt_issuer=ISS,
                jwt_audience=AUD,
            )
        )
    rotate_keys(key_dir)
    jwks = TokenVerifier.from_settings(
        FleetSettings(jwks_file=key_dir.jwks, jwt_issuer=ISS, jwt_audience=AUD)
    )
    assert jwks is not None
    assert jwks.verify(token).tenant_id == "t1"


# --- Rotation --------------------------------------------------------------------------


def test_rotation_keeps_old_tokens_valid_and_signs_with_the_new_key(key_dir: KeyFiles) -> None:
    old_token = _issue(key_dir)
    old_kid = list_keys(key_dir)[0].kid
    result = rotate_keys(key_dir)
    assert result.previous_kid == old_kid
    assert result.published == (result.kid, old_kid)
    new_token = _issue(key_dir, "t2")
    for verifier in (
        _jwks_verifier(key_dir),
        TokenVerifier.from_file(key_dir.public, issuer=ISS, audience=AUD),
    ):
        assert verifier.verify(old_token).tenant_id == "t1"
        assert verifier.verify(new_token).tenant_id == "t2"
    assert [(k.kid, k.signing) for k in list_keys(key_dir)] == [
        (result.kid, True),
        (old_kid, False),
    ]
    backup = key_dir.backup(old_kid)
    assert backup.name == f"jwt_private.{old_kid}.pem.old"
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_dir.private.stat().st_mode) == 0o600
    assert not list(key_dir.private.parent.glob(".*.tmp"))


def test_rotation_retires_keys_beyond_keep(key_dir: KeyFiles) -> None:
    first = _issue(key_dir)
    first_kid = list_keys(key_dir)[0].kid
    rotate_keys(key_dir)
    second = _issue(key_dir)
    rotate_keys(key_dir)
    result = rotate_keys(key_dir)  # 4 keys ever, 3 kept
    assert len(result.published) == 3
    assert result.retired == (first_kid,)
    assert not key_dir.backup(first_kid).exists()
    verifier = _jwks_verifier(key_dir)
    assert verifier.verify(second).tenant_id == "t1"
    with pytest.raises(PermissionDenied, match="unknown key"):
        verifier.verify(first)
    # Dropping the old keys by hand leaves only the new one valid.
    rotate_keys(key_dir, keep=2)
    rotate_keys(key_dir, keep=2)
    with pytest.raises(PermissionDenied, match="unknown key"):
        _jwks_verifier(key_dir).verify(second)
    assert _jwks_verifier(key_dir).verify(_issue(key_dir, "t9")).tenant_id == "t9"


def test_rotation_from_nothing_creates_the_first_key(tmp_path: Path) -> None:
    files = KeyFiles(
        private=tmp_path / "k" / "jwt_private.pem",
        public=tmp_path / "k" / "jwt_public.pem",
        jwks=tmp_path / "k" / "jwks.json",
    )
    result = rotate_keys(files)
    assert result.previous_kid is None
    assert result.published == (result.kid,)
    assert _jwks_verifier(files).verify(_issue(files)).tenant_id == "t1"
    with pytest.raises(ValueError, match="keep at least 2"):
        rotate_keys(files, keep=1)


# --- Commands --------------------------------------------------------------------------


def _env(files: KeyFiles) -> dict[str, str]:
    return {
        "TOOLFLEET_JWT_PRIVATE_KEY_FILE": str(files.private),
        "TOOLFLEET_JWT_PUBLIC_KEY_FILE": str(files.public),
        "TOOLFLEET_JWT_ISSUER": ISS,
        "TOOLFLEET_JWT_AUDIENCE": AUD,
    }


def test_cli_rotate_then_issue_verifies_with_the_jwks(key_dir: KeyFiles) -> None:
    runner, env = CliRunner(), _env(key_dir)
    issue = ["token", "issue", "--tenant", "t1", "--agent", "did:a", "--tool", "core__*"]
    old = runner.invoke(app, issue, env=env)
    assert old.exit_code == 0, old.output
    rotated = runner.invoke(app, ["keys", "rotate", "--json"], env=env)
    assert rotated.exit_code == 0, rotated.output
    info = json.loads(rotated.stdout)
    assert info["jwks_file"] == str(key_dir.jwks)
    assert len(info["published"]) == 2

    new = runner.invoke(
        app, [*issue, "--json", "--connection", "c1", "--connection", "c2"], env=env
    )
    assert new.exit_code == 0, new.output
    issued = json.loads(new.stdout)
    assert set(issued) == {"token", "jti", "exp"}
    verifier = _jwks_verifier(key_dir)
    cap = verifier.verify(issued["token"])
    assert (cap.jti, cap.expires_at, cap.connections) == (
        issued["jti"],
        issued["exp"],
        ("c1", "c2"),
    )
    assert verifier.verify(old.stdout.strip()).tenant_id == "t1"

    listed = runner.invoke(app, ["keys", "list", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == [
        {"kid": info["kid"], "signing": True},
        {"kid": info["previous_kid"], "signing": False},
    ]
    human = runner.invoke(app, ["keys", "list"], env=env)
    assert human.stdout.splitlines()[0] == f"* {info['kid']}"


def test_cli_keys_without_configuration_is_a_friendly_error() -> None:
    result = CliRunner().invoke(app, ["keys", "rotate"], env={})
    assert result.exit_code == 1
    assert "TOOLFLEET_JWT_PRIVATE_KEY_FILE" in result.output


def test_cli_rotate_refuses_a_broken_jwks_and_changes_nothing(key_dir: KeyFiles) -> None:
    key_dir.jwks.write_text("{broken")
    before = key_dir.private.read_bytes()
    result = CliRunner().invoke(app, ["keys", "rotate"], env=_env(key_dir))
    assert result.exit_code == 1
    assert "nothing was changed" in result.output
    assert key_dir.private.read_bytes() == before


def test_cli_token_revoke_rejects_a_malformed_jti() -> None:
    result = CliRunner().invoke(app, ["token", "revoke", "has space"], env={})
    assert result.exit_code == 1
    assert "jti" in result.output


async def test_a_verified_token_stops_verifying_once_its_key_leaves_the_ring(
    key_dir: KeyFiles,
) -> None:
    rotate_keys(key_dir)  # the JWKS holds the new and the old key; tokens use the new
    both = dict(parse_jwks(key_dir.jwks.read_bytes()).items())
    _new, old_kid = list(both)
    clock = FakeClock()
    ring = KeyRing.from_file(
        FileKeySource(path=key_dir.jwks, format="jwks"), refresh_s=300, clock=clock
    )
    verifier = TokenVerifier(ring, issuer=ISS, audience=AUD)
    token = _issue(key_dir)
    assert (await verifier.verify_fresh(token)).tenant_id == "t1"
    assert (await verifier.verify_fresh(token)).tenant_id == "t1"  # remembered

    key_dir.jwks.write_bytes(dump_jwks({old_kid: both[old_kid]}))  # its key withdrawn
    clock.now += 301  # the periodic refresh is due
    with pytest.raises(PermissionDenied, match="unknown key"):
        await verifier.verify_fresh(token)
