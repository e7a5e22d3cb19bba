"""Where the plain records of a produce to partition -1 go: Kafka's default partitioner.

A thin client names partition -1 and sends ``PlainRecords``; the broker places each record
with the partitioner the Python client uses (:mod:`highwater.records.partitioner`): a keyed
record on ``to_positive(murmur2(key)) % num_partitions`` over every partition of the topic
(so Java, librdkafka and our client agree on it), the keyless records of one request on the
topic's sticky partition among those that have a leader, which moves on once about
``batch.size`` bytes went to it (KIP-794). Pure: the caller appends each share where its
partition is led and reports what it appended to the sticky partitioner.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from highwater.records.partitioner import StickyPartitioner, partition_for_key
from highwater.v1 import broker_pb2 as pb

__all__ = ["Placement", "place_records", "record_size"]


@dataclass(frozen=True, slots=True)
class Placement:
    """The records of one request by partition: ``shares[p]`` lists the indexes (in the
    request) of the records placed on partition ``p``, in request order; ``sticky`` the
    partition the keyless ones went to (None if there were none)."""

    shares: dict[int, list[int]]
    sticky: int | None
    sticky_bytes: int


def record_size(record: pb.Record | pb.FetchedRecord) -> int:
    """The bytes of a record's key, value and headers: what the sticky partitioner counts,
    and what a consumer session's byte credit counts."""
    size = len(record.key) + len(record.value)
    for header in record.headers:
        size += len(header.key.encode()) + len(header.value)
    return size


def place_records(
    topic: str,
    records: Sequence[pb.Record],
    num_partitions: int,
    available_partitions: Iterable[int],
    sticky: StickyPartitioner,
) -> Placement:
    """Place ``records`` of ``topic`` (``num_partitions`` partitions, those with a leader in
    ``available_partitions``). Keyless records all go to the one sticky partition: the
    request is one batch's worth, as a producer's accumulator would build it."""
    shares: dict[int, list[int]] = {}
    sticky_partition: int | None = None
    sticky_bytes = 0
    for index, record in enumerate(records):
        if record.HasField("key"):
            partition = partition_for_key(record.key, num_partitions)
        else:
            if sticky_partition is None:
                sticky_partition = sticky.partition(topic, num_partitions, available_partitions)
            partition = sticky_partition
            sticky_bytes += record_size(record)
        shares.setdefault(partition, []).append(index)
    return Placement(shares, sticky_partition, sticky_bytes)
