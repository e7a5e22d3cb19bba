"""The Kafka listener's relay of the group calls to a real coordinator: JoinGroup and
SyncGroup wait there as long as the group's rebalance timeout lets them, so the relay's
deadline follows the rebalance timeouts the members ask for, not a fixed one (a Kafka
client with ``max.poll.interval.ms`` above it got COORDINATOR_NOT_AVAILABLE while the
coordinator still held its join).

The relay here has a floor of 1 s in place of the listener's 330 s, so that a wait of a
second and a half at the coordinator (a join waiting for the group's other member to
rejoin; a sync waiting for the leader's assignment) stands for one of many minutes."""

from __future__ import annotations

import asyncio

import pytest
from highwater.broker.kafka_protocol.listener import GroupCoordinatorRelay
from highwater.errors import ErrorCode
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import coordinator_pb2
from kafka_servers import KafkaServer

pytestmark = pytest.mark.timeout(60)


class _CoordinatorAt:
    """The broker's coordinator lookup, answering the server's own coordinator."""

    def __init__(self, address: str) -> None:
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)

    def find_coordinator(self, request: pb.FindCoordinatorRequest) -> pb.FindCoordinatorResponse:
        answer = pb.FindCoordinatorResponse()
        answer.coordinators.add(key=request.keys[0], host=self.host, port=self.port)
        return answer


def _join(group: str, member_id: str) -> coordinator_pb2.JoinGroupRequest:
    message = coordinator_pb2.JoinGroupRequest(
        group_id=group,
        member_id=member_id,
        session_timeout_ms=30_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        client_id="relay-test",
    )
    message.protocols.add(name="range", metadata=b"m")
    return message


_COORDINATOR_NOT_READY = (
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
)


async def _joined(relay: GroupCoordinatorRelay, group: str) -> coordinator_pb2.JoinGroupResponse:
    """A new member's two joins; the first is retried, as a client retries it, while the
    server's coordinator is still loading the group's partition after its start."""
    async with asyncio.timeout(30):
        while True:
            first = await relay.call(group, "JoinGroup", _join(group, ""))
            if first.error not in _COORDINATOR_NOT_READY:
                break
            await asyncio.sleep(0.2)
    assert first.error == ErrorCode.MEMBER_ID_REQUIRED
    return await relay.call(group, "JoinGroup", _join(group, first.member_id))


def _relay(server: KafkaServer) -> GroupCoordinatorRelay:
    return GroupCoordinatorRelay(
        _CoordinatorAt(server.address),  # type: ignore[arg-type]
        lambda: None,  # type: ignore[arg-type, return-value]
        long_timeout_s=1,
    )


async def _two_members(
    relay: GroupCoordinatorRelay, group: str
) -> tuple[coordinator_pb2.JoinGroupResponse, coordinator_pb2.JoinGroupResponse]:
    """A second member joins a stable group of one: its join is held until the first
    rejoins (1.5 s later), as the coordinator's join waits the rebalance timeout (10 s).
    The answers of the second generation: (the first member's, the second's)."""
    first = await _joined(relay, group)
    assert (first.error, first.generation_id) == (ErrorCode.NONE, 1)
    second = asyncio.ensure_future(_joined(relay, group))
    await asyncio.sleep(1.5)
    assert not second.done()
    rejoined = await relay.call(group, "JoinGroup", _join(group, first.member_id))
    return rejoined, await second


async def test_a_join_held_past_the_floor_is_answered(server: KafkaServer) -> None:
    relay = _relay(server)
    try:
        first, second = await _two_members(relay, "relay-join")
    finally:
        await relay.close()
    assert [(a.error, a.generation_id) for a in (first, second)] == [(ErrorCode.NONE, 2)] * 2


async def test_a_sync_waiting_for_the_leader_is_answered(server: KafkaServer) -> None:
    """A follower's SyncGroup waits at the coordinator for the leader's assignment, bounded
    by the group's rebalance timeout (10 s): the relay waits for it too."""
    group = "relay-sync"
    relay = _relay(server)
    try:
        a, b = await _two_members(relay, group)
        leader, follower = (a, b) if a.member_id == a.leader else (b, a)

        def sync(member: coordinator_pb2.JoinGroupResponse) -> coordinator_pb2.SyncGroupRequest:
            message = coordinator_pb2.SyncGroupRequest(
                group_id=group, generation_id=member.generation_id, member_id=member.member_id
            )
            if member is leader:
                for m in leader.members:
                    message.assignments.add(member_id=m.member_id, assignment=b"a-x")
            return message

        waiting = asyncio.ensure_future(relay.call(group, "SyncGroup", sync(follower)))
        await asyncio.sleep(1.5)
        assert not waiting.done()
        await relay.call(group, "SyncGroup", sync(leader))
        synced = await waiting
    finally:
        await relay.close()
    assert (synced.error, synced.assignment) == (ErrorCode.NONE, b"a-x")
