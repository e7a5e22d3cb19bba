"""``partition.metadata``: Kafka's two-line format, written durably, read at load; a
corrupted one takes its log directory offline with an error naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from highwater.errors import KafkaStorageError
from highwater.storage.log_manager import LogManager
from highwater.storage.partition_metadata import (
    PARTITION_METADATA,
    InconsistentPartitionMetadataError,
    read_topic_id,
    write_topic_id,
)
from highwater.storage.topic_partition import TopicPartition

TOPIC_ID = "q1Zk3PxeTTOM7fTuO0ILIw"


def test_the_file_is_kafkas_format(tmp_path: Path) -> None:
    write_topic_id(tmp_path, TOPIC_ID)
    assert (tmp_path / PARTITION_METADATA).read_text() == f"version: 0\ntopic_id: {TOPIC_ID}\n"
    assert read_topic_id(tmp_path) == TOPIC_ID
    assert [p.name for p in tmp_path.iterdir()] == [PARTITION_METADATA]


def test_a_directory_without_the_file_records_no_topic_id(tmp_path: Path) -> None:
    assert read_topic_id(tmp_path) is None


@pytest.mark.parametrize(
    "text",
    [
        f"version: 1\ntopic_id: {TOPIC_ID}\n",
        "version: 0\n",
        "version: 0\ntopic_id: not a uuid!\n",
        "garbage",
    ],
)
def test_a_malformed_file_is_a_typed_error_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / PARTITION_METADATA).write_text(text)
    with pytest.raises(InconsistentPartitionMetadataError, match=PARTITION_METADATA):
        read_topic_id(tmp_path)


def test_the_assigned_topic_id_is_read_at_the_next_start(tmp_path: Path) -> None:
    tp = TopicPartition("orders", 0)
    logs = LogManager(tmp_path)
    logs.startup(node_id=1)
    logs.get_or_create_log(tp)
    assert logs.topic_id(tp) is None
    logs.assign_topic_id(tp, TOPIC_ID)
    logs.shutdown()
    restarted = LogManager(tmp_path)
    restarted.startup(node_id=1)
    assert restarted.topic_id(tp) == TOPIC_ID
    restarted.shutdown()


def test_a_corrupted_file_takes_its_directory_offline_not_the_broker(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    logs = LogManager([first, second])
    logs.startup(node_id=1)
    broken, healthy = TopicPartition("orders", 0), TopicPartition("orders", 1)
    logs.get_or_create_log(broken)
    logs.get_or_create_log(healthy)
    logs.assign_topic_id(broken, TOPIC_ID)
    logs.assign_topic_id(healthy, TOPIC_ID)
    broken_dir = logs.directory_of(broken)
    assert broken_dir is not None and broken_dir is not logs.directory_of(healthy)
    logs.shutdown()
    (broken_dir.path / broken.dir_name / PARTITION_METADATA).write_text("version: 7\n")

    restarted = LogManager([first, second])
    restarted.startup(node_id=1)
    assert [d.path for d in restarted.offline_dirs] == [broken_dir.path]
    assert PARTITION_METADATA in (restarted.offline_dirs[0].error or "")
    assert restarted.get_log(broken) is None
    with pytest.raises(KafkaStorageError, match="offline"):
        restarted.check_creatable(broken)
    assert restarted.get_log(healthy) is not None
    restarted.shutdown()


def test_a_file_is_not_written_into_a_deleted_logs_directory(tmp_path: Path) -> None:
    # The ids recorded at an upgrade are written from a worker thread while the loop may
    # delete the log: the write and the deletion exclude each other, and after the deletion
    # the write does not run (a file appearing in a directory being removed would fail its
    # rmdir, and the log directory with it).
    tp = TopicPartition("orders", 0)
    logs = LogManager(tmp_path)
    logs.startup(node_id=1)
    partition_log = logs.get_or_create_log(tp)
    assert partition_log.write_in_directory(lambda d: write_topic_id(d, TOPIC_ID))
    assert read_topic_id(tmp_path / tp.dir_name) == TOPIC_ID
    logs.delete_logs([tp])
    assert not partition_log.write_in_directory(lambda d: write_topic_id(d, TOPIC_ID))
    assert not (tmp_path / tp.dir_name).exists() and logs.online_dirs
    logs.shutdown()
