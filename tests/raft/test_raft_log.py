"""InMemoryRaftLog: the RaftLog contract the core relies on (offsets, epochs, truncation, flush)."""

from __future__ import annotations

import pytest
from highwater.errors import InvalidRecordError, OffsetOutOfRangeError, UnexpectedAppendOffsetError
from highwater.raft.log import (
    InMemoryRaftLog,
    LogEntry,
    decode_leader_change,
    encode_leader_change,
)
from highwater.raft.messages import OffsetAndEpoch
from highwater.records import iter_batches


def log_with_epochs(*epochs: tuple[int, int]) -> InMemoryRaftLog:
    """A log holding ``count`` one-entry batches for each ``(epoch, count)``."""
    log = InMemoryRaftLog()
    for epoch, count in epochs:
        for _ in range(count):
            log.append_as_leader([f"e{epoch}-{log.end_offset}".encode()], epoch)
    return log


def test_an_empty_log_starts_and_ends_at_zero_in_epoch_zero() -> None:
    log = InMemoryRaftLog()
    assert (log.start_offset, log.end_offset, log.last_epoch, log.flushed_offset) == (0, 0, 0, 0)
    assert log.end_offset_for_epoch(0) == OffsetAndEpoch(0, 0)
    assert log.end_offset_for_epoch(5) == OffsetAndEpoch(0, 0)
    assert log.read(0, 1000) == b""


def test_append_as_leader_writes_one_batch_stamped_with_the_epoch() -> None:
    log = InMemoryRaftLog()
    assert log.append_as_leader([b"a", b"b", b"c"], 3) == OffsetAndEpoch(2, 3)
    assert log.append_as_leader([b"d"], 4, control=True) == OffsetAndEpoch(3, 4)
    batches = list(iter_batches(log.read(0, 1 << 20)))
    assert [(b.base_offset, b.last_offset, b.partition_leader_epoch) for b in batches] == [
        (0, 2, 3),
        (3, 3, 4),
    ]
    assert [b.is_control for b in batches] == [False, True]
    assert [r.value for r in batches[0].records()] == [b"a", b"b", b"c"]
    assert log.entries() == [
        LogEntry(0, 3, b"a", False),
        LogEntry(1, 3, b"b", False),
        LogEntry(2, 3, b"c", False),
        LogEntry(3, 4, b"d", True),
    ]
    assert (log.end_offset, log.last_epoch, log.flushed_offset) == (4, 4, 0)


def test_append_as_leader_refuses_nothing_and_older_epochs() -> None:
    log = log_with_epochs((5, 1))
    with pytest.raises(ValueError):
        log.append_as_leader([], 5)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader([b"x"], 4)


def test_append_as_follower_copies_the_leaders_batches_byte_for_byte() -> None:
    leader = log_with_epochs((1, 2), (3, 2))
    follower = InMemoryRaftLog()
    follower.append_as_follower(leader.read(0, 1 << 20))
    assert follower.entries() == leader.entries()
    assert follower.read(0, 1 << 20) == leader.read(0, 1 << 20)
    assert (follower.end_offset, follower.last_epoch) == (4, 3)


def test_append_as_follower_must_continue_the_log() -> None:
    leader = log_with_epochs((1, 3))
    follower = InMemoryRaftLog()
    with pytest.raises(UnexpectedAppendOffsetError):
        follower.append_as_follower(leader.read(1, 1 << 20))
    assert follower.end_offset == 0  # nothing of a rejected append is kept


def test_read_returns_whole_batches_at_least_one() -> None:
    log = log_with_epochs((1, 5))
    one_batch = len(log.read(4, 1 << 20))
    assert len(list(iter_batches(log.read(0, 1)))) == 1
    assert len(list(iter_batches(log.read(0, 2 * one_batch)))) == 2
    assert len(list(iter_batches(log.read(2, 1 << 20)))) == 3
    assert log.read(5, 100) == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(6, 100)


