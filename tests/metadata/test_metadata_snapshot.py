"""Snapshots: an image becomes the records that recreate it, and those records recreate it."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
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
    PartitionRegistration,
    PartitionsRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RegisterCoordinatorRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    decode_record,
    encode_record,
    load_snapshot,
    load_snapshot_values,
    replay,
    snapshot_records,
    snapshot_values,
)
from highwater.metadata.delta import MetadataDelta, MetadataReplayError
from highwater.metadata.snapshot import partition_columns
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


@settings(deadline=None)  # examples: the profile's (tests/conftest.py)
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


def test_a_snapshot_keeps_an_unclean_shutdown_that_is_still_owed() -> None:
    records: list[MetadataRecord] = [
        RegisterBrokerRecord(1, "i1", 0, unclean_shutdown=True),
        RegisterBrokerRecord(2, "i2", 1, unclean_shutdown=True),
        UnfenceBrokerRecord(2, 1),
    ]
    image = replay(records, 2, 1)
    snapshot = list(snapshot_records(image))
    assert snapshot == [
        RegisterBrokerRecord(1, "i1", 0, fenced=True, unclean_shutdown=True),
        RegisterBrokerRecord(2, "i2", 1, fenced=False, unclean_shutdown=False),
    ]
    loaded = load_snapshot_values(snapshot_values(image), 2, 1)
    assert loaded == image
    assert loaded.brokers[1].unclean_shutdown and not loaded.brokers[2].unclean_shutdown


def test_an_empty_image_has_an_empty_snapshot() -> None:
    assert list(snapshot_records(MetadataImage.empty())) == []
    assert load_snapshot([], -1, -1) == MetadataImage.empty()


def _topic_of_seven() -> list[MetadataRecord]:
    """A topic of 7 partitions: 2 is being reassigned, 5 has an ELR, 3 a shrunk ISR, 6 offline."""
    records: list[MetadataRecord] = [RegisterBrokerRecord(b, f"i{b}", b) for b in range(4)]
    records.append(TopicRecord("t", "tid"))
    for p in range(7):
        replicas = (p % 4, (p + 1) % 4, (p + 2) % 4)
        records.append(PartitionRecord("tid", p, replicas, replicas, replicas[0]))
    records += [
        PartitionChangeRecord("tid", 2, replicas=(0, 1, 2, 3), adding_replicas=(3,)),
        PartitionChangeRecord("tid", 3, isr=(3,), leader=3),
        PartitionChangeRecord("tid", 5, isr=(1,), eligible_leader_replicas=(2,)),
        PartitionChangeRecord("tid", 6, isr=(), leader=NO_LEADER),
    ]
    return records


def test_the_stored_snapshot_writes_partitions_in_columns() -> None:
    records = _topic_of_seven()
    image = replay(records, len(records) - 1, 4)
    topic = image.topic("t")
    assert topic is not None
    stored = list(partition_columns(topic, per_record=2))
    # Runs of at most 2 partitions, broken by the reassigned and the ELR partition, in order.
    assert [type(r).__name__ for r in stored] == [
        "PartitionsRecord",  # 0, 1
        "PartitionRecord",  # 2
        "PartitionsRecord",  # 3, 4
        "PartitionRecord",  # 5
        "PartitionsRecord",  # 6
    ]
    first = stored[2]
    assert isinstance(first, PartitionsRecord)
    assert first.first_partition_id == 3
    assert first.leaders == (3, 0) and first.leader_epochs == (1, 0)
    assert first.replica_counts == (3, 3) and first.replicas == (3, 0, 1, 0, 1, 2)
    assert first.isr_counts == (1, -1) and first.isr == (3,)  # -1: the ISR is the replicas
    offline = stored[4]
    assert isinstance(offline, PartitionsRecord)
    assert offline.leaders == (NO_LEADER,) and offline.isr_counts == (0,)
    # Encoded, decoded and replayed, the columns give the same image as the records.
    values = snapshot_values(image)
    assert len(values) < len(list(snapshot_records(image)))
    assert decode_record(encode_record(first)) == first
    assert load_snapshot_values(values, image.offset, 4) == image
    assert load_snapshot(stored_and_rest(image, stored), image.offset, 4) == image


def stored_and_rest(image: MetadataImage, stored: list[MetadataRecord]) -> list[MetadataRecord]:
    """The image's snapshot records with the topic's partitions replaced by ``stored``."""
    rest = [r for r in snapshot_records(image) if not isinstance(r, PartitionRecord)]
    at = next(i for i, r in enumerate(rest) if isinstance(r, TopicRecord)) + 1
    return rest[:at] + stored + rest[at:]


def test_columns_that_do_not_add_up_are_refused() -> None:
    records = _topic_of_seven()[:5]  # brokers and the topic
    base = replay(records, len(records) - 1, 1)
    good = PartitionsRecord("tid", 0, (0, 1), (0, 0), (0, 0), (2, 2), (0, 1, 1, 2), (-1, 1), (1,))
    assert replay([good], base.offset + 1, image=base).partition("tid", 1) == PartitionRegistration(
        (1, 2), (1,), 1
    )
    for bad in (
        PartitionsRecord("tid", 0, (0, 1), (0, 0), (0, 0), (2, 2), (0, 1, 1), (-1, 1), (1,)),
        PartitionsRecord("tid", 0, (0, 1), (0,), (0, 0), (2, 2), (0, 1, 1, 2), (-1, -1), ()),
        PartitionsRecord("tid", 0, (0, 1), (0, 0), (0, 0), (2, 2), (0, 1, 1, 2), (-1, 1), ()),
        PartitionsRecord("tid", 3, (0,), (0,), (0,), (1,), (0,), (-1,), ()),  # leaves a hole
        PartitionsRecord("nope", 0, (0,), (0,), (0,), (1,), (0,), (-1,), ()),
    ):
        with pytest.raises(MetadataReplayError):
            MetadataDelta(base).replay(bad)
