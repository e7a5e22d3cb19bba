"""Tests of the pure partition replication state: HW, ISR, pending changes, epoch truncation."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from highwater.broker.replication import (
    DEFAULT_REPLICA_LAG_TIME_MAX_MS,
    AlterPartitionProposal,
    EpochEndOffset,
    FencedLeaderEpochError,
    FollowerReplicationState,
    IsrChange,
    LeaderReplicationState,
    ProduceCompletion,
    ReplicaProgress,
    TruncationDecision,
    UnknownLeaderEpochError,
    UnknownReplicaError,
    find_diverging_epoch,
    truncation_offset,
)
from highwater.errors import OffsetOutOfRangeError
from highwater.storage.leader_epoch import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    LeaderEpochCache,
)
from highwater.v1.common_pb2 import ErrorCode
from hypothesis import given, settings
from hypothesis import strategies as st

LAG = DEFAULT_REPLICA_LAG_TIME_MAX_MS
LEADER = 1


def leader_state(
    replicas: tuple[int, ...] = (1, 2, 3),
    isr: tuple[int, ...] | None = None,
    *,
    log_end_offset: int = 0,
    high_watermark: int = 0,
    now_ms: int = 0,
    min_insync_replicas: int = 1,
    leader_epoch: int = 5,
    partition_epoch: int = 10,
) -> LeaderReplicationState:
    return LeaderReplicationState(
        LEADER,
        replicas,
        replicas if isr is None else isr,
        leader_epoch,
        partition_epoch,
        log_end_offset,
        high_watermark,
        now_ms,
        min_insync_replicas=min_insync_replicas,
    )


# --- High watermark --------------------------------------------------------------------


def test_high_watermark_is_the_smallest_log_end_offset_of_the_isr() -> None:
    state = leader_state(log_end_offset=10)
    assert state.on_follower_fetch(2, 7, now_ms=1).high_watermark_moved is False
    assert state.high_watermark == 0  # replica 3's LEO is still unknown
    assert state.on_follower_fetch(3, 4, now_ms=2).high_watermark_moved is True
    assert state.high_watermark == 4
    state.on_follower_fetch(3, 9, now_ms=3)
    assert state.high_watermark == 7
    state.on_follower_fetch(2, 10, now_ms=4)
    assert state.high_watermark == 9
    state.on_follower_fetch(3, 10, now_ms=5)
    assert state.high_watermark == 10


def test_high_watermark_counts_the_leader_log_end_offset() -> None:
    state = leader_state(log_end_offset=5)
    state.on_follower_fetch(2, 5, now_ms=1)
    state.on_follower_fetch(3, 5, now_ms=1)
    assert state.high_watermark == 5
    assert state.on_append(8, now_ms=2) is False  # the followers have not fetched 5..7
    assert state.high_watermark == 5


def test_an_isr_of_the_leader_alone_follows_its_appends() -> None:
    state = leader_state(isr=(LEADER,), log_end_offset=3)
    assert state.high_watermark == 3  # computed when it became leader
    assert state.on_append(9, now_ms=1) is True
    assert state.high_watermark == 9
    assert state.on_append(9, now_ms=2) is False


def test_high_watermark_never_decreases() -> None:
    state = leader_state(log_end_offset=10, high_watermark=6)
    state.on_follower_fetch(2, 2, now_ms=1)
    state.on_follower_fetch(3, 3, now_ms=1)
    assert state.high_watermark == 6
    state.on_follower_fetch(2, 10, now_ms=2)
    state.on_follower_fetch(3, 10, now_ms=2)
    assert state.high_watermark == 10
    # A follower fetching from lower down (it truncated) does not pull the HW back.
    assert state.on_follower_fetch(2, 4, now_ms=3).high_watermark_moved is False
    assert state.high_watermark == 10


def test_a_caught_up_follower_below_the_high_watermark_does_not_pull_it_back() -> None:
    state = leader_state(replicas=(1, 2), isr=(LEADER,), log_end_offset=2)
    assert state.high_watermark == 2
    state.on_follower_fetch(2, 1, now_ms=0)
    state.on_append(5, now_ms=0)
    assert state.high_watermark == 5
    # 3 >= 2, the leader's LEO at its last fetch: caught up (as of t=0), below the HW.
    outcome = state.on_follower_fetch(2, 3, now_ms=1)
    assert state.replica(2).is_caught_up(5, 1, LAG)
    assert outcome == (False, None)
    assert state.high_watermark == 5


def test_leader_log_end_offset_never_goes_back() -> None:
    state = leader_state(log_end_offset=10)
    with pytest.raises(ValueError, match="went back"):
        state.on_append(9, now_ms=1)
    assert state.log_end_offset == 10


def test_constructor_rejects_inconsistent_offsets_and_a_leader_outside_the_replicas() -> None:
    with pytest.raises(ValueError, match="high watermark"):
        leader_state(log_end_offset=3, high_watermark=4)
    with pytest.raises(ValueError, match="not a replica"):
        leader_state(replicas=(2, 3))


# --- Follower progress and the last caught-up time -------------------------------------


def test_a_fetch_at_the_leader_log_end_offset_is_caught_up_now() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=10, now_ms=0)
    state.on_follower_fetch(3, 10, now_ms=500)
    progress = state.replica(3)
    assert progress.log_end_offset == 10
    assert progress.last_fetch_time_ms == 500
    assert progress.last_fetch_leader_log_end_offset == 10
    assert progress.last_caught_up_time_ms == 500


def test_a_fetch_reaching_the_previous_leader_log_end_offset_was_caught_up_at_that_fetch() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=10, now_ms=0)
    state.on_follower_fetch(3, 5, now_ms=100)  # behind: never caught up so far
    assert state.replica(3).last_caught_up_time_ms is None
    state.on_append(20, now_ms=150)
    # 10 < 20, but it is what the leader had at the fetch of t=100: caught up as of t=100.
    state.on_follower_fetch(3, 10, now_ms=300)
    assert state.replica(3).last_caught_up_time_ms == 100
    assert state.replica(3).last_fetch_leader_log_end_offset == 20


def test_a_fetch_below_the_previous_leader_log_end_offset_keeps_the_caught_up_time() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=10, now_ms=0)
    state.on_follower_fetch(3, 10, now_ms=100)
    state.on_append(30, now_ms=110)
    state.on_follower_fetch(3, 12, now_ms=200)  # reached 10, the LEO at its last fetch
    assert state.replica(3).last_caught_up_time_ms == 200 - 100
    state.on_append(50, now_ms=210)
    state.on_follower_fetch(3, 20, now_ms=300)  # below 30, the LEO at its last fetch
    assert state.replica(3).last_caught_up_time_ms == 100


def test_the_leader_log_end_offset_as_of_the_read_decides() -> None:
    # The fetch read the log when it ended at 10; an append to 12 raced it.
    state = leader_state(isr=(1, 2), log_end_offset=12)
    state.on_follower_fetch(3, 10, now_ms=7, leader_log_end_offset=10)
    assert state.replica(3).last_caught_up_time_ms == 7
    with pytest.raises(ValueError, match="on_append"):
        state.on_follower_fetch(3, 10, now_ms=8, leader_log_end_offset=13)


def test_replica_progress_rules_directly() -> None:
    fresh = ReplicaProgress(4)
    assert not fresh.is_caught_up(10, now_ms=0, replica_lag_time_max_ms=LAG)
    behind = fresh.after_fetch(3, now_ms=10, leader_log_end_offset=10)
    assert behind.last_caught_up_time_ms is None  # no earlier fetch to have caught up to
    assert not behind.is_caught_up(10, now_ms=10, replica_lag_time_max_ms=LAG)
    caught = behind.after_fetch(10, now_ms=20, leader_log_end_offset=15)
    assert caught.last_caught_up_time_ms == 10
    assert caught.is_caught_up(15, now_ms=10 + LAG, replica_lag_time_max_ms=LAG)
    assert not caught.is_caught_up(15, now_ms=11 + LAG, replica_lag_time_max_ms=LAG)
    # Same LEO as the leader: caught up however long ago it fetched.
    assert caught.is_caught_up(10, now_ms=10**9, replica_lag_time_max_ms=LAG)


# --- ISR shrink ------------------------------------------------------------------------


def test_a_follower_lagging_longer_than_the_lag_time_is_proposed_out() -> None:
    state = leader_state(log_end_offset=0, now_ms=0)
    for t in range(0, LAG + 2, 1000):
        state.on_append(t // 1000 + 1, now_ms=t)
        state.on_follower_fetch(2, state.log_end_offset, now_ms=t)
    state.on_follower_fetch(3, 0, now_ms=1)  # stuck at 0 since
    end = state.log_end_offset
    assert state.maybe_shrink_isr(now_ms=LAG) is None  # caught up at 0, exactly LAG ago
    proposal = state.maybe_shrink_isr(now_ms=LAG + 1)
    assert proposal == AlterPartitionProposal(
        IsrChange.SHRINK,
        (1, 2),
        leader_epoch=5,
        partition_epoch=10,
        replicas_changed=frozenset({3}),
    )
    # Only a proposal: the ISR is what the controller last committed.
    assert state.isr == (1, 2, 3)
    assert state.maximal_isr == (1, 2, 3)
    assert state.pending_proposal == proposal
    assert state.log_end_offset == end


def test_a_silent_follower_with_the_leader_log_is_not_shrunk() -> None:
    state = leader_state(log_end_offset=10)
    state.on_follower_fetch(2, 10, now_ms=0)
    state.on_follower_fetch(3, 10, now_ms=0)
    assert state.out_of_sync_replicas(now_ms=100 * LAG) == frozenset()
    assert state.maybe_shrink_isr(now_ms=100 * LAG) is None


def test_an_incremental_fetch_that_skipped_the_partition_counts_as_a_fetch() -> None:
    state = leader_state(log_end_offset=10)
    state.on_follower_fetch(2, 10, now_ms=0)
    state.on_follower_fetch(3, 4, now_ms=0)  # behind: gains nothing from skipped fetches
    # Follower 2's session fetched at 2 * LAG without naming the partition; then an append.
    state.on_follower_session_fetch(2, 10, fetched_at_ms=2 * LAG, leader_log_end_offset=10)
    state.on_follower_session_fetch(3, 4, fetched_at_ms=2 * LAG, leader_log_end_offset=10)
    state.on_append(11, now_ms=2 * LAG + 1)
    assert state.replica(2).last_caught_up_time_ms == 2 * LAG
    assert state.out_of_sync_replicas(now_ms=2 * LAG + 1) == {3}
    # Another offset than the one it last named, an older time: nothing moves.
    state.on_follower_session_fetch(2, 9, fetched_at_ms=3 * LAG, leader_log_end_offset=11)
    state.on_follower_session_fetch(2, 10, fetched_at_ms=LAG, leader_log_end_offset=10)
    assert state.replica(2).last_caught_up_time_ms == 2 * LAG
    assert state.replica(2).log_end_offset == 10 and state.high_watermark == 4


def test_the_leader_is_never_shrunk_out() -> None:
    state = leader_state(log_end_offset=10, now_ms=0)
    proposal = state.maybe_shrink_isr(now_ms=LAG + 1)  # no follower ever fetched
    assert proposal is not None
    assert proposal.new_isr == (LEADER,)
    assert proposal.replicas_changed == frozenset({2, 3})
    alone = leader_state(isr=(LEADER,), log_end_offset=10)
    assert alone.maybe_shrink_isr(now_ms=10 * LAG) is None


def test_isr_members_without_progress_are_out_of_sync_after_the_lag() -> None:
    state = leader_state(log_end_offset=10, now_ms=1_000)
    assert state.out_of_sync_replicas(now_ms=1_000 + LAG) == frozenset()
    assert state.out_of_sync_replicas(now_ms=1_001 + LAG) == frozenset({2, 3})


# --- ISR expand ------------------------------------------------------------------------


def test_a_follower_reaching_the_high_watermark_is_proposed_back() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=10)
    state.on_follower_fetch(2, 10, now_ms=1)
    assert state.high_watermark == 10
    assert state.on_follower_fetch(3, 9, now_ms=2).proposal is None
    outcome = state.on_follower_fetch(3, 10, now_ms=3)
    assert outcome.proposal == AlterPartitionProposal(
        IsrChange.EXPAND, (1, 2, 3), 5, 10, frozenset({3})
    )
    assert state.isr == (1, 2)
    assert state.maximal_isr == (1, 2, 3)


def test_expansion_waits_for_the_current_epoch_start_offset() -> None:
    # Leader of a new epoch starting at 10, HW still 4 (its follower HW).
    state = leader_state(isr=(1, 2), log_end_offset=10, high_watermark=4)
    assert state.leader_epoch_start_offset == 10
    outcome = state.on_follower_fetch(3, 6, now_ms=1)
    assert outcome.proposal is None  # >= HW, but below the epoch's start
    assert state.on_follower_fetch(3, 10, now_ms=2).proposal is not None


def test_ineligible_followers_are_not_proposed_back() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=10)
    state.update_ineligible_replicas({3}, now_ms=0)
    assert state.on_follower_fetch(3, 10, now_ms=1).proposal is None
    state.update_ineligible_replicas((), now_ms=2)
    assert state.on_follower_fetch(3, 10, now_ms=3).proposal is not None


# --- Pending ISR changes (KIP-497) -----------------------------------------------------


def test_a_pending_expansion_already_holds_the_high_watermark() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=10)
    state.on_follower_fetch(2, 10, now_ms=0)
    proposal = state.on_follower_fetch(3, 10, now_ms=0).proposal
    assert proposal is not None
    state.on_append(20, now_ms=1)
    # Long after 3 stopped being caught up, only the pending expansion makes the HW wait.
    t = 2 * LAG
    state.on_follower_fetch(2, 20, now_ms=t)
    assert state.high_watermark == 10
    # The controller refuses it: the maximal ISR is the committed one again.
    assert state.on_alter_partition_error(proposal, ErrorCode.INELIGIBLE_REPLICA) is None
    assert state.pending_proposal is None
    # The next fetch of the other follower, at its unchanged LEO, moves the HW: with a
    # follower outside the ISR, every fetch recomputes it.
    assert state.on_follower_fetch(2, 20, now_ms=t + 1).high_watermark_moved is True
    assert state.high_watermark == 20


def test_a_pending_shrink_keeps_waiting_for_the_leaving_follower() -> None:
    state = leader_state(log_end_offset=10, now_ms=0)
    state.on_follower_fetch(2, 10, now_ms=0)
    state.on_follower_fetch(3, 4, now_ms=0)
    assert state.high_watermark == 4
    proposal = state.maybe_shrink_isr(now_ms=LAG + 1)
    assert proposal is not None and proposal.new_isr == (1, 2)
    state.on_append(12, now_ms=LAG + 2)
    state.on_follower_fetch(2, 12, now_ms=LAG + 3)
    assert state.high_watermark == 4  # 3 is still in the (maximal) ISR
    outcome = state.apply_partition_change(
        proposal.new_isr, proposal.leader_epoch, proposal.partition_epoch + 1, now_ms=LAG + 4
    )
    assert outcome.applied and outcome.high_watermark_moved
    assert state.isr == (1, 2)
    assert state.partition_epoch == 11
    assert state.pending_proposal is None
    assert state.high_watermark == 12


def test_one_proposal_at_a_time() -> None:
    state = leader_state(replicas=(1, 2, 3, 4), isr=(1, 2), log_end_offset=10, now_ms=0)
    first = state.on_follower_fetch(3, 10, now_ms=0).proposal
    assert first is not None
    assert state.on_follower_fetch(4, 10, now_ms=0).proposal is None
    assert state.maybe_shrink_isr(now_ms=10 * LAG) is None
    assert state.out_of_sync_replicas(now_ms=10 * LAG) == frozenset()
    state.apply_partition_change(first.new_isr, 5, 11, now_ms=1)
    assert state.on_follower_fetch(4, 10, now_ms=2).proposal == AlterPartitionProposal(
        IsrChange.EXPAND, (1, 2, 3, 4), 5, 11, frozenset({4})
    )


def test_a_caught_up_follower_outside_the_isr_holds_the_high_watermark_while_eligible() -> None:
    state = leader_state(isr=(LEADER,), log_end_offset=10, now_ms=0)
    assert state.high_watermark == 10
    assert state.on_follower_fetch(3, 10, now_ms=0).proposal is not None
    state.on_follower_fetch(2, 10, now_ms=0)  # caught up; no proposal while one is pending
    state.on_append(20, now_ms=1)
    state.on_follower_fetch(3, 20, now_ms=2)
    state.on_follower_fetch(2, 15, now_ms=3)
    # 2 is not in any ISR, but caught up (at t=0 it had the whole log): the HW waits for it.
    assert state.high_watermark == 15
    assert state.update_ineligible_replicas({2}, now_ms=4) is True
    assert state.high_watermark == 20


def test_alter_partition_errors() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=10)
    proposal = state.on_follower_fetch(3, 10, now_ms=0).proposal
    assert proposal is not None
    assert state.on_alter_partition_error(proposal, ErrorCode.NOT_CONTROLLER) == proposal
    assert state.on_alter_partition_error(proposal, ErrorCode.INVALID_UPDATE_VERSION) is None
    assert state.pending_proposal == proposal  # until the metadata log says more
    state.apply_partition_change((1, 2, 3), 5, 11, now_ms=1)
    # An answer to a proposal that was settled since is out of date.
    assert state.on_alter_partition_error(proposal, ErrorCode.NOT_CONTROLLER) is None
    assert state.isr == (1, 2, 3)


# --- Committed partition changes -------------------------------------------------------


def test_stale_partition_changes_are_ignored() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=10)
    proposal = state.on_follower_fetch(3, 10, now_ms=0).proposal
    assert state.apply_partition_change((1,), 5, 9, now_ms=1).applied is False
    assert state.apply_partition_change((1,), 4, 12, now_ms=1).applied is False
    assert state.isr == (1, 2)
    assert state.partition_epoch == 10
    assert state.pending_proposal == proposal
    # The same partition epoch is not stale (the answer of a no-op change).
    assert state.apply_partition_change((1, 2), 5, 10, now_ms=1).applied is True
    assert state.pending_proposal is None


def test_a_new_leader_epoch_restarts_the_epoch_and_the_followers_timers() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=10, now_ms=0)
    state.on_follower_fetch(2, 10, now_ms=0)
    state.on_follower_fetch(3, 3, now_ms=0)
    state.on_append(15, now_ms=5)
    outcome = state.apply_partition_change((1, 2), 6, 11, now_ms=1_000)
    assert outcome.applied
    assert state.leader_epoch == 6
    assert state.leader_epoch_start_offset == 15
    assert state.replica(2) == ReplicaProgress(2, 10, 1_000, 15, 1_000)
    assert state.replica(3) == ReplicaProgress(3, 3, None, 15, None)


def test_reassignment_adds_and_removes_followers() -> None:
    state = leader_state(log_end_offset=10)
    state.on_follower_fetch(2, 10, now_ms=0)
    state.apply_partition_change((1, 2), 5, 11, now_ms=1, replicas=(1, 2, 4))
    assert state.replicas == (1, 2, 4)
    assert set(state.followers) == {2, 4}
    assert state.replica(2).log_end_offset == 10
    assert state.replica(4) == ReplicaProgress(4)
    with pytest.raises(UnknownReplicaError):
        state.on_follower_fetch(3, 10, now_ms=2)


# --- Fetch validation ------------------------------------------------------------------


def test_fetches_from_brokers_that_are_not_followers_are_refused() -> None:
    state = leader_state(log_end_offset=10)
    with pytest.raises(UnknownReplicaError) as refused:
        state.on_follower_fetch(9, 5, now_ms=0)
    assert refused.value.code == ErrorCode.UNKNOWN_LEADER_EPOCH
    with pytest.raises(UnknownReplicaError):
        state.on_follower_fetch(LEADER, 5, now_ms=0)
    assert set(state.followers) == {2, 3}


def test_fetch_offsets_past_the_leader_log_end_are_out_of_range() -> None:
    state = leader_state(log_end_offset=10)
    with pytest.raises(OffsetOutOfRangeError):
        state.on_follower_fetch(2, 11, now_ms=0)
    with pytest.raises(OffsetOutOfRangeError):
        state.on_follower_fetch(2, -1, now_ms=0)
    assert state.replica(2) == ReplicaProgress(2, last_caught_up_time_ms=0)


def test_fetches_naming_another_leader_epoch_are_fenced() -> None:
    state = leader_state(log_end_offset=10, leader_epoch=5)
    with pytest.raises(FencedLeaderEpochError) as old:
        state.on_follower_fetch(2, 5, now_ms=0, current_leader_epoch=4)
    assert old.value.code == ErrorCode.FENCED_LEADER_EPOCH
    with pytest.raises(UnknownLeaderEpochError) as new:
        state.on_follower_fetch(2, 5, now_ms=0, current_leader_epoch=6)
    assert new.value.code == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert state.replica(2).log_end_offset is None
    state.on_follower_fetch(2, 5, now_ms=0, current_leader_epoch=5)
    assert state.replica(2).log_end_offset == 5


# --- acks=all and min.insync.replicas --------------------------------------------------


def test_not_enough_replicas_before_append() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=0, min_insync_replicas=2)
    assert state.check_min_isr() == ErrorCode.NONE
    state.apply_partition_change((1,), 5, 11, now_ms=0)
    assert state.is_under_min_isr
    assert state.check_min_isr() == ErrorCode.NOT_ENOUGH_REPLICAS


def test_effective_min_isr_is_bounded_by_the_replication_factor() -> None:
    state = leader_state(replicas=(1, 2), log_end_offset=0, min_insync_replicas=3)
    assert state.effective_min_isr == 2
    assert state.check_min_isr() == ErrorCode.NONE


def test_acks_all_completes_when_the_high_watermark_reaches_the_offset() -> None:
    state = leader_state(log_end_offset=0, min_insync_replicas=2)
    assert state.check_min_isr() == ErrorCode.NONE
    state.on_append(3, now_ms=1)
    assert state.can_complete_produce(3) == ProduceCompletion(False, ErrorCode.NONE)
    state.on_follower_fetch(2, 3, now_ms=2)
    assert state.can_complete_produce(3).completed is False  # 3 has not fetched
    state.on_follower_fetch(3, 3, now_ms=3)
    assert state.can_complete_produce(3) == ProduceCompletion(True, ErrorCode.NONE)


def test_not_enough_replicas_after_append_when_the_isr_shrank_meanwhile() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=0, min_insync_replicas=2)
    assert state.check_min_isr() == ErrorCode.NONE
    state.on_append(10, now_ms=1)
    state.on_follower_fetch(2, 10, now_ms=2)
    assert state.high_watermark == 10
    state.apply_partition_change((1,), 5, 11, now_ms=3)
    assert state.can_complete_produce(10) == ProduceCompletion(
        True, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    )


def test_the_high_watermark_stands_still_under_min_isr() -> None:
    state = leader_state(isr=(LEADER,), log_end_offset=4, min_insync_replicas=2)
    assert state.high_watermark == 0
    assert state.on_append(8, now_ms=1) is False
    assert state.high_watermark == 0
    state.on_follower_fetch(2, 8, now_ms=2)  # proposed back, not committed yet
    assert state.high_watermark == 0
    assert state.apply_partition_change((1, 2), 5, 11, now_ms=3).high_watermark_moved
    assert state.high_watermark == 8


def test_a_changed_min_insync_replicas_applies_at_once_and_moves_the_hw_at_once() -> None:
    state = leader_state(isr=(1, 2), log_end_offset=0, min_insync_replicas=2)
    state.on_append(4, now_ms=1)
    assert state.update_min_insync_replicas(3, now_ms=2) is False
    assert state.check_min_isr() == ErrorCode.NOT_ENOUGH_REPLICAS
    state.on_follower_fetch(2, 4, now_ms=3)
    assert state.high_watermark == 0  # strict min ISR under the new value
    # Lowered again: the HW that the strict min ISR held moves with the change itself,
    # with no append or fetch after it (a fetch at an unchanged LEO would not recompute it).
    assert state.update_min_insync_replicas(2, now_ms=4) is True
    assert state.check_min_isr() == ErrorCode.NONE
    assert state.high_watermark == 4
    assert state.can_complete_produce(4) == ProduceCompletion(True, ErrorCode.NONE)
    with pytest.raises(ValueError):
        state.update_min_insync_replicas(0, now_ms=5)


def test_a_fetch_at_an_unchanged_log_end_moves_the_hw_only_while_time_can() -> None:
    # The whole assignment in the ISR: the HW is the ISR's minimum LEO, so a fetch at
    # the same LEO (the read an append wakes, an idle long poll) has nothing to move.
    state = leader_state(log_end_offset=10, now_ms=0)
    state.on_follower_fetch(2, 10, now_ms=0)
    assert state.on_follower_fetch(3, 10, now_ms=0).high_watermark_moved is True
    state.on_append(15, now_ms=1)
    assert state.on_follower_fetch(2, 10, now_ms=2).high_watermark_moved is False
    assert state.on_follower_fetch(2, 15, now_ms=3).high_watermark_moved is False  # 3 at 10
    assert state.on_follower_fetch(3, 15, now_ms=4).high_watermark_moved is True
    assert state.high_watermark == 15
    # 3 leaves the ISR while caught up: it holds the HW (Kafka's caught-up rule) until it
    # has not been caught up for the lag time; then the other follower's idle fetch, at
    # its unchanged LEO, moves the HW, with no append or ISR change.
    state.apply_partition_change((1, 2), 5, 11, now_ms=5)
    state.on_append(20, now_ms=6)
    state.on_follower_fetch(2, 20, now_ms=7)
    assert state.high_watermark == 15
    outcome = state.on_follower_fetch(2, 20, now_ms=15 + LAG + 1)
    assert outcome.high_watermark_moved is True
    assert state.high_watermark == 20


def test_an_isr_shrink_moves_the_hw_with_no_fetch_after_it() -> None:
    state = leader_state(log_end_offset=10, now_ms=0)
    state.on_follower_fetch(2, 10, now_ms=0)
    state.on_follower_fetch(3, 10, now_ms=0)
    state.on_append(20, now_ms=1)
    state.on_follower_fetch(2, 20, now_ms=2)
    state.on_follower_fetch(2, 20, now_ms=3)  # unchanged LEO: nothing to recompute
    assert state.high_watermark == 10  # 3 (in the ISR) is at 10
    outcome = state.apply_partition_change((1, 2), 5, 11, now_ms=LAG + 4)
    assert outcome.high_watermark_moved is True
    assert state.high_watermark == 20


def test_a_pending_expansion_counts_for_acks_all() -> None:
    state = leader_state(log_end_offset=0, min_insync_replicas=3)
    state.on_append(5, now_ms=0)
    state.on_follower_fetch(2, 5, now_ms=0)
    state.on_follower_fetch(3, 5, now_ms=0)
    assert state.high_watermark == 5
    # The controller takes 3 out (say it was fenced) before the produce is answered.
    state.apply_partition_change((1, 2), 5, 11, now_ms=1)
    assert state.can_complete_produce(5) == ProduceCompletion(
        True, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    )
    # 3 fetches again and is proposed back: the maximal ISR (1, 2, 3) meets the minimum,
    # though the committed ISR does not yet (no new acks=all append is accepted).
    assert state.on_follower_fetch(3, 5, now_ms=2).proposal is not None
    assert (state.isr, state.maximal_isr) == ((1, 2), (1, 2, 3))
    assert state.check_min_isr() == ErrorCode.NOT_ENOUGH_REPLICAS
    assert state.can_complete_produce(5) == ProduceCompletion(True, ErrorCode.NONE)


# --- Follower --------------------------------------------------------------------------


def test_follower_high_watermark_is_the_min_of_its_log_end_and_the_leader_high_watermark() -> None:
    state = FollowerReplicationState(
        2, leader_id=1, leader_epoch=5, log_end_offset=0, high_watermark=0
    )
    assert state.on_fetch_response(leader_high_watermark=5, local_log_end_offset=8) is True
    assert state.high_watermark == 5
    assert state.on_fetch_response(leader_high_watermark=12, local_log_end_offset=10) is True
    assert state.high_watermark == 10
    assert state.log_end_offset == 10
    # A (new) leader whose HW lags does not pull the follower's back.
    assert state.on_fetch_response(leader_high_watermark=3, local_log_end_offset=10) is False
    assert state.high_watermark == 10


def test_follower_high_watermark_only_goes_back_with_a_truncation() -> None:
    state = FollowerReplicationState(2, 1, 5, log_end_offset=10, high_watermark=8)
    with pytest.raises(ValueError, match="without a truncation"):
        state.on_fetch_response(leader_high_watermark=8, local_log_end_offset=9)
    state.on_truncated(6)
    assert (state.log_end_offset, state.high_watermark) == (6, 6)
    state.on_truncated(7)  # not a truncation: nothing changes
    assert (state.log_end_offset, state.high_watermark) == (6, 6)


def test_follower_high_watermark_is_capped_at_its_log_end() -> None:
    state = FollowerReplicationState(2, 1, 5, log_end_offset=4, high_watermark=9)
    assert state.high_watermark == 4


def test_follower_ignores_stale_leader_changes() -> None:
    state = FollowerReplicationState(2, 1, 5, log_end_offset=0, high_watermark=0)
    assert state.on_leader_change(3, 4) is False
    assert state.on_leader_change(3, 5) is False
    assert (state.leader_id, state.leader_epoch) == (1, 5)
    assert state.on_leader_change(3, 6) is True
    assert (state.leader_id, state.leader_epoch) == (3, 6)


# --- Truncation by leader epoch --------------------------------------------------------


def cache_with(*entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(None)
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def test_truncation_to_the_end_of_the_common_epoch() -> None:
    local = cache_with((0, 0), (1, 5), (2, 8))

    def local_end(epoch: int) -> tuple[int, int]:
        return local.end_offset_for(epoch, 10)

    # The leader has epoch 2 up to 12: nothing to cut.
    assert truncation_offset(EpochEndOffset(2, 12), 10, local_end) == TruncationDecision(10, True)
    # The leader's epoch 2 ended at 9.
    assert truncation_offset(EpochEndOffset(2, 9), 10, local_end) == TruncationDecision(9, True)
    # The leader's epoch 1 runs to 7 where ours ends at 8: min.
    assert truncation_offset(EpochEndOffset(1, 7), 10, local_end) == TruncationDecision(7, True)
    assert truncation_offset(EpochEndOffset(1, 9), 10, local_end) == TruncationDecision(8, True)


def test_truncation_when_the_leader_names_an_epoch_the_follower_lacks() -> None:
    # KIP-279: follower epochs 0 and 2, leader epochs 0, 1 and 3.
    follower = cache_with((0, 0), (2, 5))
    leader = cache_with((0, 0), (1, 3), (3, 7))
    follower_leo, leader_leo = 9, 12
    answer = EpochEndOffset(*leader.end_offset_for(2, leader_leo))
    assert answer == EpochEndOffset(1, 7)
    first = truncation_offset(answer, follower_leo, lambda e: follower.end_offset_for(e, 9))
    assert first == TruncationDecision(5, completed=False)
    follower.truncate_from_end(first.offset)
    follower_leo = first.offset
    assert follower.latest_epoch == 0
    answer = EpochEndOffset(*leader.end_offset_for(0, leader_leo))
    second = truncation_offset(
        answer, follower_leo, lambda e: follower.end_offset_for(e, follower_leo)
    )
    assert second == TruncationDecision(3, completed=True)


def test_truncation_with_undefined_answers() -> None:
    local = cache_with((3, 4))

    def local_end(epoch: int) -> tuple[int, int]:
        return local.end_offset_for(epoch, 10)

    undefined = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
    assert truncation_offset(undefined, 10, local_end) == TruncationDecision(10, True)
    assert truncation_offset(EpochEndOffset(UNDEFINED_EPOCH, 6), 10, local_end) == (6, True)
    # The follower has no epoch at or below 1: the leader's end offset.
    assert truncation_offset(EpochEndOffset(1, 2), 10, lambda e: undefined) == (2, True)
    # Never past the local log end.
    assert truncation_offset(EpochEndOffset(3, 50), 10, local_end) == (10, True)


def test_find_diverging_epoch() -> None:
    leader = cache_with((0, 0), (2, 6))

    def leader_end(epoch: int) -> tuple[int, int]:
        return leader.end_offset_for(epoch, 9)

    assert find_diverging_epoch(4, 0, leader_end) is None
    assert find_diverging_epoch(6, 0, leader_end) is None
    assert find_diverging_epoch(7, 0, leader_end) == EpochEndOffset(0, 6)
    assert find_diverging_epoch(5, 1, leader_end) == EpochEndOffset(0, 6)
    assert find_diverging_epoch(9, 2, leader_end) is None
    assert find_diverging_epoch(3, -1, leader_end) is None
    with pytest.raises(OffsetOutOfRangeError):
        find_diverging_epoch(9, 3, leader_end)


# --- The two stories of the seed -------------------------------------------------------


@dataclass
class ReplicaLog:
    """A replica's log as (value, epoch) records with its leader epoch cache."""

    records: list[tuple[str, int]] = field(default_factory=list)
    cache: LeaderEpochCache = field(default_factory=lambda: LeaderEpochCache(None))

    @property
    def leo(self) -> int:
        return len(self.records)

    @property
    def latest_epoch(self) -> int:
        epoch = self.cache.latest_epoch
        return UNDEFINED_EPOCH if epoch is None else epoch

    def append(self, value: str, epoch: int) -> None:
        self.cache.assign(epoch, self.leo)
        self.records.append((value, epoch))

    def copy_from(self, other: ReplicaLog, offset: int) -> None:
        for value, epoch in other.records[offset:]:
            self.append(value, epoch)

    def truncate(self, offset: int) -> None:
        del self.records[offset:]
        self.cache.truncate_from_end(offset)

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        return self.cache.end_offset_for(epoch, self.leo)

    def values(self) -> list[str]:
        return [value for value, _ in self.records]


