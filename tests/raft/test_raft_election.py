"""Elections as transcripts: pre-vote, vote, persisting before sending, leading, resigning."""

from __future__ import annotations

import pytest
from highwater.raft.messages import NO_LEADER, OffsetAndEpoch, VoteRequest
from highwater.raft.node import NotLeaderError, RaftConfig
from highwater.raft.state import ElectionState, FollowerState, IllegalTransitionError, Role
from highwater.v1.common_pb2 import ErrorCode
from simulation import (
    CLUSTER_ID,
    NodeHarness,
    begin_epoch,
    begin_epoch_response,
    end_epoch,
    fetch_request,
    fetch_response,
    vote_request,
    vote_response,
)


def leader_of_epoch_1(voters: tuple[int, ...] = (1, 2, 3)) -> NodeHarness:
    """Node 1, elected in epoch 1 by node 2, its control record flushed, effects taken."""
    h = NodeHarness(1, voters)
    h.advance(2000)
    h.step(*(vote_response(v, 0, True, pre_vote=True) for v in voters if v != 1))
    h.step(*(vote_response(v, 1, True) for v in voters if v != 1))
    h.flush()
    h.ready()
    assert h.node.is_leader
    return h


def follower_of(leader: int, epoch: int, voters: tuple[int, ...] = (1, 2, 3)) -> NodeHarness:
    h = NodeHarness(1, voters)
    h.step(begin_epoch(leader, epoch))
    h.ready()
    return h


# --- Becoming a candidate: pre-vote first (KIP-996) ------------------------------------------


def test_a_voter_without_leader_waits_an_election_timeout_then_asks_for_pre_votes() -> None:
    h = NodeHarness(1, (1, 2, 3))
    assert h.ready().election_state == ElectionState(0)
    h.advance(999)
    assert h.sent() == []
    h.advance(1001)
    assert h.sent() == [
        "1->2 Vote candidate_epoch=0 last_offset_epoch=0 last_offset=0 pre_vote",
        "1->3 Vote candidate_epoch=0 last_offset_epoch=0 last_offset=0 pre_vote",
    ]
    ready = h.readies[-1]
    assert ready.election_state is None  # a pre-vote changes nothing durable
    assert ready.role is not None and ready.role.role is Role.PROSPECTIVE
    assert h.node.epoch == 0


def test_a_majority_of_pre_votes_makes_a_candidate_that_bumps_the_epoch_and_votes_for_itself() -> (
    None
):
    h = NodeHarness(1, (1, 2, 3))
    h.advance(2000)
    h.ready()
    h.step(vote_response(3, 0, True, pre_vote=True))
    assert h.sent() == [
        "1->2 Vote candidate_epoch=1 last_offset_epoch=0 last_offset=0",
        "1->3 Vote candidate_epoch=1 last_offset_epoch=0 last_offset=0",
    ]
    # The vote for itself is persisted before the requests go out (Ready's order).
    assert h.readies[-1].election_state == ElectionState(1, voted_id=1)


def test_a_pre_vote_granted_by_a_minority_gives_up_and_keeps_the_epoch() -> None:
    h = NodeHarness(1, (1, 2, 3, 4, 5))
    h.advance(2000)
    h.ready()
    h.step(vote_response(2, 0, True, pre_vote=True))
    h.step(vote_response(3, 0, False, pre_vote=True))
    h.step(vote_response(4, 0, False, pre_vote=True))
    assert h.node.role is Role.PROSPECTIVE
    h.step(vote_response(5, 0, False, pre_vote=True))
    assert h.node.role is Role.UNATTACHED
    assert h.node.epoch == 0
    assert h.ready().election_state is None


def test_real_vote_answers_do_not_count_as_pre_votes() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.advance(2000)
    h.step(vote_response(2, 0, True))  # not a pre-vote answer
    assert h.node.role is Role.PROSPECTIVE


