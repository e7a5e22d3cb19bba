"""Three ``highwater broker`` processes and a controller: records replicate by pull, and a
leader killed with -9 loses nothing that was acknowledged with acks=all.

The story: a topic with replication factor 3 and ``min.insync.replicas=2``; records are
produced with acks=all to the partition leader, the followers fetch them, every replica
holds them. The leader is killed with SIGKILL; the controller fences it once its session
expires and elects a new leader from the ISR; every acknowledged record is read from the
new leader, and acks=all writes go on with the two brokers left.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import pytest
from broker_processes import BrokerProcess, metadata
from highwater.client.admin import AdminClient, AdminError, NewTopic, TopicExistsError
from highwater.records import iter_batches
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(240)

TOPIC = "replicated"
BROKERS = (11, 12, 13)


@dataclass
class Cluster:
    controller: Controller
    brokers: dict[int, BrokerProcess]

    def stop_all(self) -> None:
        for broker in self.brokers.values():
            broker.kill()
        self.controller.kill()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    ports = free_loopback_ports(1 + len(BROKERS))
    controller = Controller(
        1,
        ports[0],
        f"1@127.0.0.1:{ports[0]}",
        tmp_path / "controller",
        tmp_path / "controller.log",
    )
    brokers = {
        node_id: BrokerProcess(
            node_id,
            port,
            controller.address,
            tmp_path / f"broker-{node_id}",
            tmp_path / f"broker-{node_id}.log",
        )
        for node_id, port in zip(BROKERS, ports[1:], strict=True)
    }
    running = Cluster(controller, brokers)
    controller.start()
    for broker in brokers.values():
        broker.start()
    try:
        yield running
    finally:
        running.stop_all()


async def partition_state(
    cluster: Cluster, *, not_led_by: int | None = None, timeout_s: float = 60
) -> pb.PartitionMetadata:
    """Partition 0 as a live broker sees it, once it has a leader (other than one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for broker in cluster.brokers.values():
            if broker.process is None or broker.process.poll() is not None:
                continue
            reply = await metadata(broker.address, TOPIC)
            if reply is None or not reply.topics or not reply.topics[0].partitions:
                continue
            state = reply.topics[0].partitions[0]
            if state.error == ErrorCode.NONE and state.leader_id not in (-1, not_led_by):
                return state
        await asyncio.sleep(0.1)
    raise AssertionError("the partition got no leader in time")


async def produce(address: str, values: list[bytes]) -> pb.ProducePartitionResponse:
    """One acks=all produce, retried while the broker answers NOT_LEADER_OR_FOLLOWER (as a
    client retries it): a leader named in the metadata may still be creating its log."""
    request = pb.ProduceRequest(acks=-1, timeout_ms=10_000)
    plain = request.topics.add(topic=TOPIC).partitions.add(partition=0).records
    for value in values:
        plain.records.add(value=value)
    deadline = time.monotonic() + 10
    async with grpc.aio.insecure_channel(address) as channel:
        while True:
            reply = await broker_pb2_grpc.BrokerStub(channel).Produce(request, timeout=15)
            answer = reply.topics[0].partitions[0]
            if answer.error != ErrorCode.NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
                return answer
            await asyncio.sleep(0.1)


async def read_all(address: str) -> tuple[list[bytes], int]:
    """Every record up to the high watermark (a consumer), and the high watermark."""
    values: list[bytes] = []
    offset = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        while True:
            request = pb.FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)
            request.topics.add(topic=TOPIC).partitions.add(
                partition=0,
                current_leader_epoch=-1,
                fetch_offset=offset,
                partition_max_bytes=1 << 20,
            )
            answer = (await stub.Fetch(request, timeout=5)).topics[0].partitions[0]
            assert answer.error == ErrorCode.NONE, answer
            if not answer.records:
                return values, answer.high_watermark
            for batch in iter_batches(answer.records):
                for record in batch.records():
                    if record.offset >= offset and record.value is not None:
                        values.append(record.value)
                offset = batch.next_offset


