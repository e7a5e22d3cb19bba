"""The core's dynamic membership (KIP-853), one node by hand: the voter set in use follows the
``voters`` records of the log, and the leader's AddRaftVoter/RemoveRaftVoter/UpdateRaftVoter
events append them or refuse with a typed error. The simulation (test_raft_simulation.py)
runs the same changes through faults."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from highwater.raft.log import InMemoryRaftLog
from highwater.raft.messages import (
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    OffsetAndEpoch,
    VoteRequest,
)
from highwater.raft.node import JoinRequest, NotLeaderError, RaftConfig, StaticQuorumError
from highwater.raft.state import ElectionState, Role
from highwater.raft.voter_set import (
    ChangeInProgressError,
    DuplicateVoterError,
    LastVoterError,
    NotAControllerError,
    NotCaughtUpError,
    Voter,
    VoterNotFoundError,
    VoterSet,
    encode_voters_record,
)
from highwater.v1.common_pb2 import ErrorCode
from simulation import (
    CLUSTER_ID,
    NodeHarness,
    begin_epoch,
    fetch_request,
    fetch_response,
    vote_request,
    vote_response,
)

DIRS = {i: uuid.UUID(int=i) for i in range(1, 10)}


def voter(node_id: int, directory: uuid.UUID | None = None) -> Voter:
    return Voter(node_id, directory or DIRS[node_id], f"h{node_id}:9093")


def voters(*ids: int) -> VoterSet:
    return VoterSet.of(voter(i) for i in ids)


def log_of(epoch: int, count: int) -> InMemoryRaftLog:
    log = InMemoryRaftLog()
    for _ in range(count):
        log.append_as_leader([f"e{epoch}@{log.end_offset}".encode()], epoch)
    log.mark_flushed(log.end_offset)
    return log


def dynamic_leader(*ids: int, committed: bool = True) -> NodeHarness:
    """Node 1 leading epoch 1 of a dynamic quorum; ``committed``: node 2 fetched its
    leader-change record, so the high watermark is in its epoch."""
    h = NodeHarness(1, voters(*ids), election_state=ElectionState(0))
    h.advance(10_000)
    others = [v for v in ids if v != 1]
    h.step(*(vote_response(v, 0, True, pre_vote=True) for v in others))
    h.step(*(vote_response(v, 1, True) for v in others))
    assert h.node.is_leader
    h.flush()
    h.ready()
    if committed:
        h.step(fetch_request(2, 1, (h.log.end_offset, 1)))
        assert h.node.high_watermark == h.log.end_offset
    return h


def test_the_first_leader_writes_the_bootstrap_set_as_the_first_voters_record() -> None:
    h = dynamic_leader(1, 2, 3, committed=False)
    leader_change, bootstrap = h.log.entry(0), h.log.entry(1)
    assert leader_change.is_control and b"leader_change" in leader_change.value
    assert bootstrap.is_control and bootstrap.value == encode_voters_record(voters(1, 2, 3))
    assert h.log.end_offset == 2
    h.step(fetch_request(2, 1, (2, 1)))
    assert h.ready().committed_voters == (1, voters(1, 2, 3)), "kept with its record's offset"
    # A replica that replicates from offset 0 learns the set from the log.
    follow = NodeHarness(2, voters(1, 2, 3))
    follow.step(begin_epoch(1, 1, to=2))
    follow.ready()
    follow.step(
        fetch_response(1, 1, (0, 0), records=h.log.read(0, 1 << 20), high_watermark=2, to=2)
    )
    assert follow.node.voters_at(2) == (1, voters(1, 2, 3))
    # A later leader finds the set in its log and writes no second record.
    h.restart()
    h.advance(10_000)
    h.step(vote_response(2, 1, True, pre_vote=True), vote_response(2, 2, True))
    assert h.node.is_leader and h.node.epoch == 2
    assert h.log.end_offset == 3 and b"leader_change" in h.log.entry(2).value


def test_a_fetched_voters_record_is_used_at_once_and_a_truncation_reverts_it() -> None:
    leader_log = log_of(1, 3)
    leader_log.append_as_leader([encode_voters_record(voters(1, 2, 3, 4))], 2, control=True)
    follow = NodeHarness(2, voters(1, 2, 3), log=log_of(1, 3))
    follow.step(begin_epoch(1, 2, to=2))
    follow.ready()
    follow.step(fetch_response(1, 2, (3, 1), records=leader_log.read(3, 1 << 20), to=2))
    assert follow.node.voter_set == voters(1, 2, 3, 4)  # uncommitted, in use
    assert follow.node.committed_voter_set() == voters(1, 2, 3)
    assert follow.ready().voters == voters(1, 2, 3, 4)
    # A new leader whose log never had the record: the follower truncates it away.
    follow.flush()
    follow.step(begin_epoch(3, 3, to=2))
    follow.ready()
    follow.step(fetch_response(3, 3, (4, 2), diverging=(3, 1), to=2))
    assert follow.log.end_offset == 3
    assert follow.node.voter_set == voters(1, 2, 3)


def test_a_restarted_replica_finds_its_voters_in_its_log() -> None:
    log = log_of(1, 2)
    log.append_as_leader([encode_voters_record(voters(2, 3))], 1, control=True)
    log.mark_flushed(log.end_offset)
    h = NodeHarness(1, voters(1, 2, 3), log=log)
    assert h.node.voter_set == voters(2, 3)
    assert not h.node.is_voter  # removed: it only observes
    h.advance(10_000)
    assert h.node.role is Role.UNATTACHED
    assert all(" Vote " not in line for line in h.sent())


def test_add_voter_appends_a_record_counted_at_once() -> None:
    h = dynamic_leader(1, 2, 3)
    end = h.log.end_offset
    h.step(fetch_request(4, 1, (end, 1), directory=DIRS[4]))  # observer 4 has caught up
    appended = h.node.add_voter(voter(4), h.now_ms)
    assert appended.offset == end
    assert h.node.voter_set == voters(1, 2, 3, 4)
    entry = h.log.entry(end)
    assert entry.is_control and entry.value == encode_voters_record(voters(1, 2, 3, 4))
    # Counted by the new set at once: the leader and 2 are no longer a majority of four.
    h.flush()
    h.step(fetch_request(2, 1, (end + 1, 1)))
    assert h.node.high_watermark == end
    h.step(fetch_request(4, 1, (end + 1, 1), directory=DIRS[4]))
    assert h.node.high_watermark == end + 1
    assert h.ready().committed_voters == (end, voters(1, 2, 3, 4))


def test_a_leader_counts_the_voters_records_of_its_epoch_that_a_snapshot_absorbed() -> None:
    """``voter_records_between`` vouches for the offsets the leader's own membership
    changes took between two of the controller's batches (``RaftServer.append``'s guard),
    even once a snapshot left only the latest set in the voter set history."""
    h = dynamic_leader(1, 2, 3)
    first = h.log.end_offset
    h.step(fetch_request(4, 1, (first, 1), directory=DIRS[4]))
    assert h.node.add_voter(voter(4), h.now_ms).offset == first
    h.flush()
    h.step(
        fetch_request(2, 1, (first + 1, 1)), fetch_request(4, 1, (first + 1, 1), directory=DIRS[4])
    )
    assert h.node.high_watermark == first + 1
    assert h.node.remove_voter(4, None, h.now_ms).offset == first + 1
    h.flush()
    h.step(fetch_request(2, 1, (first + 2, 1)), fetch_request(3, 1, (first + 2, 1)))
    assert h.node.high_watermark == first + 2
    h.node.snapshot_written(OffsetAndEpoch(first + 2, 1))  # keeps the set at first + 1
    assert h.node.voters_at(first + 2) == (first + 1, voters(1, 2, 3))
    assert h.node.voter_records_between(first, first + 2) == 2
    # From 0: the bootstrap set written beside the leader change too, not the leader change.
    assert h.node.voter_records_between(0, first + 2) == 3
    # A follower knows only what its history holds.
    follower = NodeHarness(2, voters(1, 2, 3), election_state=ElectionState(0))
    assert follower.node.voter_records_between(0, first + 2) == 0


def test_an_observer_that_announces_no_controller_endpoint_is_never_added() -> None:
    """A broker's or a coordinator's metadata replica fetches under its directory id but
    announces no controller endpoint: the leader refuses to add it, caught up or not, and
    adds the same node once its fetches announce one (a controller started there)."""
    h = dynamic_leader(1, 2, 3)
    end = h.log.end_offset
    h.step(fetch_request(4, 1, (end, 1), directory=DIRS[4], endpoint=""))
    with pytest.raises(NotAControllerError, match="node 4 is not a controller") as info:
        h.node.add_voter(voter(4), h.now_ms)
    assert info.value.code == ErrorCode.INVALID_REQUEST
    assert h.node.voter_set == voters(1, 2, 3)
    assert h.log.end_offset == end  # nothing appended
    described = {o.replica_id: o for o in h.node.describe().observers}
    assert described[4].directory_id == DIRS[4] and described[4].endpoint == ""
    h.step(fetch_request(4, 1, (end, 1), directory=DIRS[4], endpoint="h4:9093"))
    assert h.node.add_voter(voter(4), h.now_ms).offset == end
    assert h.node.voter_set == voters(1, 2, 3, 4)


def test_each_refusal_is_typed() -> None:
    fresh = dynamic_leader(1, 2, 3, committed=False)
    with pytest.raises(ChangeInProgressError) as info:
        fresh.node.remove_voter(3, None, fresh.now_ms)
    assert info.value.code == ErrorCode.REQUEST_TIMED_OUT

    h = dynamic_leader(1, 2, 3)
    with pytest.raises(NotCaughtUpError, match="not a caught-up observer"):
        h.node.add_voter(voter(4), h.now_ms)  # never fetched
    h.step(fetch_request(4, 1, (0, 0), directory=DIRS[4]))
    with pytest.raises(NotCaughtUpError):
        h.node.add_voter(voter(4), h.now_ms)  # fetched, but from far behind
    with pytest.raises(DuplicateVoterError, match="new incarnation"):
        h.node.add_voter(voter(2, uuid.UUID(int=99)), h.now_ms)
    with pytest.raises(VoterNotFoundError):
        h.node.remove_voter(9, None, h.now_ms)
    with pytest.raises(VoterNotFoundError):
        h.node.remove_voter(2, uuid.UUID(int=99), h.now_ms)  # another incarnation
    with pytest.raises(VoterNotFoundError):
        h.node.update_voter(voter(2, uuid.UUID(int=99)), h.now_ms)
    h.node.remove_voter(3, DIRS[3], h.now_ms)
    with pytest.raises(ChangeInProgressError, match="one change at a time"):
        h.node.remove_voter(2, None, h.now_ms)
    assert h.node.voter_set == voters(1, 2)

    single = NodeHarness(1, voters(1))
    single.flush()
    with pytest.raises(LastVoterError):
        single.node.remove_voter(1, None, single.now_ms)

    follow = NodeHarness(2, voters(1, 2, 3))
    follow.step(begin_epoch(1, 1, to=2))
    with pytest.raises(NotLeaderError):
        follow.node.add_voter(voter(4), follow.now_ms)

    static = NodeHarness(1, (1,))
    static.flush()
    with pytest.raises(StaticQuorumError) as static_info:
        static.node.add_voter(voter(2), static.now_ms)
    assert static_info.value.code == ErrorCode.UNSUPPORTED_VERSION


def test_add_voter_takes_the_observer_only_with_the_directory_id_it_fetches_with() -> None:
    """KIP-853 keys a replica by (id, directory id): adding node 4 under a directory id
    its fetches do not carry would name a voter no replica is (the real node 4 would
    count itself a stale incarnation), so it is refused as Kafka refuses an unknown key."""
    h = dynamic_leader(1, 2, 3)
    end = h.log.end_offset
    h.step(fetch_request(4, 1, (end, 1), directory=DIRS[4]))
    with pytest.raises(NotCaughtUpError, match=f"fetches with directory {DIRS[4]}") as info:
        h.node.add_voter(voter(4, uuid.UUID(int=99)), h.now_ms)
    assert info.value.code == ErrorCode.REQUEST_TIMED_OUT
    h.ready()
    h.step(fetch_request(4, 1, (end, 1)))  # a fetch that names no directory id
    with pytest.raises(NotCaughtUpError, match="names no directory id"):
        h.node.add_voter(voter(4), h.now_ms)
    h.ready()
    h.step(fetch_request(4, 1, (end, 1), directory=DIRS[4]))
    h.node.add_voter(voter(4), h.now_ms)
    assert h.node.voter_set == voters(1, 2, 3, 4)


def test_an_observer_wiped_and_back_under_a_new_directory_id_starts_uncaught_up() -> None:
    """The caught-up time belongs to the incarnation that earned it."""
    h = dynamic_leader(1, 2, 3)
    end = h.log.end_offset
    h.step(fetch_request(4, 1, (end, 1), directory=uuid.UUID(int=98)))
    h.ready()
    h.step(fetch_request(4, 1, (0, 0), directory=DIRS[4]))  # wiped: from the start
    with pytest.raises(NotCaughtUpError, match="never reached"):
        h.node.add_voter(voter(4), h.now_ms)


def test_a_fetch_from_another_incarnation_of_a_voter_is_not_the_voters_progress() -> None:
    """Node 2's disk was wiped and it came back with a new directory id while the set still
    names its old one: its fetch offsets are not what the voter acknowledged, and its
    fetches are not the voter's contact with the leader. The leader answers them as an
    observer's (the new incarnation catches up and learns the set naming its former key)
    and counts nothing."""
    h = dynamic_leader(1, 2, 3, committed=False)
    end = h.log.end_offset
    h.ready()
    h.step(fetch_request(2, 1, (0, 0), directory=uuid.UUID(int=99)))
    answers = [m for m in h.sent_messages() if isinstance(m, FetchResponse)]
    assert [a.error for a in answers] == [ErrorCode.NONE]
    assert answers[0].records == h.log.read(0, 1 << 20), "the log, from the start"
    h.step(fetch_request(2, 1, (end, 1), directory=uuid.UUID(int=99)))
    assert h.node.high_watermark is None, "its fetch offset is not the voter's"
    for _ in range(6):  # nor its fetches the voter's contact: check-quorum resigns
        h.advance(h.node.config.fetch_timeout_ms // 3)
        h.step(fetch_request(2, 1, (end, 1), directory=uuid.UUID(int=99)))
    assert not h.node.is_leader
    h = dynamic_leader(1, 2, 3, committed=False)
    h.ready()
    h.step(fetch_request(2, 1, (end, 1), directory=DIRS[2]))  # the voter itself
    assert h.node.high_watermark == end


def snapshot_fetch(source: int, directory: uuid.UUID) -> FetchSnapshotRequest:
    return FetchSnapshotRequest(
        source,
        1,
        CLUSTER_ID,
        1,
        OffsetAndEpoch(0, 0),
        0,
        replica_directory_id=directory,
    )


@pytest.mark.parametrize(("directory", "leads"), [(DIRS[2], True), (uuid.UUID(int=99), False)])
def test_a_snapshot_fetch_from_another_incarnation_of_a_voter_is_not_its_contact(
    directory: uuid.UUID, leads: bool
) -> None:
    """FetchSnapshot carries the fetcher's directory id as Fetch does: node 2's wiped disk's
    new incarnation fetching a snapshot is not the voter's contact, so a leader that hears
    from no other voter loses check-quorum; the voter itself keeps it leading."""
    h = dynamic_leader(1, 2, 3)
    for _ in range(6):
        h.advance(h.node.config.fetch_timeout_ms // 3)
        h.step(snapshot_fetch(2, directory))
    assert h.node.is_leader is leads


def test_update_voter_changes_the_endpoint_only() -> None:
    h = dynamic_leader(1, 2, 3)
    h.node.update_voter(Voter(2, DIRS[2], "new-host:9093"), h.now_ms)
    updated = h.node.voter_set.get(2)
    assert updated is not None and updated.endpoint == "new-host:9093"
    assert h.node.voter_set.ids == {1, 2, 3}


def test_a_leader_that_removes_itself_resigns_once_the_change_commits() -> None:
    h = dynamic_leader(1, 2, 3)
    end = h.log.end_offset
    h.node.remove_voter(1, None, h.now_ms)
    h.flush()
    assert h.node.is_leader and not h.node.is_voter
    # Counted without itself: 2 alone is not a majority of {2, 3}.
    h.step(fetch_request(2, 1, (end + 1, 1)))
    assert h.node.is_leader and h.node.high_watermark == end
    h.ready()
    h.step(fetch_request(3, 1, (end + 1, 1)))
    assert h.node.high_watermark == end + 1
    assert h.node.role is Role.RESIGNED
    assert any("EndQuorumEpoch" in line for line in h.sent())
    h.advance(10_000)
    assert h.node.role is Role.UNATTACHED  # an observer now: no campaign
    assert all(" Vote " not in line for line in h.sent())


def test_a_leader_that_removed_itself_describes_itself_among_the_observers() -> None:
    """While its removal is pending the leader counts the new set without itself: it is
    no voter, yet it leads and tracks progress, so DescribeQuorum lists it among the
    observers with its own log end, as Kafka's leader does."""
    h = dynamic_leader(1, 2, 3)
    h.node.remove_voter(1, None, h.now_ms)
    h.flush()
    assert h.node.is_leader and not h.node.is_voter
    described = h.node.describe()
    assert [v.replica_id for v in described.voters] == [2, 3]
    leader = [o for o in described.observers if o.replica_id == 1]
    assert len(leader) == 1, described.observers
    assert leader[0].log_end_offset == h.log.end_offset


