"""Replication, as transcripts: fetch, long poll, high watermark, divergence, snapshots."""

from __future__ import annotations

import pytest
from highwater.raft.log import InMemoryRaftLog
from highwater.raft.messages import (
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    OffsetAndEpoch,
    RaftMessage,
)
from highwater.raft.node import RaftConfig
from highwater.raft.snapshot import InMemorySnapshotStore
from highwater.raft.state import ElectionState, Role
from highwater.v1.common_pb2 import ErrorCode
from simulation import (
    NodeHarness,
    begin_epoch,
    fetch_request,
    fetch_response,
    render,
    vote_response,
)


def log_with(*batches: tuple[int, int]) -> InMemoryRaftLog:
    """A log of one-entry batches: ``count`` of them for each ``(epoch, count)``."""
    log = InMemoryRaftLog()
    for epoch, count in batches:
        for _ in range(count):
            log.append_as_leader([f"e{epoch}@{log.end_offset}".encode()], epoch)
    log.mark_flushed(log.end_offset)
    return log


def elect(h: NodeHarness, epoch: int) -> None:
    """Make ``h`` (node 1) leader of ``epoch``, every other voter granting, and flush."""
    h.node.tick(h.now_ms + 10_000)
    h.now_ms += 10_000
    others = [v for v in h.voters if v != 1]
    h.step(*(vote_response(v, epoch - 1, True, pre_vote=True) for v in others))
    h.step(*(vote_response(v, epoch, True) for v in others))
    assert h.node.is_leader and h.node.epoch == epoch
    h.flush()
    h.ready()


def leader(log: InMemoryRaftLog | None = None, epoch: int = 1, **kwargs: object) -> NodeHarness:
    h = NodeHarness(
        1,
        (1, 2, 3),
        election_state=ElectionState(epoch - 1),
        log=log,
        **kwargs,  # type: ignore[arg-type]
    )
    elect(h, epoch)
    return h


def follower(
    node_id: int = 2, epoch: int = 1, log: InMemoryRaftLog | None = None, **kwargs: object
) -> NodeHarness:
    h = NodeHarness(node_id, (1, 2, 3), log=log, **kwargs)  # type: ignore[arg-type]
    h.step(begin_epoch(1, epoch, to=node_id))
    return h


def exchange(source: NodeHarness, destination: NodeHarness) -> list[str]:
    """Deliver what ``source`` sends to ``destination``; the transcript of it."""
    delivered: list[RaftMessage] = [
        m for m in source.ready().messages if m.destination == destination.node_id
    ]
    destination.step(*delivered)
    return [render(m) for m in delivered]


# --- Fetching and the long poll ------------------------------------------------------------


def test_a_follower_fetches_from_its_log_end_and_last_epoch() -> None:
    h = follower(log=log_with((1, 3)), epoch=2)
    assert h.sent()[-1] == ("2->1 Fetch current_leader_epoch=2 fetch_offset=3 last_fetched_epoch=1")


def test_records_flow_to_the_follower_and_the_high_watermark_back() -> None:
    lead, follow = leader(), follower()
    lead.node.propose([b"a", b"b"], lead.now_ms)
    lead.flush()
    exchange(lead, follow)
    assert exchange(follow, lead) == [
        "2->1 BeginQuorumEpochResponse leader_id=1 leader_epoch=1",
        "2->1 Fetch current_leader_epoch=1 fetch_offset=0 last_fetched_epoch=0",
    ]
    assert exchange(lead, follow) == [
        "1->2 FetchResponse leader_id=1 leader_epoch=1 records=[0..2] fetch_offset=0"
        " last_fetched_epoch=0",
    ]
    assert follow.log.end_offset == 3
    # The follower reports its progress only once it is durable.
    assert exchange(follow, lead) == []
    follow.flush()
    assert exchange(follow, lead) == [
        "2->1 Fetch current_leader_epoch=1 fetch_offset=3 last_fetched_epoch=1",
    ]
    assert lead.node.high_watermark == 3
    # A voter hears of the new high watermark after the linger, when no entries come first.
    assert exchange(lead, follow) == []
    lead.advance(lead.config.high_watermark_linger_ms)
    assert exchange(lead, follow) == [
        "1->2 FetchResponse leader_id=1 leader_epoch=1 high_watermark=3 fetch_offset=3"
        " last_fetched_epoch=1",
    ]
    assert follow.ready().high_watermark == 3


