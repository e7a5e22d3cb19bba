"""PartitionLog behaviour: appends, rolls, reads, timestamps, truncation, epochs, flushing."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from highwater.config.topic import LogConfig
from highwater.errors import (
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTimestampError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
    UnsupportedForMessageFormatError,
)
from highwater.records import Compression, RecordBatch, SimpleRecord, TimestampType, build_batch
from highwater.records.header import check_batch
from highwater.storage.log import FetchData
from highwater.storage.log_loader import load_partition_log
from highwater.storage.producer_state import AppendOrigin
from storage_helpers import BASE_TS, FakeClock, batches_of, make_batch, open_log, read_all


def values(n: int, size: int = 20, tag: str = "v") -> list[bytes]:
    return [f"{tag}{i}:".encode() + b"x" * size for i in range(n)]


def test_append_assigns_consecutive_offsets_and_stamps_epoch(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    first = log.append_as_leader(make_batch(values(3)), leader_epoch=7)
    second = log.append_as_leader(make_batch(values(2)), leader_epoch=7)
    assert (first.first_offset, first.last_offset) == (0, 2)
    assert (second.first_offset, second.last_offset) == (3, 4)
    assert log.log_end_offset == 5
    data = log.read(0, 1 << 20)
    batches = batches_of(data.records)
    assert [b.base_offset for b in batches] == [0, 3]
    assert all(b.partition_leader_epoch == 7 for b in batches)
    # The stamped batches still pass the CRC: offsets and epoch lie outside it.
    for batch in batches:
        check_batch(batch.to_bytes())
    assert [r.offset for r in read_all(log)] == [0, 1, 2, 3, 4]
    log.close()


def test_rolls_on_segment_bytes_and_reads_across_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"segment.bytes": 1000})
    for _ in range(30):
        log.append_as_leader(make_batch(values(2, 100)), leader_epoch=0)
    assert len(log.segments) > 5
    assert all(s.size <= 1000 for s in log.segments)
    assert [r.offset for r in read_all(log)] == list(range(60))
    for offset in range(60):
        fetched = log.read(offset, 1)
        assert fetched.first_offset <= offset < fetched.next_offset
    log.close()


def test_a_read_without_room_for_its_first_batch_returns_nothing_and_skips_nothing(
    tmp_path: Path,
) -> None:
    """Without ``min_one_batch`` a first batch larger than ``max_bytes`` is not returned, and
    neither is anything after it: not a smaller batch of a later segment (the reader would
    skip the big one's records), nor a next offset past it."""
    log = open_log(tmp_path / "t-0", **{"segment.bytes": 1000})
    log.append_as_leader(make_batch(values(4, 200)), leader_epoch=0)  # 0-3, about 900 bytes
    log.roll()
    log.append_as_leader(make_batch(values(1, 10)), leader_epoch=0)  # 4, in a new segment
    assert len(log.segments) == 2
    for max_bytes in (0, 200):
        fetched = log.read(0, max_bytes, min_one_batch=False)
        assert (fetched.records, fetched.next_offset) == (b"", 0)
    assert [b.base_offset for b in batches_of(log.read(0, 200).records)] == [0]
    log.close()


def test_rolls_on_segment_ms_by_record_time(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path / "t-0", clock, **{"segment.ms": 60_000})
    log.append_as_leader(make_batch(values(1), timestamp=clock.now), 0)
    log.append_as_leader(make_batch(values(1), timestamp=clock.now + 30_000), 0)
    assert len(log.segments) == 1
    clock.advance(61_000)
    log.append_as_leader(make_batch(values(1), timestamp=clock.now), 0)
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.close()


def test_rolls_when_the_index_is_full(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"segment.index.bytes": 32, "index.interval.bytes": 0})
    for _ in range(12):
        log.append_as_leader(make_batch(values(1)), 0)
    assert len(log.segments) >= 2
    assert [r.offset for r in read_all(log)] == list(range(12))
    log.close()


