"""Tests of the leader epoch cache: Kafka's rules and the KIP-101/KIP-279 recovery stories."""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from highwater.storage.checkpoint import EpochEntry, LeaderEpochCheckpointFile
from highwater.storage.leader_epoch import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    LeaderEpochCache,
)
from hypothesis import given, settings
from hypothesis import strategies as st

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def cache_with(*entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(None)
    for epoch, start_offset in entries:
        cache.assign(epoch, start_offset)
    assert cache.entries == tuple(EpochEntry(e, o) for e, o in entries)
    return cache


def pairs(cache: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in cache.entries]


# --- assign ----------------------------------------------------------------------------


def test_empty_cache() -> None:
    cache = LeaderEpochCache(None)
    assert cache.entries == ()
    assert cache.latest_epoch is None
    assert cache.latest_entry is None
    assert cache.earliest_entry is None
    assert len(cache) == 0
    assert cache.epoch_for_offset(0) is None


def test_assign_appends_new_epochs() -> None:
    cache = LeaderEpochCache(None)
    assert cache.assign(0, 0)
    assert cache.assign(1, 300)
    assert cache.assign(2, 500)
    assert pairs(cache) == [(0, 0), (1, 300), (2, 500)]
    assert cache.latest_epoch == 2
    assert cache.latest_entry == EpochEntry(2, 500)
    assert cache.earliest_entry == EpochEntry(0, 0)
    assert len(cache) == 3


def test_assign_ignores_the_latest_epoch_at_a_later_offset() -> None:
    cache = cache_with((2, 6))
    assert not cache.assign(2, 7)
    assert not cache.assign(2, 6)
    assert pairs(cache) == [(2, 6)]


def test_assign_of_latest_epoch_at_an_earlier_offset_replaces_it() -> None:
    cache = cache_with((1, 3), (2, 6))
    assert cache.assign(2, 5)
    assert pairs(cache) == [(1, 3), (2, 5)]


def test_assign_removes_entries_with_larger_or_equal_start_offsets() -> None:
    cache = cache_with((2, 6))
    cache.assign(3, 5)
    assert pairs(cache) == [(3, 5)]
    cache = cache_with((1, 0), (2, 6), (3, 8))
    cache.assign(4, 6)
    assert pairs(cache) == [(1, 0), (4, 6)]


def test_assign_removes_entries_with_larger_or_equal_epochs() -> None:
    cache = cache_with((1, 0), (3, 5), (4, 8))
    cache.assign(2, 10)
    assert pairs(cache) == [(1, 0), (2, 10)]


def test_assign_of_an_epoch_that_wrote_nothing_is_replaced() -> None:
    # A leader that was elected but never appended: its successor starts at the same offset.
    cache = cache_with((0, 0), (1, 4))
    cache.assign(2, 4)
    assert pairs(cache) == [(0, 0), (2, 4)]


@pytest.mark.parametrize(("epoch", "offset"), [(-1, 0), (0, -1)])
def test_assign_refuses_negative_values(epoch: int, offset: int) -> None:
    with pytest.raises(ValueError):
        LeaderEpochCache(None).assign(epoch, offset)


# --- epoch_for_offset ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "epoch"),
    [(0, None), (4, None), (5, 1), (7, 1), (8, 2), (12, 2), (13, 4), (1000, 4)],
)
def test_epoch_for_offset(offset: int, epoch: int | None) -> None:
    cache = cache_with((1, 5), (2, 8), (4, 13))
    assert cache.epoch_for_offset(offset) == epoch


# --- end_offset_for (OffsetsForLeaderEpoch) --------------------------------------------


def test_end_offset_for_on_an_empty_cache_is_undefined() -> None:
    cache = LeaderEpochCache(None)
    assert cache.end_offset_for(0, 10) == UNDEFINED
    assert cache.end_offset_for(UNDEFINED_EPOCH, 10) == UNDEFINED


def test_end_offset_for_the_latest_epoch_is_the_log_end_offset() -> None:
    cache = cache_with((0, 0), (1, 300), (2, 500))
    assert cache.end_offset_for(2, 742) == (2, 742)


def test_end_offset_for_an_older_epoch_is_the_next_epochs_start() -> None:
    cache = cache_with((0, 0), (1, 300), (2, 500))
    assert cache.end_offset_for(0, 742) == (0, 300)
    assert cache.end_offset_for(1, 742) == (1, 500)


def test_end_offset_for_an_epoch_missing_from_the_cache() -> None:
    # Epochs 1 and 3 wrote nothing on this replica: answer with the largest epoch below
    # the requested one and the start of the first epoch above it.
    cache = cache_with((0, 10), (2, 13), (4, 17))
    assert cache.end_offset_for(0, 20) == (0, 13)
    assert cache.end_offset_for(1, 20) == (0, 13)
    assert cache.end_offset_for(2, 20) == (2, 17)
    assert cache.end_offset_for(3, 20) == (2, 17)
    assert cache.end_offset_for(4, 20) == (4, 20)


