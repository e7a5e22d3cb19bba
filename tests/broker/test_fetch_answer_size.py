"""Fetch answers fit the receiver: an unset ``max_bytes`` gives an answer under gRPC's 4 MiB
default receive limit, a larger ``max_bytes`` is held to the broker's ``fetch.max.bytes``,
and what does not fit comes in the next fetches, none of it lost.

Eight partitions of about 1.5 MiB each (batches of 256 KiB) are read by a client whose
channel keeps gRPC's default 4 MiB receive limit, as grpc-js, grpc-go and grpc-java do.
Before the limits, an unset max_bytes meant 50 MiB and every partition also got at least
one batch past the budget, so the first fetch of all eight came to about 12 MiB and failed
RESOURCE_EXHAUSTED on the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc.aio
import pytest
from broker_roles import leads
from embedded_servers import free_port
from highwater.broker.service import BrokerSettings
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.embedded import EmbeddedServer
from highwater.records import SimpleRecord, build_batch, iter_batches
from highwater.rpc.channels import open_channel
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(120)

TOPIC = "wide"
PARTITIONS = 8
BATCHES_PER_PARTITION = 6
RECORDS_PER_BATCH = 4
VALUE = b"v" * (64 * 1024)
GRPC_DEFAULT_RECEIVE_LIMIT = 4 * 1024 * 1024
FETCH_MAX_BYTES = 3 * 1024 * 1024
BATCH_BYTES = RECORDS_PER_BATCH * len(VALUE) + 1024


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    server = EmbeddedServer(
        listen=f"127.0.0.1:{free_port()}",
        data_dir=tmp_path,
        broker_settings=BrokerSettings(fetch_max_bytes=FETCH_MAX_BYTES),
    )
    await server.start()
    await server.broker.wait_unfenced()
    try:
        async with ControllerClient([server.listen]) as admin:
            reply = await admin.create_topics(
                m.CreateTopicsRequest((m.CreatableTopic(TOPIC, PARTITIONS, 1),))
            )
        assert reply.topics[0].error == ErrorCode.NONE, reply
        for _ in range(200):
            if all(leads(server.broker, TOPIC, p) for p in range(PARTITIONS)):
                break
            await asyncio.sleep(0.02)
        yield server
    finally:
        await server.stop()


async def fill(broker: broker_pb2_grpc.BrokerStub) -> None:
    for partition in range(PARTITIONS):
        for batch in range(BATCHES_PER_PARTITION):
            records = [SimpleRecord(key=f"{batch}-{i}".encode(), value=VALUE) for i in range(4)]
            request = pb.ProduceRequest(acks=1)
            request.topics.add(topic=TOPIC).partitions.add(
                partition=partition, record_batches=build_batch(records)
            )
            reply = await broker.Produce(request, timeout=10)
            assert reply.topics[0].partitions[0].error == ErrorCode.NONE


async def read_everything(
    broker: broker_pb2_grpc.BrokerStub, max_bytes: int | None
) -> tuple[dict[int, list[bytes | None]], list[int]]:
    """Every record of every partition through fetches of all eight partitions at once, and
    the size of each answer's records."""
    positions = dict.fromkeys(range(PARTITIONS), 0)
    keys: dict[int, list[bytes | None]] = {p: [] for p in range(PARTITIONS)}
    sizes: list[int] = []
    end = BATCHES_PER_PARTITION * RECORDS_PER_BATCH
    while any(offset < end for offset in positions.values()):
        request = pb.FetchRequest() if max_bytes is None else pb.FetchRequest(max_bytes=max_bytes)
        topic = request.topics.add(topic=TOPIC)
        for partition, offset in positions.items():
            topic.partitions.add(partition=partition, fetch_offset=offset)
        reply = await broker.Fetch(request, timeout=10)
        sizes.append(sum(len(a.records) for a in reply.topics[0].partitions))
        for answer in reply.topics[0].partitions:
            assert answer.error == ErrorCode.NONE, answer
            for batch in iter_batches(answer.records):
                for record in batch.records():
                    keys[answer.partition].append(record.key)
                positions[answer.partition] = batch.next_offset
    return keys, sizes


@pytest.mark.parametrize(
    ("max_bytes", "limit"),
    [(None, 1024 * 1024), (64 * 1024 * 1024, FETCH_MAX_BYTES)],
    ids=["max_bytes unset: 1 MiB", "max_bytes 64 MiB: fetch.max.bytes"],
)
async def test_answers_fit_the_default_receive_limit_and_nothing_is_lost(
    server: EmbeddedServer, max_bytes: int | None, limit: int
) -> None:
    async with grpc.aio.insecure_channel(server.listen) as channel:  # 4 MiB receive limit
        broker = broker_pb2_grpc.BrokerStub(channel)
        await fill(broker)
        keys, sizes = await read_everything(broker, max_bytes)
    expected = [
        f"{b}-{i}".encode() for b in range(BATCHES_PER_PARTITION) for i in range(RECORDS_PER_BATCH)
    ]
    assert keys == {p: expected for p in range(PARTITIONS)}
    # Each answer holds at most one batch more than its budget, and fits the receive limit.
    assert max(sizes) <= limit + BATCH_BYTES < GRPC_DEFAULT_RECEIVE_LIMIT
    assert len(sizes) > 1  # the answer that did not fit was split into several


