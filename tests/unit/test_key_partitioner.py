"""Records land on the partition aiokafka's (and the Java client's) default partitioner
picks for their key: a tenant's events stay on one partition whoever produces them."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.bus.producer import KeyPartitioner

pytestmark = pytest.mark.unit

partitions = st.integers(1, 64).map(lambda n: list(range(n)))


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=20), partitions)
def test_every_key_goes_where_the_default_partitioner_sends_it(
    keys: list[bytes], all_partitions: list[int]
) -> None:
    ours = KeyPartitioner()
    for key in keys + keys:  # asked again: from its memory
        assert ours(key, all_partitions, all_partitions) == DefaultPartitioner()(
            key, all_partitions, all_partitions
        )


def test_known_keys_land_where_the_java_client_puts_them() -> None:
    # Kafka's own murmur2 vectors (UtilsTest): "21" -973932308, "foobar" -790332482,
    # "a-little-bit-long-string" -985981536, "abc" 479470107; & 0x7fffffff, then % 12.
    twelve = list(range(12))
    ours = KeyPartitioner()
    keys = [b"21", b"foobar", b"a-little-bit-long-string", b"abc"]
    assert [ours(k, twelve, twelve) for k in keys] == [0, 6, 8, 3]


def test_a_record_without_a_key_goes_to_an_available_partition() -> None:
    ours = KeyPartitioner()
    assert {ours(None, list(range(12)), [3, 5]) for _ in range(50)} <= {3, 5}


def test_its_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KeyPartitioner, "MAX_KEYS", 4)
    ours = KeyPartitioner()
    for i in range(10):
        key = f"tenant-{i}".encode()
        assert ours(key, [0, 1, 2], [0, 1, 2]) == DefaultPartitioner()(key, [0, 1, 2], [0, 1, 2])
    assert len(ours._hashes) <= 4
