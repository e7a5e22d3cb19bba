"""A follower's fetch that claims a replica id must come from that replica: anyone naming
broker 0 on the internal ReplicaFetchService cannot move broker 0's replication state on
the leader, and a public Fetch cannot name a replica at all.

RF 3 over brokers 0, 2 and 3, broker 2 leading, broker 0 a follower. Broker 0 is paused
(SIGSTOP, well inside replica.lag.time.max.ms, so it stays in the ISR) and one more record
is appended with acks=1: the high watermark must wait for broker 0. Replica fetches that
name replica 0 without broker 0's registered epoch, or with another epoch, are refused with
STALE_BROKER_EPOCH and the high watermark does not move; a consumer's Fetch from the high
watermark gets nothing (the record past it is not committed); had one been taken for broker 0's
fetch at the log end, the leader would count the record as replicated to a broker that
never got it (and acknowledge acks=all writes on that basis). Once broker 0 resumes, its
own fetches move the high watermark as before.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc.aio
import pytest
from broker_processes import ProcessCluster, create_topic, process_cluster, wait_partition
from highwater.client.admin import NewTopic
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.internal.v1 import replication_pb2_grpc
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(150)

TOPIC = "claimed-replica"
LEADER, PAUSED, OTHER = 2, 0, 3  # the controller is node 1


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[ProcessCluster]:
    cluster = process_cluster(tmp_path, (PAUSED, LEADER, OTHER), replica_lag_time_max_ms=60_000)
    cluster.start()
    try:
        yield cluster
    finally:
        paused = cluster.brokers[PAUSED]
        if paused.alive:
            paused.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        cluster.kill()


def fetch_request(fetch_offset: int = 0) -> pb.FetchRequest:
    request = pb.FetchRequest()
    request.topics.add(topic=TOPIC).partitions.add(partition=0, fetch_offset=fetch_offset)
    return request


def replica_fetch_request(replica_id: int, replica_epoch: int) -> rpb.ReplicaFetchRequest:
    request = rpb.ReplicaFetchRequest(replica_id=replica_id, replica_epoch=replica_epoch)
    request.topics.add(topic=TOPIC).partitions.add(
        partition=0, current_leader_epoch=-1, fetch_offset=4, last_fetched_epoch=-1
    )
    return request


async def test_a_fetch_naming_a_replica_without_its_epoch_moves_nothing(
    cluster: ProcessCluster,
) -> None:
    leader = cluster.brokers[LEADER]
    await create_topic(
        leader.address, NewTopic(TOPIC, replica_assignment={0: [LEADER, PAUSED, OTHER]})
    )
    await wait_partition(
        [leader],
        TOPIC,
        lambda p: p.leader_id == LEADER and sorted(p.isr) == [PAUSED, LEADER, OTHER],
        what="the partition led by broker 2 with the whole ISR",
    )
    async with grpc.aio.insecure_channel(leader.address) as channel:
        broker = broker_pb2_grpc.BrokerStub(channel)

        async def produce(value: bytes, acks: int) -> pb.ProducePartitionResponse:
            request = pb.ProduceRequest(acks=acks, timeout_ms=10_000)
            request.topics.add(topic=TOPIC).partitions.add(partition=0).records.records.add(
                value=value
            )
            return (await broker.Produce(request, timeout=15)).topics[0].partitions[0]

        async def fetch_error() -> int:
            answer = await broker.Fetch(fetch_request(), timeout=5)
            return answer.topics[0].partitions[0].error

        async def high_watermark() -> int:
            answer = (await broker.Fetch(fetch_request(), timeout=5)).topics[0].partitions[0]
            assert answer.error == ErrorCode.NONE, answer
            return answer.high_watermark

        # The metadata names the leader before its log is made (a worker thread makes it):
        # a produce meanwhile is NOT_LEADER_OR_FOLLOWER, which a client retries.
        async with asyncio.timeout(10):
            while (await fetch_error()) == ErrorCode.NOT_LEADER_OR_FOLLOWER:
                await asyncio.sleep(0.05)
        for value in (b"a", b"b", b"c"):
            assert (await produce(value, -1)).error == ErrorCode.NONE
        assert await high_watermark() == 3

        cluster.brokers[PAUSED].process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        await asyncio.sleep(1)  # broker 0's fetch in flight, if any, has been answered
        assert (await produce(b"d", 1)).error == ErrorCode.NONE
        await asyncio.sleep(1)  # broker 3 has fetched it; the high watermark waits for 0
        assert await high_watermark() == 3

        replica_fetches = replication_pb2_grpc.ReplicaFetchServiceStub(channel).ReplicaFetch(
            timeout=10
        )
        for forged in (
            replica_fetch_request(PAUSED, 0),
            replica_fetch_request(PAUSED, 987_654),
            replica_fetch_request(7, 0),
        ):
            await replica_fetches.write(forged)
            reply = await replica_fetches.read()
            assert isinstance(reply, rpb.ReplicaFetchResponse)
            answer = reply.topics[0].partitions[0]
            assert answer.error == ErrorCode.STALE_BROKER_EPOCH, (forged, answer)
            assert answer.records == b""
        replica_fetches.cancel()
        consumer = (await broker.Fetch(fetch_request(3), timeout=5)).topics[0].partitions[0]
        assert (consumer.error, consumer.records) == (ErrorCode.NONE, b"")
        assert await high_watermark() == 3

        cluster.brokers[PAUSED].process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        for _ in range(100):
            if await high_watermark() == 4:
                break
            await asyncio.sleep(0.1)
        assert await high_watermark() == 4
