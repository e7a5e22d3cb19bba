"""The group coordinator's pure core: joins, rebalances, syncs, sessions, static members,
offsets, deletion and reloading, driven by a fake clock."""

from __future__ import annotations

from group_harness import PARTITIONS, REBALANCE_MS, SESSION_MS, Harness, partition_for
from highwater.coordinator.core import (
    CommitResult,
    DeleteResult,
    FetchedOffset,
    GroupCoordinatorCore,
    GroupCoordinatorSettings,
    JoinResult,
    OffsetDeleteResult,
    OffsetToCommit,
    Outcome,
)
from highwater.coordinator.group import GroupState
from highwater.coordinator.records import OffsetCommitRecord, decode_record
from highwater.storage.topic_partition import TopicPartition
from highwater.v1.common_pb2 import ErrorCode
from highwater.v1.consumer_protocol_pb2 import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    ConsumerProtocolTopicPartitions,
)
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolSubscription as KafkaConsumerProtocolSubscription,
)

G = "orders-app"
TP0, TP1 = TopicPartition("orders", 0), TopicPartition("orders", 1)


def stable_pair(h: Harness) -> tuple[str, str, int]:
    """Two members in a Stable generation: (leader, follower, generation)."""
    first = h.join_result(h.join_new(G))
    h.run([])
    assert first.error == ErrorCode.NONE and first.leader == first.member_id
    h.sync_result(h.sync(G, first.member_id, first.generation_id, {first.member_id: b"a1"}))
    second_token = h.join_new(G)
    assert not h.answered(second_token)  # waits for the leader to rejoin
    assert h.heartbeat(G, first.member_id, first.generation_id) == ErrorCode.REBALANCE_IN_PROGRESS
    leader = h.join_result(h.join(G, first.member_id))
    follower = h.join_result(second_token)
    assert leader.generation_id == follower.generation_id == first.generation_id + 1
    assert leader.leader == first.member_id
    assert {m.member_id for m in leader.members} == {first.member_id, follower.member_id}
    assert follower.members == ()
    follower_sync = h.sync(G, follower.member_id, follower.generation_id)
    assert not h.answered(follower_sync)
    leader_sync = h.sync(
        G,
        leader.member_id,
        leader.generation_id,
        {leader.member_id: b"L", follower.member_id: b"F"},
    )
    assert h.sync_result(leader_sync).assignment == b"L"
    assert h.sync_result(follower_sync).assignment == b"F"
    assert h.core.groups[G].state is GroupState.STABLE
    return leader.member_id, follower.member_id, leader.generation_id


def assignment(*partitions: int) -> bytes:
    """A consumer-protocol assignment of partitions of the topic "orders"."""
    entry = ConsumerProtocolTopicPartitions(topic="orders", partitions=partitions)
    return ConsumerProtocolAssignment(assigned_partitions=[entry]).SerializeToString()


def test_a_first_join_needs_a_member_id_then_forms_generation_one() -> None:
    h = Harness()
    first = h.join_result(h.join(G, client_id="c1"))
    assert first.error == ErrorCode.MEMBER_ID_REQUIRED
    assert first.member_id.startswith("c1-")
    joined = h.join_result(h.join(G, first.member_id, client_id="c1"))
    assert (joined.error, joined.generation_id, joined.leader) == (
        ErrorCode.NONE,
        1,
        first.member_id,
    )
    assert joined.protocol_name == "range" and joined.protocol_type == "consumer"
    assert [m.metadata for m in joined.members] == [b"sub"]
    assert h.core.groups[G].state is GroupState.COMPLETING_REBALANCE


def test_two_members_rebalance_and_each_gets_its_share() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    assert h.heartbeat(G, leader, generation) == ErrorCode.NONE
    assert h.heartbeat(G, follower, generation) == ErrorCode.NONE
    assert h.heartbeat(G, follower, generation - 1) == ErrorCode.ILLEGAL_GENERATION
    assert h.heartbeat(G, "nobody", generation) == ErrorCode.UNKNOWN_MEMBER_ID
    # The assignment is in __consumer_offsets before anyone is told of it.
    [*_, last] = h.records(partition_for(G))
    assert last.value.generation == generation  # type: ignore[union-attr]
    assert {m.assignment for m in last.value.members} == {b"L", b"F"}  # type: ignore[union-attr]


def test_each_rebalance_that_ends_stable_is_reported_with_its_duration() -> None:
    h = Harness()
    first = h.join_result(h.join_new(G))
    h.advance(40)
    h.sync(G, first.member_id, first.generation_id, {first.member_id: b"a"})
    [formed] = h.rebalances
    assert (formed.group_id, formed.generation, formed.duration_ms) == (G, 1, 40)
    # A second member starts a rebalance; it ends when the leader's assignment is synced.
    second = h.join_new(G)
    h.advance(25)
    leader = h.join_result(h.join(G, first.member_id))
    follower = h.join_result(second)
    h.advance(10)
    h.sync(G, follower.member_id, follower.generation_id)
    assert len(h.rebalances) == 1  # not stable before the leader's sync
    h.sync(G, leader.member_id, leader.generation_id, {first.member_id: b"L"})
    assert h.rebalances[1] == type(formed)(G, leader.generation_id, 35)
    # Heartbeats of a stable group report nothing.
    h.advance(100)
    assert h.heartbeat(G, leader.member_id, leader.generation_id) == ErrorCode.NONE
    assert len(h.rebalances) == 2


