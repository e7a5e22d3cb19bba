"""The log cleaner: last value per key, offsets kept, tombstones, bounds, regrouping, crashes."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from highwater.config.topic import LogConfig
from highwater.errors import CorruptSegmentError
from highwater.records import (
    BatchHeader,
    Compression,
    RecordBatch,
    SimpleRecord,
    TimestampType,
    build_batch,
    iter_batches,
)
from highwater.records import batch as batch_module
from highwater.storage.cleaner import CleanerStats, LogCleaner
from highwater.storage.log import PartitionLog
from highwater.storage.log_loader import load_partition_log
from highwater.storage.log_manager import LogManager
from highwater.storage.segment import LogSegment
from highwater.storage.topic_partition import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

T0 = 1_700_000_000_000
TP = TopicPartition("topic", 0)

Entry = tuple[int, bytes | None, bytes | None]  # offset, key, value


class FakeClock:
    """Milliseconds that move only when the test says so."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def compact_config(**props: Any) -> LogConfig:
    settings_: dict[str, Any] = {
        "cleanup.policy": "compact",
        "segment.index.bytes": 4096,
        "file.delete.delay.ms": 0,
    }
    settings_.update({k.replace("_", "."): v for k, v in props.items()})
    return LogConfig.from_properties(settings_)


def open_log(data_dir: Path, clock: FakeClock, **props: Any) -> PartitionLog:
    return load_partition_log(data_dir / "topic-0", compact_config(**props), clock=clock)


def append(
    log: PartitionLog,
    clock: FakeClock,
    records: Sequence[tuple[bytes | None, bytes | None]],
    *,
    producer: tuple[int, int, int] | None = None,
    compression: Compression = Compression.NONE,
) -> int:
    """Append one batch of (key, value) records; returns its base offset."""
    pid, epoch, seq = producer if producer is not None else (-1, -1, -1)
    batch = build_batch(
        [SimpleRecord(key=k, value=v, timestamp=clock.now) for k, v in records],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        compression=compression,
    )
    return log.append_as_leader(batch, leader_epoch=0).first_offset


def append_each(
    log: PartitionLog, clock: FakeClock, records: Sequence[tuple[str, str | None]]
) -> None:
    for key, value in records:
        append(log, clock, [(key.encode(), None if value is None else value.encode())])


def read_all(log: PartitionLog) -> list[Entry]:
    """Every record from the log start to the log end, through PartitionLog.read."""
    entries: list[Entry] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset, 1 << 20)
        if not fetched.records:
            break
        for batch in iter_batches(fetched.records):
            entries.extend((r.offset, r.key, r.value) for r in batch.records())
        offset = fetched.next_offset
    return entries


def headers(log: PartitionLog) -> list[BatchHeader]:
    return [h for _, _, h in log.iter_batches()]


def segment_bytes(segment: LogSegment) -> bytes:
    return segment.read_bytes(0, segment.size)


def latest_view(entries: Sequence[Entry]) -> dict[bytes | None, bytes]:
    """What a consumer reading everything ends up with: last value per key, tombstones delete."""
    view: dict[bytes | None, bytes] = {}
    for _, key, value in entries:
        if value is None:
            view.pop(key, None)
        else:
            view[key] = value
    return view


def compacted_model(entries: Sequence[Entry], end: int, *, drop_tombstones: bool) -> list[Entry]:
    """Below ``end``: the last record of each key (tombstones too, unless dropped); above: all."""
    last: dict[bytes | None, int] = {}
    for offset, key, _ in entries:
        if offset < end:
            last[key] = offset
    return [
        (offset, key, value)
        for offset, key, value in entries
        if offset >= end or (last.get(key) == offset and not (drop_tombstones and value is None))
    ]


def cleaner_for(data_dir: Path, clock: FakeClock, **kwargs: Any) -> LogCleaner:
    return LogCleaner(LogManager(data_dir, clock=clock), clock=clock, **kwargs)


def expected_end(log: PartitionLog) -> int:
    """The end offset a pass with room for every key reaches: the last segment below the HW."""
    segments = log.segments
    ends = [s.next_offset for s in segments[:-1] if s.next_offset <= log.high_watermark]
    return max(ends, default=segments[0].base_offset)


def finish_appends(log: PartitionLog) -> None:
    log.roll()
    log.update_high_watermark(log.log_end_offset)


# -- the basics -----------------------------------------------------------------------------


def test_keeps_the_last_value_per_key_with_offsets_preserved(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path, clock, segment_bytes=400)
    writes = [(f"k{i % 4}", f"value-{i}") for i in range(40)]
    append_each(log, clock, writes)
    finish_appends(log)
    before = read_all(log)
    segments_before = len(log.segments)

    stats = cleaner_for(tmp_path, clock).clean_log(log)

    after = read_all(log)
    assert after == [
        (36, b"k0", b"value-36"),
        (37, b"k1", b"value-37"),
        (38, b"k2", b"value-38"),
        (39, b"k3", b"value-39"),
    ]
    assert after == compacted_model(before, 40, drop_tombstones=False)
    assert log.log_end_offset == 40 and log.log_start_offset == 0
    assert [h.base_offset for h in headers(log)] == sorted({h.base_offset for h in headers(log)})
    assert stats.end_offset == 40 and stats.first_dirty_offset == 0
    assert stats.records_read == 40 and stats.records_retained == 4
    assert stats.map_keys == 4
    assert stats.segments_before == segments_before
    assert stats.segments_after == len(log.segments)
    assert 0 < stats.bytes_written < stats.bytes_read
    assert stats.duration_s >= 0 and not stats.aborted
    # The checkpoint records how far the log is clean.
    assert LogManager(tmp_path).cleaner_checkpoint.read() == {TP: 40}
    # No leftovers of the swap: only live segments and .deleted files awaiting removal.
    names = [p.name for p in (tmp_path / "topic-0").iterdir()]
    assert not [n for n in names if n.endswith((".cleaned", ".swap"))]


