"""Snapshots: an image becomes the records that recreate it, and those records recreate it."""

from __future__ import annotations

import hypothesis.strategies as st
from highwater.metadata import (
    NO_LEADER,
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    ConfigResourceType,
    CoordinatorAssignmentRecord,
    FenceBrokerRecord,
    MetadataImage,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RegisterCoordinatorRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    load_snapshot,
    load_snapshot_values,
    replay,
    snapshot_records,
    snapshot_values,
)
from hypothesis import given, settings


@st.composite
def histories(draw: st.DrawFn) -> list[MetadataRecord]:
    """A valid history of the metadata log: brokers, topics, changes, configs, removals."""
    records: list[MetadataRecord] = []
    broker_ids = draw(st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True))
    for epoch, broker_id in enumerate(broker_ids):
        rack = draw(st.none() | st.sampled_from(["a", "b"]))
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9000 + broker_id)
        records.append(RegisterBrokerRecord(broker_id, f"i{broker_id}", epoch, (endpoint,), rack))
        state = draw(st.sampled_from(["fenced", "active", "shutting-down"]))
        if state != "fenced":
            records.append(UnfenceBrokerRecord(broker_id, epoch))
        if state == "shutting-down":
            records.append(
                BrokerRegistrationChangeRecord(broker_id, epoch, in_controlled_shutdown=True)
            )
    if draw(st.booleans()):
        records.append(FenceBrokerRecord(broker_ids[0], 0))
    topics = draw(st.lists(st.text("abcxyz._-", min_size=1, max_size=6), max_size=4, unique=True))
    for index, name in enumerate(topics):
        topic_id = f"id-{index}"
        records.append(TopicRecord(name, topic_id))
        for partition_id in range(draw(st.integers(1, 4))):
            replicas = tuple(draw(st.permutations(broker_ids)))[: draw(st.integers(1, 3))]
            records.append(PartitionRecord(topic_id, partition_id, replicas, replicas, replicas[0]))
            for _ in range(draw(st.integers(0, 2))):
                isr = (replicas[0],)
                leader = draw(st.sampled_from([replicas[0], NO_LEADER]))
                records.append(
                    PartitionChangeRecord(topic_id, partition_id, isr=isr, leader=leader)
                )
        if draw(st.booleans()):
            value = draw(st.sampled_from(["1000", None]))
            records.append(ConfigRecord(ConfigResourceType.TOPIC, name, "retention.ms", value))
        if draw(st.booleans()):
            records.append(RemoveTopicRecord(topic_id))
    if draw(st.booleans()):
        records.append(ConfigRecord(ConfigResourceType.BROKER, "", "log.retention.ms", "5"))
    for block in range(draw(st.integers(0, 2))):
        records.append(ProducerIdsRecord(broker_ids[0], 0, 1000 * (block + 1)))
    if draw(st.booleans()):
        records.append(RegisterCoordinatorRecord(1, "c1", 9, (), "a"))
        for partition_id in range(draw(st.integers(0, 3))):
            records.append(CoordinatorAssignmentRecord(partition_id, 1, draw(st.integers(0, 5))))
    return records


@settings(max_examples=150, deadline=None)
@given(histories())
def test_a_snapshot_recreates_the_image(records: list[MetadataRecord]) -> None:
    image = replay(records, offset=len(records) - 1, epoch=3)
    snapshot = list(snapshot_records(image))
    assert load_snapshot(snapshot, image.offset, image.epoch) == image
    assert load_snapshot_values(snapshot_values(image), image.offset, 3) == image
    # A snapshot holds state, not history: never more records than the history.
    assert len(snapshot) <= len(records)


def test_a_snapshot_keeps_fencing_shutdown_epochs_and_offline_partitions() -> None:
    records: list[MetadataRecord] = [
        RegisterBrokerRecord(1, "i1", 0),
        RegisterBrokerRecord(2, "i2", 1),
        UnfenceBrokerRecord(2, 1),
        BrokerRegistrationChangeRecord(2, 1, in_controlled_shutdown=True),
        TopicRecord("t", "tid"),
        PartitionRecord("tid", 0, (1, 2), (1, 2), 1),
        PartitionChangeRecord("tid", 0, isr=(1,), leader=NO_LEADER),
    ]
    image = replay(records, 6, 2)
    snapshot = list(snapshot_records(image))
    assert snapshot[0] == RegisterBrokerRecord(1, "i1", 0, fenced=True)
    assert snapshot[1] == RegisterBrokerRecord(
        2, "i2", 1, fenced=False, in_controlled_shutdown=True
    )
    assert PartitionRecord("tid", 0, (1, 2), (1,), NO_LEADER, 1, 1) in snapshot
    assert load_snapshot(snapshot, 6, 2) == image


def test_an_empty_image_has_an_empty_snapshot() -> None:
    assert list(snapshot_records(MetadataImage.empty())) == []
    assert load_snapshot([], -1, -1) == MetadataImage.empty()
