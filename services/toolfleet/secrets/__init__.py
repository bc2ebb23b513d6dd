"""Credentials for tools: pluggable stores and the invocation-scoped capability.

Secrets never travel in events. A tool declares the credentials it needs
(``@tool(sandbox=Sandbox(permissions=ToolPermissions(credentials=["api_key"])))``); the
executor resolves them at execution time from the configured :class:`SecretStore` for
the call's ``connection_id`` and hands the tool ``ctx.credential(name)``, valid for that
one call.
"""

from toolfleet.secrets.capability import CredentialCapability, LeakDetector, resolve_credentials
from toolfleet.secrets.store import (
    Secret,
    SecretAccessDenied,
    SecretNotFound,
    SecretStore,
    SecretStoreError,
    SecretStoreUnavailable,
)

__all__ = [
    "CredentialCapability",
    "LeakDetector",
    "Secret",
    "SecretAccessDenied",
    "SecretNotFound",
    "SecretStore",
    "SecretStoreError",
    "SecretStoreUnavailable",
    "resolve_credentials",
]
