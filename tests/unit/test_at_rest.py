"""Raw results at rest: transfer blobs and cache entries sealed with the fleet key."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from toolfleet.executor.cache import RedisResultCache, cache_key
from toolfleet.sdk import Cache
from toolfleet.storage.at_rest import (
    MAGIC,
    RESULT_CACHE,
    TRANSFER_BLOB,
    AtRestCipher,
    is_sealed,
)
from toolfleet.storage.blobs import MemoryBlobStore

pytestmark = pytest.mark.unit

OLD_KEY = b"o" * 32
NEW_KEY = b"n" * 43
SECRET = b'{"ssn":"078-05-1120"}'
TENANT = "tenant_acme"


def test_a_sealed_value_opens_only_in_its_place() -> None:
    cipher = AtRestCipher([NEW_KEY], purpose=TRANSFER_BLOB)
    sealed = cipher.seal(SECRET, aad=b"row-1")
    assert is_sealed(sealed)
    assert sealed.startswith(MAGIC)
    assert b"078-05-1120" not in sealed
    assert cipher.open(sealed, aad=b"row-1") == SECRET
    assert cipher.open(sealed, aad=b"row-2") is None  # moved to another row
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    assert cipher.open(tampered, aad=b"row-1") is None
    assert cipher.seal(SECRET, aad=b"row-1") != sealed  # fresh nonce every time


def test_each_purpose_has_its_own_key() -> None:
    transfer = AtRestCipher([NEW_KEY], purpose=TRANSFER_BLOB)
    cache = AtRestCipher([NEW_KEY], purpose=RESULT_CACHE)
    assert cache.open(transfer.seal(SECRET, aad=b"k"), aad=b"k") is None


def test_rotation_seals_with_the_first_key_and_opens_with_any_listed() -> None:
    before = AtRestCipher([OLD_KEY], purpose=TRANSFER_BLOB)
    sealed_before = before.seal(SECRET, aad=b"k")
    rotated = AtRestCipher([NEW_KEY, OLD_KEY], purpose=TRANSFER_BLOB)
    assert rotated.open(sealed_before, aad=b"k") == SECRET
    assert rotated.kid != before.kid
    assert rotated.seal(SECRET, aad=b"k")[len(MAGIC) :].startswith(rotated.kid.encode())
    retired = AtRestCipher([NEW_KEY], purpose=TRANSFER_BLOB)
    assert retired.open(sealed_before, aad=b"k") is None


async def test_transfer_blobs_are_sealed_and_attachments_are_not() -> None:
    cipher = AtRestCipher([NEW_KEY], purpose=TRANSFER_BLOB)
    store = MemoryBlobStore(cipher=cipher)
    invocation = str(uuid.uuid4())
    transfer = await store.put(
        SECRET, tenant_id=TENANT, invocation_id=invocation, purpose="transfer"
    )
    attachment = await store.put(
        b'{"name":"Ada"}', tenant_id=TENANT, invocation_id=invocation, purpose="attachment"
    )
    assert is_sealed(store.raw(transfer))
    assert b"078-05-1120" not in store.raw(transfer)
    assert store.raw(attachment) == b'{"name":"Ada"}'
    blob = await store.get(transfer, purpose="transfer", tenant_id=TENANT)
    assert blob is not None
    assert blob.data == SECRET
    # A store without the key (or with another one) cannot read the raw result.
    keyless = MemoryBlobStore()
    keyless._rows = store._rows
    assert await keyless.get(transfer, purpose="transfer", tenant_id=TENANT) is None


async def test_a_plaintext_transfer_blob_from_before_the_upgrade_still_reads() -> None:
    before = MemoryBlobStore()
    invocation = str(uuid.uuid4())
    blob_id = await before.put(
        SECRET, tenant_id=TENANT, invocation_id=invocation, purpose="transfer"
    )
    after = MemoryBlobStore(cipher=AtRestCipher([NEW_KEY], purpose=TRANSFER_BLOB))
    after._rows = before._rows
    blob = await after.get(blob_id, purpose="transfer", tenant_id=TENANT)
    assert blob is not None
    assert blob.data == SECRET


class FakeRedis:
    """The two commands the result cache uses, on a dict of bytes."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    async def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    async def set(self, key: str, value: bytes | str, ex: int | None = None) -> None:
        self.values[key] = value if isinstance(value, bytes) else value.encode()


def _cache(redis: FakeRedis, keys: list[bytes] | None) -> RedisResultCache:
    cipher = AtRestCipher(keys, purpose=RESULT_CACHE) if keys else None
    fake: Any = redis
    return RedisResultCache(fake, cipher=cipher)


async def test_cache_entries_are_sealed_and_plaintext_ones_are_misses() -> None:
    redis = FakeRedis()
    policy = Cache(mode="ttl", ttl_s=60)
    result = {"ssn": "078-05-1120"}
    await _cache(redis, [NEW_KEY]).put("call-1", result, policy)
    raw = redis.values[cache_key("call-1")]
    assert is_sealed(raw)
    assert b"078-05-1120" not in raw
    assert await _cache(redis, [NEW_KEY]).get("call-1") == result
    assert await _cache(redis, [NEW_KEY, OLD_KEY]).get("call-1") == result
    assert await _cache(redis, [OLD_KEY]).get("call-1") is None  # key rotated out: a miss
    # An entry written before the upgrade, in plaintext: a miss, the tool runs again.
    await _cache(redis, None).put("call-2", result, policy)
    assert json.loads(redis.values[cache_key("call-2")]) == result
    assert await _cache(redis, [NEW_KEY]).get("call-2") is None
    # An entry copied under another call's key does not open there.
    redis.values[cache_key("call-3")] = raw
    assert await _cache(redis, [NEW_KEY]).get("call-3") is None