def test_the_protocol_every_member_supports_and_most_prefer_is_chosen() -> None:
    h = Harness()
    a = h.join_result(h.join_new(G, protocols=[("sticky", b"s1"), ("range", b"r1")]))
    h.sync(G, a.member_id, a.generation_id, {})
    b_token = h.join_new(G, protocols=[("range", b"r2"), ("sticky", b"s2")])
    c_token = h.join_new(G, protocols=[("sticky", b"s3"), ("range", b"r3")])
    rejoined = h.join_result(
        h.join(G, a.member_id, protocols=[("sticky", b"s1"), ("range", b"r1")])
    )
    assert rejoined.protocol_name == "sticky"
    assert sorted(m.metadata for m in rejoined.members) == [b"s1", b"s2", b"s3"]
    assert h.join_result(b_token).protocol_name == "sticky"
    assert h.join_result(c_token).generation_id == rejoined.generation_id
    # A member with no protocol in common is refused and the group carries on.
    refused = h.join_result(h.join(G, protocols=[("roundrobin", b"x")]))
    assert refused.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    other_type = h.join_result(h.join(G, protocol_type="connect"))
    assert other_type.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_a_member_whose_session_expires_is_removed_and_the_group_rebalances() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    for _ in range(3):
        h.advance(SESSION_MS // 2)
        assert h.heartbeat(G, leader, generation) in (
            ErrorCode.NONE,
            ErrorCode.REBALANCE_IN_PROGRESS,
        )
    group = h.core.groups[G]
    assert follower not in group.members
    assert group.state is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(G, leader, generation) == ErrorCode.REBALANCE_IN_PROGRESS
    alone = h.join_result(h.join(G, leader))
    assert alone.generation_id == generation + 1 and [m.member_id for m in alone.members] == [
        leader
    ]


def test_members_that_do_not_rejoin_in_the_rebalance_timeout_are_dropped() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    newcomer = h.join_new(G)
    # The leader rejoins; the follower keeps heartbeating but never rejoins.
    leader_join = h.join(G, leader)
    for _ in range(REBALANCE_MS // 5_000):
        h.advance(5_000)
        h.heartbeat(G, follower, generation)
    result = h.join_result(leader_join)
    assert result.generation_id == generation + 1
    assert follower not in {m.member_id for m in result.members}
    assert h.join_result(newcomer).generation_id == generation + 1
    assert h.heartbeat(G, follower, generation) == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_member_that_never_syncs_is_removed_after_the_rebalance_timeout() -> None:
    h = Harness()
    leader, follower, _ = stable_pair(h)
    h.join_new(G)  # a third member triggers a rebalance
    leader_join, follower_join = h.join(G, leader), h.join(G, follower)
    joined = h.join_result(leader_join)
    h.join_result(follower_join)
    h.sync(G, follower, joined.generation_id)
    # The leader and newcomer never sync; the follower keeps heartbeating.
    for _ in range(REBALANCE_MS // 5_000 + 1):
        h.advance(5_000)
        h.heartbeat(G, follower, joined.generation_id)
    group = h.core.groups[G]
    assert leader not in group.members
    assert follower in group.members
    assert group.state is GroupState.PREPARING_REBALANCE


def test_leaving_triggers_a_rebalance_and_the_last_member_leaves_the_group_empty() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    assert h.leave(G, follower) == ErrorCode.NONE
    assert h.leave(G, follower) == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.core.groups[G].state is GroupState.PREPARING_REBALANCE
    rejoined = h.join_result(h.join(G, leader))
    assert rejoined.generation_id == generation + 1
    assert h.leave(G, leader) == ErrorCode.NONE
    group = h.core.groups[G]
    assert group.state is GroupState.EMPTY and group.generation_id == generation + 2
    assert not group.members


def test_the_initial_rebalance_delay_gathers_members_that_start_together() -> None:
    h = Harness(settings=GroupCoordinatorSettings(group_initial_rebalance_delay_ms=3_000))
    a = h.join_new(G)
    h.advance(2_000)
    b = h.join_new(G)
    h.advance(2_000)  # the first delay ended, but b arrived during it: another delay
    assert not h.answered(a) and not h.answered(b)
    h.advance(3_000)
    ra, rb = h.join_result(a), h.join_result(b)
    assert ra.generation_id == rb.generation_id == 1
    assert len(ra.members) + len(rb.members) == 2


def test_a_static_member_restarting_keeps_its_assignment_without_a_rebalance() -> None:
    h = Harness()
    a_join = h.join(G, instance_id="pod-a", client_id="a")
    a = h.join_result(a_join)  # static members get no MEMBER_ID_REQUIRED
    assert a.error == ErrorCode.NONE
    h.sync(G, a.member_id, a.generation_id, {a.member_id: b"A"})
    b_token = h.join(G, instance_id="pod-b", client_id="b")
    leader = h.join_result(h.join(G, a.member_id, instance_id="pod-a"))
    b = h.join_result(b_token)
    h.sync(G, b.member_id, b.generation_id, instance_id="pod-b")
    h.sync(
        G,
        a.member_id,
        a.generation_id + 1,
        {a.member_id: b"A", b.member_id: b"B"},
        instance_id="pod-a",
    )
    generation = leader.generation_id
    # pod-b restarts: a new member id, the same assignment, the same generation.
    back = h.join_result(h.join(G, instance_id="pod-b", client_id="b"))
    assert back.error == ErrorCode.NONE
    assert back.generation_id == generation and back.member_id != b.member_id
    assert (
        h.sync_result(h.sync(G, back.member_id, generation, instance_id="pod-b")).assignment == b"B"
    )
    assert h.core.groups[G].state is GroupState.STABLE
    # The old incarnation is fenced.
    assert h.heartbeat(G, b.member_id, generation, "pod-b") == ErrorCode.FENCED_INSTANCE_ID
    assert h.heartbeat(G, back.member_id, generation, "pod-b") == ErrorCode.NONE
    # The leader restarting is told not to assign again.
    again = h.join_result(h.join(G, instance_id="pod-a", client_id="a"))
    assert again.skip_assignment and again.leader == again.member_id
    assert again.generation_id == generation


def test_a_static_member_rejoining_with_new_metadata_keeps_its_assignment() -> None:
    # Kafka's updateStaticMemberThenRebalanceOrCompleteJoin: in Stable, only a change of the
    # group's selected protocol rebalances; new metadata under the same protocol is stored
    # with the member and the assignment stands.
    h = Harness()
    a, b, generation = stable_static_pair(h)
    group = h.core.groups[G]
    rejoin = h.join(G, instance_id="pod-b", client_id="b", protocols=[("range", b"v2")])
    assert h.answered(rejoin)  # at once: no rebalance waits for pod-a
    back = h.join_result(rejoin)
    assert back.error == ErrorCode.NONE
    assert back.generation_id == generation and back.member_id != b
    assert group.state is GroupState.STABLE
    synced = h.sync_result(h.sync(G, back.member_id, generation, instance_id="pod-b"))
    assert synced.assignment == b"B"
    assert group.members[back.member_id].metadata_for("range") == b"v2"
    # The stored group carries the new member id and its new metadata.
    [*_, last] = h.records(partition_for(G))
    stored = {m.member_id: m for m in last.value.members}  # type: ignore[union-attr]
    assert stored[back.member_id].subscription == b"v2"
    assert h.heartbeat(G, a, generation, "pod-a") == ErrorCode.NONE


def test_a_static_member_rejoining_with_another_preferred_protocol_rebalances() -> None:
    h = Harness()
    protocols = [("range", b"r"), ("sticky", b"s")]
    a = h.join_result(h.join(G, instance_id="pod-a", client_id="a", protocols=protocols))
    h.sync(G, a.member_id, a.generation_id, {a.member_id: b"A"}, instance_id="pod-a")
    group = h.core.groups[G]
    assert group.state is GroupState.STABLE and group.protocol_name == "range"
    rejoin = h.join(G, instance_id="pod-a", client_id="a", protocols=[("sticky", b"s")])
    again = h.join_result(rejoin)
    assert again.member_id != a.member_id
    assert (again.generation_id, again.protocol_name) == (a.generation_id + 1, "sticky")
    assert not again.skip_assignment and again.leader == again.member_id
    assert group.state is GroupState.COMPLETING_REBALANCE


def test_offset_commits_are_checked_against_member_generation_and_state() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    ok = h.commit(G, leader, generation, {TP0: 42, TP1: 7}, metadata="m")
    assert {tp: o.error for tp, o in ok.errors.items()} == {
        TP0: ErrorCode.NONE,
        TP1: ErrorCode.NONE,
    }
    assert (
        h.commit(G, leader, generation - 1, {TP0: 50}).errors[TP0].error
        == ErrorCode.ILLEGAL_GENERATION
    )
    assert (
        h.commit(G, "ghost", generation, {TP0: 50}).errors[TP0].error == ErrorCode.UNKNOWN_MEMBER_ID
    )
    assert h.commit(G, "", -1, {TP0: 50}).errors[TP0].error == ErrorCode.UNKNOWN_MEMBER_ID
    too_big = h.commit(G, follower, generation, {TP0: 9}, metadata="x" * 5_000)
    assert too_big.errors[TP0].error == ErrorCode.OFFSET_METADATA_TOO_LARGE
    outcome, fetched = h.core.fetch_offsets(G, [TP0, TP1, TopicPartition("other", 0)])
    assert outcome.error == ErrorCode.NONE
    assert [(f.offset, f.leader_epoch, f.metadata) for f in fetched.values()] == [
        (42, 3, "m"),
        (7, 3, "m"),
        (-1, -1, ""),
    ]
    # During CompletingRebalance commits wait for the new generation.
    h.join_new(G)
    leader_join = h.join(G, leader)
    follower_join = h.join(G, follower)
    new_generation = h.join_result(leader_join).generation_id
    h.join_result(follower_join)
    busy = h.commit(G, follower, new_generation, {TP0: 60})
    assert busy.errors[TP0].error == ErrorCode.REBALANCE_IN_PROGRESS


def test_commits_outside_group_management_go_to_an_empty_group() -> None:
    h = Harness()
    result = h.commit("standalone", "", -1, {TP0: 10})
    assert result.errors[TP0].error == ErrorCode.NONE
    assert h.core.fetch_offsets("standalone", None)[1][TP0].offset == 10
    _, listing = h.core.list_groups()
    assert [(g.group_id, g.state) for g in listing] == [("standalone", GroupState.EMPTY)]


def test_a_failed_write_of_the_assignment_fails_the_sync_and_rebalances() -> None:
    h = Harness(auto_write=False)
    first = h.join_result(h.join(G, h.join_result(h.join(G)).member_id))
    sync = h.sync(G, first.member_id, first.generation_id, {first.member_id: b"A"})
    assert not h.answered(sync)
    h.complete_writes(ErrorCode.NOT_ENOUGH_REPLICAS)
    assert h.sync_result(sync).error == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert h.core.groups[G].state is GroupState.PREPARING_REBALANCE


def test_a_commit_is_answered_only_once_its_records_are_appended() -> None:
    h = Harness()
    leader, _, generation = stable_pair(h)
    h.auto_write = False
    token = h.token()
    from highwater.coordinator.core import OffsetToCommit

    h.run(
        h.core.commit_offsets(token, G, leader, generation, None, [OffsetToCommit(TP0, 5)], h.now)
    )
    assert not h.answered(token)
    assert h.core.fetch_offsets(G, [TP0])[1][TP0].offset == -1
    h.complete_writes()
    assert h.answered(token)
    assert h.core.fetch_offsets(G, [TP0])[1][TP0].offset == 5


def test_requests_for_partitions_not_served_or_loading_are_refused() -> None:
    core = GroupCoordinatorCore(GroupCoordinatorSettings(), partition_for)
    assert core.heartbeat(G, "m", 1, None, 0).error == ErrorCode.NOT_COORDINATOR
    core.begin_loading(partition_for(G))
    assert core.describe_group(G).error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert core.heartbeat("", "m", 1, None, 0).error == ErrorCode.INVALID_GROUP_ID


def test_unloading_answers_waiting_requests_not_coordinator() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    h.join_new(G)
    waiting = h.join(G, leader)
    h.run(h.core.unload(partition_for(G)))
    assert h.join_result(waiting).error == ErrorCode.NOT_COORDINATOR
    assert h.heartbeat(G, follower, generation) == ErrorCode.NOT_COORDINATOR


def test_a_new_owner_replays_the_partition_and_members_carry_on_without_a_rebalance() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    h.commit(G, leader, generation, {TP0: 100, TP1: 200})
    h.commit(G, leader, generation, {TP0: 150})
    partition = partition_for(G)
    successor = GroupCoordinatorCore(GroupCoordinatorSettings(), partition_for)
    successor.begin_loading(partition)
    successor.load(partition, 1, h.records(partition), h.now)
    group = successor.groups[G]
    assert group.state is GroupState.STABLE and group.generation_id == generation
    assert set(group.members) == {leader, follower}
    assert successor.heartbeat(G, follower, generation, None, h.now).error == ErrorCode.NONE
    _, offsets = successor.fetch_offsets(G, None)
    assert {tp: o.offset for tp, o in offsets.items()} == {TP0: 150, TP1: 200}
    assert group.members[follower].assignment == b"F"


def test_deleting_groups_needs_them_empty_and_leaves_tombstones() -> None:
    h = Harness()
    leader, _, generation = stable_pair(h)
    h.commit(G, leader, generation, {TP0: 1})
    h.commit("idle", "", -1, {TP1: 3})
    token = h.token()
    h.run(h.core.delete_groups(token, [G, "idle", "missing"], h.now))
    result = h.replies.pop(token)
    assert isinstance(result, DeleteResult)
    assert {g: o.error for g, o in result.errors.items()} == {
        G: ErrorCode.NON_EMPTY_GROUP,
        "idle": ErrorCode.NONE,
        "missing": ErrorCode.GROUP_ID_NOT_FOUND,
    }
    assert "idle" not in h.core.groups
    tombstones = [
        r
        for r in h.records(partition_for("idle"))
        if isinstance(r, OffsetCommitRecord) and r.offset is None
    ]
    assert [(r.group_id, r.topic_partition) for r in tombstones] == [("idle", TP1)]


RETENTION_OF_A_MINUTE = GroupCoordinatorSettings(
    group_initial_rebalance_delay_ms=0,
    offsets_retention_ms=60_000,
    offsets_retention_check_interval_ms=10_000,
)
"""Offsets kept a minute after the group emptied (or their commit), checked every 10 s."""


def test_offsets_of_an_empty_group_expire_after_the_retention() -> None:
    h = Harness(settings=RETENTION_OF_A_MINUTE)
    leader, follower, generation = stable_pair(h)
    h.commit(G, leader, generation, {TP0: 1})
    h.leave(G, follower)
    h.join_result(h.join(G, leader))
    h.leave(G, leader)
    assert h.core.groups[G].state is GroupState.EMPTY
    h.advance(50_000)
    assert h.core.fetch_offsets(G, [TP0])[1][TP0].offset == 1
    h.advance(20_000)
    assert G not in h.core.groups
    assert h.core.fetch_offsets(G, [TP0])[1][TP0].offset == -1


def test_describe_and_list_show_state_members_and_assignments() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    described = h.core.describe_group(G)
    assert described.state is GroupState.STABLE and described.generation_id == generation
    assert {(m.member_id, m.assignment) for m in described.members} == {
        (leader, b"L"),
        (follower, b"F"),
    }
    assert all(m.client_host == "/127.0.0.1" for m in described.members)
    assert [g.group_id for g in h.core.list_groups(["stable"])[1]] == [G]
    assert h.core.list_groups(["Empty"])[1] == []
    assert h.core.describe_group("unknown").state is GroupState.DEAD


def test_joins_with_bad_settings_are_refused_with_typed_errors() -> None:
    h = Harness()
    too_short = h.join_result(h.join(G, session_ms=10))
    assert too_short.error == ErrorCode.INVALID_SESSION_TIMEOUT
    unknown = h.join_result(h.join(G, "made-up"))
    assert unknown.error == ErrorCode.UNKNOWN_MEMBER_ID
    oversized = h.join_result(h.join(G, protocols=[("range", b"x" * (2 * 1024 * 1024))]))
    assert oversized.error == ErrorCode.INVALID_REQUEST
    assert h.join_result(h.join("")).error == ErrorCode.INVALID_GROUP_ID
    assert isinstance(h.join_result(h.join_new(G)), JoinResult)


def test_a_member_commits_only_the_partitions_it_was_assigned() -> None:

    h = Harness()
    first = h.join_result(h.join_new(G))
    h.sync(G, first.member_id, first.generation_id, {first.member_id: assignment(0)})
    result = h.commit(G, first.member_id, first.generation_id, {TP0: 5, TP1: 6})
    assert result.errors[TP0].error == ErrorCode.NONE
    assert result.errors[TP1].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "not assigned" in result.errors[TP1].error_message
    assert h.core.fetch_offsets(G, [TP1])[1][TP1].offset == -1


def test_a_member_may_commit_what_it_gives_up_in_the_next_generation() -> None:

    h = Harness()
    first = h.join_result(h.join_new(G))
    h.sync(G, first.member_id, first.generation_id, {first.member_id: assignment(0, 1)})
    second = h.join_new(G)
    leader = h.join_result(h.join(G, first.member_id))
    other = h.join_result(second)
    h.sync(G, other.member_id, other.generation_id)
    h.sync(
        G,
        leader.member_id,
        leader.generation_id,
        {leader.member_id: assignment(0), other.member_id: assignment(2)},
    )
    # Partition 1 moved away in this generation: its last owner still commits it.
    result = h.commit(G, leader.member_id, leader.generation_id, {TP0: 1, TP1: 2})
    assert {o.error for o in result.errors.values()} == {ErrorCode.NONE}
    refused = h.commit(G, other.member_id, other.generation_id, {TP1: 3})
    assert refused.errors[TP1].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_deleting_offsets_keeps_those_of_subscribed_topics() -> None:
    h = Harness()
    subscription = ConsumerProtocolSubscription(topics=["orders"]).SerializeToString()
    joined = h.join_result(h.join_new(G, protocols=(("range", subscription),)))
    assignment = ConsumerProtocolAssignment(
        assigned_partitions=[
            ConsumerProtocolTopicPartitions(topic="orders", partitions=[0, 1]),
            ConsumerProtocolTopicPartitions(topic="audit", partitions=[0]),
        ]
    ).SerializeToString()
    h.sync_result(h.sync(G, joined.member_id, joined.generation_id, {joined.member_id: assignment}))
    audit = TopicPartition("audit", 0)
    h.commit(G, joined.member_id, joined.generation_id, {TP0: 5, TP1: 6, audit: 7})

    def delete(group: str, *partitions: TopicPartition) -> OffsetDeleteResult:
        token = h.token()
        h.run(h.core.delete_offsets(token, group, list(partitions), h.now))
        result = h.replies.pop(token)
        assert isinstance(result, OffsetDeleteResult)
        return result

    result = delete(G, TP0, audit, TopicPartition("audit", 9))
    assert result.error.error == ErrorCode.NONE
    assert {tp: o.error for tp, o in result.partitions.items()} == {
        TP0: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
        audit: ErrorCode.NONE,
        TopicPartition("audit", 9): ErrorCode.NONE,  # had no offset: nothing to delete
    }
    _, offsets = h.core.fetch_offsets(G, None)
    assert {tp: o.offset for tp, o in offsets.items()} == {TP0: 5, TP1: 6}
    tombstones = [
        r.topic_partition
        for r in h.records(partition_for(G))
        if isinstance(r, OffsetCommitRecord) and r.offset is None
    ]
    assert tombstones == [audit]

    h.leave(G, joined.member_id)  # empty now: every offset may go
    assert delete(G, TP0, TP1).partitions == {TP0: Outcome(), TP1: Outcome()}
    assert h.core.fetch_offsets(G, None)[1] == {}
    assert delete("missing", TP0).error.error == ErrorCode.GROUP_ID_NOT_FOUND


def test_an_undecodable_subscription_keeps_every_offset() -> None:
    h = Harness()
    leader, _, generation = stable_pair(h)  # members whose metadata is not a subscription
    h.commit(G, leader, generation, {TP0: 1})
    token = h.token()
    h.run(h.core.delete_offsets(token, G, [TP0], h.now))
    result = h.replies.pop(token)
    assert isinstance(result, OffsetDeleteResult)
    assert result.partitions[TP0].error == ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC


def test_a_static_rejoin_whose_write_fails_leaves_the_old_member_in_place() -> None:
    # Kafka reverts the replacement when the group metadata cannot be stored: memory must not
    # hold a member id the log never recorded, nor fence the incarnation still in place.
    h = Harness(auto_write=False)
    a_join = h.join(G, instance_id="pod-a", client_id="a")
    h.complete_writes(ErrorCode.NONE)
    a = h.join_result(a_join)
    h.sync(G, a.member_id, a.generation_id, {a.member_id: b"A"}, instance_id="pod-a")
    h.complete_writes(ErrorCode.NONE)
    assert h.core.groups[G].state is GroupState.STABLE
    rejoin = h.join(
        G,
        instance_id="pod-a",
        client_id="a",
        protocols=[("range", b"v2")],
        session_ms=SESSION_MS * 2,
        rebalance_ms=REBALANCE_MS * 2,
    )
    h.complete_writes(ErrorCode.NOT_ENOUGH_REPLICAS)
    failed = h.join_result(rejoin)
    assert failed.error == ErrorCode.COORDINATOR_NOT_AVAILABLE and failed.member_id == ""
    assert h.heartbeat(G, a.member_id, a.generation_id, "pod-a") == ErrorCode.NONE
    assert set(h.core.groups[G].members) == {a.member_id}
    # The member is as the log has it: its former metadata and timeouts.
    member = h.core.groups[G].members[a.member_id]
    assert member.metadata_for("range") == b"sub"
    assert (member.session_timeout_ms, member.rebalance_timeout_ms) == (SESSION_MS, REBALANCE_MS)


def test_offsets_with_a_commit_in_flight_do_not_expire() -> None:
    # Kafka's removeExpiredOffsets skips partitions with a pending commit and keeps a group
    # that has one: the tombstone would land after the commit and erase an acknowledged offset.
    h = Harness(settings=RETENTION_OF_A_MINUTE)
    h.commit("standalone", "", -1, {TP0: 1})
    h.advance(55_000)  # a retention check finds nothing to expire yet
    h.auto_write = False
    token = h.token()
    h.run(h.core.commit_offsets(token, "standalone", "", -1, None, [OffsetToCommit(TP0, 2)], h.now))
    h.advance(10_000)  # the next check runs while the commit is being appended
    h.complete_writes()
    result = h.replies.pop(token)
    assert isinstance(result, CommitResult) and result.errors[TP0].error == ErrorCode.NONE
    assert h.core.fetch_offsets("standalone", [TP0])[1][TP0].offset == 2
    successor = GroupCoordinatorCore(RETENTION_OF_A_MINUTE, partition_for)
    partition = partition_for("standalone")
    successor.load(partition, 1, h.records(partition), h.now)
    assert successor.fetch_offsets("standalone", [TP0])[1][TP0].offset == 2


def test_a_member_waiting_for_the_leaders_assignment_is_not_expired() -> None:
    # A member whose SyncGroup waits cannot heartbeat (the Python consumer does not while it
    # joins); as Kafka's hasSatisfiedHeartbeat, waiting keeps it alive, its session counting
    # again from the answer.
    h = Harness()
    first = h.join_result(h.join_new(G))
    h.sync(G, first.member_id, first.generation_id, {first.member_id: b"a"})
    second = h.join_new(G)
    leader = h.join_result(h.join(G, first.member_id))
    follower = h.join_result(second)
    follower_sync = h.sync(G, follower.member_id, follower.generation_id)
    for _ in range(3):  # the leader's assignor takes longer than a session
        h.advance(SESSION_MS // 2)
        assert h.heartbeat(G, leader.member_id, leader.generation_id) == ErrorCode.NONE
    assert not h.answered(follower_sync)
    h.sync(G, leader.member_id, leader.generation_id, {follower.member_id: b"F"})
    assert h.sync_result(follower_sync).assignment == b"F"
    h.advance(SESSION_MS - 1)
    assert h.heartbeat(G, follower.member_id, follower.generation_id) == ErrorCode.NONE
    assert h.core.groups[G].state is GroupState.STABLE


def test_a_deleted_group_stays_deleted_once_the_log_is_compacted() -> None:
    # A commit appended just before the deletion must get its own tombstone: the group's
    # tombstone alone hides it from a load only until the cleaner drops that tombstone.
    h = Harness()
    h.commit("idle", "", -1, {TP1: 3})
    h.auto_write = False
    commit, delete = h.token(), h.token()
    h.run(h.core.commit_offsets(commit, "idle", "", -1, None, [OffsetToCommit(TP0, 5)], h.now))
    h.run(h.core.delete_groups(delete, ["idle"], h.now))
    h.complete_writes()
    deleted = h.replies.pop(delete)
    assert isinstance(deleted, DeleteResult) and deleted.errors["idle"].error == ErrorCode.NONE
    partition = partition_for("idle")
    latest = dict(h.log[partition])  # the cleaner keeps each key's last value...
    compacted = [(k, v) for k, v in latest.items() if v is not None]  # ...and drops tombstones
    for log in (h.log[partition], compacted):
        successor = GroupCoordinatorCore(GroupCoordinatorSettings(), partition_for)
        successor.load(partition, 1, [decode_record(k, v) for k, v in log], h.now)
        assert "idle" not in successor.groups


def test_listing_groups_while_a_partition_loads_says_so() -> None:
    # As Kafka's handleListGroups: the groups known, and COORDINATOR_LOAD_IN_PROGRESS while a
    # partition loads (its groups are missing yet), which the admin client retries.
    h = Harness()
    h.commit("standalone", "", -1, {TP0: 1})
    outcome, listing = h.core.list_groups()
    assert outcome.error == ErrorCode.NONE and [g.group_id for g in listing] == ["standalone"]
    h.core.begin_loading((partition_for("standalone") + 1) % PARTITIONS)
    outcome, listing = h.core.list_groups()
    assert outcome.error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert [g.group_id for g in listing] == ["standalone"]


def test_a_member_may_commit_what_it_gives_up_after_a_generation_that_never_came_into_force() -> (
    None
):
    h = Harness()
    first = h.join_result(h.join_new(G))
    h.sync(G, first.member_id, first.generation_id, {first.member_id: assignment(0, 1)})
    a = first.member_id
    second = h.join_new(G)
    h.join_result(h.join(G, a))
    b = h.join_result(second).member_id
    # The next generation's assignment is never stored: that generation never comes into force.
    h.auto_write = False
    h.sync(G, a, first.generation_id + 1, {a: assignment(0), b: assignment()})
    h.complete_writes(ErrorCode.NOT_ENOUGH_REPLICAS)
    h.auto_write = True
    b_join = h.join(G, b)
    leader = h.join_result(h.join(G, a))
    h.join_result(b_join)
    h.sync(G, b, leader.generation_id)
    h.sync(G, a, leader.generation_id, {a: assignment(0), b: assignment(1)})
    assert h.core.groups[G].state is GroupState.STABLE
    # Partition 1 moves from a, which owned it in the last generation in force: a commits it
    # as it gives it up (KIP-429).
    result = h.commit(G, a, leader.generation_id, {TP0: 1, TP1: 2})
    assert {o.error for o in result.errors.values()} == {ErrorCode.NONE}


def test_a_stable_groups_offsets_of_topics_no_member_subscribes_to_expire() -> None:
    # KIP-496 (Kafka's removeExpiredOffsets): in a Stable consumer group, an offset of a topic
    # no member subscribes to expires the retention after its commit; subscribed topics keep
    # theirs however old, and the group stays.
    h = Harness(settings=RETENTION_OF_A_MINUTE)
    audit = TopicPartition("audit", 0)
    h.commit(G, "", -1, {audit: 7})  # before the group had members (assign())
    subscription = ConsumerProtocolSubscription(topics=["orders"]).SerializeToString()
    joined = h.join_result(h.join_new(G, protocols=(("range", subscription),)))
    owned = ConsumerProtocolAssignment(
        assigned_partitions=[ConsumerProtocolTopicPartitions(topic="orders", partitions=[0])]
    ).SerializeToString()
    h.sync(G, joined.member_id, joined.generation_id, {joined.member_id: owned})
    h.commit(G, joined.member_id, joined.generation_id, {TP0: 5})
    for _ in range(14):
        h.advance(5_000)
        assert h.heartbeat(G, joined.member_id, joined.generation_id) == ErrorCode.NONE
    _, offsets = h.core.fetch_offsets(G, None)
    assert {tp: o.offset for tp, o in offsets.items()} == {TP0: 5}
    assert h.core.groups[G].state is GroupState.STABLE
    tombstones = [
        r.topic_partition
        for r in h.records(partition_for(G))
        if isinstance(r, OffsetCommitRecord) and r.offset is None
    ]
    assert tombstones == [audit]


def test_a_member_id_handed_out_and_never_used_lapses_after_the_session() -> None:
    # KIP-394: the join phase waits for a member given MEMBER_ID_REQUIRED, but only for its
    # session, not for the whole rebalance timeout; then its id is unknown.
    h = Harness()
    leader, follower, generation = stable_pair(h)
    ghost = h.join_result(h.join(G))
    assert ghost.error == ErrorCode.MEMBER_ID_REQUIRED
    assert h.leave(G, follower) == ErrorCode.NONE
    rejoin = h.join(G, leader)
    h.advance(SESSION_MS - 1)
    assert not h.answered(rejoin)
    h.advance(1)
    result = h.join_result(rejoin)
    assert result.generation_id == generation + 1
    assert [m.member_id for m in result.members] == [leader]
    assert h.join_result(h.join(G, ghost.member_id)).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_the_leader_leaving_mid_rebalance_hands_the_lead_to_a_member_that_rejoined() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    newcomer = h.join_new(G)
    leader_join, follower_join = h.join(G, leader), h.join(G, follower)
    h.join_result(leader_join)
    third = h.join_result(newcomer).member_id
    follower_sync = h.sync(G, follower, h.join_result(follower_join).generation_id)
    assert h.leave(G, leader) == ErrorCode.NONE  # in CompletingRebalance, before assigning
    assert h.sync_result(follower_sync).error == ErrorCode.REBALANCE_IN_PROGRESS
    follower_again, third_again = h.join(G, follower), h.join(G, third)
    results = [h.join_result(follower_again), h.join_result(third_again)]
    assert {r.generation_id for r in results} == {generation + 2}
    [new_leader] = {r.leader for r in results}
    assert new_leader in (follower, third)
    [chosen] = [r for r in results if r.members]
    assert {m.member_id for m in chosen.members} == {follower, third}


def test_a_member_joining_during_completing_rebalance_starts_another_rebalance() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    h.leave(G, follower)
    alone = h.join_result(h.join(G, leader))  # CompletingRebalance in generation + 1
    late = h.join_new(G)
    group = h.core.groups[G]
    assert group.state is GroupState.PREPARING_REBALANCE
    # The leader's assignment for the generation it was given no longer counts.
    stale = h.sync(G, leader, alone.generation_id, {leader: b"L"})
    assert h.sync_result(stale).error == ErrorCode.REBALANCE_IN_PROGRESS
    assert h.heartbeat(G, leader, alone.generation_id) == ErrorCode.REBALANCE_IN_PROGRESS
    again = h.join_result(h.join(G, leader))
    newcomer = h.join_result(late)
    assert again.generation_id == newcomer.generation_id == generation + 2
    assert {m.member_id for m in again.members} == {leader, newcomer.member_id}


def test_a_failed_expiry_is_tried_again_at_the_next_check() -> None:
    # A failed append of the expiry's tombstones must not restart the group's retention.
    h = Harness(settings=RETENTION_OF_A_MINUTE)
    joined = h.join_result(h.join_new(G))
    h.sync(G, joined.member_id, joined.generation_id, {joined.member_id: b"a"})
    h.commit(G, joined.member_id, joined.generation_id, {TP0: 1})
    h.leave(G, joined.member_id)
    assert h.core.groups[G].state is GroupState.EMPTY
    h.auto_write = False
    h.advance(65_000)  # the check that expires the group's offsets
    assert h.pending_writes
    h.complete_writes(ErrorCode.NOT_ENOUGH_REPLICAS)
    assert h.core.fetch_offsets(G, [TP0])[1][TP0].offset == 1
    h.auto_write = True
    h.advance(10_000)  # the next check
    assert G not in h.core.groups


def test_a_compacted_log_loads_the_groups_the_whole_log_does() -> None:
    # Offsets before and after a group's metadata, a deleted offset, a group deleted and
    # used again by assign() commits, a group whose members left: the cleaner keeps each
    # key's last record and in the end drops tombstones; a load must not tell the difference.
    h = Harness()
    leader, follower, generation = stable_pair(h)  # G's metadata after...
    h.commit(G, leader, generation, {TP0: 1, TP1: 2})
    h.commit(G, follower, generation, {TP0: 3})  # ...and before its last offsets
    reused = "orders-app-2"  # deleted, then used by assign() commits
    h.commit(reused, "", -1, {TP0: 7})
    token = h.token()
    h.run(h.core.delete_groups(token, [reused], h.now))
    h.replies.pop(token)
    h.commit(reused, "", -1, {TP1: 9})
    left = "orders-app-3"  # its only member left: Empty, with its offsets but one deleted
    first = h.join_result(h.join_new(left))
    h.sync(left, first.member_id, first.generation_id, {first.member_id: b"a"})
    h.commit(left, first.member_id, first.generation_id, {TP0: 11, TP1: 12})
    h.leave(left, first.member_id)
    token = h.token()
    h.run(h.core.delete_offsets(token, left, [TP1], h.now))
    assert isinstance(h.replies.pop(token), OffsetDeleteResult)

    def loaded(log: list[tuple[bytes, bytes | None]], partition: int) -> dict[str, object]:
        core = GroupCoordinatorCore(GroupCoordinatorSettings(), partition_for)
        core.load(partition, 1, [decode_record(k, v) for k, v in log], h.now)
        return {
            g.group_id: (
                g.state,
                g.generation_id,
                g.protocol_type,
                sorted(g.members),
                {tp: o.offset for tp, o in g.offsets.items()},
            )
            for g in core.groups.values()
        }

    for partition, log in h.log.items():
        latest = dict(log)
        compacted = [(k, v) for k, v in latest.items() if v is not None]
        assert loaded(compacted, partition) == loaded(log, partition)
    everything: dict[str, object] = {}
    for partition, log in h.log.items():
        everything.update(loaded(log, partition))
    assert everything == {
        G: (
            GroupState.STABLE,
            generation,
            "consumer",
            sorted([leader, follower]),
            {TP0: 3, TP1: 2},
        ),
        reused: (GroupState.EMPTY, 0, None, [], {TP1: 9}),
        left: (GroupState.EMPTY, 2, "consumer", [], {TP0: 11}),
    }


def stable_static_pair(h: Harness) -> tuple[str, str, int]:
    """Static members pod-a (the leader) and pod-b in a Stable generation: their member ids
    and the generation."""
    a = h.join_result(h.join(G, instance_id="pod-a", client_id="a"))
    h.sync(G, a.member_id, a.generation_id, {a.member_id: b"A"}, instance_id="pod-a")
    b_token = h.join(G, instance_id="pod-b", client_id="b")
    leader = h.join_result(h.join(G, a.member_id, instance_id="pod-a"))
    b = h.join_result(b_token)
    h.sync(G, b.member_id, b.generation_id, instance_id="pod-b")
    assignments = {a.member_id: b"A", b.member_id: b"B"}
    h.sync(G, a.member_id, leader.generation_id, assignments, instance_id="pod-a")
    assert h.core.groups[G].state is GroupState.STABLE
    return a.member_id, b.member_id, leader.generation_id


def test_a_static_member_that_does_not_rejoin_in_time_keeps_its_place_until_its_session_ends() -> (
    None
):
    h = Harness()
    a, b, generation = stable_static_pair(h)
    newcomer = h.join_new(G)
    a_join = h.join(G, a, instance_id="pod-a")
    # pod-b is slow to rejoin but alive: it heartbeats through the whole rebalance timeout.
    for _ in range(REBALANCE_MS // 5_000 - 1):
        h.advance(5_000)
        assert h.heartbeat(G, b, generation, "pod-b") == ErrorCode.REBALANCE_IN_PROGRESS
    h.advance(5_000)
    joined = h.join_result(a_join)
    assert joined.generation_id == generation + 1 and joined.leader == a
    # The leader assigns to every member, the static one that has not rejoined too.
    assert {m.member_id for m in joined.members} == {a, b, h.join_result(newcomer).member_id}
    group = h.core.groups[G]
    assert b in group.members and group.static_members["pod-b"] == b
    # pod-b learns of the new generation and joins it without another rebalance.
    assert h.heartbeat(G, b, generation, "pod-b") == ErrorCode.ILLEGAL_GENERATION
    again = h.join_result(h.join(G, b, instance_id="pod-b"))
    assert (again.error, again.generation_id) == (ErrorCode.NONE, generation + 1)


def test_a_silent_static_member_kept_by_a_join_goes_when_its_own_session_ends() -> None:
    """A static member that did not rejoin keeps its place in the next generation, but
    the join's end does not start its session again: it goes when the session counted from
    its last heartbeat ends, though the rebalance timeout (the pending sync) is longer."""
    h = Harness()
    timing = {"session_ms": 10_000, "rebalance_ms": 6_000}
    a = h.join_result(h.join(G, instance_id="pod-a", **timing))
    h.sync(G, a.member_id, a.generation_id, {a.member_id: b"A"}, instance_id="pod-a")
    b_token = h.join(G, instance_id="pod-b", **timing)
    leader = h.join_result(h.join(G, a.member_id, instance_id="pod-a", **timing))
    b = h.join_result(b_token)
    generation = leader.generation_id
    h.sync(G, b.member_id, generation, instance_id="pod-b")
    h.sync(G, a.member_id, generation, {a.member_id: b"A", b.member_id: b"B"}, instance_id="pod-a")
    # pod-b is heard for the last time now; a newcomer starts a rebalance a second later.
    assert h.heartbeat(G, b.member_id, generation, "pod-b") == ErrorCode.NONE
    h.advance(1_000)
    newcomer = h.join_new(G, **timing)
    assert h.heartbeat(G, a.member_id, generation, "pod-a") == ErrorCode.REBALANCE_IN_PROGRESS
    a_join = h.join(G, a.member_id, instance_id="pod-a", **timing)
    h.advance(6_000)  # the join phase ends without pod-b, which stays
    joined = h.join_result(a_join)
    c = h.join_result(newcomer).member_id
    group = h.core.groups[G]
    assert b.member_id in group.members
    h.sync(G, c, joined.generation_id)
    h.sync(G, a.member_id, joined.generation_id, {a.member_id: b"A", c: b"C"}, instance_id="pod-a")
    h.advance(2_900)  # 9.9 s after pod-b's last heartbeat
    assert b.member_id in group.members
    h.advance(200)  # 10.1 s: its session is over, 3 s before its sync would be due
    assert b.member_id not in group.members and "pod-b" not in group.static_members


def test_a_join_waits_while_only_static_members_that_have_not_rejoined_remain() -> None:
    h = Harness()
    a, _, generation = stable_static_pair(h)
    assert h.leave(G, "", "pod-b") == ErrorCode.NONE  # a rebalance without pod-b
    # pod-a keeps heartbeating but does not rejoin within the rebalance timeout: no member
    # joined, so no generation can form; the join phase is extended.
    for _ in range(REBALANCE_MS // 5_000 + 1):
        h.advance(5_000)
        assert h.heartbeat(G, a, generation, "pod-a") == ErrorCode.REBALANCE_IN_PROGRESS
    group = h.core.groups[G]
    assert group.state is GroupState.PREPARING_REBALANCE
    assert group.generation_id == generation and group.members.keys() == {a}
    rejoined = h.join_result(h.join(G, a, instance_id="pod-a"))
    assert (rejoined.generation_id, rejoined.leader) == (generation + 1, a)
    # A static member whose session ends is removed, as any member.
    h.sync(G, a, rejoined.generation_id, {a: b"A"}, instance_id="pod-a")
    h.advance(SESSION_MS)
    assert group.state is GroupState.EMPTY and not group.members


def test_an_empty_group_takes_the_protocol_type_of_its_next_first_member() -> None:
    h = Harness()
    first = h.join_result(h.join_new(G))
    h.sync(G, first.member_id, first.generation_id, {first.member_id: b"a"})
    h.commit(G, first.member_id, first.generation_id, {TP0: 5})
    assert h.leave(G, first.member_id) == ErrorCode.NONE
    group = h.core.groups[G]
    assert group.state is GroupState.EMPTY and group.protocol_type == "consumer"
    # Empty: a member of another protocol type may form the group (Kafka's supportsProtocols).
    joined = h.join_result(h.join_new(G, protocol_type="connect", protocols=[("v1", b"w")]))
    assert (joined.error, joined.protocol_type, joined.protocol_name) == (
        ErrorCode.NONE,
        "connect",
        "v1",
    )
    assert group.protocol_type == "connect"
    assert h.core.fetch_offsets(G, [TP0])[1][TP0].offset == 5
    # Not empty any more: a consumer is refused.
    refused = h.join_result(h.join(G))
    assert refused.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_a_member_that_never_syncs_is_removed_even_once_the_group_is_stable() -> None:
    h = Harness()
    first = h.join_result(h.join_new(G))
    h.sync(G, first.member_id, first.generation_id, {first.member_id: b"a"})
    second = h.join_new(G)
    leader = h.join_result(h.join(G, first.member_id))
    follower = h.join_result(second)
    generation = leader.generation_id
    # The leader's assignment makes the group Stable; the follower heartbeats but never
    # sends SyncGroup, so it never learns the share the others think it consumes.
    h.sync(G, leader.member_id, generation, {leader.member_id: b"L", follower.member_id: b"F"})
    group = h.core.groups[G]
    assert group.state is GroupState.STABLE
    for _ in range(REBALANCE_MS // 5_000 - 1):
        h.advance(5_000)
        assert h.heartbeat(G, follower.member_id, generation) == ErrorCode.NONE
        assert h.heartbeat(G, leader.member_id, generation) == ErrorCode.NONE
    h.advance(5_000)
    # As Kafka's pending-sync expiry: removed after the rebalance timeout, and a rebalance.
    assert follower.member_id not in group.members
    assert group.state is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(G, leader.member_id, generation) == ErrorCode.REBALANCE_IN_PROGRESS


def test_members_that_all_synced_in_a_stable_group_stay() -> None:
    h = Harness()
    leader, follower, generation = stable_pair(h)
    third = h.join_new(G)  # a third member: generation + 1
    leader_join, follower_join = h.join(G, leader), h.join(G, follower)
    h.join_result(leader_join)
    h.join_result(follower_join)
    first = h.join_result(third)
    new_generation = generation + 1
    h.sync(G, leader, new_generation, {leader: b"L", follower: b"F", first.member_id: b"T"})
    # The others sync after the group became Stable: no one is removed.
    h.sync(G, follower, new_generation)
    h.sync(G, first.member_id, new_generation)
    for _ in range(REBALANCE_MS // 5_000 + 1):
        h.advance(5_000)
        for member in (leader, follower, first.member_id):
            assert h.heartbeat(G, member, new_generation) == ErrorCode.NONE
    assert h.core.groups[G].state is GroupState.STABLE


# --- Kafka's rules, case by case ------------------------------------------------------------


def test_a_heartbeat_while_the_groups_partition_loads_is_answered_none() -> None:
    # Kafka's GroupCoordinatorService.heartbeat: "the group is still loading, so blindly
    # respond"; its consumer has no case for COORDINATOR_LOAD_IN_PROGRESS in a heartbeat.
    h = Harness()
    joined = h.join_result(h.join_new(G))
    h.sync_result(h.sync(G, joined.member_id, joined.generation_id, {joined.member_id: b""}))
    h.core.unload(partition_for(G))
    h.core.begin_loading(partition_for(G))
    assert h.heartbeat(G, joined.member_id, joined.generation_id) == ErrorCode.NONE
    assert h.heartbeat("", joined.member_id, joined.generation_id) == ErrorCode.INVALID_GROUP_ID
    assert h.core.describe_group(G).error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


def kafka_subscription(*topics: str, version: int = 0) -> bytes:
    """A Kafka client's JoinGroup metadata: Kafka's ConsumerProtocol subscription."""
    owned = [KafkaConsumerProtocolSubscription.TopicPartition(topic=topics[0], partitions=[0])]
    subscription = KafkaConsumerProtocolSubscription(
        topics=list(topics),
        user_data=None,
        owned_partitions=owned if version >= 1 else [],
        generation_id=3,
        rack_id="r1",
        version=version,
    )
    return bytes(subscription.encode())


def test_kafka_clients_subscriptions_decide_offset_delete_and_expiry() -> None:
    # Kafka's ClassicGroup.computeSubscribedTopics reads its ConsumerProtocol subscription
    # (version 0's prefix, whatever the version): a topic no member subscribes to is neither
    # kept by OffsetDelete nor by the KIP-496 expiry of a Stable group.
    h = Harness(settings=RETENTION_OF_A_MINUTE)
    audit = TopicPartition("audit", 0)
    h.commit(G, "", -1, {audit: 7})
    first = h.join_result(h.join(G, protocols=(("range", kafka_subscription("orders")),)))
    a = h.join_result(
        h.join(G, first.member_id, protocols=(("range", kafka_subscription("orders")),))
    )
    h.sync_result(h.sync(G, a.member_id, a.generation_id, {a.member_id: b"\x00\x00"}))
    second = kafka_subscription("orders", "billing", version=3)
    b_id = h.join_result(h.join(G, protocols=(("range", second),))).member_id
    b_join = h.join(G, b_id, protocols=(("range", second),))
    a_join = h.join(G, a.member_id, protocols=(("range", kafka_subscription("orders")),))
    generation = h.join_result(a_join).generation_id
    h.join_result(b_join)
    b_sync = h.sync(G, b_id, generation)
    h.sync_result(h.sync(G, a.member_id, generation, {a.member_id: b"", b_id: b""}))
    h.sync_result(b_sync)
    assert h.core.groups[G].state is GroupState.STABLE
    h.commit(G, a.member_id, generation, {TP0: 5, TopicPartition("billing", 0): 6})

    token = h.token()
    billing, stale = TopicPartition("billing", 0), TopicPartition("stale", 0)
    h.run(h.core.delete_offsets(token, G, [TP0, billing, stale], h.now))
    result = h.replies.pop(token)
    assert isinstance(result, OffsetDeleteResult)
    assert {tp: o.error for tp, o in result.partitions.items()} == {
        TP0: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
        billing: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
        stale: ErrorCode.NONE,
    }
    for _ in range(14):
        h.advance(5_000)
        assert h.heartbeat(G, a.member_id, generation) == ErrorCode.NONE
        assert h.heartbeat(G, b_id, generation) == ErrorCode.NONE
    _, offsets = h.core.fetch_offsets(G, None)
    assert {tp: o.offset for tp, o in offsets.items()} == {TP0: 5, billing: 6}


def test_commits_of_partitions_the_metadata_does_not_have_get_unknown_topic_or_partition() -> None:
    # Kafka's handleOffsetCommitRequest answers UNKNOWN_TOPIC_OR_PARTITION for a partition not
    # in its metadata, before and whatever the group says; any offset is stored, -1 included.
    topics = {"orders": 2}
    h = Harness()
    h.core = GroupCoordinatorCore(
        h.settings,
        partition_for,
        partition_exists=lambda tp: 0 <= tp.partition < topics.get(tp.topic, 0),
    )
    for partition in range(PARTITIONS):
        h.core.load(partition, 0, [], h.now)
    missing, beyond = TopicPartition("missing", 0), TopicPartition("orders", 2)
    result = h.commit("simple", "", -1, {TP0: -1, missing: 5, beyond: 5})
    assert {tp: o.error for tp, o in result.errors.items()} == {
        missing: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        beyond: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        TP0: ErrorCode.NONE,
    }
    assert h.core.fetch_offsets("simple", None)[1] == {TP0: FetchedOffset(-1, 3, "")}
    # Refused by the group, the partitions that exist get the group's error, the others not.
    leader, _, generation = stable_pair(h)
    stale = h.commit(G, leader, generation - 1, {TP1: 5, missing: 5})
    assert {tp: o.error for tp, o in stale.errors.items()} == {
        missing: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        TP1: ErrorCode.ILLEGAL_GENERATION,
    }
    # None exists: nothing else is looked at (no group is created).
    assert h.commit("nobody", "", -1, {missing: 1}).errors[missing].error == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert "nobody" not in h.core.groups


def test_without_metadata_a_negative_partition_does_not_exist_and_a_negative_offset_is_stored() -> (
    None
):
    h = Harness()
    negative = TopicPartition("orders", -1)
    result = h.commit("simple", "", -1, {negative: 5, TP0: -1})
    assert {tp: o.error for tp, o in result.errors.items()} == {
        negative: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        TP0: ErrorCode.NONE,
    }
    assert h.core.fetch_offsets("simple", [TP0])[1][TP0].offset == -1


def test_a_commit_with_generation_minus_one_goes_to_an_empty_group_whatever_its_member_id() -> None:
    # Kafka's ClassicGroup.validateOffsetCommit: generation < 0 and Empty → accepted; a group
    # that does not exist is created for it (OffsetMetadataManager.validateOffsetCommit).
    h = Harness()
    assert h.commit("absent", "m-old", -1, {TP0: 5}).errors[TP0].error == ErrorCode.NONE
    assert h.core.fetch_offsets("absent", [TP0])[1][TP0].offset == 5
    assert h.commit("absent2", "m", 1, {TP0: 5}).errors[TP0].error == ErrorCode.ILLEGAL_GENERATION
    joined = h.join_result(h.join_new(G))
    h.sync_result(h.sync(G, joined.member_id, joined.generation_id, {joined.member_id: b""}))
    h.leave(G, joined.member_id)
    assert h.core.groups[G].state is GroupState.EMPTY
    assert h.commit(G, joined.member_id, -1, {TP0: 6}).errors[TP0].error == ErrorCode.NONE
    stale = h.commit(G, joined.member_id, joined.generation_id, {TP0: 7})
    assert stale.errors[TP0].error == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_commit_without_member_or_generation_needs_the_group_empty_not_memberless() -> None:
    # A group rebalancing with no member (only an id handed out with MEMBER_ID_REQUIRED) is
    # not Empty: Kafka refuses the commit UNKNOWN_MEMBER_ID.
    h = Harness()
    joined = h.join_result(h.join_new(G))
    h.sync_result(h.sync(G, joined.member_id, joined.generation_id, {joined.member_id: b""}))
    assert h.join_result(h.join(G)).error == ErrorCode.MEMBER_ID_REQUIRED
    h.leave(G, joined.member_id)
    group = h.core.groups[G]
    assert group.state is GroupState.PREPARING_REBALANCE and not group.members
    assert h.commit(G, "", -1, {TP0: 5}).errors[TP0].error == ErrorCode.UNKNOWN_MEMBER_ID


def test_member_ids_handed_out_do_not_count_against_the_group_max_size() -> None:
    # Kafka's acceptJoiningMember: Stable and CompletingRebalance count members (not pending
    # ids); an Empty group takes every join.
    h = Harness(
        settings=GroupCoordinatorSettings(group_initial_rebalance_delay_ms=0, group_max_size=2)
    )
    a = h.join_result(h.join_new(G, client_id="a"))
    h.sync_result(h.sync(G, a.member_id, a.generation_id, {a.member_id: b""}))
    assert h.join_result(h.join(G, client_id="b")).error == ErrorCode.MEMBER_ID_REQUIRED
    again = h.join_result(h.join(G, client_id="b"))  # the first answer was lost
    assert again.error == ErrorCode.MEMBER_ID_REQUIRED
    b_join = h.join(G, again.member_id, client_id="b")
    a_join = h.join(G, a.member_id)
    h.advance(SESSION_MS)  # the lost id lapses: the join phase waited for it
    generation = h.join_result(a_join).generation_id
    assert h.join_result(b_join).generation_id == generation
    full = h.join_result(h.join(G, client_id="c"))
    assert full.error == ErrorCode.GROUP_MAX_SIZE_REACHED

    one = Harness(
        settings=GroupCoordinatorSettings(group_initial_rebalance_delay_ms=0, group_max_size=1)
    )
    assert one.join_result(one.join(G)).error == ErrorCode.MEMBER_ID_REQUIRED
    assert one.join_result(one.join(G)).error == ErrorCode.MEMBER_ID_REQUIRED


def test_a_rebalancing_group_takes_joins_while_fewer_than_the_max_are_waiting() -> None:
    # PreparingRebalance: new members only while fewer than group.max.size wait to rejoin; a
    # member that has not rejoined yet is refused then, and dropped from the rebalance.
    h = Harness(
        settings=GroupCoordinatorSettings(group_initial_rebalance_delay_ms=0, group_max_size=2)
    )
    leader, follower, generation = stable_pair(h)
    leader_join = h.join(G, leader)  # the leader asks for a new assignment: a rebalance
    newcomer = h.join_result(h.join(G)).member_id
    newcomer_join = h.join(G, newcomer)  # two members wait now
    assert h.join_result(h.join(G)).error == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert h.join_result(h.join(G, follower)).error == ErrorCode.GROUP_MAX_SIZE_REACHED
    led = h.join_result(leader_join)
    assert led.generation_id == generation + 1
    assert {m.member_id for m in led.members} == {leader, newcomer}
    assert h.join_result(newcomer_join).error == ErrorCode.NONE


def test_the_empty_group_id_is_served_where_kafka_serves_it() -> None:
    # Kafka refuses the empty group id only in JoinGroup, SyncGroup, Heartbeat, LeaveGroup and
    # OffsetDelete; OffsetCommit, OffsetFetch, DescribeGroups and DeleteGroups serve it.
    h = Harness()
    assert h.commit("", "", -1, {TP0: 5}).errors[TP0].error == ErrorCode.NONE
    outcome, offsets = h.core.fetch_offsets("", None)
    assert outcome.error == ErrorCode.NONE and offsets[TP0].offset == 5
    described = h.core.describe_group("")
    assert (described.error, described.state) == (ErrorCode.NONE, GroupState.EMPTY)
    token = h.token()
    h.run(h.core.delete_groups(token, ["", "never"], h.now))
    deleted = h.replies.pop(token)
    assert isinstance(deleted, DeleteResult)
    assert {g: o.error for g, o in deleted.errors.items()} == {
        "": ErrorCode.NONE,
        "never": ErrorCode.GROUP_ID_NOT_FOUND,
    }
    assert h.join_result(h.join("")).error == ErrorCode.INVALID_GROUP_ID
    assert h.sync_result(h.sync("", "m", 1)).error == ErrorCode.INVALID_GROUP_ID
    assert h.heartbeat("", "m", 1) == ErrorCode.INVALID_GROUP_ID
    assert h.leave("", "m") == ErrorCode.INVALID_GROUP_ID
    token = h.token()
    h.run(h.core.delete_offsets(token, "", [TP0], h.now))
    refused = h.replies.pop(token)
    assert isinstance(refused, OffsetDeleteResult)
    assert refused.error.error == ErrorCode.INVALID_GROUP_ID


def test_a_member_id_handed_out_outlives_the_join_phase_until_its_session_ends() -> None:
    # Kafka keeps pendingJoinMembers across generations: only the id's own session timeout
    # ends it. Joining with it later is a new member, and starts a rebalance.
    h = Harness()
    a = h.join_result(h.join_new(G))
    h.sync_result(h.sync(G, a.member_id, a.generation_id, {a.member_id: b""}))
    b = h.join_result(h.join(G, session_ms=60_000))
    assert b.error == ErrorCode.MEMBER_ID_REQUIRED
    a_join = h.join(G, a.member_id)
    h.advance(REBALANCE_MS)  # the join phase ends without b
    assert h.join_result(a_join).generation_id == a.generation_id + 1
    h.advance(5_000)
    b_join = h.join(G, b.member_id, session_ms=60_000)
    assert not h.answered(b_join)
    assert h.core.groups[G].state is GroupState.PREPARING_REBALANCE
    a_rejoin = h.join(G, a.member_id)
    assert h.join_result(b_join).generation_id == a.generation_id + 2
    assert h.join_result(a_rejoin).error == ErrorCode.NONE
    # Unused, an id lapses after its own session, whatever joins happened meanwhile.
    c = h.join_result(h.join(G, session_ms=60_000))
    h.advance(60_000)
    assert c.member_id not in h.core.groups[G].pending_members


def test_only_a_stable_group_is_described_with_its_protocol() -> None:
    # Kafka's describeGroups sets the protocol (ProtocolData) only when the group is Stable.
    h = Harness()
    joined = h.join_result(h.join_new(G))
    completing = h.core.describe_group(G)
    assert completing.state is GroupState.COMPLETING_REBALANCE
    assert (completing.protocol_type, completing.protocol_name) == ("consumer", "")
    h.sync_result(h.sync(G, joined.member_id, joined.generation_id, {joined.member_id: b""}))
    assert h.core.describe_group(G).protocol_name == "range"
    h.join_new(G)
    preparing = h.core.describe_group(G)
    assert preparing.state is GroupState.PREPARING_REBALANCE and preparing.protocol_name == ""


def test_offset_metadata_is_measured_in_characters_as_java_counts_them() -> None:
    # Kafka compares String.length() (UTF-16 code units) with offset.metadata.max.bytes.
    h = Harness()
    accented = "\u00e9" * 4096  # 4096 characters, 8192 UTF-8 bytes
    assert h.commit("s", "", -1, {TP0: 1}, metadata=accented).errors[TP0].error == ErrorCode.NONE
    emoji = "\U0001f600" * 2049  # 4098 UTF-16 code units
    too_long = h.commit("s", "", -1, {TP0: 1}, metadata=emoji).errors[TP0].error
    assert too_long == ErrorCode.OFFSET_METADATA_TOO_LARGE
    over = h.commit("s", "", -1, {TP0: 1}, metadata="a" * 4097).errors[TP0].error
    assert over == ErrorCode.OFFSET_METADATA_TOO_LARGE


def test_an_instance_id_no_member_holds_is_unknown() -> None:
    # Kafka's ClassicGroup.validateMember: a request naming a group.instance.id nobody holds
    # gets UNKNOWN_MEMBER_ID, even from a member.
    h = Harness()
    joined = h.join_result(h.join_new(G))
    member, generation = joined.member_id, joined.generation_id
    h.sync_result(h.sync(G, member, generation, {member: b""}))
    assert h.heartbeat(G, member, generation, "ghost") == ErrorCode.UNKNOWN_MEMBER_ID
    sync = h.sync_result(h.sync(G, member, generation, instance_id="ghost"))
    assert sync.error == ErrorCode.UNKNOWN_MEMBER_ID
    token = h.token()
    h.run(
        h.core.commit_offsets(
            token, G, member, generation, "ghost", [OffsetToCommit(TP0, 1)], h.now
        )
    )
    committed = h.replies.pop(token)
    assert isinstance(committed, CommitResult)
    assert committed.errors[TP0].error == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.leave(G, member, "ghost") == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.heartbeat(G, member, generation) == ErrorCode.NONE


def test_a_member_id_handed_out_cannot_take_a_static_members_place() -> None:
    # Ids are handed out pending to dynamic members only: Kafka refuses (an illegal state,
    # UNKNOWN_SERVER_ERROR) a pending id that joins with a group.instance.id.
    h = Harness()
    static = h.join_result(h.join(G, instance_id="i1"))
    h.sync_result(
        h.sync(G, static.member_id, static.generation_id, {static.member_id: b""}, instance_id="i1")
    )
    pending = h.join_result(h.join(G, client_id="x"))
    refused = h.join_result(h.join(G, pending.member_id, instance_id="i1", client_id="x"))
    assert refused.error == ErrorCode.UNKNOWN_SERVER_ERROR
    group = h.core.groups[G]
    assert group.static_members == {"i1": static.member_id}
    assert [m.group_instance_id for m in group.members.values()] == ["i1"]
