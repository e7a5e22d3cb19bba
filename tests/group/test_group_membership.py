"""A consumer's group membership against a coordinator that answers from a script: what it
keeps and what it gives up when the coordinator says the membership is gone
(ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID), as Kafka's
``AbstractCoordinator`` does, and when it joins again of its own accord (an assignment that
does not match its subscription, a leader that assigned without the partition counts, a
leader whose group's topics changed since it assigned).

The coordinator is a gRPC server on loopback whose answers each test lists in advance, so
that an answer the real coordinator gives only in a race (a SyncGroup of a generation that
moved on) comes exactly when the test wants it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc.aio
import pytest
from highwater.errors import HighwaterError
from highwater.group.assignors import assignor_for
from highwater.group.membership import (
    GroupError,
    GroupMembership,
    GroupSettings,
    changed_topics,
)
from highwater.group.protocol import (
    Assignment,
    Subscription,
    TopicPartitionKey,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from highwater.v1 import coordinator_pb2 as pb
from highwater.v1 import coordinator_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(30)

GROUP = "orders-app"
TP0, TP1 = ("orders", 0), ("orders", 1)


@dataclass
class ScriptedCoordinator(coordinator_pb2_grpc.GroupCoordinatorServicer):
    """Answers JoinGroup and SyncGroup from lists (in order), heartbeats with one error;
    keeps the JoinGroup requests."""

    joins: list[pb.JoinGroupResponse] = field(default_factory=list)
    syncs: list[pb.SyncGroupResponse] = field(default_factory=list)
    heartbeat_error: int = ErrorCode.NONE
    join_requests: list[pb.JoinGroupRequest] = field(default_factory=list)
    sync_requests: list[pb.SyncGroupRequest] = field(default_factory=list)
    heartbeats: int = 0
    heartbeat_answer_held: asyncio.Event | None = None
    commit_error: int = ErrorCode.NONE
    commit_answer_held: asyncio.Event | None = None
    """While set and not yet fired, heartbeats are answered only when it fires."""
    leaving: list[str] = field(default_factory=list)

    async def JoinGroup(self, request: pb.JoinGroupRequest, context: Any) -> pb.JoinGroupResponse:
        self.join_requests.append(request)
        if not self.joins:  # a join the test did not expect fails the member at once
            return pb.JoinGroupResponse(
                error=ErrorCode.INVALID_REQUEST,  # type: ignore[arg-type]
                error_message="no JoinGroup expected",
            )
        return self.joins.pop(0)

    async def SyncGroup(self, request: pb.SyncGroupRequest, context: Any) -> pb.SyncGroupResponse:
        self.sync_requests.append(request)
        return self.syncs.pop(0)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        self.heartbeats += 1
        error = self.heartbeat_error
        if self.heartbeat_answer_held is not None:
            await self.heartbeat_answer_held.wait()
        return pb.HeartbeatResponse(error=error)  # type: ignore[arg-type]

    async def OffsetCommit(
        self, request: pb.OffsetCommitRequest, context: Any
    ) -> pb.OffsetCommitResponse:
        error = self.commit_error
        if self.commit_answer_held is not None:
            await self.commit_answer_held.wait()
        answer = pb.OffsetCommitResponse()
        for topic in request.topics:
            entry = answer.topics.add(name=topic.name)
            for p in topic.partitions:
                entry.partitions.add(partition_index=p.partition_index, error=error)  # type: ignore[arg-type]
        return answer

    async def LeaveGroup(
        self, request: pb.LeaveGroupRequest, context: Any
    ) -> pb.LeaveGroupResponse:
        self.leaving.extend(m.member_id for m in request.members)
        return pb.LeaveGroupResponse()


@dataclass
class Cluster:
    """The coordinator's address, and a topic "orders" of two partitions."""

    address: str
    security: None = None

    async def find_coordinator(self, group_id: str) -> str:
        return self.address

    unreadable_counts: int = 0
    """How many reads of the partition counts fail before they succeed."""

    async def partition_counts(self, topics: Sequence[str]) -> Mapping[str, int]:
        if self.unreadable_counts:
            self.unreadable_counts -= 1
            raise HighwaterError("no broker answers Metadata")
        return {"orders": 2}


