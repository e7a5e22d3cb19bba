"""An idempotent producer's retries never duplicate a record, when the network loses the
broker's replies after the records were appended.

A controller and one broker process; the broker advertises the address of a
:class:`~dropping_proxy.DroppingProxy` in front of it, so the producer learns the proxy as
the partition leader's address from Metadata and every request it sends goes through the
proxy. The proxy is told to lose the next few Produce replies: the broker appends the
batches, and instead of the reply the producer's connection is reset (UNAVAILABLE), so it
sends those batches again. With ``enable.idempotence=true`` the broker recognises the
resent batches by producer id and sequence and answers them with their first offsets: the
log holds every record exactly once, in order, at the offsets the producer was told. The
control, without idempotence, loses replies the same way and finds records written twice:
the replies were lost after the append.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from broker_processes import (
    BrokerProcess,
    consume_all,
    create_topic,
    stored_records,
    wait_partition,
)
from dropping_proxy import DroppingProxy
from highwater.client.admin import NewTopic
from highwater.client.producer import AsyncProducer, RecordMetadata
from highwater.rpc.endpoints import free_loopback_ports
from quorum_processes import Controller

pytestmark = pytest.mark.timeout(120)

BROKER = 41
RECORDS = 120
DROPPED_REPLIES = 3


@dataclass
class ProxiedBroker:
    controller: Controller
    broker: BrokerProcess
    proxy: DroppingProxy


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[ProxiedBroker]:
    controller_port, broker_port, proxy_port = free_loopback_ports(3)
    controller = Controller(
        1,
        controller_port,
        f"1@127.0.0.1:{controller_port}",
        tmp_path / "controller",
        tmp_path / "controller.log",
    )
    broker = BrokerProcess(
        BROKER,
        broker_port,
        controller.address,
        tmp_path / "broker",
        tmp_path / "broker.log",
        advertised=f"127.0.0.1:{proxy_port}",
    )
    proxy = DroppingProxy(broker.address, proxy_port)
    try:
        await proxy.start()
        controller.start()
        broker.start()
        yield ProxiedBroker(controller, broker, proxy)
    finally:
        broker.kill()
        controller.kill()
        await proxy.close()


async def produce_through_lost_replies(
    proxied: ProxiedBroker, topic: str, *, idempotent: bool
) -> tuple[list[bytes], list[RecordMetadata]]:
    """Create ``topic`` (one replica), produce ``RECORDS`` records through the proxy while
    it loses ``DROPPED_REPLIES`` Produce replies; the values and their delivery reports."""
    broker, proxy = proxied.broker, proxied.proxy
    await create_topic(broker.address, NewTopic(topic, 1, 1))
    await wait_partition([broker], topic, lambda s: s.leader_id == BROKER, what="a leader")
    config = {
        "bootstrap.servers": proxy.address,
        "acks": "all",
        "enable.idempotence": idempotent,
        "batch.size": 256,  # a dozen records a batch: several Produce calls in flight
        "linger.ms": 0,
        "retry.backoff.ms": 20,
        "request.timeout.ms": 10_000,
    }
    values = [f"record-{i:04d}".encode() for i in range(RECORDS)]
    async with AsyncProducer(config) as producer:
        # The first record goes through untouched: metadata (the proxy is the leader's
        # address) and, when idempotent, the producer id.
        first = await producer.send(topic, values[0], partition=0)
        assert producer.cluster.leader_address(topic, 0) == proxy.address
        assert proxy.produce_replies_delivered == 1
        proxy.drop_produce_replies(DROPPED_REPLIES)
        futures = [producer.produce(topic, value, partition=0) for value in values[1:]]
        reports = [first, *await asyncio.wait_for(asyncio.gather(*futures), 60)]
    assert proxy.produce_replies_dropped == DROPPED_REPLIES
    return values, reports


async def test_an_idempotent_producer_writes_each_record_once_when_replies_are_lost(
    proxied: ProxiedBroker,
) -> None:
    topic = "idempotent"
    values, reports = await produce_through_lost_replies(proxied, topic, idempotent=True)

    # Every record once, in order, at the offset its delivery report gave.
    assert [r.offset for r in reports] == list(range(RECORDS))
    stored = stored_records(proxied.broker.partition_dir(topic))
    assert [(offset, value) for offset, _, value in stored] == list(enumerate(values))
    assert await consume_all(proxied.proxy.address, topic) == values


async def test_without_idempotence_the_same_lost_replies_write_records_twice(
    proxied: ProxiedBroker,
) -> None:
    topic = "not-idempotent"
    values, _ = await produce_through_lost_replies(proxied, topic, idempotent=False)

    stored = [value for _, _, value in stored_records(proxied.broker.partition_dir(topic))]
    copies = Counter(stored)
    assert set(copies) == set(values), "a record was lost"
    duplicated = [value for value, count in copies.items() if count > 1]
    assert duplicated, "no record was written twice: the replies were not lost after the append"
    assert len(stored) > len(values)