async def read_once_committed(address: str, count: int) -> list[bytes]:
    """Every record once the high watermark covers ``count`` records. A new leader's high
    watermark may start below its predecessor's (a follower learns the high watermark from
    the fetch after the one that brought the records, and the old leader may die between
    the two), and it advances when the ISR's followers next fetch, as in Kafka. A lost
    record is still caught: the high watermark then never reaches ``count``, or the records
    below it differ."""
    deadline = time.monotonic() + 30
    while True:
        seen, high_watermark = await read_all(address)
        if high_watermark >= count or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.1)


async def test_acks_all_records_replicate_and_survive_a_killed_leader(cluster: Cluster) -> None:
    await create_topic(cluster)
    state = await partition_state(cluster)
    assert sorted(state.replicas) == sorted(BROKERS)
    leader = cluster.brokers[state.leader_id]

    acknowledged: list[bytes] = []
    for round_number in range(5):
        values = [f"r{round_number}-{i}".encode() for i in range(20)]
        answer = await produce(leader.address, values)
        assert answer.error == ErrorCode.NONE, answer
        acknowledged += values
    seen, high_watermark = await read_all(leader.address)
    assert seen == acknowledged and high_watermark == len(acknowledged)

    leader.kill()
    new_state = await partition_state(cluster, not_led_by=leader.node_id, timeout_s=90)
    new_leader = cluster.brokers[new_state.leader_id]
    assert leader.node_id not in new_state.isr
    seen = await read_once_committed(new_leader.address, len(acknowledged))
    assert seen[: len(acknowledged)] == acknowledged, "an acknowledged record was lost"

    more = [b"after-failover-1", b"after-failover-2"]
    answer = await produce(new_leader.address, more)
    assert answer.error == ErrorCode.NONE, answer
    seen, _ = await read_all(new_leader.address)
    assert seen == acknowledged + more


async def create_topic(cluster: Cluster) -> None:
    """Through a broker: it forwards the admin call to the active controller."""
    address = next(iter(cluster.brokers.values())).address
    async with asyncio.timeout(60):
        while True:
            try:
                async with AdminClient(address, request_timeout_s=5) as admin:
                    results = await admin.create_topics(
                        [NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})]
                    )
            except AdminError:
                await asyncio.sleep(0.2)  # the broker is still starting
                continue
            error = results[TOPIC].error
            if error is None or isinstance(error, TopicExistsError):
                return
            await asyncio.sleep(0.2)  # brokers still registering


async def test_a_controlled_shutdown_moves_leadership_first_and_a_restart_catches_up(
    cluster: Cluster,
) -> None:
    await create_topic(cluster)
    state = await partition_state(cluster)
    leader = cluster.brokers[state.leader_id]
    first = [f"before-{i}".encode() for i in range(30)]
    assert (await produce(leader.address, first)).error == ErrorCode.NONE

    assert leader.process is not None
    started = time.monotonic()
    leader.process.send_signal(signal.SIGTERM)
    # Leadership moves while the broker shuts down: no session has to expire.
    moved = await partition_state(cluster, not_led_by=leader.node_id, timeout_s=30)
    assert time.monotonic() - started < 8, "leadership waited for the session timeout"
    assert leader.process.wait(30) == 0
    leader.reap()
    new_leader = cluster.brokers[moved.leader_id]
    second = [f"while-down-{i}".encode() for i in range(30)]
    assert (await produce(new_leader.address, second)).error == ErrorCode.NONE

    # The stopped broker comes back, catches up by fetching and rejoins the ISR.
    leader.start()
    async with asyncio.timeout(60):
        while True:
            current = await partition_state(cluster)
            if leader.node_id in current.isr:
                break
            await asyncio.sleep(0.2)
    seen, _ = await read_all(cluster.brokers[current.leader_id].address)
    assert seen == first + second