def test_a_followers_next_fetch_can_be_taken_as_soon_as_its_flush_is_done() -> None:
    lead, follow = leader(), follower()
    lead.node.propose([b"a"], lead.now_ms)
    lead.flush()
    exchange(lead, follow)
    exchange(follow, lead)
    exchange(lead, follow)  # the records: the follower appends them
    assert follow.node.ready_messages() == []  # nothing until they are durable
    follow.log.mark_flushed(follow.log.end_offset)
    follow.node.on_flushed(follow.log.end_offset, follow.now_ms)
    assert [render(m) for m in follow.node.ready_messages()] == [
        "2->1 Fetch current_leader_epoch=1 fetch_offset=2 last_fetched_epoch=1",
    ]
    assert follow.ready().messages == []  # taken already: not sent twice


def test_messages_wait_for_an_unpersisted_election_state() -> None:
    h = NodeHarness(1, (1, 2, 3))
    h.ready()
    h.advance(2000)
    assert [render(m).split()[1] for m in h.node.ready_messages()] == ["Vote", "Vote"]  # pre-votes
    h.step(vote_response(2, 0, True, pre_vote=True))  # a candidate: epoch 1, voted for itself
    assert h.node.ready_messages() == []  # the vote requests wait for the election state
    ready = h.node.ready()
    assert ready.election_state is not None
    assert [type(m).__name__ for m in ready.messages] == ["VoteRequest", "VoteRequest"]


def test_a_fetch_with_nothing_new_is_parked_until_data_arrives() -> None:
    lead = leader()
    lead.step(fetch_request(2, 1, (1, 1)))  # moves the high watermark: answered soon
    lead.advance(lead.config.high_watermark_linger_ms)
    lead.ready()
    lead.step(fetch_request(2, 1, (1, 1)))
    assert lead.sent() == []
    lead.node.propose([b"x"], lead.now_ms)
    assert lead.sent() == [
        "1->2 FetchResponse leader_id=1 leader_epoch=1 high_watermark=1 records=[1..1]"
        " fetch_offset=1 last_fetched_epoch=1",
    ]


def test_a_parked_fetch_is_answered_when_the_high_watermark_moves() -> None:
    lead = leader()
    lead.node.propose([b"x"], lead.now_ms)
    lead.flush()
    lead.step(fetch_request(3, 1, (2, 1)))  # 3 and the leader: high watermark 2
    lead.step(fetch_request(2, 1, (2, 1)))
    lead.ready()
    lead.step(fetch_request(2, 1, (2, 1)))  # nothing new for 2 now: parked
    assert lead.sent() == []
    lead.node.propose([b"y"], lead.now_ms)
    lead.flush()
    lead.ready()
    lead.step(fetch_request(3, 1, (3, 1)))  # the high watermark moves to 3
    assert lead.sent() == []  # the voter's answer lingers in case entries follow
    lead.advance(lead.config.high_watermark_linger_ms - 1)
    assert lead.sent() == []
    lead.advance(1)
    assert lead.sent() == [
        "1->3 FetchResponse leader_id=1 leader_epoch=1 high_watermark=3 fetch_offset=3"
        " last_fetched_epoch=1",
    ]


def test_a_new_high_watermark_rides_along_with_entries_appended_within_the_linger() -> None:
    lead = leader()
    lead.step(fetch_request(2, 1, (1, 1)))  # the high watermark moves to 1
    lead.advance(lead.config.high_watermark_linger_ms - 1)
    lead.node.propose([b"x"], lead.now_ms)
    assert lead.sent() == [
        "1->2 FetchResponse leader_id=1 leader_epoch=1 high_watermark=1 records=[1..1]"
        " fetch_offset=1 last_fetched_epoch=1",
    ]
    lead.advance(1)
    assert lead.sent() == []  # answered already: nothing left to send