def test_a_replica_outside_its_own_set_votes_when_a_candidate_of_a_newer_set_asks() -> None:
    """Node 4 was added by a record it has not fetched: the candidate counts it, so it
    grants (and persists) its vote; a static quorum's observer never votes."""
    h = NodeHarness(4, voters(1, 2, 3))
    assert not h.node.is_voter
    h.step(vote_request(1, 1, to=4))
    assert "4->1 VoteResponse leader_id=none leader_epoch=1 vote_granted" in h.sent()
    assert h.persisted == ElectionState(1, voted_id=1)
    h.advance(10_000)
    assert all(" Vote " not in line for line in h.sent())  # it still never campaigns


def test_a_wiped_voters_new_incarnation_neither_votes_nor_campaigns() -> None:
    """Node 3 came back with a new directory id while the set still lists its old one:
    it lost the votes the old incarnation cast, so it must not stand in for it."""
    h = NodeHarness(3, voters(1, 2, 3), directory_id=uuid.UUID(int=99))
    assert h.node.is_stale_incarnation() and not h.node.is_voter
    h.step(vote_request(1, 1, to=3))
    sent = h.sent()
    assert "3->1 VoteResponse INCONSISTENT_VOTER_SET leader_id=none leader_epoch=0" in sent
    assert all("vote_granted" not in line for line in sent)
    h.advance(10_000)
    assert all(" Vote " not in line for line in h.sent())  # it never campaigns
    # Once the old key is removed and the new one added, it is a voter like any other.
    renewed = VoterSet.of([voter(1), voter(2), voter(3, uuid.UUID(int=99))])
    assert not h.node.is_stale_incarnation(renewed)


