"""``RaftNode.next_deadline_ms``: a driver that ticks only then misses no timer.

Each case brings a node into a state with one timer that matters, then checks that a
tick a millisecond before the reported deadline does nothing and a tick at it does what
the timer is for. The seeded schedules (``test_raft_simulation.py``) tick every node
only at its deadlines too, through elections, crashes and partitions.
"""

from __future__ import annotations

from highwater.raft.state import ElectionState, Role
from simulation import NodeHarness, begin_epoch, fetch_request, vote_response


def leader() -> NodeHarness:
    """Node 1, elected leader of epoch 1 by 2 and 3, its log flushed."""
    h = NodeHarness(1, (1, 2, 3), election_state=ElectionState(0))
    h.advance(10_000)
    h.step(vote_response(2, 0, True, pre_vote=True), vote_response(3, 0, True, pre_vote=True))
    h.step(vote_response(2, 1, True), vote_response(3, 1, True))
    assert h.node.is_leader
    h.flush()
    return h


def tick_at_deadline(h: NodeHarness) -> list[str]:
    """Tick ``h`` just before and at its next deadline; what it sent at the deadline."""
    h.ready()
    deadline_ms = h.node.next_deadline_ms()
    assert deadline_ms is not None and deadline_ms > h.now_ms
    role = h.node.role
    h.advance(deadline_ms - 1 - h.now_ms)
    assert h.sent() == []
    assert h.node.role is role
    h.advance(1)
    return h.sent()


def test_a_parked_fetch_is_answered_at_the_deadline_it_reports() -> None:
    lead = leader()
    lead.step(fetch_request(2, 1, (1, 1)))  # moves the high watermark: lingers
    assert lead.node.next_deadline_ms() == lead.now_ms + lead.config.high_watermark_linger_ms
    assert tick_at_deadline(lead) == [
        "1->2 FetchResponse leader_id=1 leader_epoch=1 high_watermark=1 fetch_offset=1"
        " last_fetched_epoch=1",
    ]
    lead.step(fetch_request(2, 1, (1, 1), max_wait_ms=300))  # the long poll
    assert lead.node.next_deadline_ms() == lead.now_ms + 300
    assert len(tick_at_deadline(lead)) == 1


def test_a_leader_no_majority_fetches_from_resigns_at_its_deadline() -> None:
    lead = leader()
    assert lead.node.next_deadline_ms() == lead.now_ms + lead.config.fetch_timeout_ms
    assert tick_at_deadline(lead) == [
        "1->2 EndQuorumEpoch leader_epoch=1",
        "1->3 EndQuorumEpoch leader_epoch=1",
    ]
    assert lead.node.role is Role.RESIGNED


def test_a_follower_looks_for_a_new_leader_at_its_fetch_deadline() -> None:
    h = NodeHarness(2, (1, 2, 3))
    h.step(begin_epoch(1, 1, to=2))
    assert [m.split()[1] for m in h.sent()] == ["BeginQuorumEpochResponse", "Fetch"]
    tick_at_deadline(h)
    assert h.node.role is Role.PROSPECTIVE


def test_an_unattached_voter_and_a_prospective_time_out_at_their_deadlines() -> None:
    h = NodeHarness(1, (1, 2, 3), election_state=ElectionState(0))
    assert h.node.role is Role.UNATTACHED
    sent = tick_at_deadline(h)
    assert h.node.role is Role.PROSPECTIVE
    assert len(sent) == 2  # the pre-votes
    tick_at_deadline(h)  # no answers: the pre-vote's election times out
    assert h.node.role is Role.UNATTACHED


def test_a_prospective_back_to_its_leader_on_a_tick_fetches_at_the_next() -> None:
    """A follower whose fetch timed out stands as prospective; when its pre-vote's election
    times out, a tick sends it back to the leader it knew, with no fetch in flight: the
    fetch is due at once, so its deadline is now, not the new fetch timeout's."""
    h = NodeHarness(2, (1, 2, 3))
    h.step(begin_epoch(1, 1, to=2))
    h.sent()
    tick_at_deadline(h)
    assert h.node.role is Role.PROSPECTIVE
    tick_at_deadline(h)  # no pre-vote answers: back to following 1
    assert h.node.role is Role.FOLLOWER
    assert h.node.next_deadline_ms() == h.now_ms
    h.advance(0)
    assert [m.split()[1] for m in h.sent()] == ["Fetch"]
