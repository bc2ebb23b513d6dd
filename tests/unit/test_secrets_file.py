"""The file backend: one private file per credential, no way out of its directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolfleet.secrets.file import FileSecretStore
from toolfleet.secrets.store import SecretNotFound, SecretStoreError

pytestmark = pytest.mark.unit


def plant(
    root: Path, tenant: str, connection: str, name: str, value: str, mode: int = 0o600
) -> Path:
    path = root / tenant / connection / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value)
    path.chmod(mode)
    return path


async def test_reads_the_file_and_strips_one_trailing_newline(tmp_path: Path) -> None:
    plant(tmp_path, "t1", "conn-1", "api_key", "value with spaces \n")
    secret = await FileSecretStore(tmp_path).resolve("t1", "conn-1", "api_key")
    assert secret.reveal() == "value with spaces "


async def test_group_readable_files_are_fine(tmp_path: Path) -> None:
    plant(tmp_path, "t1", "c", "api_key", "v", mode=0o640)
    assert (await FileSecretStore(tmp_path).resolve("t1", "c", "api_key")).reveal() == "v"


async def test_missing_is_not_found_without_the_path(tmp_path: Path) -> None:
    with pytest.raises(SecretNotFound) as caught:
        await FileSecretStore(tmp_path).resolve("t1", "c", "api_key")
    assert str(tmp_path) not in caught.value.message
    assert caught.value.code == "permission_denied"


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o601, 0o666])
async def test_files_other_users_can_access_are_refused(tmp_path: Path, mode: int) -> None:
    plant(tmp_path, "t1", "c", "api_key", "exposed-value", mode=mode)
    with pytest.raises(SecretStoreError) as caught:
        await FileSecretStore(tmp_path).resolve("t1", "c", "api_key")
    assert "other users" in caught.value.message
    assert "exposed-value" not in caught.value.message
    assert str(tmp_path) not in caught.value.message


@pytest.mark.parametrize(
    ("tenant", "connection"),
    [("..", "c"), ("t1", ".."), ("t1", "../t2"), ("t1", "a/b"), ("t1", "/etc"), ("t1", "c\x00")],
)
async def test_path_traversal_is_refused(tmp_path: Path, tenant: str, connection: str) -> None:
    root = tmp_path / "secrets"
    plant(root, "t2", "c", "api_key", "other-tenant")
    plant(tmp_path, "outside", "c", "api_key", "outside")
    with pytest.raises(SecretNotFound):
        await FileSecretStore(root).resolve(tenant, connection, "api_key")


async def test_traversal_in_the_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a credential name"):
        await FileSecretStore(tmp_path).resolve("t1", "c", "../../etc/passwd")


async def test_symlinked_directory_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "secrets"
    plant(tmp_path, "elsewhere", "c", "api_key", "outside-value")
    (root / "t1").mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere" / "c", root / "t1" / "c")
    with pytest.raises(SecretNotFound):
        await FileSecretStore(root).resolve("t1", "c", "api_key")


async def test_symlinked_file_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "secrets"
    target = plant(tmp_path, "elsewhere", "c", "api_key", "outside-value")
    (root / "t1" / "c").mkdir(parents=True)
    os.symlink(target, root / "t1" / "c" / "api_key")
    with pytest.raises(SecretNotFound):
        await FileSecretStore(root).resolve("t1", "c", "api_key")


async def test_a_directory_is_not_a_secret(tmp_path: Path) -> None:
    (tmp_path / "t1" / "c" / "api_key").mkdir(parents=True)
    with pytest.raises(SecretNotFound):
        await FileSecretStore(tmp_path).resolve("t1", "c", "api_key")


async def test_oversized_and_binary_files_are_refused(tmp_path: Path) -> None:
    plant(tmp_path, "t1", "c", "big", "x" * (64 * 1024 + 1))
    path = plant(tmp_path, "t1", "c", "binary", "")
    path.write_bytes(b"\xff\xfe\x00")
    store = FileSecretStore(tmp_path)
    with pytest.raises(SecretStoreError, match="larger"):
        await store.resolve("t1", "c", "big")
    with pytest.raises(SecretStoreError, match="UTF-8"):
        await store.resolve("t1", "c", "binary")