def test_a_read_in_a_gap_compaction_left_before_the_log_end_skips_it(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    append_each(log, clock, [("k0", f"v{i}") for i in range(6)] + [("k1", "a"), ("k1", "b")])
    finish_appends(log)
    cleaner_for(tmp_path, clock).clean_log(log)
    assert read_all(log) == [(5, b"k0", b"v5"), (7, b"k1", b"b")]
    # Truncating away offset 7 leaves offset 6 (compacted away) below the log end: a read
    # there finds nothing and moves the reader to the end of the gap, not back to itself.
    log.truncate_to(7)
    fetched = log.read(6, 100)
    assert (fetched.records, fetched.first_offset, fetched.next_offset) == (b"", 6, 7)
    assert log.read(6, 100, max_offset=7).next_offset == 7
    assert read_all(log) == [(5, b"k0", b"v5")]


def test_rebuilt_batches_keep_offsets_producer_fields_and_compression(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    first = append(
        log,
        clock,
        [(b"a", b"1"), (b"b", b"1"), (b"c", b"1"), (b"d", b"1")],
        producer=(7, 3, 0),
        compression=Compression.GZIP,
    )
    append(log, clock, [(b"b", b"2"), (b"d", b"2")], compression=Compression.ZSTD)
    finish_appends(log)
    original = headers(log)[0]

    cleaner_for(tmp_path, clock).clean_log(log)

    rebuilt = headers(log)[0]
    assert rebuilt.base_offset == first == original.base_offset
    assert rebuilt.last_offset_delta == original.last_offset_delta == 3
    assert rebuilt.records_count == 2
    assert (rebuilt.producer_id, rebuilt.producer_epoch, rebuilt.base_sequence) == (7, 3, 0)
    assert rebuilt.last_sequence == original.last_sequence
    assert rebuilt.partition_leader_epoch == original.partition_leader_epoch
    assert rebuilt.compression == Compression.GZIP
    assert rebuilt.timestamp_type == original.timestamp_type
    assert not rebuilt.has_delete_horizon
    assert read_all(log) == [(0, b"a", b"1"), (2, b"c", b"1"), (4, b"b", b"2"), (5, b"d", b"2")]
    # The untouched batch was copied byte for byte (still ZSTD).
    assert headers(log)[1].compression == Compression.ZSTD


def test_records_without_a_key_are_dropped_and_counted(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    # A compacted topic refuses keyless records from producers; a follower copies them.
    batch = build_batch(
        [SimpleRecord(key=None, value=b"x", timestamp=T0), SimpleRecord(key=b"k", value=b"v")]
    )
    log.append_as_follower(batch)
    finish_appends(log)

    stats = cleaner_for(tmp_path, clock).clean_log(log)

    assert stats.keyless_records_removed == 1
    assert read_all(log) == [(1, b"k", b"v")]


def test_a_second_pass_maps_only_new_dirty_data(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path, clock, segment_bytes=300)
    append_each(log, clock, [(f"k{i % 3}", f"a{i}") for i in range(12)])
    finish_appends(log)
    cleaner = cleaner_for(tmp_path, clock)
    first = cleaner.clean_log(log)
    assert first.end_offset == 12 and first.map_keys == 3

    append_each(log, clock, [("k0", "new"), ("k9", "x")])
    finish_appends(log)
    second = cleaner.clean_log(log)

    assert second.first_dirty_offset == 12 and second.end_offset == 14
    assert second.map_keys == 2
    assert read_all(log) == [
        (10, b"k1", b"a10"),
        (11, b"k2", b"a11"),
        (12, b"k0", b"new"),
        (13, b"k9", b"x"),
    ]


# -- tombstones -------------------------------------------------------------------------------


def test_tombstones_get_a_delete_horizon_then_go_after_delete_retention(tmp_path: Path) -> None:
    clock = FakeClock()
    retention = 10_000
    log = open_log(tmp_path, clock, delete_retention_ms=retention, segment_bytes=300)
    append_each(log, clock, [("a", "1"), ("b", "1"), ("a", None), ("c", "1"), ("b", "2")])
    finish_appends(log)
    cleaner = cleaner_for(tmp_path, clock)

    first = cleaner.clean_log(log)

    assert read_all(log) == [(2, b"a", None), (3, b"c", b"1"), (4, b"b", b"2")]
    assert first.tombstones_removed == 0
    tombstone_batch = next(h for h in headers(log) if h.base_offset == 2)
    assert tombstone_batch.has_delete_horizon
    batch = RecordBatch(log.read(2, 1 << 20).records)
    assert batch.delete_horizon_ms == T0 + retention
    # Timestamps are kept although the base timestamp now holds the horizon.
    assert [r.timestamp for r in batch.records()] == [T0]

    clock.advance(retention - 1)
    assert cleaner.clean_log(log).tombstones_removed == 0
    assert (2, b"a", None) in read_all(log)

    clock.advance(1)
    third = cleaner.clean_log(log)
    assert third.tombstones_removed == 1
    assert read_all(log) == [(3, b"c", b"1"), (4, b"b", b"2")]


def test_a_batch_that_a_horizon_would_grow_past_segment_bytes_keeps_its_tombstones(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    tombstones = build_batch(
        [SimpleRecord(key=f"gone-{i}".encode(), value=None, timestamp=T0) for i in range(5)]
    )
    limit = len(tombstones)  # the batch just fits: with a horizon it would not
    log = open_log(tmp_path, clock, segment_bytes=limit, delete_retention_ms=1000)
    log.append_as_leader(tombstones, leader_epoch=0)
    finish_appends(log)
    before = read_all(log)

    cleaner_for(tmp_path, clock).clean_log(log)

    assert read_all(log) == before
    assert all(h.size <= limit and not h.has_delete_horizon for h in headers(log))
    # Reopened after a crash, the batch is still valid (recovery rejects batches > segment.bytes).
    for segment in log.segments:
        segment.close()
    reopened = load_partition_log(
        tmp_path / "topic-0", compact_config(segment_bytes=limit), clock=clock
    )
    assert read_all(reopened) == before


def test_a_superseded_tombstone_goes_at_once(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path, clock)
    append_each(log, clock, [("a", "1"), ("a", None), ("a", "2")])
    finish_appends(log)
    stats = cleaner_for(tmp_path, clock).clean_log(log)
    assert stats.tombstones_removed == 1
    assert read_all(log) == [(2, b"a", b"2")]


def test_expired_tombstones_make_a_log_cleanable_without_dirty_data(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = LogManager(tmp_path, clock=clock)
    log = manager.get_or_create_log(TP, compact_config(delete_retention_ms=1000))
    append_each(log, clock, [("a", "1"), ("a", None), ("b", "1")])
    finish_appends(log)
    cleaner = LogCleaner(manager, clock=clock)
    cleaner.clean_log(log)
    assert cleaner.cleanable_logs() == []

    clock.advance(1000)

    assert [(tp, lg) for tp, lg, _ in cleaner.cleanable_logs()] == [(TP, log)]
    stats = cleaner.clean_log(log)
    assert stats.tombstones_removed == 1
    assert read_all(log) == [(2, b"b", b"1")]
    assert cleaner.cleanable_logs() == []


# -- what is never touched --------------------------------------------------------------------


def test_the_active_segment_is_never_touched(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path, clock, segment_bytes=300)
    append_each(log, clock, [(f"k{i % 2}", f"v{i}") for i in range(10)])
    log.roll()
    append_each(log, clock, [("k0", "x"), ("k0", "y"), ("k1", None)])
    log.update_high_watermark(log.log_end_offset)
    active = log.active_segment
    active_bytes = segment_bytes(active)

    stats = cleaner_for(tmp_path, clock).clean_log(log)

    assert log.active_segment is active
    assert segment_bytes(active) == active_bytes
    assert stats.end_offset == active.base_offset == 10
    assert read_all(log)[-3:] == [(10, b"k0", b"x"), (11, b"k0", b"y"), (12, b"k1", None)]


def test_nothing_at_or_above_the_high_watermark_is_cleaned(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path, clock, segment_bytes=250)
    append_each(log, clock, [(f"k{i % 3}", f"v{i}") for i in range(30)])
    log.roll()
    segments = log.segments
    hw_segment = segments[4]
    log.update_high_watermark(hw_segment.base_offset + 1)  # inside a segment
    untouched = {
        s.base_offset: segment_bytes(s) for s in segments if s.base_offset >= hw_segment.base_offset
    }
    before = read_all(log)

    stats = cleaner_for(tmp_path, clock).clean_log(log)

    assert stats.end_offset == hw_segment.base_offset
    for segment in log.segments:
        if segment.base_offset >= hw_segment.base_offset:
            assert segment_bytes(segment) == untouched[segment.base_offset]
    assert read_all(log) == compacted_model(before, stats.end_offset, drop_tombstones=False)


def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path: Path) -> None:
    clock = FakeClock()
    lag = 60_000
    log = open_log(tmp_path, clock, min_compaction_lag_ms=lag, segment_bytes=250)
    append_each(log, clock, [(f"k{i % 2}", f"old{i}") for i in range(8)])
    log.roll()
    young_start = log.log_end_offset
    clock.advance(lag)
    append_each(log, clock, [(f"k{i % 2}", f"new{i}") for i in range(8)])
    finish_appends(log)
    clock.advance(lag // 2)  # the old segments are now older than the lag, the young ones not
    young = {s.base_offset: segment_bytes(s) for s in log.segments if s.base_offset >= young_start}

    stats = cleaner_for(tmp_path, clock).clean_log(log)

    assert stats.end_offset == young_start
    for segment in log.segments:
        if segment.base_offset >= young_start:
            assert segment_bytes(segment) == young[segment.base_offset]
    assert [e for e in read_all(log) if e[0] < young_start] == [
        (6, b"k0", b"old6"),
        (7, b"k1", b"old7"),
    ]

    clock.advance(lag)
    stats = cleaner_for(tmp_path, clock).clean_log(log)
    assert stats.end_offset == 2 * young_start
    assert read_all(log) == [(14, b"k0", b"new6"), (15, b"k1", b"new7")]


# -- choosing a log ---------------------------------------------------------------------------


def test_cleanable_logs_by_dirty_ratio_and_max_compaction_lag(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = LogManager(tmp_path, clock=clock)
    cleaner = LogCleaner(manager, clock=clock)
    dirty_tp, mostly_clean_tp, deleting_tp = (
        TopicPartition("dirty", 0),
        TopicPartition("clean", 0),
        TopicPartition("deleting", 0),
    )
    dirty = manager.get_or_create_log(dirty_tp, compact_config(segment_bytes=300))
    mostly_clean = manager.get_or_create_log(mostly_clean_tp, compact_config(segment_bytes=300))
    deleting = manager.get_or_create_log(
        deleting_tp, LogConfig.from_properties({"cleanup.policy": "delete", "segment.bytes": 300})
    )
    for partition_log in (dirty, mostly_clean, deleting):
        append_each(partition_log, clock, [(f"k{i}", f"v{i}") for i in range(20)])
        finish_appends(partition_log)
    cleaner.clean_log(mostly_clean)  # nothing to remove: all 20 keys differ
    append_each(mostly_clean, clock, [("k0", "again")])
    finish_appends(mostly_clean)

    due = cleaner.cleanable_logs()

    assert [(tp, lg) for tp, lg, _ in due] == [(dirty_tp, dirty)]
    assert due[0][2] == 1.0
    ratio = cleaner.log_to_clean(
        mostly_clean_tp,
        mostly_clean,
        clock.now,
        manager.cleaner_checkpoint.read().get(mostly_clean_tp),
    ).cleanable_ratio
    assert 0 < ratio < 0.5

    # A min.cleanable.dirty.ratio below its ratio makes the mostly clean log due; one equal
    # to it does not (Kafka's rule: the ratio must be above the minimum).
    mostly_clean.config = compact_config(segment_bytes=300, min_cleanable_dirty_ratio=ratio)
    assert [tp for tp, _, _ in cleaner.cleanable_logs()] == [dirty_tp]
    mostly_clean.config = compact_config(segment_bytes=300, min_cleanable_dirty_ratio=ratio - 0.001)
    due = cleaner.cleanable_logs()
    assert [tp for tp, _, _ in due] == [dirty_tp, mostly_clean_tp]  # dirtiest first
    assert due[1][2] == pytest.approx(ratio)

    # So does max.compaction.lag.ms, once its dirty data is old enough.
    mostly_clean.config = compact_config(segment_bytes=300, max_compaction_lag_ms=5000)
    assert [tp for tp, _, _ in cleaner.cleanable_logs()] == [dirty_tp]
    clock.advance(5000)
    assert [tp for tp, _, _ in cleaner.cleanable_logs()] == [dirty_tp]
    clock.advance(1)
    assert [tp for tp, _, _ in cleaner.cleanable_logs()] == [dirty_tp, mostly_clean_tp]


def test_a_minimum_dirty_ratio_of_one_never_cleans_by_ratio(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = LogManager(tmp_path, clock=clock)
    cleaner = LogCleaner(manager, clock=clock)
    log = manager.get_or_create_log(TP, compact_config(min_cleanable_dirty_ratio=1.0))
    append_each(log, clock, [("k", f"v{i}") for i in range(5)])
    finish_appends(log)

    candidate = cleaner.log_to_clean(TP, log, clock.now, None)

    assert candidate.cleanable_ratio == 1.0
    assert not candidate.should_clean
    assert cleaner.cleanable_logs() == []


def _log_with_a_clean_section(
    tmp_path: Path, clock: FakeClock, lag_ms: int
) -> tuple[LogCleaner, PartitionLog]:
    """A compacted log of 40 unique keys, cleaned once, with a high minimum dirty ratio:
    whatever is appended next is due only by ``max.compaction.lag.ms``."""
    manager = LogManager(tmp_path, clock=clock)
    log = manager.get_or_create_log(
        TP, compact_config(max_compaction_lag_ms=lag_ms, min_cleanable_dirty_ratio=0.99)
    )
    append_each(log, clock, [(f"u{i}", "x" * 100) for i in range(40)])
    finish_appends(log)
    cleaner = LogCleaner(manager, clock=clock)
    cleaner.clean_log(log)
    return cleaner, log


def _append_segment(log: PartitionLog, timestamp: int) -> LogSegment:
    """One batch at ``timestamp`` in a segment of its own; returns the segment."""
    log.append_as_leader(build_batch([SimpleRecord(b"a", b"v", (), timestamp)]), leader_epoch=0)
    segment = log.active_segment
    finish_appends(log)
    return segment


def test_max_compaction_lag_takes_the_earliest_first_batch_of_every_dirty_segment(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    lag = 60_000
    cleaner, log = _log_with_a_clean_section(tmp_path, clock, lag)
    # The first dirty segment is young; the next one's first batch is older than the lag
    # (producers' timestamps need not grow from one segment to the next).
    _append_segment(log, clock.now)
    _append_segment(log, clock.now - 10 * lag)

    checkpoint = cleaner.manager.cleaner_checkpoint.read().get(TP)
    candidate = cleaner.log_to_clean(TP, log, clock.now, checkpoint)

    assert candidate.cleanable_ratio < 0.99
    assert candidate.needs_compaction_now and candidate.should_clean


@pytest.mark.parametrize("timestamp", [0, -1])
def test_max_compaction_lag_ignores_first_batches_without_a_timestamp(
    tmp_path: Path, timestamp: int
) -> None:
    clock = FakeClock()
    lag = 60_000
    cleaner, log = _log_with_a_clean_section(tmp_path, clock, lag)
    segment = _append_segment(log, timestamp)
    written = (clock.now - 10 * lag) / 1000
    os.utime(segment.log_path, (written, written))  # the file is old; its record has no time

    checkpoint = cleaner.manager.cleaner_checkpoint.read().get(TP)
    candidate = cleaner.log_to_clean(TP, log, clock.now, checkpoint)

    assert candidate.cleanable_bytes > 0
    assert not candidate.needs_compaction_now and not candidate.should_clean


async def test_clean_once_async_cleans_the_dirtiest_log(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = LogManager(tmp_path, clock=clock)
    cleaner = LogCleaner(manager, clock=clock)
    assert await cleaner.clean_once_async() is None

    little = manager.get_or_create_log(
        TopicPartition("little", 0), compact_config(segment_bytes=300)
    )
    lots = manager.get_or_create_log(TopicPartition("lots", 0), compact_config(segment_bytes=300))
    append_each(little, clock, [(f"k{i}", "v") for i in range(6)] + [("k0", "w")])
    append_each(lots, clock, [("k", f"v{i}") for i in range(20)])
    for partition_log in (little, lots):
        finish_appends(partition_log)
    cleaner.clean_log(little)  # little is now clean
    append_each(little, clock, [("k1", "w")])
    finish_appends(little)

    stats = await cleaner.clean_once_async()

    assert stats is not None and stats.topic_partition == TopicPartition("lots", 0)
    assert read_all(lots) == [(19, b"k", b"v19")]
    assert manager.cleaner_checkpoint.read()[TopicPartition("lots", 0)] == 20
    assert await cleaner.clean_once_async() is None  # little's ratio is below 0.5


async def test_clean_once_async_stops_when_retention_removes_a_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    manager = LogManager(tmp_path, clock=clock)
    log = manager.get_or_create_log(TP, compact_config(segment_bytes=250))
    append_each(log, clock, [(f"k{i % 3}", f"v{i}") for i in range(20)])
    finish_appends(log)
    before = read_all(log)
    import highwater.storage.cleaner as cleaner_module

    original = cleaner_module._CleaningPass.build_offset_map

    def build_then_retention_runs(self: Any) -> None:
        original(self)
        # Meanwhile DeleteRecords and retention remove the first segment.
        log.maybe_increment_log_start_offset(log.segments[1].base_offset)
        assert log.delete_old_segments() == 1

    monkeypatch.setattr(cleaner_module._CleaningPass, "build_offset_map", build_then_retention_runs)

    stats = await LogCleaner(manager, clock=clock).clean_once_async()

    assert stats is not None and stats.aborted
    assert manager.cleaner_checkpoint.read() == {}
    assert read_all(log) == [e for e in before if e[0] >= log.log_start_offset]
    assert not [p for p in (tmp_path / "topic-0").iterdir() if p.name.endswith(".cleaned")]


async def test_a_log_whose_pass_fails_is_not_chosen_again(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = LogManager(tmp_path, clock=clock)
    log = manager.get_or_create_log(TP, compact_config(segment_bytes=250))
    append_each(log, clock, [(f"k{i % 3}", f"v{i}") for i in range(20)])
    finish_appends(log)
    # Damage a value in the first segment: the batch's CRC no longer matches.
    with open(log.segments[0].log_path, "r+b") as f:
        f.seek(log.segments[0].size - 2)
        f.write(b"!")
    cleaner = LogCleaner(manager, clock=clock)

    with pytest.raises(CorruptSegmentError, match="CRC"):
        await cleaner.clean_once_async()

    assert await cleaner.clean_once_async() is None
    assert manager.cleaner_checkpoint.read() == {}
    assert not [p for p in (tmp_path / "topic-0").iterdir() if p.name.endswith(".cleaned")]


# -- regrouping -------------------------------------------------------------------------------


def test_small_cleaned_segments_are_regrouped_within_segment_bytes(tmp_path: Path) -> None:
    clock = FakeClock()
    limit = 700
    log = open_log(tmp_path, clock, segment_bytes=limit)
    append_each(log, clock, [(f"k{i % 3}", f"value-{i:04d}") for i in range(60)])
    finish_appends(log)
    cleaner = cleaner_for(tmp_path, clock)
    first = cleaner.clean_log(log)
    assert len(log.segments) == first.segments_before  # pass 1: every segment was nearly full
    assert sum(s.size for s in log.segments) <= limit  # but now they would fit one
    content = read_all(log)

    second = cleaner.clean_log(log)

    assert second.segments_after == 2  # one cleaned segment and the active one
    assert len(log.segments) == 2
    assert all(s.size <= limit for s in log.segments)
    assert read_all(log) == content
    assert log.segments[0].base_offset == 0


# -- producer state ---------------------------------------------------------------------------


def test_the_last_batch_of_a_producer_survives_empty(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path, clock, segment_bytes=300)
    pid, epoch = 4242, 1
    append(log, clock, [(b"a", b"1"), (b"b", b"1")], producer=(pid, epoch, 0))
    last = append(log, clock, [(b"a", b"2"), (b"b", b"2")], producer=(pid, epoch, 2))
    append_each(log, clock, [("a", "3"), ("b", "3")])  # a plain producer overwrites both keys
    finish_appends(log)
    original = next(h for h in headers(log) if h.base_offset == last)

    cleaner_for(tmp_path, clock).clean_log(log)

    assert read_all(log) == [(4, b"a", b"3"), (5, b"b", b"3")]
    producer_batches = [h for h in headers(log) if h.producer_id == pid]
    assert len(producer_batches) == 1  # the first batch went, the last one stays, empty
    kept = producer_batches[0]
    assert kept.records_count == 0
    assert (kept.base_offset, kept.last_offset_delta) == (
        original.base_offset,
        original.last_offset_delta,
    )
    assert (kept.producer_epoch, kept.base_sequence, kept.last_sequence) == (epoch, 2, 3)
    assert kept.max_timestamp == original.max_timestamp

    # Rebuilt from the log alone (no snapshot), the producer state is what it was.
    log.close()
    for snapshot in (tmp_path / "topic-0").glob("*.snapshot"):
        snapshot.unlink()
    reopened = open_log(tmp_path, clock, segment_bytes=300)
    entry = reopened.producer_state.last_entry(pid)
    assert entry is not None
    assert (entry.producer_epoch, entry.last_seq, entry.last_data_offset) == (epoch, 3, 3)
    # A retry of the last batch is recognised as a duplicate; the next sequence is accepted.
    retry = build_batch(
        [
            SimpleRecord(key=b"a", value=b"2", timestamp=T0),
            SimpleRecord(key=b"b", value=b"2", timestamp=T0),
        ],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=2,
    )
    info = reopened.append_as_leader(retry, leader_epoch=0)
    assert info.duplicate and info.first_offset == last
    following = build_batch(
        [SimpleRecord(key=b"c", value=b"1", timestamp=T0)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=4,
    )
    assert not reopened.append_as_leader(following, leader_epoch=0).duplicate
    reopened.close()


# -- crash safety -----------------------------------------------------------------------------


class SimulatedCrash(BaseException):
    """The process dying: no handler runs (the cleaner only tidies up after an Exception)."""


def crash_during_swap(renamed_old: int | None) -> Callable[[LogSegment, list[LogSegment]], None]:
    """A replace_segments that dies part way: before ``.swap`` (None), or after it with the
    first ``renamed_old`` old segments renamed ``.deleted``."""

    def replace(new_segment: LogSegment, old_segments: list[LogSegment]) -> None:
        new_segment.flush()
        crashed.append(new_segment)
        if renamed_old is None:
            raise SimulatedCrash
        new_segment.change_suffix(new_segment.suffix, ".swap")
        for old in old_segments[:renamed_old]:
            old.change_suffix("", ".deleted")
        raise SimulatedCrash

    crashed: list[LogSegment] = []
    replace.crashed = crashed  # type: ignore[attr-defined]
    return replace


def build_crash_log(data_dir: Path, clock: FakeClock) -> PartitionLog:
    log = open_log(data_dir, clock, segment_bytes=100_000)
    for round_ in range(5):  # five small segments that fit one group
        append_each(log, clock, [(f"k{i % 4}", f"r{round_}-{i}") for i in range(6)])
        append_each(log, clock, [(f"k{round_}", None)])
        log.roll()
    log.update_high_watermark(log.log_end_offset)
    return log


@pytest.mark.parametrize(
    ("renamed_old", "outcome"),
    [(None, "pre"), (0, "post"), (1, "post"), (3, "post"), (5, "post")],
    ids=[
        "cleaned-not-swapped",
        "swap-no-old-renamed",
        "swap-1-renamed",
        "swap-3-renamed",
        "swap-all-renamed",
    ],
)
def test_a_crash_during_cleaning_leaves_the_log_before_or_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, renamed_old: int | None, outcome: str
) -> None:
    clock = FakeClock()
    log = build_crash_log(tmp_path / "crash", clock)
    pre = read_all(log)
    # The same pass, completed, on a copy of the directory.
    shutil.copytree(tmp_path / "crash" / "topic-0", tmp_path / "copy" / "topic-0")
    copy = open_log(tmp_path / "copy", clock, segment_bytes=100_000)
    copy.update_high_watermark(copy.log_end_offset)
    cleaner_for(tmp_path / "copy", clock).clean_log(copy)
    post = read_all(copy)
    assert pre != post and latest_view(pre) == latest_view(post)

    replace = crash_during_swap(renamed_old)
    monkeypatch.setattr(log, "replace_segments", replace)
    with pytest.raises(SimulatedCrash):
        cleaner_for(tmp_path / "crash", clock).clean_log(log)
    # The process dies: every file is closed as it is, nothing more is written.
    for segment in [*log.segments, *replace.crashed]:  # type: ignore[attr-defined]
        segment.close()

    recovered = load_partition_log(
        tmp_path / "crash" / "topic-0",
        compact_config(segment_bytes=100_000),
        clock=clock,
        had_clean_shutdown=False,
    )
    content = read_all(recovered)
    assert content == (pre if outcome == "pre" else post)
    assert latest_view(content) == latest_view(pre)
    names = [p.name for p in (tmp_path / "crash" / "topic-0").iterdir()]
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))]
    # The recovered log is usable, and cleaning it again gives the post-clean log.
    recovered.update_high_watermark(recovered.log_end_offset)
    cleaner_for(tmp_path / "crash", clock).clean_log(recovered)
    assert read_all(recovered) == post


def test_a_failed_swap_leaves_the_log_as_it_was_and_no_cleaned_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    log = build_crash_log(tmp_path, clock)
    before = read_all(log)

    def failing_replace(new_segment: LogSegment, old_segments: list[LogSegment]) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(log, "replace_segments", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        cleaner_for(tmp_path, clock).clean_log(log)

    assert read_all(log) == before
    assert not [p for p in (tmp_path / "topic-0").iterdir() if p.name.endswith(".cleaned")]
    assert LogManager(tmp_path).cleaner_checkpoint.read() == {}


def test_a_crash_between_groups_loses_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    log = open_log(tmp_path, clock, segment_bytes=300)
    append_each(log, clock, [(f"k{i % 5}", f"v{i}") for i in range(40)] + [("k1", None)])
    finish_appends(log)
    pre = read_all(log)
    calls = 0
    real_replace = log.replace_segments

    def replace_then_crash(new_segment: LogSegment, old_segments: list[LogSegment]) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            new_segment.close()
            raise SimulatedCrash
        real_replace(new_segment, old_segments)

    monkeypatch.setattr(log, "replace_segments", replace_then_crash)
    with pytest.raises(SimulatedCrash):
        cleaner_for(tmp_path, clock).clean_log(log)
    for segment in log.segments:
        segment.close()
    recovered = load_partition_log(
        tmp_path / "topic-0",
        compact_config(segment_bytes=300),
        clock=clock,
        had_clean_shutdown=False,
    )
    content = read_all(recovered)
    assert latest_view(content) == latest_view(pre)
    assert set(content) <= set(pre)
    assert [e[0] for e in content] == sorted({e[0] for e in content})
    # The checkpoint did not move: the next pass starts over and completes the job.
    assert LogManager(tmp_path).cleaner_checkpoint.read() == {}
    recovered.update_high_watermark(recovered.log_end_offset)
    cleaner_for(tmp_path, clock).clean_log(recovered)
    assert read_all(recovered) == compacted_model(pre, 41, drop_tombstones=False)


# -- properties -------------------------------------------------------------------------------

one_batch = st.lists(
    st.tuples(st.integers(0, 7), st.none() | st.binary(min_size=0, max_size=12)),
    min_size=1,
    max_size=3,
)
operations = st.lists(one_batch, min_size=15, max_size=80)


def write_batches(
    log: PartitionLog, clock: FakeClock, batches: list[list[tuple[int, bytes | None]]]
) -> None:
    for batch in batches:
        append(log, clock, [(f"key-{k}".encode(), v) for k, v in batch])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    batches=operations,
    segment_size=st.integers(150, 600),
    hw_fraction=st.just(1.0) | st.floats(0.2, 1),
)
def test_cleaning_matches_a_model(
    batches: list[list[tuple[int, bytes | None]]], segment_size: int, hw_fraction: float
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        clock = FakeClock()
        retention = 1000
        log = open_log(data_dir, clock, segment_bytes=segment_size, delete_retention_ms=retention)
        write_batches(log, clock, batches)
        log.roll()
        log.update_high_watermark(int(log.log_end_offset * hw_fraction))
        before = read_all(log)
        end = expected_end(log)
        cleaner = cleaner_for(data_dir, clock)

        stats = cleaner.clean_log(log)

        assert stats.end_offset == end
        assert read_all(log) == compacted_model(before, end, drop_tombstones=False)
        offsets = [h.base_offset for h in headers(log)]
        assert offsets == sorted(set(offsets))
        for segment in log.segments:
            # Groups fit segment.bytes; only a delete horizon lengthens records' timestamp
            # deltas (here by one byte each).
            stamped = sum(
                h.records_count for _, h in segment.iter_headers() if h.has_delete_horizon
            )
            assert segment.size <= segment_size + stamped

        # Once the delete horizon has passed, the tombstones below the end go too.
        clock.advance(retention)
        cleaner.clean_log(log)
        assert read_all(log) == compacted_model(before, end, drop_tombstones=True)
        log.close()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    batches=st.lists(one_batch, min_size=10, max_size=40),
    segment_size=st.integers(150, 400),
    capacity=st.integers(1, 6),
    passes=st.lists(st.booleans(), min_size=1, max_size=6),
)
def test_passes_with_a_small_offset_map_never_change_what_a_consumer_sees(
    batches: list[list[tuple[int, bytes | None]]],
    segment_size: int,
    capacity: int,
    passes: list[bool],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        clock = FakeClock()
        log = open_log(data_dir, clock, segment_bytes=segment_size, delete_retention_ms=1000)
        write_batches(log, clock, batches)
        finish_appends(log)
        before = read_all(log)
        cleaner = cleaner_for(data_dir, clock, dedupe_buffer_entries=capacity)
        previous_end = 0
        stats: CleanerStats | None = None
        for advance in passes:
            if advance:
                clock.advance(1000)
            stats = cleaner.clean_log(log)
            assert stats.map_keys <= max(capacity, 3)  # at most one batch beyond the capacity
            assert stats.end_offset >= previous_end
            previous_end = stats.end_offset
            content = read_all(log)
            assert latest_view(content) == latest_view(before)
            assert set(content) <= set(before)
            assert [e[0] for e in content] == sorted({e[0] for e in content})
        # Enough passes reach the end, after which the log is fully compacted.
        while stats is not None and stats.end_offset < log.high_watermark:
            stats = cleaner.clean_log(log)
        assert read_all(log) == compacted_model(
            read_all(log), log.high_watermark, drop_tombstones=False
        )
        log.close()


def test_truncating_into_a_gap_compaction_left_moves_the_start_as_a_reopen_would(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    partition_log = open_log(tmp_path, clock)
    (tmp_path / "cleaner").mkdir()
    cleaner = LogCleaner(LogManager(tmp_path / "cleaner", clock=clock))
    for value in (b"old", b"new"):
        partition_log.append_as_leader(
            build_batch([SimpleRecord(key=b"k", value=value, timestamp=clock.now)]),
            leader_epoch=1,
        )
    partition_log.roll()
    partition_log.update_high_watermark(2)
    cleaner.clean_log(partition_log)  # offset 0 goes: only offset 1 holds a record
    partition_log.truncate_to(1)  # ...and it goes too: nothing is left below the end
    assert (partition_log.log_start_offset, partition_log.log_end_offset) == (1, 1)
    recovery_point = partition_log.flush()
    partition_log.close()
    reopened = load_partition_log(
        tmp_path / "topic-0",
        compact_config(),
        clock=clock,
        had_clean_shutdown=False,
        recovery_point=recovery_point,
    )
    assert (reopened.log_start_offset, reopened.log_end_offset) == (1, 1)
    reopened.close()


# -- the compiled pass against the reference ---------------------------------------------------


@contextlib.contextmanager
def pure_cleaner() -> Iterator[None]:
    """The cleaner's loops on the pure-Python codec (its offset map and filtering among them)."""
    saved = batch_module.codec
    batch_module.codec = None
    try:
        yield
    finally:
        batch_module.codec = saved


follower_batch = st.tuples(
    st.lists(
        st.tuples(st.none() | st.integers(0, 7), st.none() | st.binary(max_size=40)),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from(list(Compression)),
    st.sampled_from(list(TimestampType)),
    st.booleans(),  # an idempotent producer's
    st.integers(0, 3),  # the offset gap before the batch
)


@pytest.mark.skipif(batch_module.codec is None, reason="the pure-Python run: nothing to compare")
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    batches=st.lists(follower_batch, min_size=4, max_size=20),
    segment_size=st.integers(300, 1500),
)
def test_the_compiled_cleaner_writes_what_the_reference_writes(
    batches: list[
        tuple[list[tuple[int | None, bytes | None]], Compression, TimestampType, bool, int]
    ],
    segment_size: int,
) -> None:
    """Two logs of the same batches (keyless records, tombstones, every codec, LogAppendTime,
    producers, offset gaps), one cleaned with the compiled pass and one with the pure
    reference, twice (the second after the delete horizon): the same bytes and stats."""
    with tempfile.TemporaryDirectory() as tmp:
        logs, clocks = [], []
        for name in ("compiled", "reference"):
            clock = FakeClock()
            log = open_log(Path(tmp) / name, clock, segment_bytes=segment_size)
            offset, sequence = 0, 0
            for records, compression, timestamp_type, idempotent, gap in batches:
                offset += gap
                data = build_batch(
                    [
                        SimpleRecord(None if k is None else b"key-%d" % k, v, (), T0 + i)
                        for i, (k, v) in enumerate(records)
                    ],
                    base_offset=offset,
                    compression=compression,
                    timestamp_type=timestamp_type,
                    producer_id=5 if idempotent else -1,
                    producer_epoch=0 if idempotent else -1,
                    base_sequence=sequence if idempotent else -1,
                )
                log.append_as_follower(data)
                offset += len(records)
                sequence += len(records) if idempotent else 0
            finish_appends(log)
            logs.append(log)
            clocks.append(clock)
        for _ in range(2):
            stats = [cleaner_for(Path(tmp) / "compiled", clocks[0]).clean_log(logs[0])]
            with pure_cleaner():
                stats.append(cleaner_for(Path(tmp) / "reference", clocks[1]).clean_log(logs[1]))
            for s in stats:
                s.duration_s = 0.0
            assert stats[0] == stats[1]
            assert [segment_bytes(s) for s in logs[0].segments] == [
                segment_bytes(s) for s in logs[1].segments
            ]
            for clock in clocks:
                clock.advance(86_400_001)  # past delete.retention.ms
        for log in logs:
            log.close()
