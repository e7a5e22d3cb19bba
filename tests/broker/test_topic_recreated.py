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