def test_story_one_a_restart_truncating_to_the_high_watermark_loses_an_acked_record() -> None:
    a_log, b_log = ReplicaLog(), ReplicaLog()
    a = leader_state(replicas=(1, 2), log_end_offset=0, leader_epoch=0)
    b = FollowerReplicationState(2, 1, 0, log_end_offset=0, high_watermark=0)
    # m0 is appended and replicated; the next fetch tells B the HW is 1.
    a_log.append("m0", 0)
    a.on_append(1, now_ms=0)
    a.on_follower_fetch(2, 0, now_ms=1)
    b_log.copy_from(a_log, 0)
    b.on_fetch_response(a.high_watermark, b_log.leo)
    a.on_follower_fetch(2, 1, now_ms=2)
    b.on_fetch_response(a.high_watermark, b_log.leo)
    assert (a.high_watermark, b.high_watermark) == (1, 1)
    # m1 (acks=all): B fetches it; its next fetch moves A's HW to 2 and acks m1...
    a_log.append("m1", 0)
    a.on_append(2, now_ms=3)
    a.on_follower_fetch(2, 1, now_ms=4)
    b_log.copy_from(a_log, 1)
    b.on_fetch_response(a.high_watermark, b_log.leo)
    assert a.on_follower_fetch(2, 2, now_ms=5).high_watermark_moved
    assert a.can_complete_produce(2) == ProduceCompletion(True, ErrorCode.NONE)
    # ...but B restarts before reading that answer: its HW is still 1.
    assert (b_log.leo, b.high_watermark) == (2, 1)
    # Pre-KIP-101, B would cut its log at its HW and m1 would only live on A, which dies.
    assert b_log.values()[: b.high_watermark] == ["m0"]
    # With epochs B keeps its log. A dies; B leads epoch 1 from offset 2.
    b_log.cache.assign(1, b_log.leo)
    b_leader = LeaderReplicationState(2, (1, 2), (2,), 1, 1, b_log.leo, b.high_watermark, 100)
    assert b_leader.high_watermark == 2
    # A comes back as follower of B: it asks for the end of its latest epoch, 0.
    a_follower = FollowerReplicationState(1, 2, 1, log_end_offset=a_log.leo, high_watermark=2)
    answer = EpochEndOffset(*b_log.end_offset_for(a_log.latest_epoch))
    assert answer == EpochEndOffset(0, 2)
    decision = a_follower.on_diverging_epoch(answer, a_log.end_offset_for)
    assert decision == TruncationDecision(2, True)
    a_log.truncate(decision.offset)
    # The KIP-320 fetch check agrees: nothing diverges.
    assert find_diverging_epoch(a_log.leo, a_log.latest_epoch, b_log.end_offset_for) is None
    outcome = b_leader.on_follower_fetch(1, a_log.leo, now_ms=101)
    assert outcome.proposal is not None and outcome.proposal.new_isr == (1, 2)
    assert a_log.values() == b_log.values() == ["m0", "m1"]


