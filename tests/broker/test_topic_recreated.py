"""A topic deleted and created again under its name, the broker seeing both in one image
(a delta of both changes, or a whole image after missed ones): the replica is the new
topic's, with an empty log, not the old topic's log under the new topic id."""

from __future__ import annotations

from pathlib import Path

from highwater.broker.partitions import PartitionManager
from highwater.metadata import (
    BrokerEndpoint,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    replay,
)
from highwater.records import SimpleRecord, build_batch
from highwater.storage.log_manager import LogManager
from highwater.storage.partition_metadata import PARTITION_METADATA, read_topic_id
from highwater.storage.topic_partition import TopicPartition

BROKER = 1


def test_a_topic_recreated_under_its_name_in_one_image_starts_with_an_empty_log(
    tmp_path: Path,
) -> None:
    logs = LogManager(tmp_path)
    logs.startup(node_id=BROKER)
    partitions = PartitionManager(BROKER, logs)
    records: list[MetadataRecord] = []
    for broker_id in (1, 2):
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092)
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id, (endpoint,)))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    records += [TopicRecord("orders", "old-id"), PartitionRecord("old-id", 0, (1,), (1,), 1)]
    image = replay(records, len(records))
    partitions.apply_image(image)
    old = partitions.get("orders", 0)
    old.append(build_batch([SimpleRecord(value=b"old")]), 1)
    assert old.log_end_offset == 1

    again = [
        RemoveTopicRecord("old-id"),
        TopicRecord("orders", "new-id"),
        PartitionRecord("new-id", 0, (1,), (1,), 1),
    ]
    partitions.apply_image(replay(again, image.offset + len(again), image=image))
    new = partitions.get("orders", 0)
    assert new.topic_id == "new-id"
    assert new.log_end_offset == 0


def _cluster_records() -> list[MetadataRecord]:
    records: list[MetadataRecord] = []
    for broker_id in (1, 2):
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092)
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id, (endpoint,)))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    return records


OLD_ID = "AAAAAAAAAAAAAAAAAAAAAQ"
NEW_ID = "AAAAAAAAAAAAAAAAAAAAAg"


def test_a_topic_recreated_while_the_broker_was_down_starts_with_an_empty_log(
    tmp_path: Path,
) -> None:
    logs = LogManager(tmp_path)
    logs.startup(node_id=BROKER)
    records = _cluster_records()
    records += [TopicRecord("orders", OLD_ID), PartitionRecord(OLD_ID, 0, (1,), (1,), 1)]
    PartitionManager(BROKER, logs).apply_image(replay(records, len(records)))
    logs.get_or_create_log(TopicPartition("orders", 0)).append_as_leader(
        build_batch([SimpleRecord(value=b"old")]), 0
    )
    logs.shutdown()

    # Down while the topic is deleted and created again: the first image it applies at
    # its next start shows only the new topic under the name.
    restarted = LogManager(tmp_path)
    restarted.startup(node_id=BROKER)
    assert restarted.topic_id(TopicPartition("orders", 0)) == OLD_ID
    records = _cluster_records()
    records += [TopicRecord("orders", NEW_ID), PartitionRecord(NEW_ID, 0, (1,), (1,), 1)]
    partitions = PartitionManager(BROKER, restarted)
    partitions.apply_image(replay(records, len(records)))
    new = partitions.get("orders", 0)
    assert new.topic_id == NEW_ID
    assert new.log_end_offset == 0
    assert restarted.topic_id(TopicPartition("orders", 0)) == NEW_ID
    assert read_topic_id(tmp_path / "orders-0") == NEW_ID


def test_a_log_recording_no_topic_id_takes_the_images(tmp_path: Path) -> None:
    logs = LogManager(tmp_path)
    logs.startup(node_id=BROKER)
    tp = TopicPartition("orders", 0)
    logs.get_or_create_log(tp).append_as_leader(build_batch([SimpleRecord(value=b"kept")]), 0)
    logs.shutdown()
    assert not (tmp_path / "orders-0" / PARTITION_METADATA).exists()

    restarted = LogManager(tmp_path)
    restarted.startup(node_id=BROKER)
    records = _cluster_records()
    records += [TopicRecord("orders", OLD_ID), PartitionRecord(OLD_ID, 0, (1,), (1,), 1)]
    partitions = PartitionManager(BROKER, restarted)
    partitions.apply_image(replay(records, len(records)))
    assert partitions.get("orders", 0).log_end_offset == 1
    assert read_topic_id(tmp_path / "orders-0") == OLD_ID


def test_logs_of_a_topic_deleted_while_the_broker_was_down_are_removed_at_start(
    tmp_path: Path,
) -> None:
    logs = LogManager(tmp_path)
    logs.startup(node_id=BROKER)
    records = _cluster_records()
    records += [
        TopicRecord("orders", OLD_ID),
        PartitionRecord(OLD_ID, 0, (1,), (1,), 1),
        PartitionRecord(OLD_ID, 1, (2,), (2,), 2),
        TopicRecord("kept", NEW_ID),
        PartitionRecord(NEW_ID, 0, (1,), (1,), 1),
    ]
    PartitionManager(BROKER, logs).apply_image(replay(records, len(records)))
    # A replica moved away while the broker was down leaves its log here too.
    moved = TopicPartition("kept", 1)
    logs.get_or_create_log(moved)
    logs.assign_topic_id(moved, NEW_ID)
    logs.shutdown()

    restarted = LogManager(tmp_path)
    restarted.startup(node_id=BROKER)
    records = _cluster_records()
    records += [
        TopicRecord("kept", NEW_ID),
        PartitionRecord(NEW_ID, 0, (1,), (1,), 1),
        PartitionRecord(NEW_ID, 1, (2,), (2,), 2),
    ]
    image = replay(records, len(records))
    partitions = PartitionManager(BROKER, restarted)
    partitions.apply_image(image)
    assert sorted(restarted.logs) == [TopicPartition("kept", 0)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["kept-0"]
