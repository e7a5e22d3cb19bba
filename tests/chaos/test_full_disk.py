"""A broker whose disk fills up in the middle of an append, then gets its space back.

The chaos harness's ``disk`` fault found this: an append that failed part-way with ENOSPC
left a torn batch at the tail of the leader's active segment; records appended once the
disk had room again went after the torn bytes and were acknowledged (acks=all), but every
Fetch at the torn position failed (``CorruptSegmentError``), so no consumer could read
them. The broker now cuts a failed write back to the last whole batch and answers
``KAFKA_STORAGE_ERROR``. The test: one controller and one broker whose data directory is
a small tmpfs (the harness's :class:`SmallDisks`, which needs root); records before the
disk fills and after it has room again are all read back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from highwater.chaos.cluster import Cluster
from highwater.chaos.faults import SmallDisks
from highwater.chaos.network import Network
from highwater.client.admin import AdminClient, NewTopic, TopicExistsError
from highwater.client.consumer import OFFSET_BEGINNING, AsyncConsumer, TopicPartition
from highwater.client.producer import AsyncProducer
from highwater.errors import HighwaterError

pytestmark = pytest.mark.timeout(180)

TOPIC = "full"


@pytest.fixture
def one_broker(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path / "cluster", Network(), controllers=1, brokers=1, coordinators=0)
    disks = SmallDisks()
    try:
        broker = cluster.brokers[0]
        assert disks.mount(broker.data_dir) is None, "a small tmpfs could not be mounted"
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        disks.close()


async def produce(bootstrap: str, values: list[bytes], timeout_ms: int = 15_000) -> list[int]:
    """Offsets of the values that were acknowledged (acks=all, idempotent)."""
    config = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 50,
        "request.timeout.ms": 5000,
        "delivery.timeout.ms": timeout_ms,
    }
    async with AsyncProducer(config) as producer:
        futures = [producer.produce(TOPIC, value, partition=0) for value in values]
        results = await asyncio.gather(*futures, return_exceptions=True)
    return [r.offset for r in results if not isinstance(r, BaseException)]


async def read_all(bootstrap: str, count: int) -> list[bytes | None]:
    """Up to ``count`` records from the partition's beginning: what a consumer reads of them
    within 20 s."""
    values: list[bytes | None] = []
    async with AsyncConsumer({"bootstrap.servers": bootstrap}) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(20):
                while len(values) < count:
                    message = await consumer.poll(1.0)
                    if message is None:
                        continue
                    assert message.error() is None, message.error()
                    values.append(message.value())
    return values


async def test_a_broker_recovers_from_a_full_disk_without_losing_acknowledged_records(
    one_broker: Cluster,
) -> None:
    bootstrap = one_broker.bootstrap
    async with asyncio.timeout(60), AdminClient(bootstrap, request_timeout_s=10) as admin:
        while True:
            try:
                results = await admin.create_topics([NewTopic(TOPIC, 1, 1)])
                error = results[TOPIC].error
                if error is None or isinstance(error, TopicExistsError):
                    break
            except HighwaterError:
                pass
            await asyncio.sleep(0.3)
    before = [f"before-{i}".encode() * 20 for i in range(20)]
    assert len(await produce(bootstrap, before)) == len(before)

    data_dir = one_broker.brokers[0].data_dir
    await asyncio.to_thread(SmallDisks.fill, data_dir)
    # A batch larger than the space left: its write fails part-way.
    await produce(bootstrap, [f"full-{i}".encode() * 400 for i in range(10)], timeout_ms=8000)
    SmallDisks.free(data_dir)

    after = [f"after-{i}".encode() for i in range(5)]
    acknowledged = await produce(bootstrap, after)
    assert len(acknowledged) == len(after), "no write is acknowledged once the disk has room"
    values = await read_all(bootstrap, acknowledged[-1] + 1)
    assert values[: len(before)] == before, "acknowledged records cannot be read"
    read_after = [v for v in values if v is not None and v.startswith(b"after-")]
    assert read_after == after, "records acknowledged after the disk had room are unreadable"
