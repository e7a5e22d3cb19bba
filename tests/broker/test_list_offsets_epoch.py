"""The leader epoch ListOffsets answers beside each offset, as Kafka answers it.

``UnifiedLog.fetchOffsetByTimestamp``: ``EARLIEST`` answers the leader epoch cache's first
entry, ``MAX_TIMESTAMP`` and a timestamp the partition leader epoch of the batch that holds
the record found; ``LATEST`` (``Partition.fetchOffsetForTimestamp``) the current leader
epoch. A consumer that checks the epoch it is given (truncation detection) relies on it.
"""

from __future__ import annotations

from pathlib import Path

from highwater.broker.partitions import Partition
from highwater.config.topic import LogConfig
from highwater.metadata.image import PartitionRegistration
from highwater.records import SimpleRecord, build_batch
from highwater.storage.log_loader import load_partition_log
from highwater.storage.topic_partition import TopicPartition

NOW = 1_700_000_000_000


def test_each_lookup_answers_the_epoch_of_what_it_found(tmp_path: Path) -> None:
    log = load_partition_log(
        tmp_path / "t-0", LogConfig(), clock=lambda: NOW, had_clean_shutdown=True
    )
    for epoch, timestamp in ((0, NOW - 3000), (2, NOW - 1000), (4, NOW - 2000)):
        log.append_as_leader(build_batch([SimpleRecord(None, b"v", (), timestamp)]), epoch)
    log.update_high_watermark(log.log_end_offset)
    registration = PartitionRegistration(replicas=(1,), isr=(1,), leader=1, leader_epoch=5)
    partition = Partition(TopicPartition("t", 0), "id", log, registration, broker_id=1)
    partition.update(registration)
    assert partition.list_offset(-2, -1) == (-1, 0, 0)  # EARLIEST
    assert partition.list_offset(-1, -1) == (-1, 3, 5)  # LATEST
    assert partition.list_offset(-3, -1) == (NOW - 1000, 1, 2)  # MAX_TIMESTAMP
    assert partition.list_offset(NOW - 2500, -1) == (NOW - 1000, 1, 2)
    assert partition.list_offset(NOW - 2000, -1) == (NOW - 1000, 1, 2)
    assert partition.list_offset(NOW - 3000, -1) == (NOW - 3000, 0, 0)
    assert partition.list_offset(NOW, -1) == (-1, -1, -1)  # none that late
    log.close()
