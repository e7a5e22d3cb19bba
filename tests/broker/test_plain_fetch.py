"""Fetches in RECORD_FORMAT_PLAIN: the broker decodes and decompresses the batches it
would have sent, so a client without a RecordBatch v2 codec reads records as messages.

Each case checks the plain answer against the batches a BATCHES fetch of the same request
returns, decoded by the project's codec: the same records (offset, timestamp and its type,
key, value, headers, leader epoch), from the fetch offset on, under the same max_bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from broker_roles import leads
from embedded_servers import free_port
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.embedded import EmbeddedServer
from highwater.records import Compression, SimpleRecord, build_batch, iter_batches
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)

Plain = tuple[int, int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[broker_pb2_grpc.BrokerStub]:
    address = f"127.0.0.1:{free_port()}"
    server = EmbeddedServer(listen=address, data_dir=tmp_path)
    await server.start()
    await server.broker.wait_unfenced()
    try:
        async with ControllerClient([address]) as admin:
            topics = (
                m.CreatableTopic("create-time", 1, 1),
                m.CreatableTopic(
                    "append-time", 1, 1, configs={"message.timestamp.type": "LogAppendTime"}
                ),
            )
            reply = await admin.create_topics(m.CreateTopicsRequest(topics))
        assert all(t.error == ErrorCode.NONE for t in reply.topics), reply
        for _ in range(200):
            if all(leads(server.broker, t.name, 0) for t in topics):
                break
            await asyncio.sleep(0.02)
        async with grpc.aio.insecure_channel(address) as channel:
            yield broker_pb2_grpc.BrokerStub(channel)
    finally:
        await server.stop()


async def produce(broker: broker_pb2_grpc.BrokerStub, topic: str) -> None:
    """Three batches, each with its own codec: keys, tombstones, headers, timestamps."""
    batches = [
        build_batch(
            [
                SimpleRecord(key=b"k0", value=b"v0", timestamp=1_000),
                SimpleRecord(key=None, value=b"v1", headers=(("h", b"x"), ("n", None))),
            ],
            compression=Compression.NONE,
        ),
        build_batch(
            [SimpleRecord(key=b"k2", value=None, timestamp=2_000)] * 3,
            compression=Compression.GZIP,
        ),
        build_batch(
            [SimpleRecord(key=f"k{i}".encode(), value=b"z" * 100) for i in range(5)],
            compression=Compression.ZSTD,
        ),
    ]
    for data in batches:
        request = pb.ProduceRequest(acks=-1)
        request.topics.add(topic=topic).partitions.add(partition=0, record_batches=data)
        answer = (await broker.Produce(request)).topics[0].partitions[0]
        assert answer.error == ErrorCode.NONE, answer


async def fetch(
    broker: broker_pb2_grpc.BrokerStub,
    topic: str,
    offset: int,
    record_format: int,
    max_bytes: int | None = None,
) -> pb.FetchPartitionResponse:
    request = pb.FetchRequest(record_format=record_format)  # type: ignore[arg-type]
    if max_bytes is not None:
        request.max_bytes = max_bytes
    request.topics.add(topic=topic).partitions.add(partition=0, fetch_offset=offset)
    return (await broker.Fetch(request)).topics[0].partitions[0]


def from_plain(answer: pb.FetchPartitionResponse) -> list[Plain]:
    return [
        (
            r.offset,
            r.timestamp_ms,
            int(r.timestamp_type) - 1,
            r.key if r.HasField("key") else None,
            r.value if r.HasField("value") else None,
            tuple((h.key, h.value if h.HasField("value") else None) for h in r.headers),
            r.leader_epoch,
        )
        for r in answer.plain_records
    ]


def from_batches(answer: pb.FetchPartitionResponse, offset: int) -> list[Plain]:
    return [
        (
            r.offset,
            r.timestamp,
            int(batch.timestamp_type),
            r.key,
            r.value,
            tuple(r.headers),
            batch.partition_leader_epoch,
        )
        for batch in iter_batches(answer.records)
        for r in batch.records()
        if r.offset >= offset
    ]


@pytest.mark.parametrize("topic", ["create-time", "append-time"])
@pytest.mark.parametrize("offset", [0, 1, 3, 9, 10])
async def test_plain_records_are_the_batches_records_from_the_fetch_offset(
    broker: broker_pb2_grpc.BrokerStub, topic: str, offset: int
) -> None:
    await produce(broker, topic)
    plain = await fetch(broker, topic, offset, pb.RECORD_FORMAT_PLAIN)
    batches = await fetch(broker, topic, offset, pb.RECORD_FORMAT_BATCHES)
    assert plain.error == batches.error == ErrorCode.NONE
    assert plain.records == b""  # the batches are not sent as well
    assert (plain.high_watermark, plain.log_start_offset) == (10, 0)
    assert from_plain(plain) == from_batches(batches, offset)
    assert [r.offset for r in plain.plain_records] == list(range(offset, 10))
    if topic == "append-time":
        assert {r.timestamp_type for r in plain.plain_records} <= {
            pb.TIMESTAMP_TYPE_LOG_APPEND_TIME
        }
    elif offset == 0:
        first = plain.plain_records[0]
        assert (first.key, first.value, first.timestamp_ms) == (b"k0", b"v0", 1_000)
        assert first.timestamp_type == pb.TIMESTAMP_TYPE_CREATE_TIME
        assert not plain.plain_records[1].HasField("key")
        assert [(h.key, h.HasField("value")) for h in plain.plain_records[1].headers] == [
            ("h", True),
            ("n", False),
        ]
        assert not plain.plain_records[2].HasField("value")  # a tombstone


async def test_plain_fetches_count_max_bytes_in_the_answers_records(
    broker: broker_pb2_grpc.BrokerStub,
) -> None:
    await produce(broker, "create-time")
    # One byte: the first whole batch in batches, the first record in plain records.
    plain = await fetch(broker, "create-time", 0, pb.RECORD_FORMAT_PLAIN, max_bytes=1)
    batches = await fetch(broker, "create-time", 0, pb.RECORD_FORMAT_BATCHES, max_bytes=1)
    assert from_plain(plain) == from_batches(batches, 0)[:1]
    assert [r.offset for r in plain.plain_records] == [0]
    everything = await fetch(broker, "create-time", 0, pb.RECORD_FORMAT_PLAIN)
    first_two = pb.FetchPartitionResponse()
    first_two.plain_records.extend(everything.plain_records[:2])
    limit = first_two.ByteSize()
    plain = await fetch(broker, "create-time", 0, pb.RECORD_FORMAT_PLAIN, max_bytes=limit)
    assert [r.offset for r in plain.plain_records] == [0, 1]
    plain = await fetch(broker, "create-time", 0, pb.RECORD_FORMAT_PLAIN, max_bytes=limit - 1)
    assert [r.offset for r in plain.plain_records] == [0]  # cut inside the first batch


async def test_compressed_records_come_in_answers_a_4_mib_receiver_takes(
    broker: broker_pb2_grpc.BrokerStub,
) -> None:
    """Four zstd batches of 8,000 alike JSON-ish records: 20 KB each as batches, 36 MB as
    plain records. Counted by their batches, one fetch with max_bytes unset (1 MiB) held all
    of them and failed RESOURCE_EXHAUSTED in every receiver with gRPC's default 4 MiB limit,
    fetch after fetch. Counted by what they add to the answer, each answer holds 1 MiB of
    records and every record comes, in order."""
    value = b'{"user": "someone", "event": "click", "page": "/home"} ' * 20
    for _ in range(4):
        data = build_batch([SimpleRecord(value=value)] * 8000, compression=Compression.ZSTD)
        assert len(data) < 30_000
        request = pb.ProduceRequest(acks=-1)
        request.topics.add(topic="create-time").partitions.add(partition=0, record_batches=data)
        answer = (await broker.Produce(request)).topics[0].partitions[0]
        assert answer.error == ErrorCode.NONE, answer
    offset = 0
    sizes = []
    while offset < 32_000:
        answer = await fetch(broker, "create-time", offset, pb.RECORD_FORMAT_PLAIN)
        assert answer.error == ErrorCode.NONE, answer
        offsets = [r.offset for r in answer.plain_records]
        assert offsets == list(range(offset, offset + len(offsets))) and offsets
        assert all(r.value == value for r in answer.plain_records)
        sizes.append(answer.ByteSize())
        offset += len(offsets)
    assert max(sizes) <= 1 << 20
    assert len(sizes) >= 30


async def test_an_unknown_record_format_is_invalid_argument(
    broker: broker_pb2_grpc.BrokerStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await fetch(broker, "create-time", 0, 7)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "record_format 7" in (raised.value.details() or "")