def test_the_candidate_that_wins_appends_a_control_record_and_begins_its_epoch() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.advance(2000)
    h.step(vote_response(2, 0, True, pre_vote=True))
    h.ready()
    h.step(vote_response(2, 1, True))
    assert h.sent() == [
        "1->2 BeginQuorumEpoch leader_epoch=1",
        "1->3 BeginQuorumEpoch leader_epoch=1",
    ]
    ready = h.readies[-1]
    assert ready.election_state == ElectionState(1, voted_id=1, leader_id=1)
    assert ready.must_flush
    assert ready.role is not None and (ready.role.role, ready.role.leader_id) == (Role.LEADER, 1)
    (entry,) = h.log.entries()
    assert (entry.offset, entry.epoch, entry.is_control) == (0, 1, True)


def test_the_leader_repeats_begin_quorum_epoch_until_each_voter_acknowledges_or_fetches() -> None:
    h = NodeHarness(1, (1, 2, 3, 4), config=RaftConfig(request_timeout_ms=600))
    h.advance(2000)
    h.step(vote_response(2, 0, True, pre_vote=True), vote_response(3, 0, True, pre_vote=True))
    h.ready()
    h.step(vote_response(2, 1, True), vote_response(3, 1, True))
    assert h.sent() == [
        "1->2 BeginQuorumEpoch leader_epoch=1",
        "1->3 BeginQuorumEpoch leader_epoch=1",
        "1->4 BeginQuorumEpoch leader_epoch=1",
    ]
    h.step(begin_epoch_response(2, 1))
    h.step(fetch_request(3, 1, (0, 0)))
    h.ready()
    h.advance(600)  # the request timeout
    assert h.sent() == ["1->4 BeginQuorumEpoch leader_epoch=1"]


def test_a_lost_election_backs_off_then_runs_a_pre_vote_again() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.advance(2000)
    h.step(vote_response(2, 0, True, pre_vote=True))
    h.step(vote_response(2, 1, False), vote_response(3, 1, False))
    h.ready()
    assert h.node.role is Role.CANDIDATE
    h.advance(1000)  # at most election_backoff_max_ms
    assert h.node.role is Role.PROSPECTIVE
    assert h.node.epoch == 1
    assert h.sent() == [
        "1->2 Vote candidate_epoch=1 last_offset_epoch=0 last_offset=0 pre_vote",
        "1->3 Vote candidate_epoch=1 last_offset_epoch=0 last_offset=0 pre_vote",
    ]


def test_a_candidate_that_hears_nothing_times_out_backs_off_and_tries_again() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.advance(2000)
    h.step(vote_response(2, 0, True, pre_vote=True))
    h.ready()
    h.advance(2000)  # the election timeout: backing off
    h.advance(1000)
    assert h.node.role is Role.PROSPECTIVE
    h.step(vote_response(3, 1, True, pre_vote=True))
    assert h.node.epoch == 2
    assert h.ready().election_state == ElectionState(2, voted_id=1)


def test_a_single_voter_elects_itself_at_once() -> None:
    h = NodeHarness(1, (1,))
    ready = h.ready()
    assert h.node.is_leader
    assert ready.election_state == ElectionState(1, voted_id=1, leader_id=1)
    assert ready.messages == []
    assert ready.must_flush
    h.flush()
    assert h.ready().high_watermark == 1


# --- Granting votes -------------------------------------------------------------------------


def test_a_vote_is_granted_and_persisted_before_the_answer_is_sent() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.ready()
    h.step(vote_request(2, 1))
    assert h.sent() == ["1->2 VoteResponse leader_id=none leader_epoch=1 vote_granted"]
    assert h.readies[-1].election_state == ElectionState(1, voted_id=2)


def test_a_second_candidate_in_the_same_epoch_is_refused_the_first_granted_again() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.step(vote_request(2, 1))
    h.ready()
    h.step(vote_request(3, 1))
    h.step(vote_request(2, 1))
    assert h.sent() == [
        "1->3 VoteResponse leader_id=none leader_epoch=1",
        "1->2 VoteResponse leader_id=none leader_epoch=1 vote_granted",
    ]
    assert h.readies[-1].election_state is None