def test_story_two_replicas_diverge_unless_truncated_by_epoch() -> None:
    a_log, b_log = ReplicaLog(), ReplicaLog()
    # A led epoch 0 and holds m0, m1 with HW 2; B holds m0 only, HW 1 (it lost an unflushed m1).
    a_log.append("m0", 0)
    a_log.append("m1", 0)
    b_log.append("m0", 0)
    # Both crash; B comes back first and leads epoch 1 from offset 1, then takes m2.
    b_log.cache.assign(1, b_log.leo)
    b = LeaderReplicationState(2, (1, 2), (2,), 1, 3, b_log.leo, 1, now_ms=0)
    b_log.append("m2", 1)
    assert b.on_append(b_log.leo, now_ms=1)
    assert b.high_watermark == 2
    # A comes back as follower, HW 2 like B's: a HW-based check would see nothing to cut.
    a = FollowerReplicationState(1, 2, 1, log_end_offset=a_log.leo, high_watermark=2)
    assert a.high_watermark == b.high_watermark and a_log.leo == b_log.leo
    assert a_log.records[1] != b_log.records[1]  # offset 1 holds m1 on A, m2 on B
    # KIP-320: A's first fetch (offset 2, last epoch 0) is answered with a diverging epoch.
    diverging = find_diverging_epoch(a_log.leo, a_log.latest_epoch, b_log.end_offset_for)
    assert diverging == EpochEndOffset(0, 1)
    decision = a.on_diverging_epoch(diverging, a_log.end_offset_for)
    assert decision == TruncationDecision(1, True)
    assert (a.log_end_offset, a.high_watermark) == (1, 1)
    a_log.truncate(decision.offset)
    # The same answer comes from OffsetsForLeaderEpoch(0).
    assert EpochEndOffset(*b_log.end_offset_for(0)) == diverging
    # A fetches on from 1 and gets m2.
    assert find_diverging_epoch(a_log.leo, a_log.latest_epoch, b_log.end_offset_for) is None
    b.on_follower_fetch(1, a_log.leo, now_ms=2)
    a_log.copy_from(b_log, a_log.leo)
    a.on_fetch_response(b.high_watermark, a_log.leo)
    b.on_follower_fetch(1, a_log.leo, now_ms=3)
    assert a_log.records == b_log.records == [("m0", 0), ("m2", 1)]
    assert a.high_watermark == 2


