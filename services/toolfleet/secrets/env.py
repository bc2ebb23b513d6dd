"""Secrets from environment variables: for development and single-host deployments.

``TOOLFLEET_SECRET__{TENANT}__{CONNECTION}__{NAME}`` holds the credential ``name`` of
connection ``connection`` for tenant ``tenant``. Each part is upper-cased, so tenant
``t_acme``, connection ``github_main`` and credential ``api_key`` read
``TOOLFLEET_SECRET__T_ACME__GITHUB_MAIN__API_KEY``.

Upper-casing folds case and variable names cannot carry ``- . :``, so a lossy mapping
would let two tenants share a variable. To stay one-to-one, this backend serves only
ids made of lower-case letters and digits joined by single underscores (``t_acme``,
``conn1``); any other tenant or connection id is refused as "not available" (use the
file or Vault backend for those). The variable is read at each resolution, so a
rotated value is picked up without a restart.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from toolfleet.secrets.store import Secret, SecretNotFound, check_name

PREFIX = "TOOLFLEET_SECRET__"
_ENV_SAFE = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)*$")


def variable_name(tenant_id: str, connection_id: str, name: str) -> str | None:
    """The variable holding this credential, or None if the ids cannot map one-to-one."""
    parts = (tenant_id, connection_id, name)
    if not all(len(p) <= 128 and _ENV_SAFE.fullmatch(p) for p in parts):
        return None
    return PREFIX + "__".join(p.upper() for p in parts)


class EnvSecretStore:
    """Reads ``TOOLFLEET_SECRET__{TENANT}__{CONNECTION}__{NAME}`` at resolution time."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ

    async def resolve(self, tenant_id: str, connection_id: str, name: str) -> Secret:
        check_name(name)
        var = variable_name(tenant_id, connection_id, name)
        value = self._environ.get(var) if var is not None else None
        if not value:
            raise SecretNotFound(connection_id, name)
        return Secret(value)