def test_end_offset_for_an_epoch_above_the_latest_is_undefined() -> None:
    cache = cache_with((0, 0), (1, 5))
    assert cache.end_offset_for(2, 9) == UNDEFINED
    assert cache.end_offset_for(UNDEFINED_EPOCH, 9) == UNDEFINED


def test_end_offset_for_an_epoch_below_the_earliest() -> None:
    # As Kafka: the requested epoch's data is gone from this log (the log start moved past
    # it), so the answer is the requested epoch ending where the earliest known epoch
    # starts, and the follower truncates to where this log begins.
    cache = cache_with((5, 11), (6, 12), (7, 13))
    assert cache.end_offset_for(4, 20) == (4, 11)
    assert cache.end_offset_for(0, 20) == (0, 11)


# --- Truncation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("end_offset", "left"),
    [
        (12, [(2, 6), (3, 8), (4, 11)]),
        (11, [(2, 6), (3, 8)]),
        (9, [(2, 6), (3, 8)]),
        (8, [(2, 6)]),
        (7, [(2, 6)]),
        (6, []),
        (0, []),
        (-1, [(2, 6), (3, 8), (4, 11)]),
    ],
)
def test_truncate_from_end(end_offset: int, left: list[tuple[int, int]]) -> None:
    cache = cache_with((2, 6), (3, 8), (4, 11))
    cache.truncate_from_end(end_offset)
    assert pairs(cache) == left


@pytest.mark.parametrize(
    ("start_offset", "left"),
    [
        (0, [(2, 6), (3, 8), (4, 11)]),
        (5, [(2, 6), (3, 8), (4, 11)]),
        (6, [(2, 6), (3, 8), (4, 11)]),
        (7, [(2, 7), (3, 8), (4, 11)]),
        (8, [(3, 8), (4, 11)]),
        (9, [(3, 9), (4, 11)]),
        (11, [(4, 11)]),
        (15, [(4, 15)]),
    ],
)
def test_truncate_from_start(start_offset: int, left: list[tuple[int, int]]) -> None:
    cache = cache_with((2, 6), (3, 8), (4, 11))
    cache.truncate_from_start(start_offset)
    assert pairs(cache) == left


def test_truncation_of_an_empty_cache() -> None:
    cache = LeaderEpochCache(None)
    cache.truncate_from_end(5)
    cache.truncate_from_start(5)
    assert cache.entries == ()


def test_clear() -> None:
    cache = cache_with((0, 0), (1, 5))
    cache.clear()
    assert cache.entries == ()
    assert cache.latest_epoch is None


# --- Persistence -----------------------------------------------------------------------


