"""New replicas' logs are created off the broker's event loop, then take their roles.

A thousand new logs are seconds of directories, files and fsyncs; made on the event loop
they stalled heartbeats, fetches and produce for that long. The broker now plans them on
the loop, makes their files in a worker thread and adopts them on the loop again
(``PartitionManager.apply_image(create_logs=False)`` and ``create_logs``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from highwater.broker.partitions import PartitionError, PartitionManager
from highwater.metadata import (
    BrokerEndpoint,
    FenceBrokerRecord,
    MetadataImage,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    replay,
)
from highwater.storage import log_manager as log_manager_module
from highwater.storage.log_manager import LogManager
from highwater.storage.partition_metadata import PARTITION_METADATA, read_topic_id
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode

BROKER = 1
PARTITIONS = 40


def with_topic(partitions: int) -> MetadataImage:
    records: list[MetadataRecord] = []
    for broker_id in (1, 2, 3):
        endpoint = BrokerEndpoint("PLAINTEXT", f"b{broker_id}", 9092)
        records.append(RegisterBrokerRecord(broker_id, f"inc-{broker_id}", broker_id, (endpoint,)))
        records.append(UnfenceBrokerRecord(broker_id, broker_id))
    records.append(TopicRecord("orders", "orders-id"))
    for index in range(partitions):
        leader = (1, 2, 3)[index % 3]
        records.append(PartitionRecord("orders-id", index, (1, 2, 3), (1, 2, 3), leader))
    return replay(records, len(records))


@pytest.fixture
def partitions(tmp_path: Path) -> PartitionManager:
    logs = LogManager(tmp_path)
    logs.startup(node_id=BROKER)
    return PartitionManager(BROKER, logs)


async def test_new_logs_are_made_in_a_worker_thread_then_take_their_roles(
    partitions: PartitionManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    load = log_manager_module.load_partition_log
    threads: set[int] = set()

    def recording_load(*args: object, **kwargs: object) -> object:
        threads.add(threading.get_ident())
        return load(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(log_manager_module, "load_partition_log", recording_load)
    image = with_topic(PARTITIONS)

    to_create = partitions.apply_image(image, create_logs=False)

    assert sorted(tp.partition for tp, _ in to_create) == list(range(PARTITIONS))
    assert not threads and not partitions.log_manager.logs
    with pytest.raises(PartitionError, match="still creating its log") as refused:
        partitions.get("orders", 0)
    assert refused.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER

    await partitions.create_logs(to_create)
    assert threads and threading.get_ident() not in threads
    assert len(partitions.log_manager.logs) == PARTITIONS

    assert partitions.apply_image(image, create_logs=False) == []
    leaders = [p.topic_partition.partition for p in partitions if p.is_leader]
    assert leaders == [i for i in range(PARTITIONS) if i % 3 == 0]


async def test_logs_made_for_a_topic_deleted_meanwhile_are_removed(
    partitions: PartitionManager, tmp_path: Path
) -> None:
    image = with_topic(PARTITIONS)
    to_create = partitions.apply_image(image, create_logs=False)
    await partitions.create_logs(to_create)
    assert any(tmp_path.glob("orders-*"))

    deleted = replay([RemoveTopicRecord("orders-id")], image.offset + 1, image=image)
    assert partitions.apply_image(deleted, create_logs=False) == []

    assert not partitions.log_manager.logs
    assert not any(tmp_path.glob("orders-*"))
    with pytest.raises(PartitionError) as refused:
        partitions.get("orders", 0)
    assert refused.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_a_replica_whose_directory_is_offline_is_refused_not_queued(
    partitions: PartitionManager,
) -> None:
    """A log a failed directory may hold is not created elsewhere: the replica is
    reported offline (KAFKA_STORAGE_ERROR), as when logs are created on the loop."""
    (directory,) = partitions.log_manager.log_dirs
    partitions.log_manager.fail_dir(directory, OSError(5, "Input/output error"))

    assert partitions.apply_image(with_topic(3), create_logs=False) == []

    with pytest.raises(PartitionError) as refused:
        partitions.get("orders", 1)
    assert refused.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert len(partitions.offline()) == 3


async def test_an_image_costs_the_topics_it_changed_and_still_applies_every_change(
    partitions: PartitionManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Topics an image shares with the one applied before are passed over; a changed
    topic, a new one, and a broker fenced (eligibility of every led partition) are not."""
    image = with_topic(PARTITIONS)
    await partitions.create_logs(partitions.apply_image(image, create_logs=False))
    assert partitions.apply_image(image, create_logs=False) == []

    applied: list[str] = []
    apply_topic = PartitionManager._apply_topic

    def recording(self: PartitionManager, image: MetadataImage, topic: object, *a: object):  # type: ignore[no-untyped-def]
        applied.append(topic.name)  # type: ignore[attr-defined]
        return apply_topic(self, image, topic, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(PartitionManager, "_apply_topic", recording)
    records: list[MetadataRecord] = [TopicRecord("audit", "audit-id")]
    records += [PartitionRecord("audit-id", i, (1, 2, 3), (1, 2, 3), 1) for i in range(3)]
    grown = replay(records, image.offset + len(records), image=image)
    await partitions.create_logs(partitions.apply_image(grown, create_logs=False))
    partitions.apply_image(grown, create_logs=False)
    assert applied == ["audit", "audit"]  # planned, then adopted; "orders" untouched
    assert partitions.get("audit", 0).is_leader

    applied.clear()
    shrunk = replay(
        [PartitionChangeRecord("orders-id", 0, isr=(1, 2))], grown.offset + 1, image=grown
    )
    partitions.apply_image(shrunk, create_logs=False)
    assert applied == ["orders"]
    assert partitions.get("orders", 0).registration.isr == (1, 2)

    applied.clear()
    fenced = replay([FenceBrokerRecord(3, 3)], shrunk.offset + 1, image=shrunk)
    partitions.apply_image(fenced, create_logs=False)
    assert sorted(applied) == ["audit", "orders"]
    leader_state = partitions.get("orders", 3).leader_state
    assert leader_state is not None and leader_state.ineligible_replicas == frozenset({3})


async def test_new_logs_record_their_topic_id_in_the_worker_thread(
    partitions: PartitionManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``partition.metadata`` is written with the log's files, off the event loop: made on
    the loop it would be two fsyncs per new partition there (seconds for a large topic)."""
    write = log_manager_module.write_topic_id
    threads: set[int] = set()

    def recording_write(log_dir: Path, topic_id: str) -> None:
        threads.add(threading.get_ident())
        write(log_dir, topic_id)

    monkeypatch.setattr(log_manager_module, "write_topic_id", recording_write)
    image = with_topic(PARTITIONS)
    to_create = partitions.apply_image(image, create_logs=False)
    await partitions.create_logs(to_create)
    partitions.apply_image(image, create_logs=False)  # the new logs take their roles

    assert len(threads) >= 1 and threading.get_ident() not in threads
    manager = partitions.log_manager
    assert {manager.topic_id(tp) for tp, _ in to_create} == {"orders-id"}
    for tp, _ in to_create:
        assert (
            "topic_id: orders-id"
            in (manager.get_log(tp).directory / "partition.metadata").read_text()
        )


def logs_made_before_partition_metadata(data_dir: Path) -> LogManager:
    """A log manager started on logs of "orders" whose directories have no
    ``partition.metadata`` (made by a version before the file existed)."""
    logs = LogManager(data_dir)
    logs.startup(node_id=BROKER)
    for index in range(PARTITIONS):
        logs.get_or_create_log(TopicPartition("orders", index))
    logs.shutdown()
    for index in range(PARTITIONS):
        assert not (data_dir / f"orders-{index}" / PARTITION_METADATA).exists()
    restarted = LogManager(data_dir)
    restarted.startup(node_id=BROKER)
    return restarted


async def test_logs_made_before_partition_metadata_record_their_topic_id_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first image after an upgrade gives every log made before ``partition.metadata``
    existed its topic id. The id holds at once and the replicas take their roles; the files
    (two fsyncs each) are written in a worker thread, not on the event loop."""
    write = log_manager_module.write_topic_id
    threads: set[int] = set()

    def recording_write(log_dir: Path, topic_id: str) -> None:
        threads.add(threading.get_ident())
        write(log_dir, topic_id)

    monkeypatch.setattr(log_manager_module, "write_topic_id", recording_write)
    logs = logs_made_before_partition_metadata(tmp_path)
    partitions = PartitionManager(BROKER, logs)

    assert partitions.apply_image(with_topic(PARTITIONS), create_logs=False) == []
    assert not threads  # nothing written on the loop
    assert partitions.get("orders", 0).is_leader
    tps = [TopicPartition("orders", index) for index in range(PARTITIONS)]
    assert {logs.topic_id(tp) for tp in tps} == {"orders-id"}

    await logs.write_topic_ids()
    assert threads and threading.get_ident() not in threads
    assert {read_topic_id(tmp_path / tp.dir_name) for tp in tps} == {"orders-id"}
    assert not logs.has_unwritten_topic_ids


async def test_a_log_deleted_before_its_topic_id_is_written_is_passed_over(
    tmp_path: Path,
) -> None:
    logs = logs_made_before_partition_metadata(tmp_path)
    partitions = PartitionManager(BROKER, logs)
    image = with_topic(PARTITIONS)
    partitions.apply_image(image, create_logs=False)
    # The topic is deleted before the background writes the ids.
    deleted = replay([RemoveTopicRecord("orders-id")], image.offset + 1, image=image)
    partitions.apply_image(deleted, create_logs=False)
    await logs.write_topic_ids()
    assert logs.online_dirs and not logs.logs
    assert not list(tmp_path.glob("orders-*"))


def test_topic_ids_not_written_yet_are_written_at_shutdown(tmp_path: Path) -> None:
    logs = logs_made_before_partition_metadata(tmp_path)
    PartitionManager(BROKER, logs).apply_image(with_topic(PARTITIONS), create_logs=False)
    assert logs.has_unwritten_topic_ids
    logs.shutdown()
    tps = [TopicPartition("orders", index) for index in range(PARTITIONS)]
    assert {read_topic_id(tmp_path / tp.dir_name) for tp in tps} == {"orders-id"}
