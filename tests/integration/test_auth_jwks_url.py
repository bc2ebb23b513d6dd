"""Verification keys fetched from a JWKS URL (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from toolfleet.auth.jwks import dump_jwks
from toolfleet.auth.keyring import KeyRing, KeySourceError, UrlJwksSource
from toolfleet.auth.keys import KeyPair, generate_key_pair, load_rsa_public_key
from toolfleet.auth.tokens import TokenIssuer, TokenVerifier, open_verifier
from toolfleet.errors import PermissionDenied
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration
ISS, AUD = "iss-test", "aud-test"


@dataclass
class JwksServer:
    url: str
    body: bytes = b'{"keys": []}'
    status: int = 200
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, *pairs: KeyPair) -> None:
        self.body = dump_jwks({p.kid: load_rsa_public_key(p.public_pem) for p in pairs})


@pytest.fixture
def jwks_server() -> Iterator[JwksServer]:
    state = JwksServer(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with state.lock:
                state.requests += 1
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _token(pair: KeyPair, tenant: str = "t1") -> str:
    issuer = TokenIssuer(pair.private_pem, issuer=ISS, audience=AUD)
    return issuer.issue(tenant_id=tenant, agent_did="did:agent:a", tool_id="*")


async def test_open_verifier_loads_the_url_and_fails_fast(jwks_server: JwksServer) -> None:
    old = generate_key_pair()
    jwks_server.publish(old)
    settings = FleetSettings(jwks_url=jwks_server.url, jwt_issuer=ISS, jwt_audience=AUD)
    verifier = await open_verifier(settings)
    assert verifier is not None
    assert verifier.verify(_token(old)).tenant_id == "t1"

    jwks_server.status = 500
    with pytest.raises(KeySourceError, match="HTTP 500") as caught:
        await open_verifier(settings)
    assert "127.0.0.1" in caught.value.message


async def test_rotation_is_picked_up_on_unknown_kid_at_most_every_30s(
    jwks_server: JwksServer,
) -> None:
    old, new = generate_key_pair(), generate_key_pair()
    jwks_server.publish(old)
    clock = FakeClock()
    ring = KeyRing(source=UrlJwksSource(url=jwks_server.url), refresh_s=300, clock=clock)
    verifier = TokenVerifier(ring, issuer=ISS, audience=AUD)
    assert await verifier.refresh(strict=True) is True
    old_token = _token(old)
    assert (await verifier.verify_fresh(old_token)).tenant_id == "t1"
    assert jwks_server.requests == 1  # known kid, not due: no fetch

    # A forged kid costs one fetch, then the throttle holds for 30 s.
    forged = _token(generate_key_pair())
    for _ in range(5):
        with pytest.raises(PermissionDenied, match="unknown key"):
            await verifier.verify_fresh(forged)
    assert jwks_server.requests == 2

    jwks_server.publish(new, old)  # rollover: both published
    new_token = _token(new, "t2")
    with pytest.raises(PermissionDenied, match="unknown key"):
        await verifier.verify_fresh(new_token)
    clock.now += 31
    assert (await verifier.verify_fresh(new_token)).tenant_id == "t2"
    assert verifier.verify(old_token).tenant_id == "t1"
    assert jwks_server.requests == 3

    jwks_server.publish(new)  # old key withdrawn; seen on the periodic refresh
    clock.now += 300
    assert (await verifier.verify_fresh(new_token)).tenant_id == "t2"
    with pytest.raises(PermissionDenied, match="unknown key"):
        verifier.verify(old_token)


async def test_a_failed_fetch_keeps_the_keys(jwks_server: JwksServer) -> None:
    pair = generate_key_pair()
    jwks_server.publish(pair)
    clock = FakeClock()
    ring = KeyRing(source=UrlJwksSource(url=jwks_server.url), refresh_s=10, clock=clock)
    await ring.refresh(strict=True)
    for body in (b"not json", b'{"keys": []}', b"x" * 1_100_000):
        jwks_server.body = body
        clock.now += 11
        assert await ring.refresh() is False
        assert ring.kids == (pair.kid,)
    unreachable = KeyRing(source=UrlJwksSource(url="http://127.0.0.1:9/jwks", timeout_s=1))
    with pytest.raises(KeySourceError, match="cannot fetch"):
        await unreachable.refresh(strict=True)


def test_jwks_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="TOOLFLEET_JWKS_URL"):
        FleetSettings(jwks_url="file:///etc/jwks.json")