def test_an_observers_parked_fetch_hears_of_a_new_high_watermark_at_once() -> None:
    lead = leader()
    lead.step(fetch_request(4, 1, (1, 1)))  # observer 4: nothing to commit by it
    lead.advance(lead.config.high_watermark_linger_ms)
    lead.ready()
    lead.step(fetch_request(4, 1, (1, 1)))
    assert lead.sent() == []  # parked: nothing new
    lead.step(fetch_request(2, 1, (1, 1)))  # voter 2 moves the high watermark to 1
    assert lead.sent() == [
        "1->4 FetchResponse leader_id=1 leader_epoch=1 high_watermark=1 fetch_offset=1"
        " last_fetched_epoch=1",
    ]


def test_a_parked_fetch_is_answered_empty_after_its_max_wait() -> None:
    lead = leader()
    lead.step(fetch_request(2, 1, (1, 1), max_wait_ms=300))
    lead.advance(lead.config.high_watermark_linger_ms)
    lead.ready()
    lead.step(fetch_request(2, 1, (1, 1), max_wait_ms=300))
    lead.advance(299)
    assert lead.sent() == []
    lead.advance(1)
    assert lead.sent() == [
        "1->2 FetchResponse leader_id=1 leader_epoch=1 high_watermark=1 fetch_offset=1"
        " last_fetched_epoch=1",
    ]


def test_a_leader_that_steps_down_answers_its_parked_fetches_with_an_error() -> None:
    lead = leader()
    lead.step(fetch_request(2, 1, (1, 1)))
    lead.ready()
    lead.step(fetch_request(2, 1, (1, 1)))
    lead.node.resign(lead.now_ms)
    assert lead.sent()[0] == (
        "1->2 FetchResponse NOT_LEADER_OR_FOLLOWER leader_id=1 leader_epoch=1 fetch_offset=1"
        " last_fetched_epoch=1"
    )


# --- The high watermark -----------------------------------------------------------------------


def test_the_leader_counts_itself_only_up_to_its_flushed_offset() -> None:
    lead = leader()
    lead.step(fetch_request(2, 1, (1, 1)))
    assert lead.ready().high_watermark == 1
    lead.node.propose([b"a"], lead.now_ms)
    lead.step(fetch_request(2, 1, (2, 1)))
    assert lead.ready().high_watermark is None  # the leader has not flushed offset 1
    lead.flush()
    assert lead.ready().high_watermark == 2


def test_entries_of_older_epochs_commit_only_with_an_entry_of_the_leaders_epoch() -> None:
    lead = leader(log_with((1, 3)), epoch=2)  # its control record is at offset 3
    lead.step(fetch_request(2, 1, (3, 1)))  # 2 has every entry of epoch 1
    lead.step(fetch_request(3, 1, (3, 1)))
    assert lead.node.high_watermark is None
    lead.step(fetch_request(2, 2, (4, 2)))
    assert lead.node.high_watermark == 4


def test_the_high_watermark_never_goes_backwards() -> None:
    lead = leader()
    lead.node.propose([b"a"], lead.now_ms)
    lead.flush()
    lead.step(fetch_request(2, 1, (2, 1)))
    assert lead.node.high_watermark == 2
    lead.step(fetch_request(2, 1, (1, 1)))  # a late duplicate of an older fetch
    assert lead.node.high_watermark == 2
    assert lead.node.describe().high_watermark == 2


def test_a_followers_high_watermark_is_the_leaders_bounded_by_its_own_log() -> None:
    follow = follower(log=log_with((1, 2)))
    follow.ready()
    follow.step(fetch_response(1, 1, (2, 1), high_watermark=7, to=2))
    assert follow.ready().high_watermark == 2
    assert follow.node.high_watermark == 2


# --- Divergence ---------------------------------------------------------------------------


def test_a_diverging_follower_is_told_where_the_common_prefix_ends() -> None:
    lead = leader(log_with((1, 3), (3, 2)), epoch=4)  # epochs 1: [0, 3), 3: [3, 5), 4: [5, 6)
    lead.step(fetch_request(2, 4, (6, 2)))  # 2 has entries of epoch 2 the leader never had
    assert lead.sent() == [
        "1->2 FetchResponse leader_id=1 leader_epoch=4 diverging_epoch=(3, 1) fetch_offset=6"
        " last_fetched_epoch=2",
    ]
    lead.step(fetch_request(3, 4, (4, 3)))  # 3 matches: a prefix of the leader's log
    assert "records=[4..5]" in lead.sent()[0]