def test_a_wiped_leaders_new_incarnation_told_that_it_leads_learns_the_epoch_only() -> None:
    """Node 1 led epoch 3, its disk was wiped and it came back (epoch 0, a new directory
    id) before the others noticed: they answer its search for the leader with "node 1
    leads epoch 3". That was its former incarnation, not a broken invariant: it takes the
    epoch with no leader known and goes on looking, as the observer it is."""
    h = NodeHarness(1, voters(1, 2, 3), directory_id=uuid.UUID(int=99))
    h.advance(100)
    asks = [m for m in h.node.ready().messages if isinstance(m, FetchRequest)]
    assert asks, "an observer looks for the leader"
    asked = asks[0].destination
    h.step(fetch_response(asked, 3, (0, 0), error=ErrorCode.NOT_LEADER_OR_FOLLOWER, leader=1, to=1))
    assert h.node.role is Role.UNATTACHED and h.node.epoch == 3
    assert h.node.leader_id is None and not h.node.is_voter
    # The others elect a new leader, whom the next answer names: it follows as an observer.
    h.step(fetch_response(3, 4, (0, 0), error=ErrorCode.NOT_LEADER_OR_FOLLOWER, leader=2, to=1))
    assert h.node.role is Role.FOLLOWER and h.node.leader_id == 2


