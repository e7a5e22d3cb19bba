"""FindCoordinator on a broker: answered from the metadata image as coordinators come and go.

Each test runs a single-voter controller and a broker in this process on one loopback
port (as ``highwater server`` does, without its own coordinator), so that the test plays
every coordinator through the Controller API (RegisterCoordinator, CoordinatorHeartbeat);
FindCoordinator goes to the broker over gRPC as a client's would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import pytest
from embedded_servers import free_port
from highwater.broker.service import BROKER_SERVICE_NAME, BrokerServer
from highwater.controller import ControllerConfig
from highwater.controller.service import ControllerServer, ControllerSettings
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.metadata import (
    CONSUMER_OFFSETS_TOPIC,
    NO_LEADER,
    BrokerEndpoint,
    MetadataImage,
    partition_for_group,
)
from highwater.rpc.server import GrpcService
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)

COORDINATOR_TIMEOUT_MS = 1500


@dataclass
class Cluster:
    server: BrokerServer
    broker: broker_pb2_grpc.BrokerStub
    admin: ControllerClient

    @property
    def image(self) -> MetadataImage:
        """The image the broker answers from."""
        return self.server.partitions.image

    async def register(self, coordinator_id: int, host: str, port: int) -> int:
        reply = await self.admin.register_coordinator(
            m.RegisterCoordinatorRequest(
                coordinator_id,
                f"incarnation-{coordinator_id}",
                (BrokerEndpoint("PLAINTEXT", host, port),),
            )
        )
        assert reply.error == ErrorCode.NONE, reply
        return reply.registration_epoch

    async def find(
        self, *keys: str, key_type: int = pb.COORDINATOR_TYPE_GROUP
    ) -> list[pb.Coordinator]:
        reply = await self.broker.FindCoordinator(
            pb.FindCoordinatorRequest(key_type=key_type, keys=list(keys))  # type: ignore[arg-type]
        )
        return list(reply.coordinators)

    async def heartbeat(self, coordinator_id: int, epoch: int) -> None:
        """Heartbeat as a live coordinator does until cancelled, reporting the broker's
        image as the metadata it has applied: a partition moved off it to balance goes to
        its next owner only once its heartbeat shows the revocation."""
        while True:
            reply = await self.admin.coordinator_heartbeat(
                m.CoordinatorHeartbeatRequest(
                    coordinator_id, epoch, metadata_offset=self.image.offset
                )
            )
            assert reply.error == ErrorCode.NONE and not reply.is_fenced, reply
            await asyncio.sleep(0.1)

    async def wait_for(self, condition: Callable[[MetadataImage], bool], what: str) -> None:
        for _ in range(500):
            if condition(self.image):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"the broker never saw {what}")


def owner(image: MetadataImage, group_id: str) -> int:
    topic = image.topic(CONSUMER_OFFSETS_TOPIC)
    assert topic is not None
    assignment = image.coordinator_assignment(partition_for_group(group_id, len(topic.partitions)))
    return NO_LEADER if assignment is None else assignment.coordinator_id


def all_assigned_to(coordinators: set[int]) -> Callable[[MetadataImage], bool]:
    def check(image: MetadataImage) -> bool:
        topic = image.topic(CONSUMER_OFFSETS_TOPIC)
        if topic is None:
            return False
        owners = set()
        for p in range(len(topic.partitions)):
            assignment = image.coordinator_assignment(p)
            if assignment is None:
                return False
            owners.add(assignment.coordinator_id)
        return owners == coordinators

    return check


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    address = f"127.0.0.1:{free_port()}"
    settings = ControllerSettings(
        controller=ControllerConfig(
            coordinator_session_timeout_ms=COORDINATOR_TIMEOUT_MS,
            offsets_topic_replication_factor=1,  # one broker
        )
    )
    brokers: list[BrokerServer] = []  # the broker's service is looked up at start
    controller = ControllerServer(
        node_id=1,
        listen=address,
        voters={1: address},
        data_dir=tmp_path / "controller",
        settings=settings,
        services=[GrpcService(BROKER_SERVICE_NAME, lambda s: brokers[0].add_servicer(s))],
    )
    broker = BrokerServer(
        node_id=1,
        advertised=address,
        data_dir=tmp_path / "broker",
        controllers=[address],
        metadata=controller.machine,
    )
    brokers.append(broker)
    await controller.start()
    try:
        await broker.start()
        try:
            await broker.wait_unfenced()
            async with (
                grpc.aio.insecure_channel(address) as channel,
                ControllerClient([address]) as admin,
            ):
                yield Cluster(broker, broker_pb2_grpc.BrokerStub(channel), admin)
        finally:
            await broker.stop()
    finally:
        await controller.stop()


async def test_no_coordinator_yet_and_bad_keys(cluster: Cluster) -> None:
    answers = await cluster.find("orders-app", "")
    assert [a.key for a in answers] == ["orders-app", ""]
    assert answers[0].error == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert (answers[0].node_id, answers[0].port) == (-1, -1)
    assert answers[1].error == ErrorCode.INVALID_REQUEST
    assert cluster.image.topic(CONSUMER_OFFSETS_TOPIC) is None
    unknown_type = await cluster.find("orders-app", key_type=7)
    assert unknown_type[0].error == ErrorCode.INVALID_REQUEST


async def test_groups_are_answered_with_their_partitions_owner(cluster: Cluster) -> None:
    epoch_a = await cluster.register(10, "coordinator-a", 9100)
    beating = asyncio.create_task(cluster.heartbeat(10, epoch_a))
    try:
        await cluster.register(11, "coordinator-b", 9101)
        await cluster.wait_for(all_assigned_to({10, 11}), "both coordinators own partitions")
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
    topic = cluster.image.topic(CONSUMER_OFFSETS_TOPIC)
    assert topic is not None and len(topic.partitions) == 50
    # Kafka's partitionFor over 50 partitions (values from a JVM).
    assert [partition_for_group(g, 50) for g in ("group-1", "hello", "Hello World")] == [49, 22, 26]
    groups = ["group-1", "hello", "Hello World", "polygenelubricants", "\U0001f600", ""]
    answers = await cluster.find(*groups)
    assert [a.key for a in answers] == groups
    addresses = {10: ("coordinator-a", 9100), 11: ("coordinator-b", 9101)}
    for group, answer in zip(groups[:-1], answers[:-1], strict=True):
        expected = owner(cluster.image, group)
        assert answer.error == ErrorCode.NONE, answer
        assert answer.node_id == expected
        assert (answer.host, answer.port) == addresses[expected]
    assert answers[-1].error == ErrorCode.INVALID_REQUEST
    # Both coordinators serve some of these groups.
    many = await cluster.find(*[f"group-{i}" for i in range(40)])
    assert {a.node_id for a in many} == {10, 11}


async def test_a_coordinator_that_stops_heartbeating_loses_its_groups(cluster: Cluster) -> None:
    epoch_a = await cluster.register(10, "coordinator-a", 9100)
    beating = asyncio.create_task(cluster.heartbeat(10, epoch_a))
    try:
        epoch_b = await cluster.register(11, "coordinator-b", 9101)
        await cluster.wait_for(all_assigned_to({10, 11}), "both coordinators own partitions")
        group_of_b = next(
            g for g in (f"group-{i}" for i in range(100)) if owner(cluster.image, g) == 11
        )
        assert (await cluster.find(group_of_b))[0].node_id == 11
        await cluster.wait_for(all_assigned_to({10}), "coordinator 11 expire")
        answer = (await cluster.find(group_of_b))[0]
        assert (answer.error, answer.node_id, answer.host) == (ErrorCode.NONE, 10, "coordinator-a")
        # Coordinator 11's next heartbeat tells it to register again.
        late = await cluster.admin.coordinator_heartbeat(m.CoordinatorHeartbeatRequest(11, epoch_b))
        assert late.error == ErrorCode.BROKER_ID_NOT_REGISTERED and late.is_fenced
        again = await cluster.register(11, "coordinator-b", 9101)
        assert again > epoch_b
        await cluster.wait_for(all_assigned_to({10, 11}), "coordinator 11 back")
        # A graceful stop: its partitions move at once.
        bye = await cluster.admin.coordinator_heartbeat(
            m.CoordinatorHeartbeatRequest(11, again, want_shutdown=True)
        )
        assert bye.error == ErrorCode.NONE and bye.should_shut_down
        await cluster.wait_for(all_assigned_to({10}), "coordinator 11 leave")
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
    # The last coordinator leaving leaves the groups without one.
    gone = await cluster.admin.unregister_coordinator(m.UnregisterCoordinatorRequest(10, epoch_a))
    assert gone.error == ErrorCode.NONE
    await cluster.wait_for(all_assigned_to({NO_LEADER}), "the partitions unassigned")
    assert (await cluster.find(group_of_b))[0].error == ErrorCode.COORDINATOR_NOT_AVAILABLE