def test_a_diverging_follower_truncates_in_one_step_and_fetches_again() -> None:
    follow = follower(log=log_with((1, 3), (2, 3)), epoch=4)
    follow.ready()
    follow.step(fetch_response(1, 4, (6, 2), diverging=(3, 1), to=2))
    assert follow.log.end_offset == 3
    assert follow.sent() == [
        "2->1 Fetch current_leader_epoch=4 fetch_offset=3 last_fetched_epoch=1"
    ]


def test_the_follower_truncates_where_its_own_epoch_ends_if_earlier() -> None:
    # The leader's epoch 1 ends at 5, the follower's at 2: the follower keeps 2 entries.
    follow = follower(log=log_with((1, 2), (2, 3)), epoch=4)
    follow.ready()
    follow.step(fetch_response(1, 4, (5, 2), diverging=(5, 1), to=2))
    assert follow.log.end_offset == 2


def test_answers_to_an_older_position_are_ignored() -> None:
    follow = follower(log=log_with((1, 5)), epoch=2)
    follow.ready()
    # A late duplicate of an answer to a fetch from offset 2: it must not truncate anything.
    follow.step(fetch_response(1, 2, (2, 1), diverging=(1, 1), to=2))
    follow.step(fetch_response(1, 2, (2, 1), high_watermark=2, to=2))
    assert follow.log.end_offset == 5
    assert follow.node.high_watermark is None


def test_a_follower_never_truncates_below_its_high_watermark() -> None:
    follow = follower(log=log_with((1, 5)), epoch=2)
    follow.step(fetch_response(1, 2, (5, 1), high_watermark=4, to=2))
    with pytest.raises(RuntimeError):
        follow.step(fetch_response(1, 2, (5, 1), diverging=(2, 1), to=2))


# --- Snapshots ------------------------------------------------------------------------------


def snapshotted_leader() -> NodeHarness:
    """A leader of epoch 2 whose log starts at a snapshot at offset 4."""
    snapshots = InMemorySnapshotStore()
    lead = leader(log_with((1, 4)), epoch=2, snapshots=snapshots)
    lead.step(fetch_request(2, 2, (5, 2)))
    lead.ready()
    snapshots.write(OffsetAndEpoch(4, 1), b"state-at-4")
    lead.node.snapshot_written(OffsetAndEpoch(4, 1))
    assert (lead.log.start_offset, lead.log.end_offset) == (4, 5)
    return lead


def test_a_follower_behind_the_log_start_is_sent_the_snapshot_id() -> None:
    lead = snapshotted_leader()
    lead.step(fetch_request(3, 2, (2, 1)))
    lead.step(fetch_request(3, 2, (0, 0)))
    assert lead.sent() == [
        "1->3 FetchResponse leader_id=1 leader_epoch=2 high_watermark=5 log_start_offset=4"
        " snapshot_id=(4, 1) fetch_offset=2 last_fetched_epoch=1",
        "1->3 FetchResponse leader_id=1 leader_epoch=2 high_watermark=5 log_start_offset=4"
        " snapshot_id=(4, 1) fetch_offset=0 last_fetched_epoch=0",
    ]


def test_a_follower_whose_log_diverges_before_the_log_start_is_sent_the_snapshot_id() -> None:
    lead = snapshotted_leader()
    lead.step(fetch_request(3, 2, (6, 0)))  # entries of epoch 0 the leader never had
    assert "snapshot_id=(4, 1)" in lead.sent()[0]