def test_a_vote_request_names_the_voter_key_and_another_incarnation_refuses() -> None:
    """KIP-853's VoteRequest carries the directory id the candidate's set gives the voter
    it asks: a wiped node's new incarnation that has not learned the set yet (its own
    names node 4 nowhere) refuses, the incarnation named grants."""
    candidate = NodeHarness(1, voters(1, 2, 3, 4))
    candidate.advance(10_000)
    asks = [m for m in candidate.node.ready().messages if isinstance(m, VoteRequest)]
    assert {(m.destination, m.voter_directory_id) for m in asks} == {
        (n, DIRS[n]) for n in (2, 3, 4)
    }
    assert NodeHarness(1, (1, 2, 3))._new_node()._directory_id_of(2) is None  # static

    def replica(directory_id: uuid.UUID) -> NodeHarness:
        # It has not fetched the record adding it.
        return NodeHarness(4, voters(1, 2, 3), directory_id=directory_id)

    ask = replace(vote_request(1, 1, to=4), voter_directory_id=DIRS[4])
    wiped = replica(uuid.UUID(int=99))
    wiped.step(ask)
    assert "4->1 VoteResponse INCONSISTENT_VOTER_SET" in " ".join(wiped.sent())
    assert wiped.persisted == ElectionState(0), "nothing voted, no epoch bumped"
    named = replica(DIRS[4])
    named.step(ask)
    assert "4->1 VoteResponse leader_id=none leader_epoch=1 vote_granted" in named.sent()


