"""Which ``__consumer_offsets`` partition serves a group: Java's String.hashCode and Kafka's abs.

The expected values were computed by a JVM (``String.hashCode()`` and Kafka's
``Utils.abs(h) % 50``).
"""

from __future__ import annotations

import pytest
from highwater.metadata import (
    CONSUMER_OFFSETS_TOPIC,
    java_string_hash,
    kafka_abs,
    partition_for_group,
)
from hypothesis import given
from hypothesis import strategies as st

JAVA: list[tuple[str, int, int]] = [
    # (string, String.hashCode(), Utils.abs(hashCode) % 50)
    ("", 0, 0),
    ("a", 97, 47),
    ("hello", 99162322, 22),
    ("group-1", 293427299, 49),
    ("my-consumer-group", 1513705513, 13),
    ("console-consumer-12345", 158455506, 6),
    ("Hello World", -862545276, 26),  # negative: abs, not the 0x7fffffff mask (22)
    ("polygenelubricants", -(2**31), 0),  # Integer.MIN_VALUE: Utils.abs gives 0
    ("DESIGNING WORKHOUSES", -(2**31), 0),
    ("caf\u00e9", 3045921, 21),
    ("\u65e5\u672c\u8a9e\u30b0\u30eb\u30fc\u30d7", -305235731, 31),
    ("\U0001f600", 1772899, 49),  # one astral character: two UTF-16 code units
    ("g\U0001f680-\U00010000", -63711197, 47),
]


@pytest.mark.parametrize(("value", "hash_code", "partition"), JAVA)
def test_java_string_hash_and_kafka_partition(value: str, hash_code: int, partition: int) -> None:
    assert java_string_hash(value) == hash_code
    assert partition_for_group(value, 50) == partition


def test_kafka_abs() -> None:
    assert kafka_abs(0) == 0
    assert kafka_abs(-5) == 5
    assert kafka_abs(2**31 - 1) == 2**31 - 1
    assert kafka_abs(-(2**31)) == 0


def test_the_topic_name_and_bad_partition_counts() -> None:
    assert CONSUMER_OFFSETS_TOPIC == "__consumer_offsets"
    assert partition_for_group("g", 1) == 0
    with pytest.raises(ValueError):
        partition_for_group("g", 0)


def _reference(value: str) -> int:
    """Java's definition over UTF-16 code units, with Python's big ints, then wrapped."""
    units = []
    for ch in value:
        code = ord(ch)
        if code > 0xFFFF:
            code -= 0x10000
            units += [0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)]
        else:
            units.append(code)
    n = len(units)
    total = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)) % 2**32
    return total - 2**32 if total >= 2**31 else total


@given(st.text(), st.integers(1, 1000))
def test_hash_matches_the_definition_and_partitions_are_in_range(value: str, count: int) -> None:
    h = java_string_hash(value)
    assert h == _reference(value)
    assert -(2**31) <= h < 2**31
    assert 0 <= partition_for_group(value, count) < count