def test_a_follower_loads_the_leaders_snapshot_in_chunks() -> None:
    lead = snapshotted_leader()
    config = RaftConfig(snapshot_chunk_bytes=4)
    follow = follower(3, epoch=2, log=log_with((1, 1)), config=config)
    exchange(lead, follow)
    exchange(follow, lead)
    assert exchange(lead, follow)[-1].startswith("1->3 FetchResponse") and "snapshot_id=(4, 1)"
    transcript = []
    for _ in range(3):
        transcript += exchange(follow, lead) + exchange(lead, follow)
    assert transcript == [
        "3->1 FetchSnapshot current_leader_epoch=2 snapshot_id=(4, 1) position=0 max_bytes=4",
        "1->3 FetchSnapshotResponse leader_id=1 leader_epoch=2 snapshot_id=(4, 1) size=10 chunk=4B",
        "3->1 FetchSnapshot current_leader_epoch=2 snapshot_id=(4, 1) position=4 max_bytes=4",
        "1->3 FetchSnapshotResponse leader_id=1 leader_epoch=2 snapshot_id=(4, 1) size=10"
        " position=4 chunk=4B",
        "3->1 FetchSnapshot current_leader_epoch=2 snapshot_id=(4, 1) position=8 max_bytes=4",
        "1->3 FetchSnapshotResponse leader_id=1 leader_epoch=2 snapshot_id=(4, 1) size=10"
        " position=8 chunk=2B",
    ]
    ready = follow.ready()
    assert ready.load_snapshot == OffsetAndEpoch(4, 1)
    assert ready.high_watermark == 4
    assert follow.snapshots.read(OffsetAndEpoch(4, 1)) == b"state-at-4"
    assert (follow.log.start_offset, follow.log.end_offset, follow.log.last_epoch) == (4, 4, 1)
    assert [render(m) for m in ready.messages] == [
        "3->1 Fetch current_leader_epoch=2 fetch_offset=4 last_fetched_epoch=1"
    ]


def test_a_snapshot_the_leader_no_longer_has_is_abandoned_for_a_new_fetch() -> None:
    follow = follower(3, epoch=2)
    follow.step(fetch_response(1, 2, (0, 0), snapshot=(4, 1), to=3))
    follow.ready()
    follow.step(
        FetchSnapshotResponse(
            1, 3, ErrorCode.SNAPSHOT_NOT_FOUND, 1, 2, snapshot_id=OffsetAndEpoch(4, 1)
        )
    )
    assert follow.sent()[-1].startswith("3->1 Fetch current_leader_epoch=2 fetch_offset=0")


def test_fetch_snapshot_errors_carry_the_protocol_codes() -> None:
    lead = snapshotted_leader()
    lead.step(FetchSnapshotRequest(3, 1, "sim-cluster", 2, OffsetAndEpoch(3, 1), 0))
    lead.step(FetchSnapshotRequest(3, 1, "sim-cluster", 2, OffsetAndEpoch(4, 1), 99))
    lead.step(FetchSnapshotRequest(3, 1, "sim-cluster", 1, OffsetAndEpoch(4, 1), 0))
    errors = [line.split()[2] for line in lead.sent()]
    assert errors == ["SNAPSHOT_NOT_FOUND", "POSITION_OUT_OF_RANGE", "FENCED_LEADER_EPOCH"]


def test_a_snapshot_must_be_committed_and_match_the_log() -> None:
    lead = leader(log_with((1, 4)), epoch=2)
    with pytest.raises(ValueError):
        lead.node.snapshot_written(OffsetAndEpoch(4, 1))  # nothing is committed yet
    lead.step(fetch_request(2, 2, (5, 2)))
    with pytest.raises(ValueError):
        lead.node.snapshot_written(OffsetAndEpoch(4, 2))  # entry 3 is of epoch 1


def test_snapshot_written_drops_older_snapshots_and_the_log_before_it() -> None:
    lead = snapshotted_leader()
    lead.snapshots.write(OffsetAndEpoch(5, 2), b"state-at-5")
    lead.node.snapshot_written(OffsetAndEpoch(5, 2))
    assert lead.snapshots.snapshots() == [OffsetAndEpoch(5, 2)]
    assert (lead.log.start_offset, lead.log.last_epoch) == (5, 2)


def test_a_restarted_replica_starts_its_state_machine_from_its_latest_snapshot() -> None:
    lead = snapshotted_leader()
    lead.restart()
    ready = lead.ready()
    assert ready.load_snapshot == OffsetAndEpoch(4, 1)
    assert ready.high_watermark == 4


def test_a_snapshot_received_before_a_crash_replaces_a_log_that_lacks_it() -> None:
    snapshots = InMemorySnapshotStore()
    snapshots.write(OffsetAndEpoch(9, 3), b"s")
    h = NodeHarness(2, (1, 2, 3), log=log_with((1, 3)), snapshots=snapshots)
    assert (h.log.start_offset, h.log.end_offset, h.log.last_epoch) == (9, 9, 3)
    assert h.ready().load_snapshot == OffsetAndEpoch(9, 3)


