"""QuorumState and the election states: legal transitions only, and what must be persisted."""

from __future__ import annotations

import random

import pytest
from highwater.raft.messages import OffsetAndEpoch
from highwater.raft.state import (
    CandidateState,
    ElectionState,
    FollowerState,
    IllegalTransitionError,
    LeaderState,
    ProspectiveState,
    QuorumState,
    RequestTracker,
    ResignedState,
    UnattachedState,
    VoteTally,
)

VOTERS = frozenset({1, 2, 3})
EMPTY_LOG = OffsetAndEpoch(0, 0)


def quorum(
    election: ElectionState | None = None,
    *,
    local_id: int = 1,
    voters: frozenset[int] = VOTERS,
    log_end: OffsetAndEpoch = EMPTY_LOG,
) -> QuorumState:
    state = QuorumState(
        local_id,
        voters,
        election_timeout_ms=1000,
        fetch_timeout_ms=2000,
        request_timeout_ms=2000,
        retry_backoff_ms=20,
        rng=random.Random(0),
    )
    state.initialize(election, log_end, now_ms=0)
    return state


def elect(q: QuorumState) -> LeaderState:
    """Prospective, candidate, leader: with every vote granted."""
    prospective = q.transition_to_prospective(0)
    for voter in q.voters:
        prospective.pre_votes.record(voter, True)
    candidate = q.transition_to_candidate(0)
    for voter in q.voters:
        candidate.votes.record(voter, True)
    return q.transition_to_leader(epoch_start_offset=0, now_ms=0)


# --- Initialization: the persisted election state decides where a replica starts -----------


def test_a_new_voter_starts_unattached_in_epoch_zero_and_persists_that() -> None:
    q = quorum()
    assert isinstance(q.state, UnattachedState)
    assert q.epoch == 0
    assert q.take_unpersisted() == ElectionState(0)
    assert q.take_unpersisted() is None


@pytest.mark.parametrize(
    ("election", "expected"),
    [
        (ElectionState(4, voted_id=1, leader_id=1), ResignedState),
        (ElectionState(4, voted_id=1), CandidateState),
        (ElectionState(4, voted_id=2), UnattachedState),
        (ElectionState(4, voted_id=2, leader_id=2), FollowerState),
        (ElectionState(4, leader_id=3), FollowerState),
        (ElectionState(4), UnattachedState),
    ],
)
def test_a_restarted_voter_resumes_the_state_it_persisted(
    election: ElectionState, expected: type
) -> None:
    q = quorum(election)
    assert type(q.state) is expected
    assert q.state.epoch == 4
    assert q.state.voted_id == election.voted_id
    assert q.take_unpersisted() is None  # nothing new to persist


def test_a_log_with_a_later_epoch_than_the_election_state_wins() -> None:
    q = quorum(ElectionState(2, voted_id=1, leader_id=1), log_end=OffsetAndEpoch(10, 5))
    assert isinstance(q.state, UnattachedState)
    assert q.epoch == 5
    assert q.take_unpersisted() == ElectionState(5)


def test_an_observer_never_resumes_a_vote() -> None:
    q = quorum(ElectionState(4, voted_id=2), local_id=9)
    assert isinstance(q.state, UnattachedState)
    assert q.state.voted_id is None
    assert q.state.election_deadline_ms is None  # observers never campaign


# --- Transitions ----------------------------------------------------------------------------


def test_granting_a_vote_is_persisted_and_only_once_per_epoch() -> None:
    q = quorum()
    q.take_unpersisted()
    q.transition_to_unattached_voted(1, 2, now_ms=0)
    assert q.take_unpersisted() == ElectionState(1, voted_id=2)
    with pytest.raises(IllegalTransitionError):
        q.transition_to_unattached_voted(1, 3, now_ms=0)
    q.transition_to_unattached_voted(2, 3, now_ms=0)  # a new epoch: a new vote
    assert q.take_unpersisted() == ElectionState(2, voted_id=3)


def test_a_vote_never_goes_to_ourselves() -> None:
    with pytest.raises(IllegalTransitionError):
        quorum().transition_to_unattached_voted(1, 1, now_ms=0)
    # A candidate outside our voter set is the node's call (a static quorum refuses it;
    # a dynamic one may not have fetched the record that made it a voter, KIP-853).
    quorum().transition_to_unattached_voted(1, 7, now_ms=0)