# --- Properties ------------------------------------------------------------------------


@st.composite
def leader_scenarios(draw: st.DrawFn) -> tuple[LeaderReplicationState, list[tuple[object, ...]]]:
    followers = draw(st.integers(min_value=1, max_value=4))
    replicas = tuple(range(1, followers + 2))
    isr = (LEADER, *(r for r in replicas[1:] if draw(st.booleans())))
    state = LeaderReplicationState(
        LEADER,
        replicas,
        isr,
        leader_epoch=3,
        partition_epoch=7,
        log_end_offset=draw(st.integers(min_value=0, max_value=6)),
        high_watermark=0,
        now_ms=0,
        replica_lag_time_max_ms=draw(st.integers(min_value=1, max_value=50)),
        min_insync_replicas=draw(st.integers(min_value=1, max_value=len(replicas) + 1)),
    )
    follower = st.sampled_from(replicas[1:])
    dt = st.integers(min_value=0, max_value=30)
    # How far a follower's fetch offset moves: a few records, or all the leader has.
    advance = st.integers(min_value=0, max_value=4) | st.just(1 << 30)
    errors = st.sampled_from(
        [ErrorCode.INELIGIBLE_REPLICA, ErrorCode.INVALID_UPDATE_VERSION, ErrorCode.NONE]
    )
    by_kind = {
        "append": st.tuples(st.just("append"), st.integers(min_value=0, max_value=3), dt),
        "fetch": st.tuples(st.just("fetch"), follower, advance, dt),
        "tick": st.tuples(st.just("tick"), dt),
        "accept": st.tuples(st.just("accept")),
        "reject": st.tuples(st.just("reject"), errors),
        "controller_shrink": st.tuples(st.just("controller_shrink"), st.sets(follower)),
        "stale": st.tuples(st.just("stale"), st.sets(follower), st.booleans()),
        "new_epoch": st.tuples(st.just("new_epoch")),
    }
    # Fetches and appends are most of what a leader sees; controller events are rarer.
    weights = {"append": 4, "fetch": 8, "tick": 3, "accept": 2, "reject": 1}
    kinds = [kind for kind in by_kind for _ in range(weights.get(kind, 1))]
    op = st.sampled_from(kinds).flatmap(by_kind.__getitem__)
    return state, draw(st.lists(op, min_size=10, max_size=60))


