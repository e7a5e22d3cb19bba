"""A broker's open logs take their topics' configs from each metadata image.

A topic's effective config (Kafka's defaults, the cluster defaults, the topic's
overrides) is parsed again only when one of those changed: an image whose records left a
topic's config alone keeps that topic's parsed ``LogConfig`` object, and a changed topic
(its AlterConfigs, or the cluster defaults) is parsed once and given to its open logs.
A leader takes a changed ``min.insync.replicas`` at once, as Kafka's does, for its next
check; a high watermark the strict min ISR held moves at the next append, follower fetch or
ISR change, not with the change itself (as Kafka's).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from highwater.broker.partitions import PartitionError, PartitionManager
from highwater.broker.replication import ProduceCompletion
from highwater.config.topic import LogConfig
from highwater.metadata import (
    BrokerEndpoint,
    ConfigRecord,
    MetadataImage,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    replay,
)
from highwater.metadata.records import ConfigResourceType
from highwater.records import SimpleRecord, build_batch
from highwater.storage.log_manager import LogManager
from highwater.v1.common_pb2 import ErrorCode

BROKER = 1


def cluster_with(*topics: str) -> MetadataImage:
    records: list[MetadataRecord] = []
    for broker_id in (1, 2, 3):
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092)
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id, (endpoint,)))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    for name in topics:
        records.append(TopicRecord(name, f"{name}-id"))
        for index in range(2):
            records.append(PartitionRecord(f"{name}-id", index, (1, 2, 3), (1, 2, 3), 1))
    return replay(records, len(records))


def then(image: MetadataImage, *records: MetadataRecord) -> MetadataImage:
    return replay(list(records), image.offset + len(records), image=image)


def configs(partitions: PartitionManager, topic: str) -> list[LogConfig]:
    return [partitions.get(topic, index).log.config for index in range(2)]


@pytest.fixture
def partitions(tmp_path: Path) -> PartitionManager:
    logs = LogManager(tmp_path)
    logs.startup(node_id=BROKER)
    return PartitionManager(BROKER, logs)


def test_only_a_topic_whose_config_changed_is_parsed_again(
    partitions: PartitionManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    log_config = MetadataImage.log_config

    def counting(
        self: MetadataImage,
        name: str,
        defaults: LogConfig | None = None,
        *,
        invalid: list[str] | None = None,
    ) -> LogConfig:
        parsed.append(name)
        return log_config(self, name, defaults, invalid=invalid)

    monkeypatch.setattr(MetadataImage, "log_config", counting)
    image = cluster_with("orders", "audit")
    partitions.apply_image(image)
    assert sorted(parsed) == ["audit", "orders"]
    orders_config, audit_config = configs(partitions, "orders")[0], configs(partitions, "audit")[0]
    assert configs(partitions, "orders") == [orders_config, orders_config]

    parsed.clear()
    altered = then(image, ConfigRecord(ConfigResourceType.TOPIC, "audit", "retention.ms", "60000"))
    partitions.apply_image(altered)
    assert parsed == ["audit"]
    assert all(config is orders_config for config in configs(partitions, "orders"))
    assert all(config.retention_ms == 60_000 for config in configs(partitions, "audit"))
    assert orders_config.retention_ms == audit_config.retention_ms != 60_000

    # An image that changed no config parses nothing.
    parsed.clear()
    partitions.apply_image(then(altered, TopicRecord("empty", "empty-id")))
    assert parsed == []


def test_a_cluster_default_reaches_every_topic_that_does_not_override_it(
    partitions: PartitionManager,
) -> None:
    image = then(
        cluster_with("orders", "audit"),
        ConfigRecord(ConfigResourceType.TOPIC, "audit", "segment.bytes", "1048576"),
    )
    partitions.apply_image(image)
    defaults = then(
        image, ConfigRecord(ConfigResourceType.BROKER, "", "log.segment.bytes", "2097152")
    )
    partitions.apply_image(defaults)
    assert {config.segment_bytes for config in configs(partitions, "orders")} == {2_097_152}
    assert {config.segment_bytes for config in configs(partitions, "audit")} == {1_048_576}

    # The override deleted: the topic takes the cluster default.
    cleared = then(defaults, ConfigRecord(ConfigResourceType.TOPIC, "audit", "segment.bytes", None))
    partitions.apply_image(cleared)
    assert {config.segment_bytes for config in configs(partitions, "audit")} == {2_097_152}


def test_a_leader_takes_a_changed_min_insync_replicas_at_once(
    partitions: PartitionManager,
) -> None:
    """Replicas 1, 2, 3 with an ISR of 1 and 2, led here: min.insync.replicas=2 lets an
    acks=all produce in; raised to 3 by an image, the next one is refused, and one that
    waited completes only under the value of its completion: the image that lowers the
    value again moves the high watermark."""
    records: list[MetadataRecord] = []
    for broker_id in (1, 2, 3):
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092)
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id, (endpoint,)))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    records += [
        TopicRecord("orders", "orders-id"),
        PartitionRecord("orders-id", 0, (1, 2, 3), (1, 2), BROKER),
        ConfigRecord(ConfigResourceType.TOPIC, "orders", "min.insync.replicas", "2"),
    ]
    image = replay(records, len(records))
    partitions.apply_image(image)
    leader = partitions.get("orders", 0)
    batch = build_batch([SimpleRecord(value=b"v")])

    first = leader.append(batch, -1)
    end = first.last_offset + 1
    leader.read_for_follower(2, end, 0, 1 << 20, leader.leader_epoch)
    assert leader.produce_completion(end) == ProduceCompletion(True, ErrorCode.NONE)
    waiting = leader.append(batch, -1)  # in purgatory: follower 2 has not fetched it yet
    waiting_end = waiting.last_offset + 1

    three = then(
        image, ConfigRecord(ConfigResourceType.TOPIC, "orders", "min.insync.replicas", "3")
    )
    partitions.apply_image(three)
    with pytest.raises(PartitionError) as refused:
        leader.append(batch, -1)
    assert refused.value.code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert leader.log_end_offset == waiting_end  # nothing appended
    # The waiting produce: its follower caught up, but the ISR is below the new minimum
    # and the high watermark stands still (strict min ISR).
    leader.read_for_follower(2, waiting_end, 0, 1 << 20, leader.leader_epoch)
    assert leader.high_watermark == end
    assert leader.produce_completion(waiting_end).completed is False

    # Back to 2: the high watermark moves with the config change itself (its follower has
    # the records already), and the waiting produce completes; the next append is let in.
    two = then(three, ConfigRecord(ConfigResourceType.TOPIC, "orders", "min.insync.replicas", "2"))
    partitions.apply_image(two)
    assert leader.high_watermark == leader.log.high_watermark == waiting_end
    leader.append(batch, -1)
    assert leader.produce_completion(waiting_end) == ProduceCompletion(True, ErrorCode.NONE)


def test_stored_values_that_no_longer_validate_are_left_out_and_logged(
    partitions: PartitionManager, caplog: pytest.LogCaptureFixture
) -> None:
    """A metadata log may hold values an earlier release allowed (``max.message.bytes``
    above today's 63 MiB cap, a key since unknown): the broker keeps serving the topic, the
    bad settings taking the layer below (the cluster default, then Kafka's), the rest of
    the topic's overrides applied, and each bad one logged as an error."""
    image = then(
        cluster_with("orders"),
        ConfigRecord(ConfigResourceType.TOPIC, "orders", "max.message.bytes", "104857600"),
        ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "60000"),
        ConfigRecord(ConfigResourceType.TOPIC, "orders", "retired.setting", "1"),
        ConfigRecord(ConfigResourceType.BROKER, "", "log.segment.bytes", "12"),
        ConfigRecord(ConfigResourceType.BROKER, "", "log.retention.bytes", "5000000"),
    )
    with caplog.at_level("ERROR", logger="highwater.broker.partitions"):
        partitions.apply_image(image)
    default = LogConfig()
    for config in configs(partitions, "orders"):
        assert config.max_message_bytes == default.max_message_bytes
        assert config.segment_bytes == default.segment_bytes
        assert config.retention_ms == 60_000  # the valid override
        assert config.retention_bytes == 5_000_000  # the valid cluster default
    errors = " ".join(record.getMessage() for record in caplog.records)
    assert "topic orders" in errors
    for key in ("max.message.bytes", "retired.setting", "log.segment.bytes"):
        assert key in errors
    # The topic takes appends and its next valid change as ever.
    partitions.get("orders", 0).log.append_as_leader(build_batch([SimpleRecord(value=b"v")]), 1)
    fixed = then(
        image, ConfigRecord(ConfigResourceType.TOPIC, "orders", "max.message.bytes", "2048")
    )
    partitions.apply_image(fixed)
    assert {config.max_message_bytes for config in configs(partitions, "orders")} == {2048}