# --- Errors, timeouts, bookkeeping ---------------------------------------------------------


def test_fetches_for_other_epochs_or_to_non_leaders_say_who_leads() -> None:
    lead = leader(epoch=3)
    lead.step(fetch_request(2, 2, (0, 0)))
    lead.step(fetch_request(2, 4, (0, 0)))
    assert lead.sent() == [
        "1->2 FetchResponse FENCED_LEADER_EPOCH leader_id=1 leader_epoch=3 fetch_offset=0"
        " last_fetched_epoch=0",
        "1->2 FetchResponse UNKNOWN_LEADER_EPOCH leader_id=1 leader_epoch=3 fetch_offset=0"
        " last_fetched_epoch=0",
    ]
    follow = follower(2, epoch=3)
    follow.ready()
    follow.step(fetch_request(3, 3, (0, 0), to=2))
    assert follow.sent()[0] == (
        "2->3 FetchResponse NOT_LEADER_OR_FOLLOWER leader_id=1 leader_epoch=3 fetch_offset=0"
        " last_fetched_epoch=0"
    )


def test_a_follower_told_of_a_newer_leader_follows_it() -> None:
    follow = follower(2, epoch=3)
    follow.ready()
    follow.step(fetch_response(1, 5, (0, 0), error=ErrorCode.FENCED_LEADER_EPOCH, leader=3, to=2))
    assert (follow.node.leader_id, follow.node.epoch) == (3, 5)
    assert follow.sent()[-1].startswith("2->3 Fetch current_leader_epoch=5")


def test_a_follower_retries_after_an_error_with_a_backoff() -> None:
    follow = follower(2, epoch=3)
    follow.ready()
    follow.step(fetch_response(1, 3, (0, 0), error=ErrorCode.NOT_LEADER_OR_FOLLOWER, to=2))
    follow.advance(19)
    assert follow.sent() == []
    follow.advance(1)
    assert len(follow.sent()) == 1


def test_an_unanswered_fetch_is_sent_again_after_the_request_timeout() -> None:
    follow = follower(2, epoch=3, config=RaftConfig(request_timeout_ms=1000))
    follow.ready()
    follow.advance(999)
    assert follow.sent() == []
    follow.advance(1)
    assert len(follow.sent()) == 1


def test_a_follower_that_hears_nothing_for_the_fetch_timeout_looks_for_a_new_leader() -> None:
    follow = follower(2, epoch=3)
    follow.step(fetch_response(1, 3, (0, 0), to=2))
    follow.advance(1999)
    assert follow.node.role is Role.FOLLOWER
    follow.advance(1)
    assert follow.node.role is Role.PROSPECTIVE


def test_an_observer_whose_leader_goes_quiet_looks_for_it_again() -> None:
    observer = NodeHarness(9, (1, 2, 3))
    observer.step(
        fetch_response(2, 3, (0, 0), error=ErrorCode.NOT_LEADER_OR_FOLLOWER, leader=1, to=9)
    )
    assert (observer.node.role, observer.node.leader_id) == (Role.FOLLOWER, 1)
    observer.advance(2000)
    assert observer.node.role is Role.UNATTACHED
    assert observer.node.epoch == 3


def test_describe_on_the_leader_shows_every_replicas_progress() -> None:
    lead = leader()
    lead.advance(5)
    lead.step(fetch_request(2, 1, (1, 1)))
    lead.step(fetch_request(9, 1, (0, 0)))
    description = lead.node.describe()
    assert (description.leader_id, description.leader_epoch, description.high_watermark) == (
        1,
        1,
        1,
    )
    assert [(r.replica_id, r.log_end_offset) for r in description.voters] == [
        (1, 1),
        (2, 1),
        (3, -1),
    ]
    assert [(r.replica_id, r.log_end_offset, r.last_fetch_ms) for r in description.observers] == [
        (9, 0, lead.now_ms)
    ]


def test_must_flush_stays_set_until_the_log_is_flushed() -> None:
    lead = leader()
    lead.node.propose([b"a"], lead.now_ms)
    assert lead.ready().must_flush
    assert lead.ready().must_flush
    lead.flush()
    assert not lead.ready().must_flush
