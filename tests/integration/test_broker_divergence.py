"""The seed's second story on real processes: two replicas whose logs diverge at the same
offsets are reconciled by leader epoch (KIP-101, KIP-320), never by the high watermark.

Replica A leads (leader epoch e0) with B in the ISR; m0 is written with acks=all and both
hold it. B is killed -9 and leaves the ISR; A takes m1 (acks=all with min.insync.replicas=1:
A alone is enough) and its high watermark, checkpointed, reaches 2. A is killed -9. B comes
back alone and, with unclean.leader.election.enable, leads in a newer epoch e1 and takes m2
at offset 1 — where A holds m1. Both logs end at 2 with the high watermark at 2: a follower
that truncated to its high watermark would keep m1, and the replicas would disagree for
good. When A comes back as B's follower, B answers its fetch (last fetched epoch e0) with
the diverging epoch — e0 ends at 1 on B — and A truncates to 1 and fetches m2: both
replicas then hold byte-identical logs, m0 then m2, and consumers read exactly B's history
from either of them. m1 is lost: it was acknowledged by A alone (min.insync.replicas=1), and
the unclean election chose B over it, as the story explains.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import pytest
from broker_processes import (
    BrokerProcess,
    consume_all,
    create_topic,
    read_committed,
    segment_bytes,
    stored_records,
    wait_partition,
)
from highwater.client.admin import NewTopic
from highwater.client.consumer import AsyncConsumer, LogTruncationError, Message
from highwater.client.consumer import TopicPartition as ConsumerTopicPartition
from highwater.client.producer import AsyncProducer, RecordMetadata
from highwater.internal.v1 import replication_pb2 as rpb
from highwater.internal.v1 import replication_pb2_grpc
from highwater.rpc.endpoints import free_loopback_ports
from highwater.storage.checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from highwater.storage.topic_partition import TopicPartition
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(150)

TOPIC = "diverging"
REPLICA_A, REPLICA_B = 21, 22
M0, M1, M2 = b"m0: acked by both replicas", b"m1: acked by A alone", b"m2: acked by B, epoch e1"


@dataclass
class TwoReplicas:
    controller: Controller
    a: BrokerProcess
    b: BrokerProcess

    @property
    def brokers(self) -> list[BrokerProcess]:
        return [self.a, self.b]

    def stop_all(self) -> None:
        self.a.kill()
        self.b.kill()
        self.controller.kill()


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[TwoReplicas]:
    controller_port, port_a, port_b = free_loopback_ports(3)
    controller = Controller(
        1,
        controller_port,
        f"1@127.0.0.1:{controller_port}",
        tmp_path / "controller",
        tmp_path / "controller.log",
    )
    a, b = (
        BrokerProcess(
            node_id,
            port,
            controller.address,
            tmp_path / f"broker-{node_id}",
            tmp_path / f"{node_id}.log",
        )
        for node_id, port in ((REPLICA_A, port_a), (REPLICA_B, port_b))
    )
    running = TwoReplicas(controller, a, b)
    try:
        controller.start()
        a.start()
        b.start()
        yield running
    finally:
        running.stop_all()


async def produce(bootstrap: str, value: bytes) -> RecordMetadata:
    """One record with acks=all through the client library (an idempotent producer)."""
    config = {"bootstrap.servers": bootstrap, "acks": "all", "request.timeout.ms": 10_000}
    async with AsyncProducer(config) as producer:
        return await producer.send(TOPIC, value, partition=0)


def checkpointed_high_watermark(broker: BrokerProcess) -> int | None:
    path = broker.data_dir / "logs" / REPLICATION_OFFSET_CHECKPOINT
    if not path.exists():
        return None
    return OffsetCheckpointFile(path).read().get(TopicPartition(TOPIC, 0))


async def wait_checkpointed_high_watermark(broker: BrokerProcess, expected: int) -> None:
    """The broker writes its high watermarks every few seconds: wait until it wrote this."""
    deadline = time.monotonic() + 30
    while checkpointed_high_watermark(broker) != expected:
        assert time.monotonic() < deadline, checkpointed_high_watermark(broker)
        await asyncio.sleep(0.1)


async def follower_view(
    leader: BrokerProcess, follower: BrokerProcess, leader_epoch: int
) -> tuple[pb.EpochEndOffsetResult, pb.FetchPartitionResponse]:
    """What the leader answers a follower whose log is A's (two records, the last of epoch
    e0): OffsetsForLeaderEpoch for e0, and a follower's ReplicaFetch from offset 2 with last fetched
    epoch e0 (neither changes the leader's state). The fetch stands in for ``follower``'s
    own, with its id and registered broker epoch."""
    async with grpc.aio.insecure_channel(leader.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        asked = pb.OffsetsForLeaderEpochRequest()
        asked.topics.add(topic=TOPIC).partitions.add(
            partition=0, current_leader_epoch=leader_epoch, leader_epoch=0
        )
        epochs = await stub.OffsetsForLeaderEpoch(asked, timeout=5)
        fetch = rpb.ReplicaFetchRequest(
            replica_id=follower.node_id,
            replica_epoch=follower.broker_epoch(),
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=1 << 20,
        )
        fetch.topics.add(topic=TOPIC).partitions.add(
            partition=0,
            current_leader_epoch=leader_epoch,
            fetch_offset=2,
            last_fetched_epoch=0,
            partition_max_bytes=1 << 20,
        )
        call = replication_pb2_grpc.ReplicaFetchServiceStub(channel).ReplicaFetch(timeout=5)
        await call.write(fetch)
        fetched = await call.read()
        call.cancel()
        assert isinstance(fetched, rpb.ReplicaFetchResponse)
    return epochs.topics[0].partitions[0], fetched.topics[0].partitions[0]


async def test_a_returning_leader_truncates_by_leader_epoch_and_the_replicas_converge(
    replicas: TwoReplicas,
) -> None:
    a, b = replicas.a, replicas.b
    await create_topic(
        a.address,
        NewTopic(
            TOPIC,
            replica_assignment={0: [REPLICA_A, REPLICA_B]},
            config={"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
        ),
    )
    first = await wait_partition(
        replicas.brokers,
        TOPIC,
        lambda s: s.leader_id == REPLICA_A and set(s.isr) == {REPLICA_A, REPLICA_B},
        what="A leads with B in the ISR",
    )
    epoch_a = first.leader_epoch

    # m0, acks=all while the ISR is {A, B}: both replicas hold it.
    assert (await produce(a.address, M0)).offset == 0

    # B dies and leaves the ISR (fenced once its session expires); m1 needs A alone.
    b.kill()
    await wait_partition([a], TOPIC, lambda s: list(s.isr) == [REPLICA_A], what="B out of the ISR")
    assert (await produce(a.address, M1)).offset == 1
    await wait_checkpointed_high_watermark(a, 2)
    a.kill()

    # On disk: A holds m0, m1 (epoch e0) with a high watermark of 2; B only m0.
    assert stored_records(a.partition_dir(TOPIC)) == [(0, epoch_a, M0), (1, epoch_a, M1)]
    assert stored_records(b.partition_dir(TOPIC)) == [(0, epoch_a, M0)]
    assert checkpointed_high_watermark(a) == 2

    # B returns alone: A's session expires, and B, outside the ISR, is elected uncleanly.
    b.start()
    second = await wait_partition(
        [b], TOPIC, lambda s: s.leader_id == REPLICA_B, what="B leads (unclean)", timeout_s=60
    )
    epoch_b = second.leader_epoch
    assert epoch_b > epoch_a
    assert (await produce(b.address, M2)).offset == 1, "m2 goes where A holds m1"
    b_records = [(0, epoch_a, M0), (1, epoch_b, M2)]
    assert stored_records(b.partition_dir(TOPIC)) == b_records
    # Same log end offset (2) and high watermark (2) on both: the high watermark alone
    # cannot tell the replicas apart.
    assert await read_committed(b.address, TOPIC) == ([M0, M2], 2)

    # What the leader tells a follower with A's log: epoch e0 ends at 1 here (KIP-101),
    # and a fetch from 2 with last fetched epoch e0 diverges there (KIP-320).
    epoch_end, diverging = await follower_view(b, a, epoch_b)
    assert epoch_end.error == ErrorCode.NONE
    assert (epoch_end.leader_epoch, epoch_end.end_offset) == (epoch_a, 1)
    assert diverging.error == ErrorCode.NONE and not diverging.records
    assert diverging.HasField("diverging_epoch")
    assert (diverging.diverging_epoch.epoch, diverging.diverging_epoch.end_offset) == (epoch_a, 1)

    # A comes back as B's follower, truncates by leader epoch, catches up, rejoins the ISR.
    a.start()
    await wait_partition(
        [b],
        TOPIC,
        lambda s: s.leader_id == REPLICA_B and set(s.isr) == {REPLICA_A, REPLICA_B},
        what="A back in B's ISR",
        timeout_s=60,
    )
    assert f"broker {REPLICA_A}: {TOPIC}-0 truncated to 1 (diverging epoch {epoch_a})" in (
        a.log_text()
    )
    deadline = time.monotonic() + 10
    while stored_records(a.partition_dir(TOPIC)) != b_records:
        assert time.monotonic() < deadline, stored_records(a.partition_dir(TOPIC))
        await asyncio.sleep(0.1)
    assert segment_bytes(a.partition_dir(TOPIC)) == segment_bytes(b.partition_dir(TOPIC))

    # Consumers read B's history: m0 and m2 survive, m1 (acknowledged by A alone) is gone.
    assert await consume_all(f"{a.address},{b.address}", TOPIC) == [M0, M2]

    # And from A too, once leadership moves to it (B's controlled shutdown).
    assert b.terminate() == 0
    await wait_partition(
        [a], TOPIC, lambda s: s.leader_id == REPLICA_A, what="A leads again", timeout_s=30
    )
    assert await consume_all(a.address, TOPIC) == [M0, M2]
    assert segment_bytes(a.partition_dir(TOPIC)) == segment_bytes(b.partition_dir(TOPIC))


async def poll_until(consumer: AsyncConsumer, timeout_s: float = 60) -> Message:
    """The next record or error message ``consumer`` returns."""
    async with asyncio.timeout(timeout_s):
        while True:
            message = await consumer.poll(0.5)
            if message is not None:
                return message


async def test_a_consumer_past_the_divergence_resumes_where_the_new_leader_diverges(
    replicas: TwoReplicas,
) -> None:
    """KIP-320 on the consumer: two consumers read m0 and m1 from A (epoch e0, position 2),
    then B, without m1, is elected uncleanly and takes m2 at offset 1. Fetching on from 2
    would read nothing of B's history (m2 lies below the position) and go on from there as
    if nothing had happened. The new leader in the metadata makes each consumer ask B where
    e0 ends (OffsetsForLeaderEpoch): at 1, below the position. With auto.offset.reset the
    consumer resumes at 1 and reads m2; with none it gets a LogTruncationError naming the
    divergence."""
    a, b = replicas.a, replicas.b
    await create_topic(
        a.address,
        NewTopic(
            TOPIC,
            replica_assignment={0: [REPLICA_A, REPLICA_B]},
            config={"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
        ),
    )
    first = await wait_partition(
        replicas.brokers,
        TOPIC,
        lambda s: s.leader_id == REPLICA_A and set(s.isr) == {REPLICA_A, REPLICA_B},
        what="A leads with B in the ISR",
    )
    epoch_a = first.leader_epoch
    assert (await produce(a.address, M0)).offset == 0
    b.kill()
    await wait_partition([a], TOPIC, lambda s: list(s.isr) == [REPLICA_A], what="B out of the ISR")
    assert (await produce(a.address, M1)).offset == 1

    config = {
        "bootstrap.servers": f"{a.address},{b.address}",
        "request.timeout.ms": 5_000,
        "retry.backoff.ms": 100,
    }
    resetting = AsyncConsumer({**config, "auto.offset.reset": "earliest"})
    strict = AsyncConsumer({**config, "auto.offset.reset": "none"})
    try:
        for consumer in (resetting, strict):
            consumer.assign([ConsumerTopicPartition(TOPIC, 0, 0)])
            read = [(await poll_until(consumer)) for _ in range(2)]
            assert [(m.offset(), m.value()) for m in read] == [(0, M0), (1, M1)]

        a.kill()
        b.start()
        second = await wait_partition(
            [b], TOPIC, lambda s: s.leader_id == REPLICA_B, what="B leads (unclean)", timeout_s=60
        )
        assert second.leader_epoch > epoch_a
        assert (await produce(b.address, M2)).offset == 1, "m2 goes where A holds m1"

        message = await poll_until(resetting)
        assert message.error() is None, message.error()
        assert (message.offset(), message.value()) == (1, M2)
        assert resetting.position([ConsumerTopicPartition(TOPIC, 0)])[0].offset == 2

        failed = await poll_until(strict)
        error = failed.error()
        assert isinstance(error, LogTruncationError), error
        assert (error.truncation.offset, error.truncation.epoch) == (2, epoch_a)
        assert (error.truncation.divergent_offset, error.truncation.divergent_epoch) == (
            1,
            epoch_a,
        )
        # Sought to the divergence, it reads B's history from there.
        truncation = error.truncation
        strict.seek(
            ConsumerTopicPartition(
                TOPIC, 0, truncation.divergent_offset, leader_epoch=truncation.divergent_epoch
            )
        )
        message = await poll_until(strict)
        assert (message.offset(), message.value()) == (1, M2)
    finally:
        await resetting.close()
        await strict.close()
