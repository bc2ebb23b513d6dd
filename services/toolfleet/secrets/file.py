"""Secrets from files: ``{TOOLFLEET_SECRET_DIR}/{tenant}/{connection}/{name}``.

The layout Kubernetes secret volumes and Docker secrets produce. One trailing newline
is stripped. Every path part must be a plain name (letters, digits, ``_ . : -``; no
``/``, no ``..``), the final file must be a regular file reached without following a
symlink out of the directory, at most 64 KiB, and not accessible to "other" users
(mode ``0600`` or ``0640``): a file anyone on the host can read is refused with a
:class:`SecretStoreError` instead of being used.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
from pathlib import Path

from toolfleet.secrets.store import (
    Secret,
    SecretAccessDenied,
    SecretNotFound,
    SecretStoreError,
    check_name,
    is_path_segment,
)

log = logging.getLogger(__name__)

MAX_SECRET_BYTES = 64 * 1024


class FileSecretStore:
    """Reads one file per credential under ``root``."""

    def __init__(self, root: Path) -> None:
        self._root = root

    async def resolve(self, tenant_id: str, connection_id: str, name: str) -> Secret:
        check_name(name)
        if not (is_path_segment(tenant_id) and is_path_segment(connection_id)):
            raise SecretNotFound(connection_id, name)
        return await asyncio.to_thread(self._read, tenant_id, connection_id, name)

    def _read(self, tenant_id: str, connection_id: str, name: str) -> Secret:
        root = self._root.resolve()
        path = root / tenant_id / connection_id / name
        # A symlinked tenant or connection directory must not lead outside the root.
        if not path.parent.resolve().is_relative_to(root):
            log.warning("secret path leaves the secret directory", extra={"credential": name})
            raise SecretNotFound(connection_id, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise SecretNotFound(connection_id, name) from None
        except PermissionError:
            raise SecretAccessDenied(connection_id, name) from None
        except OSError as exc:
            if exc.errno in {errno.ELOOP, errno.ENOTDIR, errno.EISDIR}:
                raise SecretNotFound(connection_id, name) from None
            raise SecretStoreError(f"credential {name!r} could not be read") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SecretNotFound(connection_id, name)
            if info.st_mode & (stat.S_IRWXO):
                log.warning(
                    "refusing a secret file other users can access; chmod o-rwx it",
                    extra={"secret_file": str(path.relative_to(root))},
                )
                raise SecretStoreError(
                    f"credential {name!r} is stored in a file other users can read; "
                    "the secret store refuses it (an operator must restrict its mode)"
                )
            if info.st_size > MAX_SECRET_BYTES:
                raise SecretStoreError(f"credential {name!r} is larger than 64 KiB")
            data = os.read(fd, MAX_SECRET_BYTES + 1)
        finally:
            os.close(fd)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SecretStoreError(f"credential {name!r} is not UTF-8 text") from None
        text = text.removesuffix("\n").removesuffix("\r")
        if not text:
            raise SecretNotFound(connection_id, name)
        return Secret(text)