def test_sparse_index_entry_every_interval(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"index.interval.bytes": 1000})
    for _ in range(40):
        log.append_as_leader(make_batch(values(1, 200)), 0)
    index = log.active_segment.offset_index
    # Batches of ~290 bytes: an entry after every fourth or so, never for every batch.
    assert 5 <= index.entries <= 15
    log.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_recovery_rebuilds_the_indexes_byte_for_byte(tmp_path: Path, seed: int) -> None:
    """Crash recovery writes each index in one copy from the walk's encoded entries; they
    must be the very bytes the appends wrote one by one (timestamps that go back included,
    which the time index skips)."""
    import random

    from highwater.storage.log_loader import load_partition_log

    rng = random.Random(seed)
    directory = tmp_path / "t-0"
    config = {"index.interval.bytes": 300, "segment.bytes": 6000}
    log = open_log(directory, **config)
    for _ in range(60):
        timestamp = BASE_TS + rng.randrange(-5_000, 5_000)
        sizes = [rng.randrange(1, 120) for _ in range(rng.randrange(1, 4))]
        batches = [
            make_batch([b"x" * size for size in sizes], timestamp=timestamp)
            for _ in range(rng.randrange(1, 3))
        ]
        log.append_as_leader(b"".join(batches), 0)
    log.close()
    appended = {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if "index" in p.name}
    assert len(appended) >= 4 and any(appended.values())
    recovered = load_partition_log(
        directory,
        log.config,
        clock=FakeClock(),
        recovery_point=0,
        had_clean_shutdown=False,
    )
    recovered.close()
    rebuilt = {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if "index" in p.name}
    assert rebuilt == appended