def test_end_offset_for_epoch_is_where_the_largest_epoch_at_most_the_requested_ends() -> None:
    log = log_with_epochs((1, 2), (3, 3), (6, 1))  # epoch 1: [0, 2), 3: [2, 5), 6: [5, 6)
    assert log.end_offset_for_epoch(1) == OffsetAndEpoch(2, 1)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(2, 1)
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(5, 3)
    assert log.end_offset_for_epoch(5) == OffsetAndEpoch(5, 3)
    assert log.end_offset_for_epoch(6) == OffsetAndEpoch(6, 6)
    assert log.end_offset_for_epoch(9) == OffsetAndEpoch(6, 6)
    assert log.end_offset_for_epoch(0) == OffsetAndEpoch(0, 0)


def test_truncate_to_removes_the_suffix_and_what_was_flushed_of_it() -> None:
    log = log_with_epochs((1, 2), (3, 3))
    log.mark_flushed(5)
    log.truncate_to(2)
    assert (log.end_offset, log.last_epoch, log.flushed_offset) == (2, 1, 2)
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(2, 1)
    log.truncate_to(7)  # past the end: nothing to do
    assert log.end_offset == 2
    log.append_as_leader([b"new"], 4)
    assert log.entry(2) == LogEntry(2, 4, b"new", False)


def test_truncate_to_needs_a_batch_boundary_within_the_log() -> None:
    log = InMemoryRaftLog()
    log.append_as_leader([b"a", b"b"], 1)
    with pytest.raises(ValueError):
        log.truncate_to(1)
    log.delete_before(2)
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_to(0)


def test_truncate_to_snapshot_starts_the_log_afresh_at_the_snapshot() -> None:
    log = log_with_epochs((1, 3))
    log.truncate_to_snapshot(OffsetAndEpoch(10, 4))
    assert (log.start_offset, log.end_offset, log.last_epoch, log.flushed_offset) == (10, 10, 4, 10)
    assert log.end_offset_for_epoch(4) == OffsetAndEpoch(10, 4)
    # Before its start the log can vouch for nothing but the snapshot.
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(10, 4)
    log.append_as_leader([b"x"], 5)
    assert log.end_offset_for_epoch(4) == OffsetAndEpoch(10, 4)
    assert log.end_offset_for_epoch(5) == OffsetAndEpoch(11, 5)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(9, 100)


def test_delete_before_moves_the_start_up_and_keeps_the_epoch_of_the_entry_before_it() -> None:
    log = log_with_epochs((1, 2), (3, 3))
    log.delete_before(3)
    assert (log.start_offset, log.end_offset, log.last_epoch) == (3, 5, 3)
    assert log.end_offset_for_epoch(1) == OffsetAndEpoch(3, 3)
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(5, 3)
    log.delete_before(5)
    assert (log.start_offset, log.end_offset, log.last_epoch) == (5, 5, 3)
    assert log.flushed_offset == 5
    log.delete_before(1)  # below the start: nothing to do
    assert log.start_offset == 5
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_before(6)


def test_crash_loses_only_what_was_not_flushed_when_asked() -> None:
    log = log_with_epochs((1, 3))
    log.mark_flushed(2)
    log.crash(lose_unflushed=True)
    assert (log.end_offset, log.flushed_offset) == (2, 2)
    log.append_as_leader([b"x"], 2)
    log.crash(lose_unflushed=False)
    assert (log.end_offset, log.flushed_offset) == (3, 3)


def test_crash_rounds_a_flush_inside_a_batch_down_to_the_batch_start() -> None:
    log = InMemoryRaftLog()
    log.append_as_leader([b"a"], 1)
    log.append_as_leader([b"b", b"c"], 1)
    log.mark_flushed(2)
    log.crash(lose_unflushed=True)
    assert log.end_offset == 1


def test_mark_flushed_never_goes_past_the_end_nor_backwards() -> None:
    log = log_with_epochs((1, 2))
    log.mark_flushed(7)
    assert log.flushed_offset == 2
    log.mark_flushed(1)
    assert log.flushed_offset == 2


def test_record_timestamps_come_from_the_clock_given() -> None:
    log = InMemoryRaftLog(clock=lambda: 1234)
    log.append_as_leader([b"a"], 1)
    (batch,) = iter_batches(log.read(0, 100))
    assert [r.timestamp for r in batch.records()] == [1234]


def test_leader_change_control_record_round_trips() -> None:
    value = encode_leader_change(2, [3, 1, 2])
    assert decode_leader_change(value) == (2, (1, 2, 3))
    with pytest.raises(InvalidRecordError):
        decode_leader_change(b'{"type":"other"}')