BUSY_BATCHES = 56
BUSY_BATCH_VALUE = b"b" * 1_010_000
LARGE_BATCH_VALUE = b"L" * (12 << 20)


async def test_a_later_partitions_large_batch_waits_rather_than_overflow_the_message(
    tmp_path: Path,
) -> None:
    """A fetch of 55 MiB (the broker's ``fetch.max.bytes``) whose first partition fills
    53.9 MiB and whose second holds a 12 MiB batch (its topic takes up to 16 MiB): passing
    the second partition's share by that batch would make a 65.9 MiB answer, which no gRPC
    message carries (the server refused to send it, RESOURCE_EXHAUSTED, and the consumer
    asked again for ever). The answer holds the first partition's records alone, and the
    large batch comes in the next fetch. A partition of a topic whose batches are small
    still gets its first batch past its share while the answer has room."""
    server = EmbeddedServer(listen=f"127.0.0.1:{free_port()}", data_dir=tmp_path)
    await server.start()
    try:
        await server.broker.wait_unfenced()
        async with ControllerClient([server.listen]) as admin:
            reply = await admin.create_topics(
                m.CreateTopicsRequest(
                    (
                        m.CreatableTopic("busy", 1, 1),
                        m.CreatableTopic("large", 1, 1, configs={"max.message.bytes": "16777216"}),
                        m.CreatableTopic("small", 1, 1),
                    )
                )
            )
        assert all(t.error == ErrorCode.NONE for t in reply.topics), reply
        for _ in range(200):
            if all(leads(server.broker, t, 0) for t in ("busy", "large", "small")):
                break
            await asyncio.sleep(0.02)
        async with open_channel(server.listen) as channel:  # the 64 MiB message limit
            broker = broker_pb2_grpc.BrokerStub(channel)

            async def produce(topic: str, value: bytes) -> None:
                request = pb.ProduceRequest(acks=1)
                request.topics.add(topic=topic).partitions.add(
                    partition=0, record_batches=build_batch([SimpleRecord(value=value)])
                )
                answer = await broker.Produce(request, timeout=30)
                assert answer.topics[0].partitions[0].error == ErrorCode.NONE, answer

            for _ in range(BUSY_BATCHES):
                await produce("busy", BUSY_BATCH_VALUE)
            await produce("large", LARGE_BATCH_VALUE)
            await produce("small", BUSY_BATCH_VALUE)

            def fetch(*partitions: tuple[str, int]) -> pb.FetchRequest:
                request = pb.FetchRequest(max_bytes=55 << 20, max_wait_ms=0)
                for topic, partition_max_bytes in partitions:
                    request.topics.add(topic=topic).partitions.add(
                        partition=0, fetch_offset=0, partition_max_bytes=partition_max_bytes
                    )
                return request

            def records(reply: pb.FetchResponse) -> dict[str, int]:
                for topic in reply.topics:
                    assert topic.partitions[0].error == ErrorCode.NONE, topic
                return {t.topic: len(t.partitions[0].records) for t in reply.topics}

            first = records(await broker.Fetch(fetch(("busy", 55 << 20), ("large", 1)), timeout=30))
            assert first["busy"] > 53 << 20 and first["large"] == 0
            second = records(await broker.Fetch(fetch(("large", 1)), timeout=30))
            assert second["large"] > len(LARGE_BATCH_VALUE)
            # 10 MiB of the busy partition, then the small topic's 1 MB batch past its share.
            third = records(await broker.Fetch(fetch(("busy", 10 << 20), ("small", 1)), timeout=30))
            assert third["busy"] <= 10 << 20 and third["small"] > len(BUSY_BATCH_VALUE)

            # The large topic's max.message.bytes lowered to 1 MiB: its 12 MiB batch stays,
            # and still must not ride past the busy partition's 53.9 MiB.
            async with ControllerClient([server.listen]) as admin:
                altered = await admin.alter_configs(
                    m.AlterConfigsRequest(
                        (
                            m.AlterConfigsResource(
                                m.ConfigResourceType.TOPIC,
                                "large",
                                (m.AlterableConfig("max.message.bytes", value="1048576"),),
                            ),
                        )
                    )
                )
            assert altered.resources[0].error == ErrorCode.NONE, altered
            for _ in range(200):
                if server.broker.partitions.get("large", 0).log.config.max_message_bytes < 2 << 20:
                    break
                await asyncio.sleep(0.02)
            lowered = records(
                await broker.Fetch(fetch(("busy", 55 << 20), ("large", 1)), timeout=30)
            )
            assert lowered["busy"] > 53 << 20 and lowered["large"] == 0
            alone = records(await broker.Fetch(fetch(("large", 1)), timeout=30))
            assert alone["large"] > len(LARGE_BATCH_VALUE)
    finally:
        await server.stop()
