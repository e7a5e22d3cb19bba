"""A topic deleted and created again under its name while one of its brokers is down.

Brokers 11 and 12 replicate ``reborn``; broker 12 stops, the topic is deleted and created
again through the controller (a new topic id, the same name and assignment), and broker 12
starts. Its disk still holds the old topic's log under ``reborn-0``, recording the old
topic id in ``partition.metadata``: the broker removes it before it makes the new topic's
replica, which fetches only the new topic's records from the leader, and a consumer
reading from broker 12 once it leads sees none of the old ones.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from broker_processes import (
    consume_all,
    create_topic,
    metadata,
    process_cluster,
    stored_records,
    wait_partition,
)
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.producer import AsyncProducer

pytestmark = pytest.mark.timeout(120)

TOPIC = "reborn"


async def produce(bootstrap: str, values: list[bytes]) -> None:
    settings = {"bootstrap.servers": bootstrap, "acks": "all", "request.timeout.ms": 10_000}
    async with AsyncProducer(settings) as producer:
        await asyncio.gather(*[producer.produce(TOPIC, v, partition=0) for v in values])


async def test_a_topic_recreated_while_a_broker_was_down_holds_none_of_the_old_records(
    tmp_path: Path,
) -> None:
    cluster = process_cluster(tmp_path, [11, 12])
    first, second = cluster.brokers[11], cluster.brokers[12]
    try:
        cluster.start()
        await create_topic(first.address, NewTopic(TOPIC, replica_assignment={0: [11, 12]}))
        old = [b"old-%d" % i for i in range(5)]
        await produce(cluster.bootstrap, old)
        assert [v for _, _, v in stored_records(second.partition_dir(TOPIC))] == old
        assert second.terminate() == 0

        async with AdminClient(first.address, request_timeout_s=10) as admin:
            assert (await admin.delete_topics([TOPIC]))[TOPIC].error is None
            async with asyncio.timeout(30):
                while (reply := await metadata(first.address, TOPIC)) is not None and any(
                    t.partitions for t in reply.topics
                ):
                    await asyncio.sleep(0.1)
            created = await admin.create_topics([NewTopic(TOPIC, replica_assignment={0: [11, 12]})])
            assert created[TOPIC].error is None
        await wait_partition([first], TOPIC, lambda p: p.leader_id == 11, what="the new topic led")
        # As many records as the old topic had: the old log's end offset matches the
        # leader's, in the same leader epoch, so nothing in the fetch protocol tells it apart.
        new = [b"new-%d" % i for i in range(5)]
        await produce(first.address, new)

        second.start()
        await wait_partition(
            [first], TOPIC, lambda p: 12 in p.isr, what="broker 12 back in the new topic's ISR"
        )
        assert [v for _, _, v in stored_records(second.partition_dir(TOPIC))] == new
        # Broker 12 alone serves the topic: a consumer reads only the new topic's records.
        assert first.terminate() == 0
        await wait_partition([second], TOPIC, lambda p: p.leader_id == 12, what="broker 12 leads")
        assert await consume_all(second.address, TOPIC) == new
    finally:
        cluster.kill()
