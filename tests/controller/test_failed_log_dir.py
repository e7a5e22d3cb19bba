"""A failed log directory (EIO) on a leader, from the broker's core to the controller.

The broker's :class:`~highwater.broker.partitions.PartitionManager` over a real two-directory
:class:`~highwater.storage.log_manager.LogManager`, and the real controller: a leader whose
log can no longer be read stops leading at once, reports the replica offline in its
heartbeat, and the controller moves the leadership away and drops it from the ISR (Kafka's
``LogDirFailureChannel`` and ``handleDirectoriesOffline``); the replicas in the other
directory serve on. Only the disk's failure is put in by hand (an ``EIO`` from the
segment reads of one directory).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest
from controller_helpers import NONE, Harness
from highwater.broker.partitions import MAX_TIMESTAMP, PartitionError, PartitionManager
from highwater.controller_api.messages import BrokerHeartbeatRequest
from highwater.errors import KafkaStorageError
from highwater.records import SimpleRecord, build_batch
from highwater.records.header import BatchHeader
from highwater.storage.log_manager import LogManager
from highwater.storage.segment import LogSegment
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode

BROKER = 1


def broker_one(h: Harness, tmp_path: Path) -> tuple[LogManager, PartitionManager]:
    """Broker 1's core over two log directories, with the service's listener: a failed
    directory's replicas stop replicating at once."""
    manager = LogManager([tmp_path / "d0", tmp_path / "d1"])
    manager.startup(node_id=BROKER)
    partitions = PartitionManager(BROKER, manager)
    manager.add_failure_listener(lambda _directory: partitions.stop_offline())
    partitions.apply_image(h.image)
    return manager, partitions


def heartbeat(h: Harness, partitions: PartitionManager) -> None:
    dirs, replicas = partitions.offline_report()
    response = h.commit(
        h.controller.broker_heartbeat(
            BrokerHeartbeatRequest(
                BROKER,
                h.epochs[BROKER],
                h.image.offset,
                offline_log_dirs=tuple(dirs),
                offline_replicas=tuple(replicas),
            ),
            h.clock.now_ms,
        )
    )
    assert response.error == NONE


def led_by(h: Harness, broker: int) -> list[int]:
    return [i for i in range(6) if h.partition("t", i).leader == broker]


def test_a_leader_that_cannot_read_its_log_stops_leading_and_the_controller_moves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness()
    h.start_brokers((1, 2, 3))
    h.create_topic("t", 6, 3, {"min.insync.replicas": "1"})
    manager, partitions = broker_one(h, tmp_path)
    led = led_by(h, BROKER)
    assert led, "broker 1 leads some partition"
    index = led[0]
    tp = TopicPartition("t", index)
    failed = manager.directory_of(tp)
    assert failed is not None
    elsewhere = [
        TopicPartition("t", i)
        for i in range(6)
        if manager.directory_of(TopicPartition("t", i)) not in (failed, None)
    ]
    assert elsewhere, "the other directory holds replicas too"
    partition = partitions.get("t", index)
    epoch = partition.leader_epoch
    partition.append(build_batch([SimpleRecord(value=b"v")]), 1)

    real_read = LogSegment.read

    def read(self: LogSegment, *args: object, **kwargs: object) -> object:
        if failed.path in self.log_path.parents:
            raise OSError(errno.EIO, "Input/output error", str(self.log_path))
        return real_read(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LogSegment, "read", read)

    # A follower's fetch meets the failed disk: the log, then its directory, go offline,
    # and the partition stops leading at once (no leader state left to answer from).
    with pytest.raises(KafkaStorageError):
        partition.read_for_follower(2, 0, -1, 1 << 20, epoch)
    assert not failed.online and partition.leader_state is None
    assert partition.follower_state is None
    with pytest.raises(PartitionError) as refused:
        partitions.get("t", index)
    assert refused.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    offline = {TopicPartition("t", r.partition_id) for r in partitions.offline_report()[1]}
    assert tp in offline and not offline & set(elsewhere)
    assert partitions.offline_report()[0] == [failed.directory_id]

    # The heartbeat tells the controller: another ISR member leads, broker 1 leaves the
    # ISR of every replica of the failed directory, and of no other.
    heartbeat(h, partitions)
    for i in range(6):
        registration = h.partition("t", i)
        if TopicPartition("t", i) in offline:
            assert registration.leader not in (BROKER, -1)
            assert BROKER not in registration.isr
        else:
            assert BROKER in registration.isr
    # Broker 1 applies the new metadata: the offline replica takes no role, the others
    # go on as the image says.
    partitions.apply_image(h.image)
    assert partition.leader_state is None and partition.follower_state is None
    for other in elsewhere:
        served = partitions.get("t", other.partition)
        assert (served.leader_state is not None) == served.is_leader
        assert (served.follower_state is not None) == (not served.is_leader)
    manager.shutdown()


def test_a_leader_whose_log_fails_a_batch_scan_goes_offline_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ListOffsets for the largest timestamp scans the batch headers (``iter_batches``,
    a generator the read guard did not cover): an EIO there escaped as a bare OSError
    and the leader went on leading over a disk that failed its reads."""
    h = Harness()
    h.start_brokers((1, 2, 3))
    h.create_topic("t", 6, 3, {"min.insync.replicas": "1"})
    manager, partitions = broker_one(h, tmp_path)
    index = led_by(h, BROKER)[0]
    partition = partitions.get("t", index)
    partition.append(build_batch([SimpleRecord(value=b"v")]), 1)
    partition.log.update_high_watermark(1)
    failed = manager.directory_of(TopicPartition("t", index))
    assert failed is not None
    assert partition.list_offset(MAX_TIMESTAMP, partition.leader_epoch)[1] == 0
    real_headers = LogSegment.iter_headers

    def iter_headers(self: LogSegment, position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        if failed.path in self.log_path.parents:
            raise OSError(errno.EIO, "Input/output error", str(self.log_path))
        return real_headers(self, position)

    monkeypatch.setattr(LogSegment, "iter_headers", iter_headers)
    with pytest.raises(KafkaStorageError):
        partition.list_offset(MAX_TIMESTAMP, partition.leader_epoch)
    assert not failed.online and partition.leader_state is None
    heartbeat(h, partitions)
    assert h.partition("t", index).leader not in (BROKER, -1)
    manager.shutdown()