@settings(deadline=None)  # examples: the profile's (tests/conftest.py)
@given(leader_scenarios())
def test_leader_high_watermark_invariants(
    scenario: tuple[LeaderReplicationState, list[tuple[object, ...]]],
) -> None:
    state, ops = scenario
    now = 0
    follower_leo = dict.fromkeys(state.followers, 0)  # every follower's log starts empty
    previous_hw = state.high_watermark

    def check() -> None:
        nonlocal previous_hw
        hw = state.high_watermark
        assert hw >= previous_hw
        assert hw <= state.log_end_offset
        for member in set(state.isr) | set(state.maximal_isr):
            if member != LEADER:
                assert hw <= follower_leo[member]
        assert LEADER in state.isr
        pending = state.pending_proposal
        assert pending is None or LEADER in pending.new_isr
        previous_hw = hw

    check()
    for op in ops:
        match op:
            case ("append", int(count), int(dt)):
                now += dt
                state.on_append(state.log_end_offset + count, now)
            case ("fetch", int(replica), int(advance), int(dt)):
                now += dt
                offset = min(follower_leo[replica] + advance, state.log_end_offset)
                follower_leo[replica] = offset
                state.on_follower_fetch(replica, offset, now)
            case ("tick", int(dt)):
                now += dt
                state.maybe_shrink_isr(now)
            case ("accept",):
                if (pending := state.pending_proposal) is not None:
                    applied = state.apply_partition_change(
                        pending.new_isr, pending.leader_epoch, pending.partition_epoch + 1, now
                    )
                    assert applied.applied and state.isr == pending.new_isr
            case ("reject", int(error)):
                if (pending := state.pending_proposal) is not None:
                    state.on_alter_partition_error(pending, error)
            case ("controller_shrink", set(removed)):
                isr = tuple(r for r in state.isr if r not in removed)
                state.apply_partition_change(
                    isr, state.leader_epoch, state.partition_epoch + 1, now
                )
            case ("stale", set(members), bool(older_leader_epoch)):
                before = (state.isr, state.pending_proposal, state.partition_epoch)
                outcome = state.apply_partition_change(
                    (LEADER, *members),
                    state.leader_epoch - (1 if older_leader_epoch else 0),
                    state.partition_epoch + (1 if older_leader_epoch else -1),
                    now,
                )
                assert not outcome.applied
                assert (state.isr, state.pending_proposal, state.partition_epoch) == before
            case ("new_epoch",):
                state.apply_partition_change(
                    state.isr, state.leader_epoch + 1, state.partition_epoch + 1, now
                )
            case _:
                raise AssertionError(f"unknown op {op}")
        check()
    # Liveness: once every follower has the whole log, the HW reaches it (unless under min ISR).
    for replica in follower_leo:
        follower_leo[replica] = state.log_end_offset
        state.on_follower_fetch(replica, state.log_end_offset, now)
    check()
    if not state.is_under_min_isr:
        assert state.high_watermark == state.log_end_offset


@settings(deadline=None)  # examples: the profile's (tests/conftest.py)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["fetch", "truncate"]),
            st.integers(min_value=0, max_value=5),
            st.integers(min_value=0, max_value=40),
        ),
        max_size=60,
    )
)
def test_follower_high_watermark_invariants(ops: list[tuple[str, int, int]]) -> None:
    state = FollowerReplicationState(2, 1, 0, log_end_offset=0, high_watermark=0)
    for kind, appended, offset in ops:
        before_hw, before_leo = state.high_watermark, state.log_end_offset
        if kind == "fetch":
            # ``offset`` is the leader's HW in the answer.
            state.on_fetch_response(offset, before_leo + appended)
            assert state.log_end_offset == before_leo + appended
            assert state.high_watermark == max(before_hw, min(state.log_end_offset, offset))
        else:
            state.on_truncated(offset)
            assert state.log_end_offset == min(before_leo, offset)
            assert state.high_watermark == min(before_hw, state.log_end_offset)
        assert 0 <= state.high_watermark <= state.log_end_offset