async def test_a_restarted_follower_keeps_what_was_acknowledged_when_the_leader_then_dies(
    cluster: Cluster,
) -> None:
    """The seed's first story: a follower restarts while its high watermark lags its log;
    truncating to that high watermark would drop acknowledged records, and when the
    leader then dies they would be gone. Truncation goes by leader epoch instead."""
    await create_topic(cluster)
    state = await partition_state(cluster)
    leader = cluster.brokers[state.leader_id]
    acknowledged = [f"acked-{i}".encode() for i in range(40)]
    for chunk in range(0, len(acknowledged), 10):
        answer = await produce(leader.address, acknowledged[chunk : chunk + 10])
        assert answer.error == ErrorCode.NONE, answer
    # Every follower restarts, hard, with whatever high watermark it had last.
    for follower_id in [b for b in BROKERS if b != leader.node_id]:
        follower = cluster.brokers[follower_id]
        follower.kill()
        follower.start()
    async with asyncio.timeout(90):
        # The old incarnations' sessions expire: the controller fences them and takes them
        # out of the ISR; the new ones register, catch up by fetching, and are let back in.
        while len((await partition_state(cluster)).isr) == len(BROKERS):
            await asyncio.sleep(0.2)
        while set((await partition_state(cluster)).isr) != set(BROKERS):
            await asyncio.sleep(0.2)
    leader.kill()
    new_state = await partition_state(cluster, not_led_by=leader.node_id, timeout_s=90)
    seen = await read_once_committed(
        cluster.brokers[new_state.leader_id].address, len(acknowledged)
    )
    assert seen[: len(acknowledged)] == acknowledged, "an acknowledged record was lost"


@pytest.mark.parametrize("unclean", [False, True])
async def test_a_partition_whose_isr_died_waits_for_it_unless_unclean_election_is_on(
    cluster: Cluster, unclean: bool
) -> None:
    """RF 2: the follower dies (it leaves the ISR), then the leader, the last ISR member.
    When the follower comes back, it may lead only if the topic allows unclean election:
    otherwise the partition stays offline until its last ISR member returns."""
    address = cluster.brokers[BROKERS[0]].address
    config = {"unclean.leader.election.enable": "true" if unclean else "false"}
    async with asyncio.timeout(60):
        while True:
            try:
                async with AdminClient(address, request_timeout_s=5) as admin:
                    results = await admin.create_topics(
                        [
                            NewTopic(
                                TOPIC,
                                replica_assignment={0: [BROKERS[0], BROKERS[1]]},
                                config=config,
                            )
                        ]
                    )
            except AdminError:
                await asyncio.sleep(0.2)
                continue
            if results[TOPIC].error is None:
                break
            await asyncio.sleep(0.2)
    state = await partition_state(cluster)
    leader, follower = (
        cluster.brokers[state.leader_id],
        cluster.brokers[next(r for r in state.replicas if r != state.leader_id)],
    )
    assert (await produce(leader.address, [b"kept-by-the-leader"])).error == ErrorCode.NONE
    follower.kill()
    async with asyncio.timeout(60):  # fenced when its session expires: out of the ISR
        while follower.node_id in (await partition_state(cluster)).isr:
            await asyncio.sleep(0.2)
    leader.kill()
    follower.start()
    if unclean:
        moved = await partition_state(cluster, not_led_by=leader.node_id, timeout_s=90)
        assert moved.leader_id == follower.node_id
    else:
        # Both decisions taken: the dead leader fenced (its connection closed), the
        # follower back and active (unfenced); neither may have elected the follower.
        async with asyncio.timeout(60):
            while True:
                reply = await metadata(follower.address, TOPIC)
                active = set() if reply is None else {b.node_id for b in reply.brokers}
                if follower.node_id in active and leader.node_id not in active:
                    break
                await asyncio.sleep(0.1)
        assert reply is not None
        offline = reply.topics[0].partitions[0]
        assert offline.leader_id == -1 and offline.error == ErrorCode.LEADER_NOT_AVAILABLE
        leader.start()  # the last ISR member returns: the partition is back, nothing lost
        back = await partition_state(cluster, timeout_s=90)
        assert back.leader_id == leader.node_id
        seen, _ = await read_all(leader.address)
        assert seen == [b"kept-by-the-leader"]
