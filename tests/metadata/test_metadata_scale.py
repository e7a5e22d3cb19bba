"""Scale: an image of 20,000 partitions, its cost in time and memory per partition.

Large enough that every structure is chunked and indexed as in a big cluster; measures and
prints (run with ``-s`` or see the captured output) and asserts correctness only, never
time. The figures at 100,000 to 2,000,000 partitions are ``python -m bench scale``'s.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import pytest
from highwater.metadata import (
    MetadataDelta,
    MetadataImage,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    load_snapshot_values,
    replay,
    snapshot_values,
)

T = TypeVar("T")

BROKERS = 10
TOPICS = 20
PARTITIONS_PER_TOPIC = 1000
PARTITIONS = TOPICS * PARTITIONS_PER_TOPIC


def cluster_records(topics: int, partitions_per_topic: int) -> list[MetadataRecord]:
    records: list[MetadataRecord] = []
    for broker_id in range(BROKERS):
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    for topic in range(topics):
        topic_id = f"topic-id-{topic:013d}"
        records.append(TopicRecord(f"topic-{topic}", topic_id))
        for partition_id in range(partitions_per_topic):
            first = (topic + partition_id) % BROKERS
            replicas = tuple((first + i) % BROKERS for i in range(3))
            records.append(PartitionRecord(topic_id, partition_id, replicas, replicas, first))
    return records


def memory(action: Callable[[], T]) -> tuple[T, int]:
    """(result, bytes still allocated by the action afterwards), under tracemalloc."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    result = action()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return result, after - before


def timed(action: Callable[[], T], repeat: int = 1) -> tuple[T, float]:
    """(result, the best of ``repeat`` wall-clock timings in seconds)."""
    best = float("inf")
    gc.collect()
    for _ in range(repeat):
        start = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - start)
    return result, best


@pytest.mark.slow
def test_an_image_of_20000_partitions(capsys: pytest.CaptureFixture[str]) -> None:
    def build() -> MetadataImage:
        return replay(cluster_records(TOPICS, PARTITIONS_PER_TOPIC), count - 1, 1)

    def time_replay() -> float:
        records = cluster_records(TOPICS, PARTITIONS_PER_TOPIC)
        return timed(lambda: replay(records, len(records) - 1, 1))[1]

    count = 2 * BROKERS + TOPICS * (PARTITIONS_PER_TOPIC + 1)
    replay_s = time_replay()
    # The records are made inside the measurement and dropped: what stays is the image.
    image, image_bytes = memory(build)
    assert image.partition_count == PARTITIONS

    # Copy-on-write: one ISR change, then one leader move, in a topic of 1,000 partitions.
    change = PartitionChangeRecord("topic-id-0000000000012", 7, isr=(7, 8))
    changed, change_s = timed(lambda: replay([change], image.offset + 1, image=image), 5)
    assert changed.topic("topic-1") is image.topic("topic-1")

    # The per-broker indexes: built on first use, then derived from the changes.
    def lookups(of: MetadataImage) -> object:
        return of.partitions_led_by(0), of.replicas_of(0), of.partitions_with_isr_member(0)

    _, index_bytes = memory(lambda: lookups(image))
    index_s = timed(partial(lookups, build()))[1]
    assert len(image.partitions_led_by(0)) == PARTITIONS // BROKERS
    assert len(image.replicas_of(0)) == 3 * PARTITIONS // BROKERS
    moved = PartitionChangeRecord("topic-id-0000000000012", 8, isr=(1, 2), leader=1)
    derived, derive_s = timed(lambda: replay([moved], image.offset + 1, image=image), 5)
    assert len(derived.topics.built_indexes()) == 3
    assert len(derived.partitions_led_by(0)) == PARTITIONS // BROKERS - 1

    # Snapshots: the image to encoded values and back.
    values, snapshot_s = timed(lambda: snapshot_values(image))
    loaded, load_s = timed(lambda: load_snapshot_values(values, image.offset, 1))
    assert loaded == image

    # One topic of 20,000 partitions: a change still copies one chunk, not the topic.
    big = replay(cluster_records(1, PARTITIONS), PARTITIONS + 2 * BROKERS, 1)
    big_change = PartitionChangeRecord("topic-id-0000000000000", 12345, isr=(1,), leader=1)
    _, big_change_s = timed(lambda: replay([big_change], big.offset + 1, image=big), 5)
    batch = [
        PartitionChangeRecord("topic-id-0000000000000", p, isr=(p % BROKERS,))
        for p in range(0, PARTITIONS, 10)
    ]
    _, batch_s = timed(lambda: MetadataDelta(big).replay_all(batch).apply(big.offset + 1), 3)

    per = PARTITIONS
    with capsys.disabled():
        print()
        print(f"  metadata image, {per:,} partitions ({TOPICS} topics x {PARTITIONS_PER_TOPIC}):")
        print(
            f"    replay into an image  {replay_s:8.3f} s  {replay_s / per * 1e6:7.2f} us/partition"
            f"  {image_bytes / per:7.0f} B/partition"
        )
        print(
            f"    3 broker indexes      {index_s:8.3f} s  {index_s / per * 1e6:7.2f} us/partition"
            f"  {index_bytes / per:7.0f} B/partition"
        )
        print(f"    one ISR change        {change_s * 1e3:8.3f} ms")
        print(f"    one leader change, index derived  {derive_s * 1e3:8.3f} ms")
        print(
            f"    snapshot: {len(values):,} records, encode {snapshot_s:.3f} s, "
            f"decode+load {load_s:.3f} s"
        )
        print(f"    one topic of {per:,} partitions: one change {big_change_s * 1e3:.3f} ms,")
        print(f"      {len(batch):,} changes in one batch {batch_s * 1e3:.1f} ms")


def test_the_image_of_the_scale_test_is_sound() -> None:
    """The scale test's generator builds valid partitions (a small version, always run)."""
    image: MetadataImage = replay(cluster_records(3, 20), 100, 1)
    for _, partition in image.partitions():
        assert partition.leader in partition.isr
        assert len(set(partition.replicas)) == 3
