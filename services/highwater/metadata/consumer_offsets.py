"""The internal ``__consumer_offsets`` topic: its name, its writer, the partition of a group.

A consumer group lives in one partition of ``__consumer_offsets``: the one Kafka picks
with ``Utils.abs(groupId.hashCode()) % partitionCount`` (``GroupCoordinator.partitionFor``).
The same group must land on the same partition whichever process asks (a broker
answering FindCoordinator, a coordinator checking it owns a group, a Java client's
tooling), so the hash is Java's ``String.hashCode`` bit for bit: over UTF-16 code units
(a character outside the Basic Multilingual Plane counts as its two surrogates), with
32-bit signed overflow; and ``abs`` is Kafka's ``Utils.abs``, which maps
``Integer.MIN_VALUE`` to 0 rather than leaving it negative as ``Math.abs`` does.
"""

from __future__ import annotations

from typing import Final

CONSUMER_OFFSETS_TOPIC: Final = "__consumer_offsets"
"""Kafka's ``Topic.GROUP_METADATA_TOPIC_NAME``: committed offsets and group metadata."""

ADMIN_CLIENT_ID: Final = "__admin_client"
"""The client id whose produce requests internal topics take (Kafka's
``AdminUtils.ADMIN_CLIENT_ID``: ``ReplicaManager.appendRecords`` allows internal topics only
for it). Kafka's group coordinator appends inside the broker; Highwater's appends over the
brokers' Produce call, so it names itself with this id. Any other producer's records for
an internal topic are refused INVALID_TOPIC_EXCEPTION: a client could otherwise rewrite a
group's offsets, or fence its coordinator by appending as its producer id with a higher
epoch. It is a guard against mistakes, as in Kafka; with the ACL checks on, WRITE on the
topic is what keeps others out."""

_INT_MIN: Final = -(1 << 31)
_MASK_32: Final = (1 << 32) - 1


def java_string_hash(value: str) -> int:
    """Java's ``String.hashCode()`` of ``value``: ``s[0]*31^(n-1) + ... + s[n-1]`` over
    its UTF-16 code units, as a signed 32-bit int (wrapping on overflow)."""
    units = value.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (h * 31 + ((units[i] << 8) | units[i + 1])) & _MASK_32
    return h - (1 << 32) if h >= 1 << 31 else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs`` of a 32-bit int: ``|n|``, except ``Integer.MIN_VALUE`` -> 0."""
    return 0 if n == _INT_MIN else abs(n)


def partition_for_group(group_id: str, partition_count: int) -> int:
    """The ``__consumer_offsets`` partition of ``group_id`` when the topic has
    ``partition_count`` partitions (Kafka's ``GroupCoordinator.partitionFor``)."""
    if partition_count < 1:
        raise ValueError(f"the offsets topic needs at least one partition, not {partition_count}")
    return kafka_abs(java_string_hash(group_id)) % partition_count
