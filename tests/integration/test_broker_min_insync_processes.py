"""acks=all and min.insync.replicas across real broker processes: a leader whose ISR shrank
below min.insync.replicas refuses acks=all writes before appending them, still takes
acks=1 writes, and takes acks=all writes again once a follower is back in the ISR — with
nothing acknowledged lost.

RF 3, min.insync.replicas=2, replica.lag.time.max.ms=2000 on every broker. Both followers
are killed -9; the leader drops them from the ISR once they have not fetched for the lag
time. acks=all then fails with NOT_ENOUGH_REPLICAS, which the client surfaces as a typed
``ProduceError`` (and an idempotent producer keeps retrying); acks=1 succeeds, though the
high watermark stays where it was while the ISR is below min.insync.replicas (KIP-966's
strict min ISR). One follower restarts, catches up and rejoins the ISR: the waiting
idempotent record is written (once), acks=all works again, and a consumer reads every
acknowledged record, in order, and none of the refused one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from broker_processes import (
    BrokerProcess,
    consume_all,
    create_topic,
    read_committed,
    stored_records,
    wait_partition,
)
from highwater.client.admin import NewTopic
from highwater.client.producer import AsyncProducer, ProduceError, RecordMetadata
from highwater.rpc.endpoints import free_loopback_ports
from highwater.v1.common_pb2 import ErrorCode
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(150)

TOPIC = "min-isr"
LEADER, FOLLOWER_1, FOLLOWER_2 = 31, 32, 33
REPLICA_LAG_TIME_MAX_MS = 2000


@dataclass
class ThreeBrokers:
    controller: Controller
    brokers: dict[int, BrokerProcess]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers.values())

    def stop_all(self) -> None:
        for broker in self.brokers.values():
            broker.kill()
        self.controller.kill()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[ThreeBrokers]:
    controller_port, *ports = free_loopback_ports(4)
    controller = Controller(
        1,
        controller_port,
        f"1@127.0.0.1:{controller_port}",
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
            replica_lag_time_max_ms=REPLICA_LAG_TIME_MAX_MS,
        )
        for node_id, port in zip((LEADER, FOLLOWER_1, FOLLOWER_2), ports, strict=True)
    }
    running = ThreeBrokers(controller, brokers)
    try:
        controller.start()
        for broker in brokers.values():
            broker.start()
        yield running
    finally:
        running.stop_all()


async def produce(bootstrap: str, values: list[bytes], **config: object) -> list[RecordMetadata]:
    """Send ``values`` to partition 0 with the client library and wait for all of them."""
    settings = {"bootstrap.servers": bootstrap, "request.timeout.ms": 10_000, **config}
    async with AsyncProducer(settings) as producer:
        futures = [producer.produce(TOPIC, value, partition=0) for value in values]
        return list(await asyncio.gather(*futures))


async def test_acks_all_needs_min_insync_replicas_and_recovers_when_a_follower_returns(
    cluster: ThreeBrokers,
) -> None:
    leader = cluster.brokers[LEADER]
    await create_topic(
        leader.address,
        NewTopic(
            TOPIC,
            replica_assignment={0: [LEADER, FOLLOWER_1, FOLLOWER_2]},
            config={"min.insync.replicas": "2"},
        ),
    )
    everyone = {LEADER, FOLLOWER_1, FOLLOWER_2}
    await wait_partition(
        [leader],
        TOPIC,
        lambda s: s.leader_id == LEADER and set(s.isr) == everyone,
        what="the leader with a full ISR",
    )

    # All three up: acks=all succeeds.
    acknowledged = [f"all-up-{i}".encode() for i in range(10)]
    written = await produce(cluster.bootstrap, acknowledged, acks="all")
    assert [w.offset for w in written] == list(range(10))

    # Both followers die; the leader drops them from the ISR after the lag time.
    cluster.brokers[FOLLOWER_1].kill()
    cluster.brokers[FOLLOWER_2].kill()
    await wait_partition(
        [leader], TOPIC, lambda s: list(s.isr) == [LEADER], what="the ISR shrunk to the leader"
    )

    # acks=all is refused before the append, as a typed error (no retries: it is final).
    with pytest.raises(ProduceError) as refused:
        await produce(leader.address, [b"refused"], acks="all", retries=0)
    assert refused.value.code == ErrorCode.NOT_ENOUGH_REPLICAS, refused.value

    # acks=1 still succeeds, right after the records acknowledged before.
    leader_only = [f"leader-only-{i}".encode() for i in range(5)]
    written = await produce(leader.address, leader_only, acks="1")
    assert [w.offset for w in written] == list(range(10, 15))
    acknowledged += leader_only
    stored = [value for _, _, value in stored_records(leader.partition_dir(TOPIC))]
    assert stored == acknowledged, "the refused record was appended"
    # The high watermark does not move while the ISR is below min.insync.replicas.
    assert await read_committed(leader.address, TOPIC) == (acknowledged[:10], 10)

    # An idempotent acks=all producer keeps retrying NOT_ENOUGH_REPLICAS meanwhile.
    retrying = AsyncProducer(
        {"bootstrap.servers": leader.address, "acks": "all", "request.timeout.ms": 10_000}
    )
    try:
        waiting = retrying.produce(TOPIC, b"sent-during-the-outage", partition=0)
        await asyncio.sleep(0.5)  # a few attempts, each refused before the append
        assert not waiting.done()

        # One follower returns, catches up and rejoins: acks=all works again.
        cluster.brokers[FOLLOWER_1].start()
        await wait_partition(
            [leader],
            TOPIC,
            lambda s: s.leader_id == LEADER and set(s.isr) == {LEADER, FOLLOWER_1},
            what="the restarted follower back in the ISR",
            timeout_s=60,
        )
        delivered = await asyncio.wait_for(waiting, 30)
    finally:
        await retrying.close()
    assert delivered.offset == 15
    acknowledged.append(b"sent-during-the-outage")
    after = [f"after-rejoin-{i}".encode() for i in range(5)]
    written = await produce(cluster.bootstrap, after, acks="all")
    assert [w.offset for w in written] == list(range(16, 21))
    acknowledged += after

    # Nothing acknowledged was lost, nothing refused was written, nothing twice.
    assert await consume_all(cluster.bootstrap, TOPIC) == acknowledged
    # The high watermark is past every record, so the follower (the only other ISR member
    # the strict min ISR lets it count on) holds every one of them, as the leader does.
    assert await read_committed(leader.address, TOPIC) == (acknowledged, len(acknowledged))
    for replica in (leader, cluster.brokers[FOLLOWER_1]):
        stored = [value for _, _, value in stored_records(replica.partition_dir(TOPIC))]
        assert stored == acknowledged, replica.node_id
