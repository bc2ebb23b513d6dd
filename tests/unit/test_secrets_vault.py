"""The Vault backend against a tiny fake Vault (KV v2 read endpoint) on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import free_port
from toolfleet.secrets.store import (
    SecretAccessDenied,
    SecretNotFound,
    SecretStoreError,
    SecretStoreUnavailable,
)
from toolfleet.secrets.vault import VaultConfig, VaultSecretStore

pytestmark = pytest.mark.unit

TOKEN = "hvs.test-token"


@dataclass
class FakeVault:
    """KV v2 data by ``mount/path``; records the requests it saw."""

    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)
    token: str = TOKEN
    status_override: int | None = None
    seen: list[tuple[str, str | None]] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        vault = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                vault.seen.append((self.path, self.headers.get("X-Vault-Token")))
                if vault.status_override is not None:
                    return self._send(vault.status_override, {"errors": ["down"]})
                if self.headers.get("X-Vault-Token") != vault.token:
                    return self._send(403, {"errors": ["permission denied"]})
                prefix = "/v1/"
                mount, _, rest = self.path.removeprefix(prefix).partition("/data/")
                data = vault.secrets.get(f"{mount}/{rest}")
                if not self.path.startswith(prefix) or data is None:
                    return self._send(404, {"errors": []})
                return self._send(
                    200,
                    {
                        "request_id": "r",
                        "data": {"data": data, "metadata": {"version": 1, "deletion_time": ""}},
                    },
                )

            def _send(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def vault() -> Iterator[tuple[FakeVault, str]]:
    fake = FakeVault()
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), fake.handler())
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def store_for(
    addr: str, tmp_path: Path, token: str = TOKEN, mount: str = "secret"
) -> VaultSecretStore:
    token_file = tmp_path / "vault-token"
    token_file.write_text(token + "\n")
    return VaultSecretStore(VaultConfig(addr=addr, token_file=token_file, mount=mount, timeout_s=2))


async def test_reads_the_key_of_the_connection_secret(
    vault: tuple[FakeVault, str], tmp_path: Path
) -> None:
    fake, addr = vault
    fake.secrets["kv/t_acme/gh_main"] = {"api_key": "ghp_value", "other": "x"}
    secret = await store_for(addr, tmp_path, mount="kv").resolve("t_acme", "gh_main", "api_key")
    assert secret.reveal() == "ghp_value"
    assert fake.seen == [("/v1/kv/data/t_acme/gh_main", TOKEN)]


async def test_token_file_is_reread_each_time(vault: tuple[FakeVault, str], tmp_path: Path) -> None:
    fake, addr = vault
    fake.secrets["secret/t1/c"] = {"api_key": "v"}
    store = store_for(addr, tmp_path)
    await store.resolve("t1", "c", "api_key")
    fake.token = "hvs.rotated"
    (tmp_path / "vault-token").write_text("hvs.rotated")
    assert (await store.resolve("t1", "c", "api_key")).reveal() == "v"


async def test_missing_path_or_key_is_not_found(
    vault: tuple[FakeVault, str], tmp_path: Path
) -> None:
    fake, addr = vault
    fake.secrets["secret/t1/c"] = {"api_key": "v"}
    store = store_for(addr, tmp_path)
    with pytest.raises(SecretNotFound):
        await store.resolve("t1", "missing", "api_key")
    with pytest.raises(SecretNotFound) as caught:
        await store.resolve("t1", "c", "other_key")
    assert "secret/" not in caught.value.message


async def test_forbidden_is_access_denied(vault: tuple[FakeVault, str], tmp_path: Path) -> None:
    fake, addr = vault
    fake.secrets["secret/t1/c"] = {"api_key": "v"}
    with pytest.raises(SecretAccessDenied) as caught:
        await store_for(addr, tmp_path, token="hvs.wrong").resolve("t1", "c", "api_key")
    assert caught.value.code == "permission_denied"
    assert "hvs." not in caught.value.message


@pytest.mark.parametrize("status", [500, 502, 503, 429])
async def test_server_trouble_is_transient(
    vault: tuple[FakeVault, str], tmp_path: Path, status: int
) -> None:
    fake, addr = vault
    fake.status_override = status
    with pytest.raises(SecretStoreUnavailable):
        await store_for(addr, tmp_path).resolve("t1", "c", "api_key")


async def test_unreachable_vault_is_transient(tmp_path: Path) -> None:
    store = store_for(f"http://127.0.0.1:{free_port()}", tmp_path)
    with pytest.raises(SecretStoreUnavailable) as caught:
        await store.resolve("t1", "c", "api_key")
    assert isinstance(caught.value, ConnectionError)  # the consumer retries it with backoff


async def test_non_string_value_is_a_store_error(
    vault: tuple[FakeVault, str], tmp_path: Path
) -> None:
    fake, addr = vault
    fake.secrets["secret/t1/c"] = {"api_key": {"nested": "v"}}
    with pytest.raises(SecretStoreError, match="not a string"):
        await store_for(addr, tmp_path).resolve("t1", "c", "api_key")


@pytest.mark.parametrize("connection", ["..", "../t2/c", "a/b", "c?x=1", "c#frag", "c%2f..", ""])
async def test_ids_that_change_the_path_never_reach_vault(
    vault: tuple[FakeVault, str], tmp_path: Path, connection: str
) -> None:
    fake, addr = vault
    fake.secrets["secret/t2/c"] = {"api_key": "other-tenant"}
    with pytest.raises(SecretNotFound):
        await store_for(addr, tmp_path).resolve("t1", connection, "api_key")
    assert fake.seen == []


async def test_unreadable_token_file_is_a_store_error(
    vault: tuple[FakeVault, str], tmp_path: Path
) -> None:
    _, addr = vault
    store = VaultSecretStore(VaultConfig(addr=addr, token_file=tmp_path / "absent"))
    with pytest.raises(SecretStoreError, match="token file"):
        await store.resolve("t1", "c", "api_key")


def test_mount_must_be_one_segment(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one path segment"):
        VaultSecretStore(VaultConfig(addr="http://x", token_file=tmp_path / "t", mount="a/../b"))