@pytest.mark.parametrize(
    ("last", "granted"),
    [
        ((5, 2), True),  # same log
        ((6, 2), True),  # longer in the same epoch
        ((1, 3), True),  # a later last epoch wins whatever the length
        ((4, 2), False),  # shorter in the same epoch
        ((9, 1), False),  # an older last epoch loses whatever the length
    ],
)
def test_a_vote_needs_a_log_at_least_as_up_to_date(last: tuple[int, int], granted: bool) -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.log.append_as_leader([b"a", b"b"], 1)
    h.log.append_as_leader([b"c", b"d", b"e"], 2)  # ends at (5, 2)
    h.node = h._new_node()
    h.step(vote_request(2, 4, last))
    (answer,) = h.sent_messages()
    assert answer.vote_granted is granted  # type: ignore[union-attr]
    expected = ElectionState(4, voted_id=2) if granted else ElectionState(4)
    assert h.persisted == expected


def test_a_vote_request_from_an_older_epoch_is_fenced() -> None:
    h = follower_of(2, 3)
    h.step(vote_request(3, 2))
    assert h.sent() == ["1->3 VoteResponse FENCED_LEADER_EPOCH leader_id=2 leader_epoch=3"]


def test_a_vote_request_of_a_higher_epoch_ends_the_followers_epoch() -> None:
    h = follower_of(2, 3)
    h.step(vote_request(3, 4))
    assert h.sent() == ["1->3 VoteResponse leader_id=none leader_epoch=4 vote_granted"]
    assert h.readies[-1].election_state == ElectionState(4, voted_id=3)


def test_a_follower_never_grants_a_vote_in_its_leaders_epoch() -> None:
    h = follower_of(2, 3)
    h.step(vote_request(3, 3, (0, 0)))
    assert h.sent() == ["1->3 VoteResponse leader_id=2 leader_epoch=3"]


def test_a_pre_vote_binds_nothing() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.ready()
    h.step(vote_request(2, 0, pre_vote=True))
    h.step(vote_request(3, 0, pre_vote=True))
    assert h.sent() == [
        "1->2 VoteResponse leader_id=none leader_epoch=0 vote_granted pre_vote",
        "1->3 VoteResponse leader_id=none leader_epoch=0 vote_granted pre_vote",
    ]
    assert h.readies[-1].election_state is None
    assert h.node.epoch == 0


def test_a_follower_refuses_pre_votes_while_it_hears_from_its_leader() -> None:
    h = follower_of(2, 1)
    h.step(fetch_response(2, 1, (0, 0), high_watermark=0))
    h.ready()
    # A voter cut off from the leader comes back and asks: it cannot force an election.
    h.step(vote_request(3, 1, (0, 0), pre_vote=True))
    assert h.sent() == ["1->3 VoteResponse leader_id=2 leader_epoch=1 pre_vote"]


def test_a_follower_that_never_heard_from_its_leader_grants_pre_votes() -> None:
    h = follower_of(2, 1)
    h.step(vote_request(3, 1, (0, 0), pre_vote=True))
    assert h.sent()[-1] == "1->3 VoteResponse leader_id=2 leader_epoch=1 vote_granted pre_vote"