def test_observers_neither_vote_nor_campaign() -> None:
    q = quorum(local_id=9)
    with pytest.raises(IllegalTransitionError):
        q.transition_to_unattached_voted(1, 2, now_ms=0)
    with pytest.raises(IllegalTransitionError):
        q.transition_to_prospective(0)


def test_a_candidate_comes_only_from_a_won_pre_vote() -> None:
    q = quorum()
    with pytest.raises(IllegalTransitionError):
        q.transition_to_candidate(0)
    prospective = q.transition_to_prospective(0)
    assert q.epoch == 0  # a pre-vote does not bump the epoch
    with pytest.raises(IllegalTransitionError):
        q.transition_to_candidate(0)
    prospective.pre_votes.record(2, True)
    candidate = q.transition_to_candidate(0)
    assert candidate.epoch == 1
    assert q.take_unpersisted() == ElectionState(1, voted_id=1)


def test_a_leader_comes_only_from_a_won_election() -> None:
    q = quorum()
    prospective = q.transition_to_prospective(0)
    prospective.pre_votes.record(2, True)
    candidate = q.transition_to_candidate(0)
    with pytest.raises(IllegalTransitionError):
        q.transition_to_leader(0, 0)
    candidate.votes.record(3, True)
    leader = q.transition_to_leader(0, 0)
    assert q.take_unpersisted() == ElectionState(1, voted_id=1, leader_id=1)
    assert leader.epoch == 1


def test_following_needs_a_newer_epoch_or_an_unknown_leader() -> None:
    q = quorum()
    q.transition_to_follower(1, 2, now_ms=0)
    assert q.take_unpersisted() == ElectionState(1, leader_id=2)
    with pytest.raises(IllegalTransitionError):
        q.transition_to_follower(1, 3, now_ms=0)  # two leaders in one epoch
    with pytest.raises(IllegalTransitionError):
        q.transition_to_follower(0, 3, now_ms=0)
    with pytest.raises(IllegalTransitionError):
        q.transition_to_follower(2, 1, now_ms=0)  # ourselves
    q.transition_to_follower(2, 3, now_ms=0)
    assert q.leader_id == 3
    # A leader this replica's voter set does not list yet (KIP-853: it was added by a
    # record not fetched yet): the epoch names it, so it is followed.
    q.transition_to_follower(3, 8, now_ms=0)
    assert q.leader_id == 8


def test_a_follower_remembers_its_vote_in_the_epoch() -> None:
    q = quorum()
    q.transition_to_unattached_voted(1, 2, now_ms=0)
    q.transition_to_follower(1, 2, now_ms=0)
    assert q.take_unpersisted() == ElectionState(1, voted_id=2, leader_id=2)


def test_a_leader_cannot_follow_or_campaign_in_its_epoch() -> None:
    q = quorum()
    elect(q)
    with pytest.raises(IllegalTransitionError):
        q.transition_to_follower(1, 2, now_ms=0)
    with pytest.raises(IllegalTransitionError):
        q.transition_to_prospective(0)
    with pytest.raises(IllegalTransitionError):
        q.transition_to_unattached(1, now_ms=0)
    q.transition_to_unattached(2, now_ms=0)  # a higher epoch always wins


def test_resigning_is_a_soft_state_that_remembers_leading_the_epoch() -> None:
    q = quorum()
    elect(q)
    q.take_unpersisted()
    resigned = q.transition_to_resigned([3, 2], now_ms=0)
    assert resigned.preferred_successors == (3, 2)
    assert q.take_unpersisted() is None
    with pytest.raises(IllegalTransitionError):
        q.transition_to_follower(1, 2, now_ms=0)
    # Its pre-vote fails: it stays a replica that led epoch 1, never one that may lead it again.
    prospective = q.transition_to_prospective(0)
    assert prospective.leader_id == 1
    unattached = q.transition_to_unattached(1, now_ms=0)
    assert unattached.election() == ElectionState(1, voted_id=1, leader_id=1)
    assert isinstance(quorum(unattached.election()).state, ResignedState)


def test_only_a_leader_resigns() -> None:
    with pytest.raises(IllegalTransitionError):
        quorum().transition_to_resigned([], now_ms=0)


def test_a_lost_pre_vote_keeps_the_epoch_and_the_vote() -> None:
    q = quorum(ElectionState(3, voted_id=2))
    q.transition_to_prospective(0)
    unattached = q.transition_to_unattached(3, now_ms=0)
    assert unattached.election() == ElectionState(3, voted_id=2)