# --- Auto-join (controller.quorum.auto.join.enable) ------------------------------------------

AUTO_JOIN = RaftConfig(auto_join=True, auto_join_backoff_ms=500)


def joiner(
    node_id: int,
    quorum: VoterSet,
    directory: uuid.UUID,
    *,
    config: RaftConfig = AUTO_JOIN,
    endpoint: str = "h9:9093",
) -> NodeHarness:
    """A dynamic quorum's replica ``node_id`` (directory ``directory``) started with the
    set ``quorum``, following leader 1 of epoch 1 once :func:`follow` answers its fetch."""
    return NodeHarness(node_id, quorum, config=config, directory_id=directory, endpoint=endpoint)


def follow(h: NodeHarness, leader_log: InMemoryRaftLog, high_watermark: int) -> None:
    """Leader 1 answers the replica's fetches with the rest of ``leader_log`` (an observer
    that was looking for the leader follows it from the first answer, and counts as
    having heard from it from the second)."""
    for _ in range(2):
        h.advance(100)
        h.ready()
        end = h.log.end_offset
        h.step(
            fetch_response(
                1,
                1,
                (end, h.log.last_epoch),
                records=leader_log.read(end, 1 << 20) if end < leader_log.end_offset else b"",
                high_watermark=high_watermark,
                to=h.node_id,
            )
        )
        h.flush()