def test_every_change_is_flushed_and_survives_reload(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    cache = LeaderEpochCache(LeaderEpochCheckpointFile(path))
    assert not path.exists()

    def on_disk() -> list[tuple[int, int]]:
        reloaded = LeaderEpochCache(LeaderEpochCheckpointFile(path))
        return pairs(reloaded)

    cache.assign(0, 0)
    assert on_disk() == [(0, 0)]
    cache.assign(1, 300)
    cache.assign(2, 500)
    assert path.read_text() == "0\n3\n0 0\n1 300\n2 500\n"
    assert on_disk() == [(0, 0), (1, 300), (2, 500)]
    cache.truncate_from_end(400)
    assert on_disk() == [(0, 0), (1, 300)]
    cache.truncate_from_start(100)
    assert on_disk() == [(0, 100), (1, 300)]
    cache.assign(3, 350)
    assert on_disk() == [(0, 100), (1, 300), (3, 350)]
    cache.clear()
    assert on_disk() == []
    assert path.read_text() == "0\n0\n"


def test_no_op_changes_do_not_rewrite_the_file(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    cache = LeaderEpochCache(LeaderEpochCheckpointFile(path))
    cache.assign(1, 5)
    path.write_text("0\n1\n1 5\n")  # same contents; a rewrite would replace the inode
    inode = path.stat().st_ino
    cache.assign(1, 9)
    cache.truncate_from_end(6)
    cache.truncate_from_start(5)
    cache.truncate_from_start(2)
    assert path.stat().st_ino == inode


def test_loading_an_out_of_order_file_keeps_it_monotonic_as_kafka_does(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n4\n0 0\n1 10\n3 5\n4 20\n")
    cache = LeaderEpochCache(LeaderEpochCheckpointFile(path))
    assert pairs(cache) == [(0, 0), (3, 5), (4, 20)]


# --- The recovery stories of the seed article (and KIP-101 / KIP-279) ------------------


@dataclass
class Replica:
    """A replica reduced to what leader epochs need: per-offset epochs, HW and the cache."""

    name: str
    log: list[tuple[int, str]] = field(default_factory=list)  # (leader epoch, record)
    hw: int = 0
    epoch: int = -1  # the epoch this replica leads, once it leads
    cache: LeaderEpochCache = field(default_factory=lambda: LeaderEpochCache(None))

    @property
    def leo(self) -> int:
        return len(self.log)

    def become_leader(self, epoch: int) -> None:
        # Kafka records the new epoch at the log end offset when the replica becomes leader.
        self.cache.assign(epoch, self.leo)
        self.epoch = epoch

    def append(self, record: str) -> None:
        self.cache.assign(self.epoch, self.leo)
        self.log.append((self.epoch, record))

    def truncate_to(self, offset: int) -> None:
        if offset < self.leo:
            del self.log[offset:]
            self.cache.truncate_from_end(offset)
        self.hw = min(self.hw, offset)

    def fetch_from(self, leader: Replica) -> None:
        for epoch, record in leader.log[self.leo :]:
            self.cache.assign(epoch, self.leo)
            self.log.append((epoch, record))
        self.hw = min(leader.hw, self.leo)

    def records(self) -> list[str]:
        return [record for _, record in self.log]


def truncate_by_leader_epoch(follower: Replica, leader: Replica) -> None:
    """The follower's side of OffsetsForLeaderEpoch (KIP-279), repeated until it agrees."""
    for _ in range(10):
        requested = follower.cache.latest_epoch
        if requested is None:
            follower.truncate_to(follower.hw)
            return
        epoch, end_offset = leader.cache.end_offset_for(requested, leader.leo)
        if end_offset == UNDEFINED_EPOCH_OFFSET:
            follower.truncate_to(follower.hw)
            return
        own_epoch, own_end = follower.cache.end_offset_for(epoch, follower.leo)
        if own_epoch == epoch:
            follower.truncate_to(min(end_offset, own_end, follower.leo))
            return
        # The follower lacks the leader's epoch: cut back to the end of its own version of
        # it and ask again with the epoch that is now its latest.
        follower.truncate_to(min(own_end, follower.leo))
    raise AssertionError("no agreement after 10 rounds")


def assert_converged(*replicas: Replica) -> None:
    first = replicas[0]
    for other in replicas[1:]:
        assert other.log == first.log, (first.name, first.log, other.name, other.log)
        assert other.cache.entries == first.cache.entries


def test_no_loss_when_the_follower_restarts_before_learning_the_new_hw() -> None:
    # A leads epoch 0 and wrote m0, m1; B fetched both, but crashed before the fetch that
    # would have told it HW = 2, so B's HW is 1.
    a, b = Replica("A"), Replica("B")
    a.become_leader(0)
    a.append("m0")
    b.fetch_from(a)
    a.append("m1")
    b.fetch_from(a)
    a.hw, b.hw = 2, 1
    # Old rule: B truncates to its HW on restart and m1, acknowledged, is at risk.
    # With epochs, B asks A for the end of epoch 0 - A's latest epoch, so A's LEO: 2.
    assert a.cache.end_offset_for(0, a.leo) == (0, 2)
    truncate_by_leader_epoch(b, a)
    assert b.records() == ["m0", "m1"]
    assert_converged(a, b)


def test_no_loss_when_the_follower_becomes_leader_and_the_old_leader_returns() -> None:
    # As above, but A is down when B restarts: B is elected for epoch 1 at its LEO 2.
    a, b = Replica("A"), Replica("B")
    a.become_leader(0)
    for record in ("m0", "m1"):
        a.append(record)
        b.fetch_from(a)
    a.hw, b.hw = 2, 1
    b.become_leader(1)
    assert pairs(b.cache) == [(0, 0), (1, 2)]
    # A restarts as a follower with latest epoch 0; B answers with the start of the first
    # epoch after 0: offset 2 = A's LEO, so A truncates nothing.
    assert b.cache.end_offset_for(0, b.leo) == (0, 2)
    truncate_by_leader_epoch(a, b)
    assert a.records() == ["m0", "m1"]
    b.append("m2")
    a.fetch_from(b)
    assert a.records() == ["m0", "m1", "m2"]
    assert_converged(a, b)


def test_no_divergence_when_both_crash_and_the_shorter_log_wins() -> None:
    # A leads epoch 0 with m0, m1 (HW 2); B has only m0. Both crash; B comes back first
    # and is elected for epoch 1, writing epoch 1 at offset 1, then takes m2 at offset 1.
    a, b = Replica("A"), Replica("B")
    a.become_leader(0)
    a.append("m0")
    b.fetch_from(a)
    a.append("m1")
    a.hw, b.hw = 2, 1
    b.become_leader(1)
    b.append("m2")
    b.hw = 2
    assert pairs(b.cache) == [(0, 0), (1, 1)]
    # Old rule: A's HW (2) equals B's, A truncates nothing and offset 1 differs forever.
    assert a.log[1] != b.log[1]
    # With epochs: A asks for the end of epoch 0, B says 1, A drops m1 and fetches m2.
    assert b.cache.end_offset_for(0, b.leo) == (0, 1)
    truncate_by_leader_epoch(a, b)
    assert a.records() == ["m0"]
    a.fetch_from(b)
    assert a.records() == ["m0", "m2"]
    assert_converged(a, b)


def test_no_divergence_after_fast_double_failover_kip_279() -> None:
    # Epoch 0: A leads; m0, m1 reach B; A writes m2 alone and dies.
    a, b = Replica("A"), Replica("B")
    a.become_leader(0)
    for record in ("m0", "m1"):
        a.append(record)
        b.fetch_from(a)
    a.append("m2")
    # Epoch 1: B leads, writes n2 alone at offset 2, and dies at once.
    b.become_leader(1)
    b.append("n2")
    # Epoch 2: A is back and leads again at its LEO 3, writing p3, p4.
    a.become_leader(2)
    a.append("p3")
    a.append("p4")
    assert pairs(a.cache) == [(0, 0), (2, 3)]
    assert pairs(b.cache) == [(0, 0), (1, 2)]
    # B returns as follower with latest epoch 1, which A never saw: A answers with its
    # largest epoch <= 1 (0) and where the next epoch starts (3).
    assert a.cache.end_offset_for(1, a.leo) == (0, 3)
    # KIP-101 alone would truncate B to min(3, LEO 3) = 3, keeping n2: diverged. KIP-279:
    # B's own epoch 0 ends at 2, so B truncates to 2 and replaces n2 with A's m2.
    truncate_by_leader_epoch(b, a)
    assert b.records() == ["m0", "m1"]
    b.fetch_from(a)
    assert b.records() == ["m0", "m1", "m2", "p3", "p4"]
    assert_converged(a, b)


# --- Properties ------------------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 20), st.integers(0, 100)),
        st.tuples(st.just("truncate_from_end"), st.integers(-1, 110), st.just(0)),
        st.tuples(st.just("truncate_from_start"), st.integers(0, 110), st.just(0)),
        st.tuples(st.just("clear"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


def apply(cache: LeaderEpochCache, operation: tuple[str, int, int]) -> None:
    name, a, b = operation
    if name == "assign":
        cache.assign(a, b)
    elif name == "truncate_from_end":
        cache.truncate_from_end(a)
    elif name == "truncate_from_start":
        cache.truncate_from_start(a)
    else:
        cache.clear()


def assert_strictly_increasing(cache: LeaderEpochCache) -> None:
    entries = cache.entries
    for before, after in itertools.pairwise(entries):
        assert before.epoch < after.epoch, entries
        assert before.start_offset < after.start_offset, entries


@given(operations)
def test_epochs_and_start_offsets_stay_strictly_increasing(ops: list[tuple[str, int, int]]) -> None:
    cache = LeaderEpochCache(None)
    for operation in ops:
        apply(cache, operation)
        assert_strictly_increasing(cache)
        if operation[0] == "assign":
            # What was just assigned is the latest entry, or an equal-epoch no-op.
            latest = cache.latest_entry
            assert latest is not None
            assert latest.epoch == operation[1]
            assert latest.start_offset <= operation[2]


@given(operations, st.integers(-1, 25), st.integers(0, 120))
def test_end_offset_for_matches_its_definition(
    ops: list[tuple[str, int, int]], requested: int, log_end_offset: int
) -> None:
    cache = LeaderEpochCache(None)
    for operation in ops:
        apply(cache, operation)
    entries = cache.entries
    result = cache.end_offset_for(requested, log_end_offset)
    if entries and requested == entries[-1].epoch:
        assert result == (requested, log_end_offset)
        return
    higher = [e for e in entries if e.epoch > requested]
    lower = [e for e in entries if e.epoch <= requested]
    if requested == UNDEFINED_EPOCH or not higher:
        assert result == UNDEFINED
    elif not lower:
        assert result == (requested, higher[0].start_offset)
    else:
        assert result == (lower[-1].epoch, higher[0].start_offset)


@settings(max_examples=30, deadline=None)
@given(operations)
def test_the_checkpoint_always_matches_memory(ops: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "leader-epoch-checkpoint"
        cache = LeaderEpochCache(LeaderEpochCheckpointFile(path))
        for operation in ops:
            apply(cache, operation)
            assert LeaderEpochCache(LeaderEpochCheckpointFile(path)).entries == cache.entries