def test_a_voter_cannot_drop_its_leader_within_the_epoch_but_an_observer_can() -> None:
    voter = quorum()
    voter.transition_to_follower(1, 2, now_ms=0)
    with pytest.raises(IllegalTransitionError):
        voter.transition_to_unattached(1, now_ms=0)
    observer = quorum(local_id=9)
    observer.transition_to_follower(1, 2, now_ms=0)
    observer.transition_to_unattached(1, now_ms=0)
    assert observer.leader_id is None


def test_election_timeouts_are_randomized_in_t_to_2t() -> None:
    q = quorum()
    timeouts = {q.random_election_timeout_ms() for _ in range(200)}
    assert min(timeouts) >= 1000
    assert max(timeouts) < 2000
    assert len(timeouts) > 50


# --- Grant rules per state --------------------------------------------------------------------


def test_unattached_grants_to_an_up_to_date_log_and_again_to_the_same_candidate() -> None:
    tracker = RequestTracker(100, 10)
    fresh = UnattachedState(1, tracker, voted_id=None, election_deadline_ms=0)
    assert fresh.can_grant_vote(2, True, False, 0)
    assert not fresh.can_grant_vote(2, False, False, 0)
    voted = UnattachedState(1, tracker, voted_id=2, election_deadline_ms=0)
    assert voted.can_grant_vote(2, True, False, 0)
    assert not voted.can_grant_vote(3, True, False, 0)
    assert voted.can_grant_vote(3, True, True, 0)  # a pre-vote binds nothing


def test_follower_grants_pre_votes_only_once_the_leader_went_quiet() -> None:
    follower = FollowerState(
        1, RequestTracker(100, 10), leader_id=2, voted_id=None, now_ms=0, fetch_timeout_ms=2000
    )
    assert follower.can_grant_vote(3, True, True, 0)  # never heard from the leader
    follower.heard_from_leader(100)
    assert not follower.can_grant_vote(3, True, True, 1000)
    assert follower.can_grant_vote(3, True, True, 2100)
    assert not follower.can_grant_vote(3, True, False, 5000)  # never a real vote
    follower.heard_from_leader(5000)
    follower.leader_ending(5001, 0)
    assert follower.can_grant_vote(3, True, True, 5001)


def test_candidate_leader_and_resigned_never_grant_real_votes() -> None:
    tracker = RequestTracker(100, 10)
    candidate = CandidateState(
        2, tracker, local_id=1, voters=VOTERS, election_deadline_ms=0, retries=1
    )
    leader = LeaderState(
        2,
        tracker,
        local_id=1,
        voters=VOTERS,
        epoch_start_offset=0,
        now_ms=0,
        fetch_timeout_ms=2000,
    )
    resigned = ResignedState(
        2, tracker, local_id=1, voters=VOTERS, preferred_successors=(), election_deadline_ms=0
    )
    for state in (candidate, leader, resigned):
        assert not state.can_grant_vote(2, True, False, 0)
    assert candidate.can_grant_vote(2, True, True, 0)
    assert resigned.can_grant_vote(2, True, True, 0)
    assert not leader.can_grant_vote(2, True, True, 0)


def test_prospective_that_knows_a_leader_grants_no_real_vote() -> None:
    tracker = RequestTracker(100, 10)
    prospective = ProspectiveState(
        1,
        tracker,
        local_id=1,
        voters=VOTERS,
        voted_id=None,
        leader_id=2,
        election_deadline_ms=0,
        retries=0,
    )
    assert not prospective.can_grant_vote(3, True, False, 0)
    assert prospective.can_grant_vote(3, True, True, 0)


# --- The leader's bookkeeping ----------------------------------------------------------------


def leader_state(voters: frozenset[int] = VOTERS, epoch_start_offset: int = 0) -> LeaderState:
    return LeaderState(
        3,
        RequestTracker(100, 10),
        local_id=1,
        voters=voters,
        epoch_start_offset=epoch_start_offset,
        now_ms=0,
        fetch_timeout_ms=2000,
    )


def test_high_watermark_is_what_a_majority_reached_the_leader_at_its_flushed_offset() -> None:
    leader = leader_state()
    assert not leader.update_local_state(flushed_offset=0, end_offset=10, now_ms=0)
    assert not leader.update_replica_state(2, 10, leader_end_offset=10, now_ms=0)
    assert leader.high_watermark is None  # the leader has not flushed anything
    assert leader.update_local_state(flushed_offset=6, end_offset=10, now_ms=0)
    assert leader.high_watermark == 6
    assert leader.update_replica_state(3, 8, leader_end_offset=10, now_ms=0)
    assert leader.high_watermark == 8