def test_a_follower_whose_leader_is_gone_stands_within_half_an_election_timeout() -> None:
    h = follower_of(2, 1)
    h.step(fetch_response(2, 1, (0, 0), high_watermark=0))
    h.ready()
    h.node.peer_unreachable(2, h.now_ms)  # the leader's process refused the connection
    # It vouches for the leader no more: another follower's pre-vote is granted.
    h.step(vote_request(3, 1, (0, 0), pre_vote=True))
    assert h.sent() == ["1->3 VoteResponse leader_id=2 leader_epoch=1 vote_granted pre_vote"]
    for _ in range(h.config.election_timeout_ms // 2):
        if h.node.role is Role.PROSPECTIVE:
            break
        h.advance(1)
    assert h.node.role is Role.PROSPECTIVE  # long before the 2,000 ms fetch timeout
    assert h.sent() == [
        "1->2 Vote candidate_epoch=1 last_offset_epoch=0 last_offset=0 pre_vote",
        "1->3 Vote candidate_epoch=1 last_offset_epoch=0 last_offset=0 pre_vote",
    ]


def test_the_delay_after_a_lost_leader_is_drawn_once_until_the_leader_answers_again() -> None:
    h = follower_of(2, 1)
    h.step(fetch_response(2, 1, (0, 0), high_watermark=0))
    h.node.peer_unreachable(2, h.now_ms)
    state = h.node.state
    assert isinstance(state, FollowerState)
    deadline = state.fetch_deadline_ms
    assert deadline <= h.now_ms + h.config.election_timeout_ms // 2
    for _ in range(50):  # every failed retry reports again: the deadline stays
        h.node.peer_unreachable(2, h.now_ms)
    assert state.fetch_deadline_ms == deadline
    h.step(fetch_response(2, 1, (0, 0), high_watermark=0))  # back after all
    assert state.fetch_deadline_ms == h.now_ms + h.config.fetch_timeout_ms
    h.step(vote_request(3, 1, (0, 0), pre_vote=True))
    assert h.sent()[-1] == "1->3 VoteResponse leader_id=2 leader_epoch=1 pre_vote"


def test_an_unreachable_peer_that_is_not_the_leader_changes_nothing() -> None:
    h = follower_of(2, 1)
    h.step(fetch_response(2, 1, (0, 0), high_watermark=0))
    h.ready()
    h.node.peer_unreachable(3, h.now_ms)
    h.step(vote_request(3, 1, (0, 0), pre_vote=True))
    assert h.sent() == ["1->3 VoteResponse leader_id=2 leader_epoch=1 pre_vote"]
    h.advance(h.config.fetch_timeout_ms - 1)
    assert h.node.role is Role.FOLLOWER


def test_a_leader_refuses_votes_and_pre_votes_in_its_epoch() -> None:
    h = leader_of_epoch_1()
    h.step(vote_request(3, 1, (9, 0), pre_vote=True))
    h.step(vote_request(3, 1, (9, 0)))
    assert h.sent() == [
        "1->3 VoteResponse leader_id=1 leader_epoch=1 pre_vote",
        "1->3 VoteResponse leader_id=1 leader_epoch=1",
    ]


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (VoteRequest(2, 1, "other-cluster", 1, 0, 0), "INCONSISTENT_CLUSTER_ID"),
        (VoteRequest(2, 1, CLUSTER_ID, 1, 1, 0), "INVALID_REQUEST"),  # last epoch >= its epoch
        (VoteRequest(2, 1, CLUSTER_ID, 1, 0, -1), "INVALID_REQUEST"),
        (VoteRequest(7, 1, CLUSTER_ID, 1, 0, 0), "INCONSISTENT_VOTER_SET"),
    ],
)
def test_invalid_vote_requests_are_refused_with_an_error(request_: VoteRequest, error: str) -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.ready()
    h.step(request_)
    (line,) = h.sent()
    assert error in line.split()
    assert h.node.epoch == 0


def test_an_observer_never_votes_nor_campaigns() -> None:
    h = NodeHarness(9, (1, 2, 3))
    h.ready()
    h.step(vote_request(2, 1, to=9))
    assert h.sent()[0] == "9->2 VoteResponse INCONSISTENT_VOTER_SET leader_id=none leader_epoch=0"
    h.advance(10_000)
    lines = h.sent()
    assert lines and all(" Fetch " in line for line in lines)
    assert h.node.role is Role.UNATTACHED


def test_an_observer_finds_the_leader_from_any_voters_answer() -> None:
    h = NodeHarness(9, (1, 2, 3), seed=4)
    h.advance(10)
    (fetch,) = h.sent_messages()
    voter = fetch.destination
    assert fetch.source == 9 and voter in (1, 2, 3)
    # Not the leader, but it knows who is.
    h.step(fetch_response(voter, 5, (0, 0), error=ErrorCode.FENCED_LEADER_EPOCH, leader=3, to=9))
    assert (h.node.role, h.node.leader_id, h.node.epoch) == (Role.FOLLOWER, 3, 5)
    assert h.sent() == ["9->3 Fetch current_leader_epoch=5 fetch_offset=0 last_fetched_epoch=0"]