def test_an_auto_joining_controller_asks_the_leader_to_add_it_once_it_follows() -> None:
    me = Voter(4, uuid.UUID(int=44), "h9:9093")
    h = joiner(4, voters(1, 2, 3), me.directory_id)
    h.advance(100)
    assert h.ready().join is None, "no leader heard from yet: nobody to ask"
    leader_log = log_of(1, 2)
    follow(h, leader_log, high_watermark=2)
    h.advance(1)
    assert h.ready().join == JoinRequest(1, add=True, voter=me)
    h.advance(1)
    assert h.ready().join is None, "asked again only after the backoff"
    assert h.node.next_deadline_ms() is not None
    assert h.node.next_deadline_ms() <= h.now_ms + 499
    h.advance(500)
    assert h.ready().join == JoinRequest(1, add=True, voter=me), "no answer: it asks again"
    # The leader appends the set naming it; once that commits it asks no more, even
    # after an operator removes it (remove-controller stands until it restarts).
    leader_log.append_as_leader(
        [encode_voters_record(VoterSet.of([voter(1), voter(2), voter(3), me]))], 1, control=True
    )
    follow(h, leader_log, high_watermark=leader_log.end_offset)
    assert h.node.is_voter
    h.ready()
    leader_log.append_as_leader([encode_voters_record(voters(1, 2, 3))], 1, control=True)
    follow(h, leader_log, high_watermark=leader_log.end_offset)
    assert not h.node.is_voter
    for _ in range(3):
        h.advance(600)
        assert h.ready().join is None


