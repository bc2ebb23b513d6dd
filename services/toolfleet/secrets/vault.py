"""Secrets from HashiCorp Vault's KV version 2 engine, through ``hvac``.

The credentials of one connection are the keys of one KV v2 secret at
``{mount}/{tenant}/{connection}`` (read as ``GET /v1/{mount}/data/{tenant}/{connection}``):
``vault kv put -mount=secret t_acme/github_main api_key=...``. The executor's Vault
token is read from ``TOOLFLEET_VAULT_TOKEN_FILE`` at each resolution, so an agent that
renews it in place (Vault Agent) needs no restart. ``hvac`` is synchronous: every call
runs in a worker thread, never on the event loop.

Vault answering 404 (or a deleted version) means "not available"; 401/403 means the
executor's token may not read the path; 5xx, 429 and connection trouble are transient
and retried by the consumer with backoff.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hvac
import hvac.exceptions

from toolfleet.secrets.store import (
    Secret,
    SecretAccessDenied,
    SecretNotFound,
    SecretStoreError,
    SecretStoreUnavailable,
    check_name,
    is_path_segment,
)

log = logging.getLogger(__name__)

_TRANSIENT = (
    hvac.exceptions.VaultDown,
    hvac.exceptions.InternalServerError,
    hvac.exceptions.BadGateway,
    hvac.exceptions.RateLimitExceeded,
)


class _Refused(Exception):
    """Vault answered 401 or 403 for the path."""


@dataclass(frozen=True, kw_only=True)
class VaultConfig:
    """Where the Vault KV v2 engine is and how to authenticate to it."""

    addr: str
    """Vault's URL, e.g. ``https://vault.internal:8200``."""
    token_file: Path
    """File holding the executor's Vault token (re-read at each resolution)."""
    mount: str = "secret"
    """Mount point of the KV v2 engine."""
    timeout_s: int = 5
    """HTTP timeout of one Vault request, in seconds."""
    verify: bool | str = True
    """TLS verification: True, False, or a CA bundle path."""


class VaultSecretStore:
    """Reads ``{mount}/{tenant}/{connection}`` and returns its key ``name``."""

    def __init__(self, config: VaultConfig) -> None:
        if not is_path_segment(config.mount.strip("/")):
            raise ValueError("TOOLFLEET_VAULT_MOUNT must be one path segment, like 'secret'")
        self._config = config

    async def resolve(self, tenant_id: str, connection_id: str, name: str) -> Secret:
        check_name(name)
        if not (is_path_segment(tenant_id) and is_path_segment(connection_id)):
            raise SecretNotFound(connection_id, name)
        try:
            data = await asyncio.to_thread(self._read, f"{tenant_id}/{connection_id}")
        except _Refused:
            raise SecretAccessDenied(connection_id, name) from None
        if data is None:
            raise SecretNotFound(connection_id, name)
        value = data.get(name)
        if value is None or value == "":
            raise SecretNotFound(connection_id, name)
        if not isinstance(value, str):
            raise SecretStoreError(f"credential {name!r} in Vault is not a string")
        return Secret(value)

    def _token(self) -> str:
        try:
            token = self._config.token_file.read_text().strip()
        except OSError:
            raise SecretStoreError("the Vault token file cannot be read") from None
        if not token:
            raise SecretStoreError("the Vault token file is empty")
        return token

    def _read(self, path: str) -> dict[str, Any] | None:
        config = self._config
        client = hvac.Client(
            url=config.addr, token=self._token(), timeout=config.timeout_s, verify=config.verify
        )
        try:
            response = client.secrets.kv.v2.read_secret_version(
                path=path, mount_point=config.mount.strip("/"), raise_on_deleted_version=True
            )
        except hvac.exceptions.InvalidPath:
            return None
        except (hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized):
            log.warning("Vault refused a secret read", extra={"vault_path": path})
            raise _Refused from None
        except _TRANSIENT as exc:
            raise SecretStoreUnavailable(f"Vault is unavailable: {type(exc).__name__}") from None
        except hvac.exceptions.VaultError as exc:
            raise SecretStoreError(f"Vault answered {type(exc).__name__}") from None
        except OSError as exc:  # requests' ConnectionError and Timeout are OSErrors
            raise SecretStoreUnavailable(f"Vault is unreachable: {type(exc).__name__}") from None
        finally:
            client.adapter.close()
        data = response.get("data", {}) if isinstance(response, dict) else {}
        secret = data.get("data") if isinstance(data, dict) else None
        return secret if isinstance(secret, dict) else None
