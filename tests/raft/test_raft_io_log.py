"""``PartitionRaftLog`` behaves as the core's ``InMemoryRaftLog``, and survives restarts.

The behaviour tests run against both implementations (the ``raft_log`` fixture), so the
on-disk log is held to the same contract the Raft core is tested with; the restart tests
are the disk's own: recovery, the log start after snapshots, group-commit flushes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from highwater.errors import (
    InvalidRecordError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    UnexpectedAppendOffsetError,
)
from highwater.raft.log import InMemoryRaftLog
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.partition_raft_log import (
    METADATA_TOPIC_PARTITION,
    PartitionRaftLog,
    metadata_log_config,
    metadata_log_dir,
)
from highwater.records import SimpleRecord, build_batch, iter_batches

LogFactory = Callable[[], Any]


def _entries(raft_log: Any) -> list[tuple[int, int, bytes | None]]:
    """(offset, epoch, value) of every entry, read back through ``read``."""
    out: list[tuple[int, int, bytes | None]] = []
    offset = raft_log.start_offset
    while offset < raft_log.end_offset:
        data = raft_log.read(offset, 1 << 20)
        for batch in iter_batches(data):
            for record in batch.records():
                if record.offset >= offset:
                    out.append((record.offset, batch.partition_leader_epoch, record.value))
            offset = batch.next_offset
    return out


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return metadata_log_dir(tmp_path)


@pytest.fixture(params=["in-memory", "partition"])
def raft_log(request: pytest.FixtureRequest, log_dir: Path) -> Iterator[Any]:
    if request.param == "in-memory":
        yield InMemoryRaftLog()
        return
    opened = PartitionRaftLog.open(log_dir, config=metadata_log_config(segment_bytes=512))
    yield opened
    opened.close()


# --- the RaftLog contract, on both -----------------------------------------------------


def test_empty_log(raft_log: Any) -> None:
    assert (raft_log.start_offset, raft_log.end_offset, raft_log.last_epoch) == (0, 0, 0)
    assert raft_log.end_offset_for_epoch(0) == OffsetAndEpoch(0, 0)
    assert raft_log.read(0, 100) == b""


def test_append_as_leader_returns_the_last_entry_and_reads_back(raft_log: Any) -> None:
    assert raft_log.append_as_leader([b"a", b"b"], 1) == OffsetAndEpoch(1, 1)
    assert raft_log.append_as_leader([b"c"], 1) == OffsetAndEpoch(2, 1)
    assert raft_log.append_as_leader([b"d"], 3) == OffsetAndEpoch(3, 3)
    assert raft_log.end_offset == 4
    assert raft_log.last_epoch == 3
    assert _entries(raft_log) == [(0, 1, b"a"), (1, 1, b"b"), (2, 1, b"c"), (3, 3, b"d")]
    with pytest.raises(InvalidRecordError):
        raft_log.append_as_leader([b"e"], 2)
    with pytest.raises(ValueError):
        raft_log.append_as_leader([], 3)


def test_control_batches_are_marked(raft_log: Any) -> None:
    raft_log.append_as_leader([b"leader-change"], 1, control=True)
    (batch,) = list(iter_batches(raft_log.read(0, 1000)))
    assert batch.is_control
    assert batch.partition_leader_epoch == 1


def test_end_offset_for_epoch(raft_log: Any) -> None:
    raft_log.append_as_leader([b"a", b"b"], 1)  # 0, 1
    raft_log.append_as_leader([b"c"], 3)  # 2
    raft_log.append_as_leader([b"d", b"e"], 5)  # 3, 4
    assert raft_log.end_offset_for_epoch(0) == OffsetAndEpoch(0, 0)
    assert raft_log.end_offset_for_epoch(1) == OffsetAndEpoch(2, 1)
    assert raft_log.end_offset_for_epoch(2) == OffsetAndEpoch(2, 1)
    assert raft_log.end_offset_for_epoch(3) == OffsetAndEpoch(3, 3)
    assert raft_log.end_offset_for_epoch(4) == OffsetAndEpoch(3, 3)
    assert raft_log.end_offset_for_epoch(5) == OffsetAndEpoch(5, 5)
    assert raft_log.end_offset_for_epoch(9) == OffsetAndEpoch(5, 5)


def test_append_as_follower_keeps_offsets_and_epochs(raft_log: Any) -> None:
    leader = InMemoryRaftLog()
    leader.append_as_leader([b"a"], 1)
    leader.append_as_leader([b"b", b"c"], 2)
    raft_log.append_as_follower(leader.read(0, 1 << 20))
    assert _entries(raft_log) == [(0, 1, b"a"), (1, 2, b"b"), (2, 2, b"c")]
    assert raft_log.last_epoch == 2
    raft_log.append_as_follower(b"")
    assert raft_log.end_offset == 3


def test_append_as_follower_rejects_gaps_and_older_epochs(raft_log: Any) -> None:
    leader = InMemoryRaftLog()
    leader.append_as_leader([b"a"], 1)
    leader.append_as_leader([b"b"], 2)
    with pytest.raises(UnexpectedAppendOffsetError):
        raft_log.append_as_follower(leader.read(1, 1 << 20))
    raft_log.append_as_leader([b"x"], 3)
    with pytest.raises(InvalidRecordError):
        raft_log.append_as_follower(leader.read(1, 1 << 20))
    assert raft_log.end_offset == 1


def test_read_bounds(raft_log: Any) -> None:
    raft_log.append_as_leader([b"a", b"b"], 1)
    raft_log.append_as_leader([b"c"], 1)
    # A read from inside a batch returns the whole batch holding the offset.
    (first, *_) = list(iter_batches(raft_log.read(1, 1 << 20)))
    assert first.base_offset == 0
    # At least one batch, whatever max_bytes says.
    assert len(list(iter_batches(raft_log.read(0, 1)))) == 1
    assert raft_log.read(3, 100) == b""
    with pytest.raises(OffsetOutOfRangeError):
        raft_log.read(4, 100)


def test_truncate_to(raft_log: Any) -> None:
    raft_log.append_as_leader([b"a"], 1)
    raft_log.append_as_leader([b"b", b"c"], 2)
    raft_log.append_as_leader([b"d"], 3)
    raft_log.truncate_to(9)  # past the end: nothing happens
    assert raft_log.end_offset == 4
    with pytest.raises(ValueError):
        raft_log.truncate_to(2)  # inside a batch
    raft_log.truncate_to(1)
    assert raft_log.end_offset == 1
    assert raft_log.last_epoch == 1
    assert raft_log.end_offset_for_epoch(2) == OffsetAndEpoch(1, 1)
    assert raft_log.flushed_offset <= 1
    raft_log.append_as_leader([b"e"], 4)
    assert _entries(raft_log) == [(0, 1, b"a"), (1, 4, b"e")]


def test_delete_before_keeps_the_snapshot_epoch(raft_log: Any) -> None:
    raft_log.append_as_leader([b"a"], 1)  # 0
    raft_log.append_as_leader([b"b"], 2)  # 1
    raft_log.append_as_leader([b"c"], 4)  # 2
    raft_log.delete_before(0)
    assert raft_log.start_offset == 0
    raft_log.delete_before(2)
    assert raft_log.start_offset == 2
    assert raft_log.end_offset == 3
    assert _entries(raft_log) == [(2, 4, b"c")]
    # Epochs the log no longer holds: the answer is the start and the snapshot's epoch.
    assert raft_log.end_offset_for_epoch(1) == OffsetAndEpoch(2, 2)
    assert raft_log.end_offset_for_epoch(3) == OffsetAndEpoch(2, 2)
    with pytest.raises(OffsetOutOfRangeError):
        raft_log.read(1, 100)
    raft_log.delete_before(3)
    assert (raft_log.start_offset, raft_log.end_offset, raft_log.last_epoch) == (3, 3, 4)
    with pytest.raises(OffsetOutOfRangeError):
        raft_log.delete_before(5)
    with pytest.raises(OffsetOutOfRangeError):
        raft_log.truncate_to(2)


def test_truncate_to_snapshot(raft_log: Any) -> None:
    raft_log.append_as_leader([b"a", b"b"], 1)
    raft_log.truncate_to_snapshot(OffsetAndEpoch(10, 3))
    assert (raft_log.start_offset, raft_log.end_offset, raft_log.last_epoch) == (10, 10, 3)
    assert raft_log.flushed_offset == 10
    assert raft_log.end_offset_for_epoch(2) == OffsetAndEpoch(10, 3)
    assert raft_log.end_offset_for_epoch(3) == OffsetAndEpoch(10, 3)
    raft_log.append_as_leader([b"k"], 5)
    assert raft_log.end_offset_for_epoch(4) == OffsetAndEpoch(10, 3)
    assert _entries(raft_log) == [(10, 5, b"k")]


def test_a_read_repeated_after_a_change_sees_the_change(raft_log: Any) -> None:
    # The same read (offset and size) before and after each change: the partition log
    # keeps its last read, which must not outlive a truncation, an append or a new start.
    def values(offset: int) -> list[bytes | None]:
        return [r.value for b in iter_batches(raft_log.read(offset, 1 << 20)) for r in b.records()]

    raft_log.append_as_leader([b"a"], 1)  # 0
    raft_log.append_as_leader([b"b"], 1)  # 1
    assert values(1) == [b"b"]
    raft_log.truncate_to(1)
    assert values(1) == []
    raft_log.append_as_leader([b"c"], 2)  # 1 again, another entry
    assert values(1) == [b"c"]
    raft_log.append_as_leader([b"d"], 2)  # 2
    assert values(1) == [b"c", b"d"]
    follower = InMemoryRaftLog()
    follower.append_as_leader([b"x"], 1)
    follower.append_as_leader([b"y"], 3)
    raft_log.truncate_to(1)
    assert values(1) == []
    raft_log.append_as_follower(follower.read(1, 1 << 20))
    assert values(1) == [b"y"]
    raft_log.delete_before(1)
    assert values(1) == [b"y"]
    raft_log.truncate_to_snapshot(OffsetAndEpoch(1, 3))
    assert values(1) == []


# --- the disk: flushes, restarts, snapshots ----------------------------------------------


def test_directory_is_the_metadata_partition(tmp_path: Path) -> None:
    assert metadata_log_dir(tmp_path) == tmp_path / "__cluster_metadata-0"
    assert METADATA_TOPIC_PARTITION.dir_name == "__cluster_metadata-0"


def test_flush_covers_every_append_since_the_last(log_dir: Path) -> None:
    raft_log = PartitionRaftLog.open(log_dir)
    try:
        raft_log.append_as_leader([b"a"], 1)
        raft_log.append_as_leader([b"b"], 1)
        assert raft_log.flushed_offset == 0
        assert raft_log.flush() == 2
        assert raft_log.flushed_offset == 2
        # A flush in a worker thread while the owner keeps appending.
        result: list[int] = []
        worker = threading.Thread(target=lambda: result.append(raft_log.flush()))
        raft_log.append_as_leader([b"c"], 1)
        worker.start()
        raft_log.append_as_leader([b"d"], 1)
        worker.join()
        assert 2 <= result[0] <= 4
        assert raft_log.flush() == 4
    finally:
        raft_log.close()


def test_reopen_keeps_entries_and_epochs(log_dir: Path) -> None:
    raft_log = PartitionRaftLog.open(log_dir, config=metadata_log_config(segment_bytes=300))
    for epoch in (1, 1, 2, 2, 2, 5):
        raft_log.append_as_leader([b"v" * 50], epoch)
    raft_log.flush()
    before = _entries(raft_log)
    raft_log.close()
    reopened = PartitionRaftLog.open(log_dir, config=metadata_log_config(segment_bytes=300))
    try:
        assert len(reopened.partition_log.segments) > 1
        assert _entries(reopened) == before
        assert reopened.last_epoch == 5
        assert reopened.flushed_offset == reopened.end_offset == 6
        assert reopened.end_offset_for_epoch(1) == OffsetAndEpoch(2, 1)
        assert reopened.end_offset_for_epoch(4) == OffsetAndEpoch(5, 2)
    finally:
        reopened.close()


def test_unflushed_tail_that_reached_the_disk_counts_as_flushed_after_a_crash(
    log_dir: Path,
) -> None:
    raft_log = PartitionRaftLog.open(log_dir)
    raft_log.append_as_leader([b"a"], 1)
    raft_log.flush()
    raft_log.append_as_leader([b"b"], 2)
    # No close: the process dies; the bytes are in the page cache, the epoch cache is not.
    reopened = PartitionRaftLog.open(log_dir)
    try:
        assert _entries(reopened) == [(0, 1, b"a"), (1, 2, b"b")]
        assert reopened.last_epoch == 2
        assert reopened.flushed_offset == 2
    finally:
        reopened.close()
        raft_log.partition_log.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names fds through /proc")
def test_a_flush_syncs_the_logs_and_a_load_rebuilds_the_indexes_it_left(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every load re-validates every segment and rebuilds its indexes from the log, so a
    flush (on a voter, before each acknowledgement) syncs the segments' logs only; here
    the process dies after flushing and the index files' pages never reached the disk."""
    config = metadata_log_config(segment_bytes=400)
    raft_log = PartitionRaftLog.open(log_dir, config=config)
    raft_log.append_as_leader([b"v" * 50], 1)
    raft_log.flush()  # the first flush also writes the epoch checkpoint
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for _ in range(9):
        raft_log.append_as_leader([b"v" * 50], 1)
        raft_log.flush()
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert sum(name.endswith(".log") for name in synced) >= 9
    assert not [name for name in synced if name.endswith(("index", "timeindex"))]
    segments = raft_log.partition_log.segments
    assert len(segments) > 1
    before = _entries(raft_log)
    indexed = [(s.offset_index.entries, s.time_index.entries) for s in segments]
    assert sum(entries for entries, _ in indexed) >= 5
    for segment in segments:
        for index in (segment.offset_index, segment.time_index):
            index.path.write_bytes(b"")  # lost with the page cache
    reopened = PartitionRaftLog.open(log_dir, config=config)
    try:
        assert _entries(reopened) == before
        assert [
            (s.offset_index.entries, s.time_index.entries) for s in reopened.partition_log.segments
        ] == indexed
        assert reopened.end_offset_for_epoch(1) == OffsetAndEpoch(10, 1)
    finally:
        reopened.close()
        for segment in segments:
            segment.close()