def test_follower_rolls_when_offsets_leave_the_relative_range(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append_as_follower(build_batch([_rec(b"a")], base_offset=0, partition_leader_epoch=1))
    far = 2**31 + 10
    log.append_as_follower(build_batch([_rec(b"b")], base_offset=far, partition_leader_epoch=1))
    assert [s.base_offset for s in log.segments] == [0, far]
    assert [(r.offset, r.value) for r in read_all(log)] == [(0, b"a"), (far, b"b")]
    log.close()


def _rec(value: bytes, key: bytes | None = None, ts: int = BASE_TS) -> object:
    from highwater.records import SimpleRecord

    return SimpleRecord(key=key, value=value, timestamp=ts)


def test_read_bounds(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    for _ in range(5):
        log.append_as_leader(make_batch(values(2)), 0)
    assert log.read(10, 100).records == b""  # at the log end: nothing, no error
    with pytest.raises(OffsetOutOfRangeError):
        log.read(11, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    # max_offset (the high watermark) hides batches at or past it.
    assert [r.offset for r in read_all(log, 0, max_offset=6)] == [0, 1, 2, 3, 4, 5]
    assert log.read(6, 100, max_offset=6).records == b""
    # max_bytes returns whole batches, at least one.
    one = log.read(0, 1)
    assert len(batches_of(one.records)) == 1
    assert log.read(0, 1, min_one_batch=False).records == b""
    log.close()


@pytest.mark.parametrize("interval", [1, 1 << 20])
def test_a_read_ending_inside_a_batch_returns_the_whole_batches_before_it(
    tmp_path: Path, interval: int
) -> None:
    """Every batch indexed (the read stops at an indexed batch start) or none (it reads
    into the next batch and cuts it off): the same whole batches either way."""
    log = open_log(tmp_path / "t-0", **{"index.interval.bytes": str(interval)})
    for _ in range(5):
        log.append_as_leader(make_batch(values(2)), 0)
    size = len(log.read(0, 1 << 20).records) // 5
    read = log.read(0, size * 2 + size // 2)
    assert [b.base_offset for b in batches_of(read.records)] == [0, 2]
    assert len(read.records) == 2 * size
    assert [b.base_offset for b in batches_of(log.read(2, size * 3).records)] == [2, 4, 6]
    log.close()


def test_offset_for_timestamp(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"segment.bytes": 400})
    stamps = [100, 300, 200, 500, 400, 900, 700]
    for ts in stamps:
        log.append_as_leader(make_batch([b"x" * 60], timestamp=BASE_TS + ts), 0)
    assert len(log.segments) > 2
    assert log.offset_for_timestamp(BASE_TS) == (BASE_TS + 100, 0)
    assert log.offset_for_timestamp(BASE_TS + 150) == (BASE_TS + 300, 1)
    assert log.offset_for_timestamp(BASE_TS + 450) == (BASE_TS + 500, 3)
    assert log.offset_for_timestamp(BASE_TS + 600) == (BASE_TS + 900, 5)
    assert log.offset_for_timestamp(BASE_TS + 901) is None
    log.close()


def test_log_append_time_stamps_the_batch(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path / "t-0", clock, **{"message.timestamp.type": "LogAppendTime"})
    info = log.append_as_leader(make_batch(values(3), timestamp=5), 0)
    assert info.log_append_time == clock.now
    (batch,) = batches_of(log.read(0, 1 << 20).records)
    assert batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert batch.max_timestamp == clock.now
    assert {r.timestamp for r in batch.records()} == {clock.now}
    log.close()


def test_create_time_outside_the_window_is_rejected(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(
        tmp_path / "t-0",
        clock,
        **{"message.timestamp.before.max.ms": 1000, "message.timestamp.after.max.ms": 1000},
    )
    with pytest.raises(InvalidTimestampError):
        log.append_as_leader(make_batch(values(1), timestamp=clock.now - 5000), 0)
    with pytest.raises(InvalidTimestampError):
        log.append_as_leader(make_batch(values(1), timestamp=clock.now + 5000), 0)
    log.append_as_leader(make_batch(values(1), timestamp=clock.now - 500), 0)
    assert log.log_end_offset == 1
    log.close()


def test_compacted_topic_requires_keys(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"cleanup.policy": "compact"})
    with pytest.raises(InvalidRecordError, match="requires keys"):
        log.append_as_leader(make_batch([b"a", b"b"], keys=[b"k", None]), 0)
    assert log.log_end_offset == 0
    log.append_as_leader(make_batch([b"a"], keys=[b"k"]), 0)
    assert log.log_end_offset == 1
    log.close()


def test_bad_batches_are_rejected_and_change_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"max.message.bytes": 500})
    log.append_as_leader(make_batch(values(2)), 0)
    good = make_batch(values(2))
    flipped = bytearray(good)
    flipped[-3] ^= 0xFF
    wrong_magic = bytearray(good)
    wrong_magic[16] = 1
    bad_count = bytearray(good)
    bad_count[57:61] = (5).to_bytes(4, "big")  # records_count lies outside... and inside the CRC
    cases: list[tuple[bytes, type[Exception]]] = [
        (bytes(flipped), CorruptRecordError),
        (bytes(wrong_magic), UnsupportedForMessageFormatError),
        (good[:-5], CorruptRecordError),
        (good + good[:30], CorruptRecordError),
        (make_batch(values(5, 200)), RecordTooLargeError),
        (b"", InvalidRecordError),
        (bytes(bad_count), CorruptRecordError),
        # A valid CRC but offsets that span more records than the batch holds.
        (build_batch([_rec(b"a")], last_offset_delta=3), InvalidRecordError),
    ]
    for data, error in cases:
        with pytest.raises(error):
            log.append_as_leader(data, 0)
    assert log.log_end_offset == 2
    assert [r.offset for r in read_all(log)] == [0, 1]
    log.close()


def test_follower_append_keeps_offsets_and_rejects_going_back(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    batch = build_batch([_rec(b"a"), _rec(b"b")], base_offset=0, partition_leader_epoch=3)
    log.append_as_follower(batch)
    log.append_as_follower(build_batch([_rec(b"c")], base_offset=5, partition_leader_epoch=4))
    assert log.log_end_offset == 6
    assert log.leader_epoch_cache.entries == ((3, 0), (4, 5))
    with pytest.raises(UnexpectedAppendOffsetError):
        log.append_as_follower(build_batch([_rec(b"d")], base_offset=4, partition_leader_epoch=4))
    assert log.log_end_offset == 6
    assert log.append_as_follower(b"") is None
    log.close()


def test_leader_epochs_and_offsets_for_leader_epoch(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch(values(3)), leader_epoch=0)
    log.append_as_leader(make_batch(values(2)), leader_epoch=2)
    log.append_as_leader(make_batch(values(1)), leader_epoch=2)
    assert log.leader_epoch_cache.entries == ((0, 0), (2, 3))
    assert log.latest_epoch_end_offset(0) == (0, 3)
    assert log.latest_epoch_end_offset(1) == (0, 3)
    assert log.latest_epoch_end_offset(2) == (2, 6)
    log.truncate_to(4)
    assert log.log_end_offset == 3  # the batch holding offset 4 started at 3
    assert log.leader_epoch_cache.entries == ((0, 0),)
    log.close()


def test_truncate_across_segments_lowers_recovery_point_and_high_watermark(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"segment.bytes": 500, "file.delete.delay.ms": 0})
    for _ in range(20):
        log.append_as_leader(make_batch(values(2, 50)), 0)
    log.flush()
    log.update_high_watermark(40)
    segments_before = len(log.segments)
    log.truncate_to(11)
    assert log.log_end_offset == 10
    assert log.recovery_point == 10
    assert log.high_watermark == 10
    assert len(log.segments) < segments_before
    assert [r.offset for r in read_all(log)] == list(range(10))
    assert log.delete_pending_files() > 0
    assert not list((tmp_path / "t-0").glob("*.deleted"))
    # Appends continue from the new end.
    info = log.append_as_leader(make_batch(values(1)), 0)
    assert info.first_offset == 10
    log.close()


def test_two_segments_of_one_base_offset_pending_deletion_are_both_deleted(
    tmp_path: Path,
) -> None:
    """A follower truncated twice to the same segment boundary within
    ``file.delete.delay.ms`` (it rolls there again in between) dooms two segments of one
    base offset: the second's rename to ``.deleted`` replaces the first's files, so the
    first deletion removes both sets. The second is then no I/O error: the log (and its
    directory) stays online."""
    log = open_log(tmp_path / "t-0", **{"index.interval.bytes": 0})
    for _ in range(3):
        log.append_as_leader(make_batch(values(2)), 0)
    boundary = log.log_end_offset
    for appended in (3, 4):
        log.roll()
        assert log.segments[-1].base_offset == boundary
        for _ in range(appended):  # index entries, in a preallocated (active) index
            log.append_as_leader(make_batch(values(2)), 0)
        log.truncate_to(boundary)
    assert log.delete_pending_files(force=True) == 2
    assert not log.offline
    assert not list((tmp_path / "t-0").glob("*.deleted"))
    log.append_as_leader(make_batch(values(1)), 0)
    assert [r.offset for r in read_all(log)] == list(range(boundary + 1))
    log.close()


def test_truncate_below_log_start_starts_afresh(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    for _ in range(5):
        log.append_as_leader(make_batch(values(2)), 0)
    log.update_high_watermark(10)
    log.maybe_increment_log_start_offset(6)
    log.truncate_to(3)
    assert (log.log_start_offset, log.log_end_offset) == (3, 3)
    assert log.append_as_leader(make_batch(values(1)), 1).first_offset == 3
    log.close()


def test_idempotent_producer_duplicate_and_out_of_order(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    pid = 42

    def idempotent(seq: int, n: int, epoch: int = 0) -> bytes:
        return make_batch(values(n), producer_id=pid, producer_epoch=epoch, base_sequence=seq)

    first = log.append_as_leader(idempotent(0, 3), 0)
    log.append_as_leader(idempotent(3, 2), 0)
    retry = log.append_as_leader(idempotent(0, 3), 0)
    assert retry.duplicate
    assert (retry.first_offset, retry.last_offset) == (first.first_offset, first.last_offset)
    assert log.log_end_offset == 5
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(idempotent(9, 1), 0)
    log.append_as_leader(idempotent(0, 1, epoch=1), 0)  # a new epoch restarts at 0
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(idempotent(5, 1, epoch=0), 0)
    assert log.log_end_offset == 6
    # Producer state survives a restart (snapshot at close).
    log.close()
    reopened = open_log(tmp_path / "t-0")
    assert reopened.append_as_leader(idempotent(0, 1, epoch=1), 0).duplicate
    assert reopened.append_as_leader(idempotent(1, 1, epoch=1), 0).first_offset == 6
    reopened.close()


def test_producer_state_rebuilt_from_log_without_snapshot(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch(values(2), producer_id=7, producer_epoch=0, base_sequence=0), 0)
    log.flush()
    # Simulate a crash: no close (so no snapshot at the log end).
    for segment in log.segments:
        segment.close()
    for snapshot in (tmp_path / "t-0").glob("*.snapshot"):
        snapshot.unlink()
    from highwater.config.topic import LogConfig
    from highwater.storage.log_loader import load_partition_log

    reopened = load_partition_log(tmp_path / "t-0", LogConfig(), recovery_point=2)
    again = make_batch(values(2), producer_id=7, producer_epoch=0, base_sequence=0)
    assert reopened.append_as_leader(again, 0).duplicate
    reopened.close()


def test_flush_target_by_messages_time_and_roll(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path / "t-0", clock, **{"flush.messages": 5, "segment.bytes": 400})
    assert log.flush_target() is None
    log.append_as_leader(make_batch(values(2)), 0)
    assert log.flush_target() is None
    log.append_as_leader(make_batch(values(3)), 0)
    assert log.flush_target() == 5
    assert log.flush() == 5
    assert log.flush_target() is None
    # A roll asks for the finished segment to be flushed.
    log.roll()
    log.append_as_leader(make_batch(values(1)), 0)
    log.roll()
    assert log.flush_target() == 6
    log.close()
    timed = open_log(tmp_path / "u-0", clock, **{"flush.ms": 1000})
    timed.append_as_leader(make_batch(values(1)), 0)
    assert timed.flush_target() is None
    clock.advance(1000)
    assert timed.flush_target() == 1
    timed.close()


def test_reopen_after_clean_close_keeps_everything(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"segment.bytes": 600})
    for _ in range(25):
        log.append_as_leader(make_batch(values(3, 30)), 1)
    expected = [(r.offset, r.value) for r in read_all(log)]
    log.close()
    reopened = open_log(tmp_path / "t-0", **{"segment.bytes": 600})
    assert reopened.log_end_offset == 75
    assert [(r.offset, r.value) for r in read_all(reopened)] == expected
    assert reopened.append_as_leader(make_batch(values(1)), 1).first_offset == 75
    reopened.close()


def test_records_decode_with_their_values(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch([b"hello", None], keys=[b"k1", b"k2"]), 0)
    records = read_all(log)
    assert [(r.key, r.value) for r in records] == [(b"k1", b"hello"), (b"k2", None)]
    batch = RecordBatch(log.read(0, 100).records)
    assert batch.records_count == 2
    log.close()


def test_roll_snapshot_and_epoch_checkpoint_are_written_by_flush(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory, **{"segment.bytes": 400})
    pid_batch = make_batch(values(1), producer_id=9, producer_epoch=0, base_sequence=0)
    log.append_as_leader(pid_batch, leader_epoch=3)
    log.roll()
    # Nothing was fsynced on the appending thread: the roll's snapshot and the new epoch
    # wait for the flush.
    assert not list(directory.glob("*.snapshot"))
    assert not (directory / "leader-epoch-checkpoint").exists()
    log.flush()
    assert [p.name for p in directory.glob("*.snapshot")] == ["00000000000000000001.snapshot"]
    assert (directory / "leader-epoch-checkpoint").read_text().splitlines() == ["0", "1", "3 0"]
    log.close()


def test_crash_before_flush_rederives_leader_epochs_from_batches(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory)
    log.append_as_leader(make_batch(values(2)), leader_epoch=1)
    log.flush()
    log.append_as_leader(make_batch(values(2)), leader_epoch=4)
    # Crash: the epoch-4 entry was never checkpointed.
    for segment in log.segments:
        segment.close()
    from highwater.config.topic import LogConfig
    from highwater.storage.log_loader import load_partition_log

    reopened = load_partition_log(directory, LogConfig(), recovery_point=2)
    assert reopened.leader_epoch_cache.entries == ((1, 0), (4, 2))
    assert reopened.latest_epoch_end_offset(1) == (1, 2)
    reopened.close()


async def test_manager_truncation_checkpoints_the_recovery_point(tmp_path: Path) -> None:
    from highwater.storage.log_manager import LogManager
    from highwater.storage.topic_partition import TopicPartition

    manager = LogManager(tmp_path)
    manager.startup()
    tp = TopicPartition("t", 0)
    log = manager.get_or_create_log(tp)
    for _ in range(5):
        log.append_as_leader(make_batch(values(2)), 0)
    log.flush()
    manager.checkpoint_recovery_points()
    assert "t 0 10" in (tmp_path / "recovery-point-offset-checkpoint").read_text()
    assert await manager.truncate_to(tp, 4)
    assert "t 0 4" in (tmp_path / "recovery-point-offset-checkpoint").read_text()
    manager.shutdown()


async def test_manager_truncation_lowers_the_cleaner_checkpoint(tmp_path: Path) -> None:
    """Records appended again below the old cleaner checkpoint are dirty and get compacted."""
    from highwater.config.topic import LogConfig
    from highwater.storage.cleaner import LogCleaner
    from highwater.storage.log_manager import LogManager
    from highwater.storage.topic_partition import TopicPartition

    config = LogConfig.from_properties(
        {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0}
    )
    manager = LogManager(tmp_path)
    manager.startup()
    cleaner = LogCleaner(manager)
    tp = TopicPartition("t", 0)
    log = manager.get_or_create_log(tp, config)

    def append_round(tag: str) -> None:
        log.append_as_leader(make_batch(values(4, tag=tag), keys=[b"k"] * 4), 0)
        log.roll()
        log.update_high_watermark(log.log_end_offset)

    append_round("a")
    assert cleaner.clean_log(log).end_offset == 4
    assert manager.cleaner_checkpoint.read()[tp] == 4
    assert await manager.truncate_to(tp, 0)
    assert manager.cleaner_checkpoint.read()[tp] == 0
    append_round("b")
    cleaner.clean_log(log)
    assert [r.offset for r in read_all(log)] == [3]
    manager.shutdown()


def test_truncating_into_a_compaction_gap_keeps_the_high_watermark_above_the_log_start(
    tmp_path: Path,
) -> None:
    from highwater.config.topic import LogConfig
    from highwater.storage.cleaner import LogCleaner
    from highwater.storage.log_manager import LogManager
    from highwater.storage.topic_partition import TopicPartition

    config = LogConfig.from_properties(
        {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0}
    )
    manager = LogManager(tmp_path)
    manager.startup()
    log = manager.get_or_create_log(TopicPartition("t", 0), config)
    for tag in ("a", "b"):
        log.append_as_leader(make_batch(values(1, tag=tag), keys=[b"k"]), 0)
    log.roll()
    log.update_high_watermark(2)
    LogCleaner(manager).clean_log(log)  # offset 0 goes: only offset 1 is left
    log.update_high_watermark(0)
    assert log.truncate_to(1)  # the end falls into the gap: the log starts at 1
    assert (log.log_start_offset, log.log_end_offset) == (1, 1)
    assert log.log_start_offset <= log.high_watermark <= log.log_end_offset
    manager.shutdown()


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Files this process writes cannot grow past ``limit`` bytes (RLIMIT_FSIZE): a write
    that crosses it is cut short, the next one fails with EFBIG, as a full disk does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_write_that_fails_part_way_leaves_the_log_at_its_last_whole_batch(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch(values(3)), leader_epoch=0)
    segment_file = log.segments[-1].log_path
    size = segment_file.stat().st_size
    big = make_batch(values(50, 200))
    with (
        file_size_limit(size + len(big) // 2),
        pytest.raises(KafkaStorageError, match="nothing was appended"),
    ):
        log.append_as_leader(big, leader_epoch=0)
    assert segment_file.stat().st_size == size  # the torn half is gone
    assert log.log_end_offset == 3
    # Once there is room again the log takes appends after its last whole batch.
    after = log.append_as_leader(make_batch(values(2, tag="after")), leader_epoch=0)
    assert after.first_offset == 3
    expected = values(3) + values(2, tag="after")
    assert [r.value for r in read_all(log)] == expected
    log.close()
    reopened = open_log(tmp_path / "t-0")
    assert [r.value for r in read_all(reopened)] == expected
    reopened.close()


@contextlib.contextmanager
def no_more_file_descriptors() -> Iterator[None]:
    """Opening a file fails with EMFILE (RLIMIT_NOFILE at the lowest free descriptor)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_segment_that_cannot_be_rolled_leaves_the_active_one_in_place(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"segment.bytes": 1000})
    log.append_as_leader(make_batch(values(4, 100)), leader_epoch=0)
    with (
        no_more_file_descriptors(),
        pytest.raises(KafkaStorageError, match="cannot start a segment"),
    ):
        log.append_as_leader(make_batch(values(8, 100)), leader_epoch=0)
    assert len(log.segments) == 1 and log.log_end_offset == 4
    log.append_as_leader(make_batch(values(8, 100)), leader_epoch=0)
    assert len(log.segments) == 2 and log.log_end_offset == 12
    assert [r.offset for r in read_all(log)] == list(range(12))
    log.close()


class _CountedPreads:
    """``os.pread`` counted: the segment's reads of its ``.log`` file go through it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = os.pread

        def pread(fd: int, length: int, position: int) -> bytes:
            self.calls += 1
            return real(fd, length, position)

        monkeypatch.setattr(os, "pread", pread)

    def during(
        self, read: Callable[..., FetchData], *args: int, **kwargs: int
    ) -> tuple[int, FetchData]:
        """How many preads ``read(*args, **kwargs)`` made, and what it returned."""
        before = self.calls
        result = read(*args, **kwargs)
        return self.calls - before, result


def test_a_read_from_where_the_last_one_ended_takes_one_pread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer or follower reading on from the end of its last answer (batches larger
    than the header scan's 16 KiB chunk) reads the file once; the first read, which looks
    the offset up, reads it three times. The bytes are those a lookup finds."""
    log = open_log(tmp_path / "t-0")
    for _ in range(6):
        log.append_as_leader(make_batch(values(40, size=500)), 0)  # ~20 KiB a batch
    whole = log.read(0, 1 << 20).records
    size = len(whole) // 6
    preads = _CountedPreads(monkeypatch)
    calls, first = preads.during(log.read, 40, size * 2)
    assert calls == 3  # the index's entry is batch 0: a chunk, the next chunk, the read
    got, offset, counts = [first.records], first.next_offset, []
    for high_watermark in (200, 240):  # on to a high watermark of 200, then past it
        calls, read = preads.during(log.read, offset, size * 2, max_offset=high_watermark)
        got.append(read.records)
        counts.append(calls)
        offset = read.next_offset
    assert offset == 240
    assert counts == [1, 1]
    assert b"".join(got) == whole[size:]
    # A follower at the log end: the next batch appended is read with one pread too.
    log.append_as_leader(make_batch(values(40, size=500)), 0)
    calls, read = preads.during(log.read, offset, 1 << 20)
    assert calls == 1
    assert [b.base_offset for b in batches_of(read.records)] == [240]
    # The other readers at the tail (a second follower, a consumer) read it from the same
    # offset: one pread each as well.
    for _ in range(2):
        calls, again = preads.during(log.read, offset, 1 << 20)
        assert calls == 1 and again.records == read.records
    log.close()


def test_a_read_after_truncation_looks_its_offset_up_again(tmp_path: Path) -> None:
    """A read end remembered before a truncation does not outlive it: where the batches
    written after the cut put a sound batch at the old end position (here the one of
    offset 11, where offset 9 once began), a read of 9 still starts at the batch holding 9."""
    rewritten = [make_batch(values(6, tag="a")), make_batch(values(2, tag="b"))]  # 3..8, 9..10
    span = sum(len(batch) for batch in rewritten)
    cut = make_batch(values(5))  # 4..8 before the cut
    one = next(  # offset 3 before the cut: a single record, sized so that 3..8 span `span`
        batch
        for length in range(1, span)
        if len(batch := make_batch([b"x" * length])) + len(cut) == span
    )
    log = open_log(tmp_path / "t-0")
    for batch in (make_batch(values(3)), one, cut):
        log.append_as_leader(batch, 0)
    assert log.read(0, 1 << 20).next_offset == 9  # remembers 9 -> the file's end
    log.truncate_to(3)
    for batch in [*rewritten, make_batch(values(2, tag="c"))]:  # 11..12 at the old end
        log.append_as_leader(batch, 1)
    records = read_all(log, 9)
    assert [r.offset for r in records] == [9, 10, 11, 12]
    assert [r.value for r in records] == values(2, tag="b") + values(2, tag="c")
    log.close()


# -- idempotent producers when the log start moves -------------------------------------------


def _idempotent(seq: int, n: int, *, timestamp: int = BASE_TS) -> bytes:
    return make_batch(
        values(n), timestamp=timestamp, producer_id=42, producer_epoch=0, base_sequence=seq
    )


def test_delete_records_keeps_a_producer_whose_batches_it_deleted(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    first = log.append_as_leader(_idempotent(0, 2), 0)
    log.update_high_watermark(log.log_end_offset)
    assert log.maybe_increment_log_start_offset(2)

    retry = log.append_as_leader(_idempotent(0, 2), 0)  # its first response was lost
    assert retry.duplicate
    assert (retry.first_offset, retry.last_offset) == (first.first_offset, first.last_offset)
    assert log.log_end_offset == 2  # nothing written twice
    assert log.append_as_leader(_idempotent(2, 1), 0).first_offset == 2
    log.close()


def test_a_restart_keeps_a_producer_whose_batches_are_below_the_log_start(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory)
    log.append_as_leader(_idempotent(0, 2), 0)
    log.update_high_watermark(log.log_end_offset)
    log.maybe_increment_log_start_offset(2)
    log.close()  # the snapshot at the log end, 2

    reopened = load_partition_log(
        directory, LogConfig(), log_start_offset=2, had_clean_shutdown=True, clock=FakeClock()
    )

    assert reopened.log_start_offset == 2
    assert reopened.append_as_leader(_idempotent(0, 2), 0).duplicate
    assert reopened.append_as_leader(_idempotent(2, 1), 0).first_offset == 2
    reopened.close()


def test_retention_keeps_a_producer_whose_segments_it_deleted(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path / "t-0", clock, **{"retention.ms": 10_000})
    log.append_as_leader(_idempotent(0, 2, timestamp=clock.now), 0)
    log.roll()
    log.append_as_leader(make_batch(values(1), timestamp=clock.now + 20_000), 0)
    log.update_high_watermark(log.log_end_offset)
    clock.advance(15_000)

    assert log.delete_old_segments() == 1
    assert log.log_start_offset == 2
    assert list(log.producer_state.active_producers) == [42]
    assert log.append_as_leader(_idempotent(0, 2, timestamp=clock.now), 0).duplicate
    assert log.append_as_leader(_idempotent(2, 1, timestamp=clock.now), 0).first_offset == 3
    log.close()


def test_a_retention_pass_expires_idle_producers(tmp_path: Path) -> None:
    clock = FakeClock()
    log = load_partition_log(
        tmp_path / "t-0", LogConfig(), clock=clock, producer_id_expiration_ms=60_000
    )
    log.append_as_leader(_idempotent(0, 1, timestamp=clock.now), 0)
    clock.advance(59_999)
    log.delete_old_segments()
    assert list(log.producer_state.active_producers) == [42]
    clock.advance(1)
    log.delete_old_segments()
    assert log.producer_state.is_empty
    log.close()


# -- a log start offset above the recovered log end --------------------------------------------


@pytest.mark.parametrize("clean_shutdown", [True, False])
def test_a_log_that_ends_below_its_log_start_starts_empty_there(
    tmp_path: Path, clean_shutdown: bool
) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory)
    for _ in range(5):
        log.append_as_leader(_idempotent(log.log_end_offset, 2), 3)
    log.close()
    # DeleteRecords moved the log start to 15 (the high watermark, on the other replicas)
    # but only offsets below 10 reached this disk.
    reopened = load_partition_log(
        directory,
        LogConfig(),
        log_start_offset=15,
        recovery_point=0,
        high_watermark=15,
        had_clean_shutdown=clean_shutdown,
        clock=FakeClock(),
    )

    assert (reopened.log_start_offset, reopened.log_end_offset) == (15, 15)
    assert [s.base_offset for s in reopened.segments] == [15]
    assert sorted(p.name for p in directory.iterdir() if p.suffix in (".log", ".snapshot")) == [
        "00000000000000000015.log"
    ]
    assert reopened.leader_epoch_cache.entries == ()
    assert reopened.producer_state.is_empty
    assert not reopened.missing_committed_records
    assert reopened.append_as_leader(make_batch(values(1)), 4).first_offset == 15
    reopened.close()


# -- client batches the log refuses -------------------------------------------------------------


def _resigned(data: bytearray) -> bytes:
    from highwater.records.header import crc32c

    struct.pack_into(">I", data, 17, crc32c(memoryview(data)[21:]))
    return bytes(data)


def test_clients_may_not_write_control_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    control = build_batch(
        [SimpleRecord(b"k", b"v", (), BASE_TS)],
        is_control=True,
        is_transactional=True,
        producer_id=5,
        producer_epoch=0,
        base_sequence=0,
    )
    without_producer = bytearray(make_batch(values(1)))
    without_producer[22] |= 0x20  # the control flag
    for data in (control, _resigned(without_producer), make_batch(values(1)) + control):
        with pytest.raises(InvalidRecordError, match="control records"):
            log.append_as_leader(data, 0)
    assert log.log_end_offset == 0
    # A coordinator is not a client: Kafka lets it write control batches.
    assert log.append_as_leader(control, 0, origin=AppendOrigin.COORDINATOR).first_offset == 0
    log.close()


def test_a_producer_id_without_a_base_sequence_is_an_invalid_record(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    data = bytearray(_idempotent(0, 2))
    struct.pack_into(">i", data, 53, -1)  # the base sequence
    with pytest.raises(InvalidRecordError, match="sequence number -1"):
        log.append_as_leader(_resigned(data), 0)
    assert log.log_end_offset == 0
    log.close()


# -- ListOffsets MAX_TIMESTAMP -------------------------------------------------------------------


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_max_timestamp_answers_the_first_record_carrying_it(
    tmp_path: Path, compression: Compression
) -> None:
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch(values(2), timestamp=BASE_TS + 100), 0)  # offsets 0..1
    stamps = [0, 500, 100, 500, 200]  # offsets 2..6: the max first at 3
    batch = build_batch(
        [SimpleRecord(None, b"v", (), BASE_TS + ts) for ts in stamps], compression=compression
    )
    log.append_as_leader(batch, 0)
    log.append_as_leader(make_batch(values(1), timestamp=BASE_TS + 600), 0)  # offset 7

    assert log.max_timestamp_and_offset(7) == (BASE_TS + 500, 3)
    assert log.max_timestamp_and_offset(8) == (BASE_TS + 600, 7)
    assert log.max_timestamp_and_offset(2) == (BASE_TS + 101, 1)
    assert log.max_timestamp_and_offset(0) is None
    log.close()


def test_max_timestamp_with_log_append_time_answers_the_batchs_first_offset(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    log = open_log(tmp_path / "t-0", clock, **{"message.timestamp.type": "LogAppendTime"})
    log.append_as_leader(make_batch(values(3)), 0)
    assert log.max_timestamp_and_offset(3) == (clock.now, 0)
    log.close()


# -- a lost time index ---------------------------------------------------------------------------


def test_an_empty_time_index_beside_a_segment_still_gives_its_largest_timestamp(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory, **{"index.interval.bytes": 1})
    for ts in (-5000, -9000, -9000):  # offset 0 holds the segment's largest timestamp
        log.append_as_leader(make_batch(values(1), timestamp=BASE_TS + ts), 0)
    log.roll()
    log.append_as_leader(make_batch(values(1), timestamp=BASE_TS), 0)
    log.close()
    os.truncate(directory / "00000000000000000000.timeindex", 0)

    reopened = open_log(directory, **{"index.interval.bytes": 1})

    first = reopened.segments[0]
    assert (first.max_timestamp, first.offset_of_max_timestamp) == (BASE_TS - 5000, 0)
    assert reopened.offset_for_timestamp(BASE_TS - 6000) == (BASE_TS - 5000, 0)
    assert first.next_offset == 3
    reopened.close()