def test_a_wiped_controller_auto_joining_removes_its_former_incarnation_first() -> None:
    fresh = uuid.UUID(int=99)
    h = joiner(3, voters(1, 2, 3), fresh)
    leader_log = log_of(1, 2)
    follow(h, leader_log, high_watermark=2)
    asked = [r.join for r in h.readies if r.join is not None]
    assert asked == [JoinRequest(1, add=False, voter=voter(3))], "the old key first, once"
    h.advance(500)
    assert h.ready().join == JoinRequest(1, add=False, voter=voter(3)), "until it is gone"
    leader_log.append_as_leader([encode_voters_record(voters(1, 2))], 1, control=True)
    follow(h, leader_log, high_watermark=leader_log.end_offset)
    h.advance(500)
    assert h.ready().join == JoinRequest(1, add=True, voter=Voter(3, fresh, "h9:9093"))


@pytest.mark.parametrize(
    "why",
    ["auto-join off", "a broker's metadata replica", "a bootstrap voter", "a static quorum"],
)
def test_no_auto_join_where_it_does_not_apply(why: str) -> None:
    if why == "a static quorum":
        h = NodeHarness(4, (1, 2, 3), config=AUTO_JOIN)
    elif why == "a bootstrap voter":
        h = joiner(3, voters(1, 2, 3), DIRS[3])
    else:
        h = joiner(
            4,
            voters(1, 2, 3),
            uuid.UUID(int=44),
            config=RaftConfig() if why == "auto-join off" else AUTO_JOIN,
            endpoint="" if why == "a broker's metadata replica" else "h9:9093",
        )
    follow(h, log_of(1, 2), high_watermark=2)
    for _ in range(3):
        h.advance(600)
        assert h.ready().join is None
