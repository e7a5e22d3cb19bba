"""The image's heap frozen out of full garbage collections at doubling partition counts."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from highwater.metadata import MetadataImage, PartitionRecord, TopicRecord, replay
from highwater.metadata.heap import ImageHeapFreezer


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def with_topic(image: MetadataImage, name: str, partitions: int) -> MetadataImage:
    topic_id = f"id-{name}"
    records = [
        TopicRecord(name, topic_id),
        *(PartitionRecord(topic_id, p, (0, 1, 2), (0, 1, 2), p % 3) for p in range(partitions)),
    ]
    return replay(records, image.offset + len(records), 1, image=image)


def test_the_heap_is_frozen_at_the_threshold_and_again_once_the_partitions_doubled(
    unfrozen: None,
) -> None:
    freezer = ImageHeapFreezer(min_partitions=100)
    small = with_topic(MetadataImage(), "a", 60)
    assert not freezer.after_publish(small)
    assert gc.get_freeze_count() == 0

    reached = with_topic(small, "b", 60)  # 120 partitions
    assert freezer.after_publish(reached)
    frozen = gc.get_freeze_count()
    assert frozen > 0
    assert not freezer.after_publish(reached)  # the same topics: nothing to look at

    grown = with_topic(reached, "c", 100)  # 220 < 2 x 120
    assert not freezer.after_publish(grown)
    doubled = with_topic(grown, "d", 40)  # 260 >= 240
    assert freezer.after_publish(doubled)
    assert gc.get_freeze_count() >= frozen
