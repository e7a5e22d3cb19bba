"""A coordinator paused past its session serves nothing from its stale cache when it wakes.

One controller, one broker and two ``highwater coordinator`` processes. A group commits
offset 5 through its coordinator, which is then paused (SIGSTOP) longer than its session
timeout: the controller hands the group's partition of ``__consumer_offsets`` to the other
coordinator, and the group commits 9 there. When the paused coordinator is resumed
(SIGCONT), a fetch of the group's offsets sent straight to it is answered NOT_COORDINATOR
(it never answers 5 again: a committed offset must not go back), and the group's
offsets, wherever clients find its coordinator, are 9.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import pytest
from broker_processes import BrokerProcess, ProcessCluster, create_topic, process_cluster
from coordinator_processes import CoordinatorProcess
from highwater.client.admin import AdminClient, NewTopic, OffsetAndMetadata
from highwater.errors import HighwaterError
from highwater.rpc.channels import open_channel
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1 import broker_pb2, broker_pb2_grpc, coordinator_pb2_grpc
from highwater.v1 import coordinator_pb2 as pb
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(150)

GROUP, TOPIC = "ledger", "entries"


@dataclass
class Cluster:
    processes: ProcessCluster
    coordinators: dict[int, CoordinatorProcess]

    @property
    def broker(self) -> BrokerProcess:
        return self.processes.brokers[11]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    processes = process_cluster(
        tmp_path, [11], controller_args=("--offsets-topic-replication-factor", "1")
    )
    ports = free_loopback_ports(2 + 2)  # more than needed: the cluster's may be among them
    taken = {processes.controller.port, processes.brokers[11].port}
    free = [p for p in ports if p not in taken]
    coordinators = {
        node_id: CoordinatorProcess(
            node_id, port, processes.controller.address, tmp_path / f"coordinator-{node_id}.log"
        )
        for node_id, port in zip((21, 22), free, strict=False)
    }
    try:
        processes.start()
        for coordinator in coordinators.values():
            coordinator.start()
        yield Cluster(processes, coordinators)
    finally:
        for coordinator in coordinators.values():
            if coordinator.process is not None and coordinator.process.poll() is None:
                coordinator.resume()
            coordinator.kill()
        processes.kill()


async def commit(bootstrap: str, offset: int, timeout_s: float = 60) -> int:
    """Commit ``offset`` for the group (retrying while its coordinator moves); the id of the
    coordinator the admin client found for it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            async with AdminClient(bootstrap, request_timeout_s=5) as admin:
                await admin.alter_consumer_group_offsets(
                    GROUP, {(TOPIC, 0): OffsetAndMetadata(offset)}
                )
                described = await admin.describe_consumer_groups([GROUP])
                return described[GROUP].coordinator.node_id
        except HighwaterError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def wait_coordinator_moved(bootstrap: str, away_from: int, timeout_s: float = 60) -> int:
    """The group's coordinator as the broker's FindCoordinator names it, once it is not
    ``away_from`` (the controller moved the group's partition of ``__consumer_offsets``)."""
    async with asyncio.timeout(timeout_s), open_channel(bootstrap) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        while True:
            reply = await stub.FindCoordinator(
                broker_pb2.FindCoordinatorRequest(keys=[GROUP]), timeout=5
            )
            (answer,) = reply.coordinators
            if answer.error == ErrorCode.NONE and answer.node_id != away_from:
                return answer.node_id
            await asyncio.sleep(0.2)


async def fetch_directly(address: str) -> pb.OffsetFetchResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.GroupCoordinatorStub(channel)
        request = pb.OffsetFetchRequest(group_id=GROUP)
        request.topics.add(name=TOPIC, partition_indexes=[0])
        reply: pb.OffsetFetchResponse = await stub.OffsetFetch(request, timeout=10)
        return reply


async def test_a_paused_coordinator_answers_not_coordinator_when_it_wakes(
    cluster: Cluster,
) -> None:
    await create_topic(cluster.broker.address, NewTopic(TOPIC, 1, 1))
    first = await commit(cluster.broker.address, 5)
    paused = cluster.coordinators[first]
    answer = await fetch_directly(paused.address)
    assert answer.error == ErrorCode.NONE and answer.topics[0].partitions[0].committed_offset == 5

    paused.pause()
    try:
        # Its session (9 s) expires: the controller moves the group's partition.
        moved_to = await wait_coordinator_moved(cluster.broker.address, away_from=first)
        second = await commit(cluster.broker.address, 9)
        assert second == moved_to != first
    finally:
        paused.resume()
    woken = await fetch_directly(paused.address)
    assert woken.error == ErrorCode.NOT_COORDINATOR, woken
    async with AdminClient(cluster.broker.address, request_timeout_s=10) as admin:
        offsets = await admin.list_consumer_group_offsets(GROUP)
    assert offsets[(TOPIC, 0)].offset == 9