def test_torn_tail_is_cut_on_open(log_dir: Path) -> None:
    raft_log = PartitionRaftLog.open(log_dir)
    raft_log.append_as_leader([b"a"], 1)
    raft_log.append_as_leader([b"b" * 100], 1)
    raft_log.close()
    segment = log_dir / "00000000000000000000.log"
    data = segment.read_bytes()
    segment.write_bytes(data[:-20])
    reopened = PartitionRaftLog.open(log_dir)
    try:
        assert _entries(reopened) == [(0, 1, b"a")]
    finally:
        reopened.close()


def test_delete_before_removes_whole_segments_and_survives_restart(log_dir: Path) -> None:
    config = metadata_log_config(segment_bytes=300)
    raft_log = PartitionRaftLog.open(log_dir, config=config)
    for i in range(12):
        raft_log.append_as_leader([b"%02d" % i + b"x" * 60], 1 + i // 4)
    raft_log.flush()
    segments_before = len(raft_log.partition_log.segments)
    raft_log.delete_before(9)
    assert raft_log.start_offset == 9
    assert len(raft_log.partition_log.segments) < segments_before
    assert not list(log_dir.glob("*.deleted"))
    raft_log.close()
    # The first segment may begin before 9: the snapshot at 9 settles the start again.
    reopened = PartitionRaftLog.open(log_dir, snapshots=[OffsetAndEpoch(9, 3)], config=config)
    try:
        assert reopened.start_offset == 9
        assert reopened.end_offset_for_epoch(1) == OffsetAndEpoch(9, 3)
        assert [offset for offset, _, _ in _entries(reopened)] == [9, 10, 11]
    finally:
        reopened.close()


def test_log_start_without_a_covering_snapshot_refuses_to_open(log_dir: Path) -> None:
    config = metadata_log_config(segment_bytes=300)
    raft_log = PartitionRaftLog.open(log_dir, config=config)
    for _ in range(12):
        raft_log.append_as_leader([b"x" * 60], 1)
    raft_log.flush()
    raft_log.delete_before(9)
    first_segment = raft_log.partition_log.segments[0].base_offset
    raft_log.close()
    assert first_segment > 0
    with pytest.raises(KafkaStorageError, match="no snapshot covers"):
        PartitionRaftLog.open(log_dir, config=config)


def test_snapshot_past_the_log_starts_it_afresh(log_dir: Path) -> None:
    raft_log = PartitionRaftLog.open(log_dir)
    raft_log.append_as_leader([b"a"], 1)
    raft_log.close()
    # A follower received snapshot (50, 4) and crashed before truncating its log.
    reopened = PartitionRaftLog.open(log_dir, snapshots=[OffsetAndEpoch(50, 4)])
    try:
        assert (reopened.start_offset, reopened.end_offset, reopened.last_epoch) == (50, 50, 4)
    finally:
        reopened.close()
    again = PartitionRaftLog.open(log_dir, snapshots=[OffsetAndEpoch(50, 4)])
    try:
        assert (again.start_offset, again.end_offset, again.last_epoch) == (50, 50, 4)
    finally:
        again.close()


def test_truncation_is_durable(log_dir: Path) -> None:
    raft_log = PartitionRaftLog.open(log_dir)
    raft_log.append_as_leader([b"a"], 1)
    raft_log.append_as_leader([b"b"], 2)
    raft_log.flush()
    raft_log.truncate_to(1)
    raft_log.append_as_follower(_batch_from_leader([(b"c", 3)], start=1))
    # Crash without a flush: the truncation holds, the new entry is there or not.
    reopened = PartitionRaftLog.open(log_dir)
    try:
        assert _entries(reopened)[:1] == [(0, 1, b"a")]
        assert all(epoch != 2 for _, epoch, _ in _entries(reopened))
    finally:
        reopened.close()
        raft_log.partition_log.close()


def _batch_from_leader(values: list[tuple[bytes, int]], *, start: int) -> bytes:
    leader = InMemoryRaftLog()
    leader.truncate_to_snapshot(OffsetAndEpoch(start, 1))
    for value, epoch in values:
        leader.append_as_leader([value], epoch)
    return leader.read(start, 1 << 20)


def test_a_leaders_data_batch_is_the_bytes_build_batch_makes(log_dir: Path) -> None:
    # Written by the producer's builder (the compiled codec's per-record path): a
    # follower, a snapshot or a replay reads the same batch as the reference encoder's.
    raft_log = PartitionRaftLog.open(log_dir, config=metadata_log_config())
    raft_log.append_as_leader([b"first"], epoch=2)
    values = [b"", b"x" * 300, bytes(range(256)), b"last"]
    raft_log.append_as_leader(values, epoch=3)
    data = bytes(raft_log.read(1, 1 << 20))
    batch = next(iter_batches(data))
    expected = build_batch(
        [SimpleRecord(value=value, timestamp=batch.max_timestamp) for value in values],
        base_offset=1,
        partition_leader_epoch=3,
    )
    assert data == expected