# --- Learning of other leaders and epochs ------------------------------------------------------


def test_begin_quorum_epoch_makes_a_follower_that_fetches_at_once() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.ready()
    h.step(begin_epoch(2, 3))
    assert h.sent() == [
        "1->2 BeginQuorumEpochResponse leader_id=2 leader_epoch=3",
        "1->2 Fetch current_leader_epoch=3 fetch_offset=0 last_fetched_epoch=0",
    ]
    assert h.readies[-1].election_state == ElectionState(3, leader_id=2)


def test_a_candidate_that_learns_the_winner_of_its_epoch_follows_it() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.advance(2000)
    h.step(vote_response(2, 0, True, pre_vote=True))
    h.step(begin_epoch(3, 1))
    assert (h.node.role, h.node.leader_id, h.node.epoch) == (Role.FOLLOWER, 3, 1)
    assert h.ready().election_state == ElectionState(1, voted_id=1, leader_id=3)


def test_a_higher_epoch_in_an_answer_ends_a_candidacy() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.advance(2000)
    h.step(vote_response(2, 0, True, pre_vote=True))
    h.step(vote_response(3, 4, False, leader=2))
    assert (h.node.role, h.node.leader_id, h.node.epoch) == (Role.FOLLOWER, 2, 4)


def test_a_message_naming_a_second_leader_of_an_epoch_is_a_broken_invariant() -> None:
    h = follower_of(2, 3)
    with pytest.raises(IllegalTransitionError):
        h.step(begin_epoch(3, 3))


def test_begin_quorum_epoch_of_an_older_epoch_is_fenced() -> None:
    h = follower_of(2, 3)
    h.step(begin_epoch(3, 2))
    assert h.sent() == [
        "1->3 BeginQuorumEpochResponse FENCED_LEADER_EPOCH leader_id=2 leader_epoch=3"
    ]


# --- Resigning ------------------------------------------------------------------------------


def test_a_graceful_resignation_names_the_most_caught_up_voters_first() -> None:
    h = leader_of_epoch_1((1, 2, 3, 4))
    h.log.append_as_leader([b"x", b"y"], 1)
    h.flush()
    h.step(fetch_request(3, 1, (3, 1)))
    h.step(fetch_request(2, 1, (1, 1)))
    h.ready()
    h.node.resign(h.now_ms)
    assert h.sent()[-3:] == [
        "1->2 EndQuorumEpoch leader_epoch=1 preferred_successors=(3, 2, 4)",
        "1->3 EndQuorumEpoch leader_epoch=1 preferred_successors=(3, 2, 4)",
        "1->4 EndQuorumEpoch leader_epoch=1 preferred_successors=(3, 2, 4)",
    ]
    assert h.readies[-1].election_state is None  # resigned is not persisted
    assert h.node.role is Role.RESIGNED
    with pytest.raises(NotLeaderError):
        h.node.propose([b"z"], h.now_ms)


def test_end_quorum_epoch_makes_the_first_successor_campaign_at_once() -> None:
    h = follower_of(2, 1)
    h.step(end_epoch(2, 1, (1, 3)))
    assert h.node.role is Role.PROSPECTIVE
    assert h.sent() == [
        "1->2 EndQuorumEpochResponse leader_id=2 leader_epoch=1",
        "1->2 Vote candidate_epoch=1 last_offset_epoch=0 last_offset=0 pre_vote",
        "1->3 Vote candidate_epoch=1 last_offset_epoch=0 last_offset=0 pre_vote",
    ]