def test_high_watermark_waits_for_an_entry_of_the_leaders_epoch() -> None:
    leader = leader_state(epoch_start_offset=5)  # entries below 5 are from older epochs
    leader.update_local_state(flushed_offset=6, end_offset=6, now_ms=0)
    assert not leader.update_replica_state(2, 5, leader_end_offset=6, now_ms=0)
    assert leader.high_watermark is None
    assert leader.update_replica_state(2, 6, leader_end_offset=6, now_ms=0)
    assert leader.high_watermark == 6


def test_high_watermark_never_goes_backwards() -> None:
    leader = leader_state()
    leader.update_local_state(flushed_offset=10, end_offset=10, now_ms=0)
    leader.update_replica_state(2, 10, leader_end_offset=10, now_ms=0)
    assert leader.high_watermark == 10
    assert not leader.update_replica_state(2, 4, leader_end_offset=10, now_ms=0)
    assert leader.high_watermark == 10


def test_observers_do_not_count_for_the_high_watermark_but_are_tracked() -> None:
    leader = leader_state()
    leader.update_local_state(flushed_offset=10, end_offset=10, now_ms=0)
    assert not leader.update_replica_state(9, 10, leader_end_offset=10, now_ms=5)
    assert leader.high_watermark is None
    (observer,) = leader.observer_progress(now_ms=5)
    assert (observer.replica_id, observer.log_end_offset, observer.last_fetch_ms) == (9, 10, 5)
    assert leader.observer_progress(now_ms=10_000_000) == ()  # forgotten after a while


def test_five_voters_need_three() -> None:
    leader = leader_state(frozenset({1, 2, 3, 4, 5}))
    leader.update_local_state(flushed_offset=9, end_offset=9, now_ms=0)
    leader.update_replica_state(2, 9, leader_end_offset=9, now_ms=0)
    assert leader.high_watermark is None
    leader.update_replica_state(3, 4, leader_end_offset=9, now_ms=0)
    assert leader.high_watermark == 4


def test_a_replica_is_caught_up_when_it_reaches_the_leaders_end_at_its_last_fetch() -> None:
    leader = leader_state()
    leader.update_replica_state(2, 3, leader_end_offset=10, now_ms=100)
    assert leader.voter_states[2].last_caught_up_ms is None
    leader.update_replica_state(2, 10, leader_end_offset=12, now_ms=200)
    assert leader.voter_states[2].last_caught_up_ms == 100
    leader.update_replica_state(2, 12, leader_end_offset=12, now_ms=300)
    assert leader.voter_states[2].last_caught_up_ms == 300


def test_check_quorum_restarts_when_a_majority_fetched() -> None:
    leader = leader_state()
    assert not leader.has_lost_quorum(1999)
    leader.record_contact(2, 1500)
    assert not leader.has_lost_quorum(3000)
    assert leader.has_lost_quorum(3500)


def test_preferred_successors_are_the_most_caught_up_voters_first() -> None:
    leader = leader_state(frozenset({1, 2, 3, 4}))
    leader.update_replica_state(2, 5, leader_end_offset=10, now_ms=0)
    leader.update_replica_state(4, 9, leader_end_offset=10, now_ms=0)
    assert leader.preferred_successors() == (4, 2, 3)


# --- Small parts ------------------------------------------------------------------------------


def test_vote_tally_counts_each_voter_once_and_knows_when_the_majority_is_out_of_reach() -> None:
    tally = VoteTally(frozenset({1, 2, 3, 4, 5}), local_id=1)
    tally.record(2, False)
    tally.record(2, True)  # a duplicate answer changes nothing
    tally.record(9, True)  # not a voter
    assert tally.granted == {1} and tally.rejected == {2}
    tally.record(3, False)
    assert not tally.is_rejected
    tally.record(4, False)
    assert tally.is_rejected
    assert tally.unanswered() == [5]


def test_request_tracker_waits_for_an_answer_or_the_timeout_then_backs_off_failures() -> None:
    tracker = RequestTracker(request_timeout_ms=100, retry_backoff_ms=10)
    assert tracker.is_ready(2, 0)
    tracker.on_sent(2, 0)
    assert not tracker.is_ready(2, 99)
    assert tracker.is_ready(2, 100)
    tracker.on_sent(2, 100)
    tracker.on_response(2, 120, failed=True)
    assert not tracker.is_ready(2, 125)
    assert tracker.is_ready(2, 130)
