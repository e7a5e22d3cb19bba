"""Retention: deleting whole segments by time, size and log start offset."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from highwater.config.topic import LogConfig
from highwater.errors import OffsetOutOfRangeError, StrayFileError
from highwater.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager, LogManagerSettings
from highwater.storage.retention import RetentionReason, SegmentSummary, deletable_segments
from highwater.storage.topic_partition import TopicPartition
from storage_helpers import FakeClock, make_batch, open_log, read_all


def _summaries(*sizes_and_ts: tuple[int, int]) -> list[SegmentSummary]:
    return [SegmentSummary(i * 10, size, ts) for i, (size, ts) in enumerate(sizes_and_ts)]


def test_rules_pick_a_prefix_below_the_high_watermark() -> None:
    segments = _summaries((100, 10), (100, 20), (100, 30), (100, 40))
    common = dict(
        retention_bytes=-1,
        delete_policy=True,
        log_start_offset=0,
        log_end_offset=40,
    )
    # By time: the first two are older than 1000 - 975 = 25.
    assert deletable_segments(
        segments, now_ms=1000, retention_ms=975, high_watermark=40, **common
    ) == (2, (RetentionReason.TIME,))
    # Never past the high watermark, whatever their age.
    assert deletable_segments(
        segments, now_ms=1000, retention_ms=1, high_watermark=5, **common
    ) == (0, ())
    assert deletable_segments(
        segments, now_ms=1000, retention_ms=1, high_watermark=15, **common
    ) == (1, (RetentionReason.TIME,))
    assert deletable_segments(
        segments, now_ms=1000, retention_ms=1, high_watermark=20, **common
    ) == (2, (RetentionReason.TIME,))
    # An old segment after a young one is kept: only a prefix goes.
    mixed = _summaries((100, 10), (100, 999), (100, 10), (100, 999))
    assert deletable_segments(
        mixed, now_ms=1000, retention_ms=500, high_watermark=40, **common
    ) == (1, (RetentionReason.TIME,))


def test_size_rule_keeps_the_log_at_or_above_the_limit() -> None:
    segments = _summaries((100, 0), (100, 0), (100, 0), (50, 0))
    count, reason = deletable_segments(
        segments,
        now_ms=0,
        retention_ms=-1,
        retention_bytes=160,
        delete_policy=True,
        log_start_offset=0,
        log_end_offset=40,
        high_watermark=40,
    )
    assert (count, reason) == (1, (RetentionReason.SIZE,))  # 350 - 100 = 250 >= 160; 150 < 160


def test_log_start_rule_applies_to_compacted_logs_too() -> None:
    segments = _summaries((100, 0), (100, 0), (100, 0))
    count, reason = deletable_segments(
        segments,
        now_ms=10**12,
        retention_ms=1,
        retention_bytes=1,
        delete_policy=False,
        log_start_offset=20,
        log_end_offset=30,
        high_watermark=30,
    )
    assert (count, reason) == (2, (RetentionReason.LOG_START_OFFSET,))


def test_one_pass_applies_every_rule_to_what_the_earlier_ones_left() -> None:
    # Log start offset 10 takes the first; of the 400 bytes left, 150 over retention.bytes
    # (250), the size rule takes the next; of the rest the time rule takes the old one.
    segments = _summaries((100, 999), (100, 999), (100, 10), (100, 999), (100, 999))
    count, reasons = deletable_segments(
        segments,
        now_ms=1000,
        retention_ms=500,
        retention_bytes=250,
        delete_policy=True,
        log_start_offset=10,
        log_end_offset=50,
        high_watermark=50,
    )
    assert count == 3
    assert reasons == (
        RetentionReason.LOG_START_OFFSET,
        RetentionReason.SIZE,
        RetentionReason.TIME,
    )
    # The size rule counts only the segments the log start rule left: 300 bytes, 50 over.
    assert deletable_segments(
        segments,
        now_ms=1000,
        retention_ms=-1,
        retention_bytes=250,
        delete_policy=True,
        log_start_offset=20,
        log_end_offset=50,
        high_watermark=50,
    ) == (2, (RetentionReason.LOG_START_OFFSET,))


def test_a_log_with_an_expired_segment_and_over_its_size_is_trimmed_in_one_pass(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    log = open_log(
        tmp_path / "t-0",
        clock,
        **{"segment.bytes": 400, "retention.ms": 10_000, "retention.bytes": 700},
    )
    for i in range(12):
        if i == 2:
            clock.advance(20_000)  # only the first segment's records are past retention.ms
        log.append_as_leader(make_batch([b"x" * 100], timestamp=clock.now), 0)
    log.update_high_watermark(log.log_end_offset)
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6, 8, 10]

    # The time rule alone takes one segment; the size rule, in the same pass, takes the
    # log down to the last size at or above retention.bytes.
    assert log.delete_old_segments() == 3
    assert log.log_start_offset == 6
    assert log.size >= 700
    assert log.delete_old_segments() == 0


def test_time_retention_on_a_log(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(
        tmp_path / "t-0",
        clock,
        **{"segment.bytes": 400, "retention.ms": 10_000, "file.delete.delay.ms": 5_000},
    )
    for i in range(10):
        log.append_as_leader(make_batch([b"x" * 100], timestamp=clock.now + i), 0)
    clock.advance(5_000)
    for i in range(10):
        log.append_as_leader(make_batch([b"y" * 100], timestamp=clock.now + i), 0)
    log.update_high_watermark(log.log_end_offset)
    clock.advance(6_000)  # the first ten records are now 11 s old, the others 6 s
    deleted = log.delete_old_segments()
    assert deleted > 0
    assert 0 < log.log_start_offset <= 10
    assert all(r.value.startswith(b"y") or r.offset >= log.log_start_offset for r in read_all(log))
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    # Renamed now, removed after file.delete.delay.ms.
    directory = tmp_path / "t-0"
    assert list(directory.glob("*.log.deleted"))
    assert log.delete_pending_files() == 0
    assert log.has_pending_deletions
    clock.advance(5_000)
    assert log.delete_pending_files() == deleted
    assert not log.has_pending_deletions
    assert not list(directory.glob("*.deleted"))
    log.close()


def test_every_segment_expired_rolls_a_new_active_segment(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path / "t-0", clock, **{"retention.ms": 1000, "segment.bytes": 400})
    for _ in range(8):
        log.append_as_leader(make_batch([b"x" * 100], timestamp=clock.now), 0)
    log.update_high_watermark(log.log_end_offset)
    clock.advance(5000)
    log.delete_old_segments()
    assert log.log_start_offset == log.log_end_offset == 8
    assert len(log.segments) == 1 and log.active_segment.base_offset == 8
    assert log.append_as_leader(make_batch([b"z"], timestamp=clock.now), 0).first_offset == 8
    log.close()


def test_size_retention_on_a_log(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"segment.bytes": 500, "retention.bytes": 1200})
    for _ in range(30):
        log.append_as_leader(make_batch([b"x" * 100]), 0)
    log.update_high_watermark(log.log_end_offset)
    before = log.size
    log.delete_old_segments()
    assert log.size < before
    assert log.size >= 1200
    log.close()


def test_delete_records_moves_log_start_then_segments_go(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", **{"segment.bytes": 400})
    for _ in range(20):
        log.append_as_leader(make_batch([b"x" * 100]), 0)
    log.update_high_watermark(12)
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(13)  # not past the high watermark
    assert log.maybe_increment_log_start_offset(9)
    assert log.log_start_offset == 9
    assert next(r.offset for r in read_all(log)) == 9
    assert log.delete_old_segments() > 0
    assert log.segments[0].base_offset <= 9 < log.segments[0].next_offset
    log.close()


def test_log_manager_checkpoints_and_clean_shutdown(tmp_path: Path) -> None:
    tp = TopicPartition("orders", 3)
    manager = LogManager(tmp_path, default_config=LogConfig.from_properties({"segment.bytes": 400}))
    manager.startup(cluster_id="abc", node_id=1)
    log = manager.get_or_create_log(tp)
    for _ in range(10):
        log.append_as_leader(make_batch([b"x" * 50]), 0)
    log.update_high_watermark(7)
    log.maybe_increment_log_start_offset(2)
    manager.shutdown()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    text = (tmp_path / "replication-offset-checkpoint").read_text()
    assert text.splitlines() == ["0", "1", "orders 3 7"]
    meta = (tmp_path / "meta.properties").read_text().splitlines()
    assert meta[:3] == ["version=1", "cluster.id=abc", "node.id=1"]
    assert meta[3] == f"directory.id={manager.log_dirs[0].directory_id}"
    assert len(manager.log_dirs[0].directory_id) == 22  # a Uuid in Kafka's base64

    again = LogManager(tmp_path)
    again.startup(cluster_id="abc", node_id=1)
    assert again.had_clean_shutdown
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # a crash from now on is unclean
    reopened = again.get_log(tp)
    assert reopened is not None
    assert (reopened.log_start_offset, reopened.high_watermark, reopened.log_end_offset) == (
        2,
        7,
        10,
    )
    again.shutdown()

    wrong = LogManager(tmp_path)
    with pytest.raises(Exception, match="node 1"):
        wrong.startup(cluster_id="abc", node_id=2)


def test_log_manager_rejects_stray_entries(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(StrayFileError, match=r"notes\.txt"):
        LogManager(tmp_path).startup()
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "lost+found").mkdir()
    manager = LogManager(tmp_path)
    manager.startup()
    manager.shutdown()


async def test_background_upkeep_flushes_and_applies_retention(tmp_path: Path) -> None:
    clock = FakeClock()
    settings = LogManagerSettings(
        log_retention_check_interval_ms=20,
        log_flush_scheduler_interval_ms=10,
        log_flush_offset_checkpoint_interval_ms=20,
        replica_high_watermark_checkpoint_interval_ms=20,
        log_cleaner_enable=False,
    )
    config = LogConfig.from_properties(
        {"flush.messages": 3, "segment.bytes": 400, "retention.ms": 1000, "file.delete.delay.ms": 0}
    )
    manager = LogManager(tmp_path, default_config=config, settings=settings, clock=clock)
    manager.startup()
    log = manager.get_or_create_log(TopicPartition("t", 0))
    for _ in range(6):
        log.append_as_leader(make_batch([b"x" * 100], timestamp=clock.now), 0)
    log.update_high_watermark(log.log_end_offset)
    task = asyncio.create_task(manager.run_background())
    try:
        for _ in range(200):
            await asyncio.sleep(0.01)
            if log.recovery_point == log.log_end_offset:
                break
        assert log.recovery_point == 6
        clock.advance(10_000)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if log.log_start_offset == 6:
                break
        assert log.log_start_offset == 6
        for _ in range(200):
            await asyncio.sleep(0.01)
            if "t 0 6" in (tmp_path / "log-start-offset-checkpoint").read_text():
                break
        assert "t 0 6" in (tmp_path / "log-start-offset-checkpoint").read_text()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    manager.shutdown()