def test_end_quorum_epoch_makes_later_successors_wait_longer() -> None:
    h = follower_of(2, 1, (1, 2, 3, 4))
    h.step(end_epoch(2, 1, (3, 1, 4)))
    h.advance(249)
    assert h.node.role is Role.FOLLOWER
    h.advance(1)  # election_backoff_max_ms >> 2
    assert h.node.role is Role.PROSPECTIVE


def test_a_resigned_leader_helps_its_successors_pre_vote() -> None:
    h = leader_of_epoch_1()
    h.node.resign(h.now_ms)
    h.ready()
    h.step(vote_request(2, 1, (1, 1), pre_vote=True))
    assert h.sent() == ["1->2 VoteResponse leader_id=1 leader_epoch=1 vote_granted pre_vote"]


def test_a_leader_that_hears_from_no_majority_within_the_fetch_timeout_resigns() -> None:
    h = leader_of_epoch_1()
    h.advance(1500)
    h.step(fetch_request(2, 1, (1, 1)))
    # The fetch moved the high watermark: its answer lingers, and counts as contact too
    # when it goes out (the follower's long poll is still open).
    h.advance(h.config.high_watermark_linger_ms)
    assert any("FetchResponse" in line for line in h.sent())
    h.advance(1999)  # voter 2 last heard 1999 ms ago
    assert h.node.is_leader
    h.advance(1)
    assert h.node.role is Role.RESIGNED
    assert [line.split()[1] for line in h.sent()][-2:] == ["EndQuorumEpoch", "EndQuorumEpoch"]


def test_a_restarted_leader_is_resigned_in_its_epoch_and_never_leads_it_again() -> None:
    h = leader_of_epoch_1()
    h.restart()
    assert h.node.role is Role.RESIGNED
    assert h.node.epoch == 1
    h.step(vote_request(3, 1, (0, 0)))
    assert h.sent()[0] == "1->3 VoteResponse leader_id=1 leader_epoch=1"
    h.advance(2000)
    assert h.node.role is Role.PROSPECTIVE
    h.step(vote_response(2, 1, True, pre_vote=True))
    assert h.node.epoch == 2  # leads again only in a new epoch


def test_a_restarted_candidate_asks_again_in_its_epoch() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.advance(2000)
    h.step(vote_response(2, 0, True, pre_vote=True))
    h.ready()
    h.restart()
    assert (h.node.role, h.node.epoch) == (Role.CANDIDATE, 1)
    h.advance(1)
    assert h.sent() == [
        "1->2 Vote candidate_epoch=1 last_offset_epoch=0 last_offset=0",
        "1->3 Vote candidate_epoch=1 last_offset_epoch=0 last_offset=0",
    ]


def test_a_restarted_voter_keeps_its_vote() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.step(vote_request(2, 1))
    h.ready()
    h.restart()
    h.step(vote_request(3, 1))
    assert h.sent()[-1] == "1->3 VoteResponse leader_id=none leader_epoch=1"


def test_role_changes_are_reported_once() -> None:
    h = leader_of_epoch_1()
    assert h.ready().role is None
    h.node.resign(h.now_ms)
    role = h.ready().role
    assert role is not None and (role.role, role.epoch, role.leader_id) == (Role.RESIGNED, 1, None)


def test_propose_elsewhere_names_the_leader() -> None:
    h = follower_of(2, 3)
    with pytest.raises(NotLeaderError) as raised:
        h.node.propose([b"x"], h.now_ms)
    assert (raised.value.leader_id, raised.value.epoch) == (2, 3)
    assert raised.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_describe_off_the_leader_says_what_is_known() -> None:
    h = follower_of(2, 3)
    description = h.node.describe()
    assert (description.leader_id, description.leader_epoch, description.high_watermark) == (
        2,
        3,
        -1,
    )
    assert description.voters == ()
    unattached = NodeHarness(1, (1, 2, 3)).node.describe()
    assert unattached.leader_id == NO_LEADER


def test_snapshot_id_type_is_offset_and_epoch() -> None:
    # The snapshot id and the diverging epoch share one value type.
    assert OffsetAndEpoch(3, 1) == OffsetAndEpoch(offset=3, epoch=1)