@pytest.fixture
async def coordinator() -> AsyncIterator[tuple[ScriptedCoordinator, Cluster]]:
    scripted = ScriptedCoordinator()
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_GroupCoordinatorServicer_to_server(scripted, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield scripted, Cluster(f"127.0.0.1:{port}")
    finally:
        await server.stop(None)


def joined(generation: int, member_id: str = "m-1") -> pb.JoinGroupResponse:
    """A follower's JoinGroup answer (another member leads)."""
    return pb.JoinGroupResponse(
        generation_id=generation,
        protocol_type="consumer",
        protocol_name="cooperative-sticky",
        leader="m-0",
        member_id=member_id,
    )


def synced(*partitions: TopicPartitionKey) -> pb.SyncGroupResponse:
    return pb.SyncGroupResponse(assignment=encode_assignment(Assignment(partitions)))


def refused(error: int) -> pb.SyncGroupResponse:
    return pb.SyncGroupResponse(error=error)  # type: ignore[arg-type]


def membership(cluster: Cluster, **settings: Any) -> GroupMembership:
    return GroupMembership(
        cluster,
        GroupSettings(GROUP, retry_backoff_ms=10, **settings),
        [assignor_for("cooperative-sticky")],
    )


async def member_of_generation_one(
    scripted: ScriptedCoordinator, cluster: Cluster, **settings: Any
) -> GroupMembership:
    """A cooperative member that owns orders-0 and orders-1 in generation 1."""
    member = membership(cluster, **settings)
    scripted.joins.append(joined(1))
    scripted.syncs.append(synced(TP0, TP1))
    rebalance = await member.join(["orders"])
    assert rebalance is not None and rebalance.change.added == (TP0, TP1)
    member.assigned(rebalance.change.added)
    return member


@pytest.mark.parametrize(
    ("error", "member_id_kept"),
    [(ErrorCode.ILLEGAL_GENERATION, "m-1"), (ErrorCode.UNKNOWN_MEMBER_ID, "")],
)
async def test_a_sync_refused_mid_rebalance_loses_the_partitions_before_the_next_join(
    coordinator: tuple[ScriptedCoordinator, Cluster], error: int, member_id_kept: str
) -> None:
    scripted, cluster = coordinator
    member = await member_of_generation_one(scripted, cluster)
    try:
        # A rebalance; the coordinator refuses the member's SyncGroup.
        member.rejoin_needed = True
        scripted.joins.append(joined(2))
        scripted.syncs.append(refused(error))
        assert await member.join(["orders"]) is None
        # The partitions may already be another member's: lost, for the consumer to drop
        # (on_lost) before it joins again, not kept into the next generation and revoked.
        assert member.lost and member.owned == (TP0, TP1)
        assert member.rejoin_needed and member.generation_id == -1
        # ILLEGAL_GENERATION keeps the member id (the member may still be known),
        # UNKNOWN_MEMBER_ID does not.
        assert member.member_id == member_id_kept
        member.revoked(member.owned)
        member.lost = False
        scripted.joins.append(joined(3))
        scripted.syncs.append(synced(TP0))
        rebalance = await member.join(["orders"])
        assert rebalance is not None and rebalance.change == type(rebalance.change)(
            (), (TP0,), False
        )
        rejoin = scripted.join_requests[-1]
        assert rejoin.member_id == member_id_kept
        [protocol] = rejoin.protocols
        assert decode_subscription(protocol.metadata).owned_partitions == ()
    finally:
        await member.close()


async def test_a_heartbeat_answered_illegal_generation_keeps_the_member_id(
    coordinator: tuple[ScriptedCoordinator, Cluster],
) -> None:
    scripted, cluster = coordinator
    member = await member_of_generation_one(scripted, cluster, heartbeat_interval_ms=20)
    try:
        scripted.heartbeat_error = ErrorCode.ILLEGAL_GENERATION
        async with asyncio.timeout(5):
            while not member.lost:
                await asyncio.sleep(0.01)
        assert (member.member_id, member.generation_id) == ("m-1", -1)
        assert member.rejoin_needed
    finally:
        await member.close()


async def test_a_fenced_static_member_loses_its_partitions_and_fails_instead_of_rejoining(
    coordinator: tuple[ScriptedCoordinator, Cluster],
) -> None:
    scripted, cluster = coordinator
    member = await member_of_generation_one(
        scripted, cluster, heartbeat_interval_ms=20, group_instance_id="pod-a"
    )
    try:
        # Another consumer took pod-a's place: rejoining would fence it in turn.
        scripted.heartbeat_error = ErrorCode.FENCED_INSTANCE_ID
        async with asyncio.timeout(5):
            while not member.lost:
                await asyncio.sleep(0.01)
        assert member.owned == (TP0, TP1) and member.rejoin_needed
        joins = len(scripted.join_requests)
        with pytest.raises(GroupError) as fenced:
            await member.join(["orders"])
        assert fenced.value.code == ErrorCode.FENCED_INSTANCE_ID
        assert len(scripted.join_requests) == joins
    finally:
        await member.close()


async def test_a_cooperative_member_gives_up_the_topics_it_no_longer_subscribes_to_before_joining(
    coordinator: tuple[ScriptedCoordinator, Cluster],
) -> None:
    scripted, cluster = coordinator
    member = await member_of_generation_one(scripted, cluster)
    try:
        # As Kafka's onJoinPrepare: the partitions it keeps consuming through a cooperative
        # rebalance are those of topics it still subscribes to.
        assert member.partitions_to_revoke_before_join(["orders", "payments"]) == ()
        assert member.partitions_to_revoke_before_join(["payments"]) == (TP0, TP1)
        eager = GroupMembership(cluster, GroupSettings(GROUP), [assignor_for("range")])
        eager.assigned([TP0, TP1])
        assert eager.partitions_to_revoke_before_join(["orders"]) == (TP0, TP1)
    finally:
        await member.close()


async def test_a_member_not_polled_within_max_poll_interval_leaves_and_rejoins_when_polled(
    coordinator: tuple[ScriptedCoordinator, Cluster],
) -> None:
    scripted, cluster = coordinator
    member = await member_of_generation_one(
        scripted, cluster, heartbeat_interval_ms=20, max_poll_interval_ms=300
    )
    try:
        member.polled()
        # The application stops polling: the heartbeats leave the group for it.
        async with asyncio.timeout(5):
            while not member.lost:
                await asyncio.sleep(0.01)
        assert scripted.leaving == ["m-1"]
        assert (member.member_id, member.generation_id) == ("", -1)
        assert member.rejoin_needed and member.owned == (TP0, TP1)
        heartbeats = scripted.heartbeats
        await asyncio.sleep(0.1)
        assert scripted.heartbeats == heartbeats  # no longer a member: no heartbeats
        # The next poll gives the partitions up (on_lost) and joins afresh.
        member.polled()
        member.revoked(member.owned)
        member.lost = False
        scripted.joins.append(joined(2, "m-2"))
        scripted.syncs.append(synced(TP1))
        rebalance = await member.join(["orders"])
        assert rebalance is not None and rebalance.change.added == (TP1,)
        assert scripted.join_requests[-1].member_id == ""
        assert (member.member_id, member.generation_id) == ("m-2", 2)
    finally:
        await member.close()


async def test_a_member_waiting_in_poll_stays_past_max_poll_interval(
    coordinator: tuple[ScriptedCoordinator, Cluster],
) -> None:
    """max.poll.interval.ms is about poll() calls: an application inside poll(), waiting
    for records however long (``polling``, a broker's session holding none), polls; once
    it stops, the interval runs from then."""
    scripted, cluster = coordinator
    member = await member_of_generation_one(
        scripted, cluster, heartbeat_interval_ms=20, max_poll_interval_ms=200
    )
    waiting = True
    member.polling = lambda: waiting
    try:
        await asyncio.sleep(0.6)
        assert not member.lost and scripted.leaving == [] and member.is_member()
        waiting = False
        async with asyncio.timeout(5):
            while not member.lost:
                await asyncio.sleep(0.01)
        assert scripted.leaving == ["m-1"]
    finally:
        await member.close()


async def test_a_heartbeat_answer_about_a_generation_the_member_has_left_is_ignored(
    coordinator: tuple[ScriptedCoordinator, Cluster],
) -> None:
    scripted, cluster = coordinator
    member = await member_of_generation_one(scripted, cluster, heartbeat_interval_ms=20)
    try:
        # A heartbeat of generation 1 is answered ILLEGAL_GENERATION, late: the member
        # has joined generation 2 meanwhile (Kafka's generationUnchanged()).
        scripted.heartbeat_answer_held = asyncio.Event()
        scripted.heartbeat_error = ErrorCode.ILLEGAL_GENERATION
        async with asyncio.timeout(5):
            while not scripted.heartbeats:
                await asyncio.sleep(0.005)
        scripted.heartbeat_error = ErrorCode.NONE
        member.rejoin_needed = True
        scripted.joins.append(joined(2))
        scripted.syncs.append(synced(TP0, TP1))
        rebalance = await member.join(["orders"])
        assert rebalance is not None and member.generation_id == 2
        scripted.heartbeat_answer_held.set()
        heartbeats = scripted.heartbeats
        async with asyncio.timeout(5):
            while scripted.heartbeats < heartbeats + 3 and not member.lost:
                await asyncio.sleep(0.01)
        assert not member.lost and not member.rejoin_needed
        assert (member.member_id, member.generation_id) == ("m-1", 2)
    finally:
        await member.close()


async def test_a_commit_answer_about_a_generation_the_member_has_left_does_not_lose_the_new_one(
    coordinator: tuple[ScriptedCoordinator, Cluster],
) -> None:
    scripted, cluster = coordinator
    member = await member_of_generation_one(scripted, cluster)
    try:
        scripted.commit_answer_held = asyncio.Event()
        scripted.commit_error = ErrorCode.ILLEGAL_GENERATION
        commit = asyncio.create_task(member.commit({TP0: (5, -1, "")}))
        await asyncio.sleep(0.05)  # the commit of generation 1 is on its way
        member.rejoin_needed = True
        scripted.joins.append(joined(2))
        scripted.syncs.append(synced(TP0, TP1))
        assert await member.join(["orders"]) is not None
        scripted.commit_answer_held.set()
        assert await commit == {TP0: (ErrorCode.ILLEGAL_GENERATION, "")}
        # The commit failed, but generation 2 stands (Kafka's generationUnchanged).
        assert not member.lost and not member.rejoin_needed
        assert (member.member_id, member.generation_id) == ("m-1", 2)
    finally:
        await member.close()


async def test_an_assignment_of_topics_no_longer_subscribed_to_is_not_taken_and_the_member_rejoins(
    coordinator: tuple[ScriptedCoordinator, Cluster],
) -> None:
    # A static member that restarts with another subscription gets its former assignment
    # back without a rebalance (the coordinator keeps it while the group's protocol stays).
    # As Kafka's onJoinComplete, the member does not take an assignment that does not match
    # its subscription: it joins again at once, in the generation it was answered, so that
    # its changed metadata starts a rebalance.
    scripted, cluster = coordinator
    member = membership(cluster, group_instance_id="pod-a")
    try:
        scripted.joins += [joined(4), joined(5)]
        scripted.syncs += [synced(("payments", 0), TP0), synced(TP0, TP1)]
        rebalance = await member.join(["orders"])
        assert rebalance is not None and rebalance.generation_id == 5
        assert rebalance.change.added == (TP0, TP1)
        first, second = scripted.join_requests
        assert decode_subscription(first.protocols[0].metadata).generation_id == -1
        assert second.member_id == "m-1"
        assert decode_subscription(second.protocols[0].metadata).generation_id == 4
    finally:
        await member.close()


def led(generation: int) -> pb.JoinGroupResponse:
    """The leader's JoinGroup answer: it and m-2, both subscribed to "orders"."""
    metadata = encode_subscription(Subscription(topics=("orders",)))
    return pb.JoinGroupResponse(
        generation_id=generation,
        protocol_type="consumer",
        protocol_name="cooperative-sticky",
        leader="m-1",
        member_id="m-1",
        members=[pb.JoinGroupMember(member_id=m, metadata=metadata) for m in ("m-1", "m-2")],
    )


def assigned_by(sync: pb.SyncGroupRequest) -> set[TopicPartitionKey]:
    return {tp for a in sync.assignments for tp in decode_assignment(a.assignment).partitions}


async def test_a_leader_that_could_not_read_the_partition_counts_rejoins_once_it_can(
    coordinator: tuple[ScriptedCoordinator, Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    # Kafka's leader assigns from the metadata it has and rejoins when the metadata differs
    # from what it assigned from (ConsumerCoordinator's assignment snapshot): a group must
    # not settle with its partitions assigned to nobody.
    scripted, cluster = coordinator
    cluster.unreadable_counts = 2  # the assignment's read, and the first heartbeat's
    member = membership(cluster, heartbeat_interval_ms=20)
    try:
        scripted.joins.append(led(1))
        scripted.syncs.append(synced())
        rebalance = await member.join(["orders"])
        assert rebalance is not None and rebalance.assignment.partitions == ()
        assert assigned_by(scripted.sync_requests[-1]) == set()
        assert "partition counts" in caplog.text  # the failure is told, not swallowed
        async with asyncio.timeout(5):
            while not member.rejoin_needed:
                await asyncio.sleep(0.01)
        assert cluster.unreadable_counts == 0
        scripted.joins.append(led(2))
        scripted.syncs.append(synced(TP0))
        assert await member.join(["orders"]) is not None
        assert assigned_by(scripted.sync_requests[-1]) == {TP0, TP1}
    finally:
        await member.close()


@pytest.mark.parametrize(
    ("assigned_from", "counts", "changed"),
    [
        ({"orders": 2, "payments": 0}, {"orders": 2}, ()),
        ({"orders": 2, "payments": 0}, {"orders": 2, "payments": 3}, ("payments",)),
        ({"orders": 2, "payments": 1}, {"orders": 2, "payments": 3}, ("payments",)),
        ({"orders": 2, "payments": 1}, {"orders": 2}, ("payments",)),
        ({"orders": 2}, {"orders": 4, "refunds": 1}, ("orders",)),
        ({}, {"orders": 2}, ()),
    ],
    ids=["unchanged", "created", "grown", "deleted", "only-the-snapshot's-topics", "none"],
)
def test_the_topics_whose_partition_counts_differ_from_the_assignment_snapshot(
    assigned_from: dict[str, int], counts: dict[str, int], changed: tuple[str, ...]
) -> None:
    assert changed_topics(assigned_from, counts) == changed


def led_with_payments(generation: int) -> pb.JoinGroupResponse:
    """The leader's JoinGroup answer: it subscribes to "orders", m-2 to "orders" and
    "payments" (which the cluster does not have)."""
    answer = led(generation)
    del answer.members[1:]
    answer.members.add(
        member_id="m-2",
        metadata=encode_subscription(Subscription(topics=("orders", "payments"))),
    )
    return answer


async def test_a_leader_watches_the_whole_groups_topics_and_rejoins_when_their_counts_change(
    coordinator: tuple[ScriptedCoordinator, Cluster],
) -> None:
    # Kafka's leader adds the group's subscription to its metadata (groupSubscribe) and
    # rejoins when it differs from the snapshot it assigned from: "payments", which only
    # m-2 subscribes to, appearing must reach the group through the leader.
    scripted, cluster = coordinator
    member = membership(cluster)
    try:
        scripted.joins.append(led_with_payments(1))
        scripted.syncs.append(synced(TP0))
        assert await member.join(["orders"]) is not None
        assert member.watched_topics() == ("orders", "payments")
        member.metadata_seen({"orders": 2})
        assert not member.rejoin_needed
        member.metadata_seen({"orders": 2, "payments": 3})
        assert member.rejoin_needed
        # The next generation is led by another member: this one watches nothing more.
        scripted.joins.append(joined(2))
        scripted.syncs.append(synced(TP0))
        assert await member.join(["orders"]) is not None
        assert not member.rejoin_needed and member.watched_topics() == ()
        member.metadata_seen({"orders": 4, "payments": 3})
        assert not member.rejoin_needed
    finally:
        await member.close()


async def test_a_returning_static_leader_that_skips_the_assignment_still_watches(
    coordinator: tuple[ScriptedCoordinator, Cluster],
) -> None:
    # KIP-814: the coordinator tells a static leader that rejoins unchanged to keep the
    # current assignment; as Kafka's onLeaderElected, it takes the snapshot all the same.
    scripted, cluster = coordinator
    member = membership(cluster, group_instance_id="pod-a")
    try:
        answer = led_with_payments(3)
        answer.skip_assignment = True
        scripted.joins.append(answer)
        scripted.syncs.append(synced(TP0))
        assert await member.join(["orders"]) is not None
        assert list(scripted.sync_requests[-1].assignments) == []
        assert member.watched_topics() == ("orders", "payments")
        member.metadata_seen({"orders": 3})
        assert member.rejoin_needed
    finally:
        await member.close()
