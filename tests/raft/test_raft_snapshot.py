"""InMemorySnapshotStore: the SnapshotStore contract (write, chunked reads, chunked receives)."""

from __future__ import annotations

import pytest
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.snapshot import (
    InMemorySnapshotStore,
    PositionOutOfRangeError,
    SnapshotNotFoundError,
)
from highwater.v1.common_pb2 import ErrorCode

S10 = OffsetAndEpoch(10, 2)
S20 = OffsetAndEpoch(20, 3)


def test_a_new_store_is_empty() -> None:
    store = InMemorySnapshotStore()
    assert store.latest() is None
    assert store.snapshots() == []


def test_written_snapshots_are_listed_oldest_first_and_latest_is_the_largest() -> None:
    store = InMemorySnapshotStore()
    store.write(S20, b"twenty")
    store.write(S10, b"ten")
    assert store.snapshots() == [S10, S20]
    assert store.latest() == S20


def test_read_chunk_pages_through_a_snapshot() -> None:
    store = InMemorySnapshotStore()
    store.write(S10, b"0123456789")
    assert store.read_chunk(S10, 0, 4) == (b"0123", 10)
    assert store.read_chunk(S10, 8, 4) == (b"89", 10)
    assert store.read_chunk(S10, 10, 4) == (b"", 10)


def test_read_chunk_errors_carry_the_protocol_error_codes() -> None:
    store = InMemorySnapshotStore()
    store.write(S10, b"0123")
    with pytest.raises(SnapshotNotFoundError) as not_found:
        store.read_chunk(S20, 0, 4)
    assert not_found.value.code == ErrorCode.SNAPSHOT_NOT_FOUND
    with pytest.raises(PositionOutOfRangeError) as out_of_range:
        store.read_chunk(S10, 5, 4)
    assert out_of_range.value.code == ErrorCode.POSITION_OUT_OF_RANGE


def test_a_received_snapshot_is_visible_only_once_finished() -> None:
    store = InMemorySnapshotStore()
    store.begin_receive(S20)
    store.receive_chunk(0, b"abc")
    store.receive_chunk(3, b"def")
    assert store.latest() is None
    assert store.finish_receive() == S20
    assert store.read(S20) == b"abcdef"


def test_chunks_must_arrive_in_order() -> None:
    store = InMemorySnapshotStore()
    store.begin_receive(S20)
    store.receive_chunk(0, b"abc")
    with pytest.raises(PositionOutOfRangeError):
        store.receive_chunk(5, b"xyz")


def test_begin_receive_drops_a_partial_snapshot_and_a_crash_too() -> None:
    store = InMemorySnapshotStore()
    store.begin_receive(S10)
    store.receive_chunk(0, b"partial")
    store.begin_receive(S20)
    store.receive_chunk(0, b"whole")
    assert store.finish_receive() == S20
    assert store.read(S20) == b"whole"
    store.begin_receive(S10)
    store.crash()
    with pytest.raises(RuntimeError):
        store.finish_receive()


def test_delete_before_keeps_the_snapshot_named_and_newer_ones() -> None:
    store = InMemorySnapshotStore()
    for snapshot_id in (OffsetAndEpoch(5, 1), S10, S20):
        store.write(snapshot_id, b"x")
    store.delete_before(S10)
    assert store.snapshots() == [S10, S20]
