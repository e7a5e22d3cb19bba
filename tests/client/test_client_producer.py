"""The client Producer against a real in-process EmbeddedServer: batching, keys, compression,
idempotence, delivery reports, errors, the blocking wrapper and configuration checks.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc.aio
import pyarrow as pa
import pytest
from broker_roles import leads
from embedded_servers import free_port
from highwater.client.cluster import (
    ClusterMetadata,
    UnknownTopicOrPartitionError,
)
from highwater.client.producer import (
    PRODUCER_CONFIG_DEF,
    AsyncProducer,
    BatchMetadata,
    DeliveryTimeoutError,
    Message,
    Producer,
    ProducerClosedError,
    ProducerConfig,
    RecordMetadata,
    RecordTooLargeError,
)
from highwater.client.producer.accumulator import MAX_PRODUCER_EPOCH
from highwater.client.security_config import SECURITY_CONFIG_KEYS
from highwater.config.definition import NO_DEFAULT
from highwater.controller_api import messages as m
from highwater.controller_api.client import ControllerClient
from highwater.embedded import EmbeddedServer
from highwater.errors import HighwaterError, InvalidConfigError
from highwater.records import Compression, RecordBatch, iter_batches
from highwater.records.partitioner import UnknownPartitionError, partition_for_key
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)


@dataclass
class Cluster:
    """A running EmbeddedServer with a raw broker stub and an admin client."""

    address: str
    server: EmbeddedServer
    broker: broker_pb2_grpc.BrokerStub
    admin: ControllerClient

    async def create_topic(self, name: str, partitions: int = 1, **configs: str) -> None:
        """Create a topic and wait until the broker leads all its partitions."""
        reply = await self.admin.create_topics(
            m.CreateTopicsRequest((m.CreatableTopic(name, partitions, 1, configs=dict(configs)),))
        )
        assert reply.topics[0].error == ErrorCode.NONE, reply
        for _ in range(200):
            described = await self.broker.Metadata(pb.MetadataRequest(topics=[name]))
            found = described.topics[0].partitions
            if (
                len(found) == partitions
                and all(p.leader_id == 1 for p in found)
                and all(leads(self.server.broker, name, p) for p in range(partitions))
            ):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{name} got no leader")

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and wait until Metadata no longer names it."""
        reply = await self.admin.delete_topics(m.DeleteTopicsRequest(names=(name,)))
        assert all(t.error == ErrorCode.NONE for t in reply.topics), reply
        for _ in range(200):
            described = await self.broker.Metadata(pb.MetadataRequest(topics=[name]))
            if described.topics[0].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{name} was not deleted")

    async def batches(self, topic: str, partition: int = 0) -> list[RecordBatch]:
        """Every batch of the partition, read with the broker's Fetch."""
        request = pb.FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=1 << 24)
        request.topics.add(topic=topic).partitions.add(
            partition=partition,
            current_leader_epoch=-1,
            fetch_offset=0,
            partition_max_bytes=1 << 24,
        )
        answer = (await self.broker.Fetch(request)).topics[0].partitions[0]
        assert answer.error == ErrorCode.NONE, answer
        return list(iter_batches(answer.records))

    async def values(self, topic: str, partition: int = 0) -> list[bytes | None]:
        """Every record value of the partition, in offset order."""
        return [r.value for b in await self.batches(topic, partition) for r in b.records()]

    def config(self, **overrides: object) -> dict[str, object]:
        """A producer config for this server; ``linger_ms=0`` stands for ``linger.ms``."""
        config: dict[str, object] = {"bootstrap.servers": self.address}
        config.update({k.replace("_", "."): v for k, v in overrides.items()})
        return config


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """An EmbeddedServer on a free loopback port, stopped after the test."""
    address = f"127.0.0.1:{free_port()}"
    server = EmbeddedServer(listen=address, data_dir=tmp_path)
    await server.start()
    await server.broker.wait_unfenced()
    try:
        async with (
            grpc.aio.insecure_channel(address) as channel,
            ControllerClient([address]) as admin,
        ):
            yield Cluster(address, server, broker_pb2_grpc.BrokerStub(channel), admin)
    finally:
        await server.stop()


# --- cluster metadata -----------------------------------------------------------------------


async def test_cluster_metadata_knows_leaders_and_forgets_stale_ones(cluster: Cluster) -> None:
    await cluster.create_topic("meta", partitions=3)
    metadata = ClusterMetadata(cluster.address)
    try:
        info = await metadata.topic_info("meta")
        assert info.num_partitions == 3
        assert metadata.brokers == {1: cluster.address}
        assert metadata.leader_address("meta", 2) == cluster.address
        assert metadata.leader_epoch("meta", 0) >= 0
        assert metadata.handle_error("meta", 1, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        assert not metadata.handle_error("meta", 1, ErrorCode.MESSAGE_TOO_LARGE)
        assert metadata.needs_refresh("meta")
        with pytest.raises(HighwaterError):
            metadata.leader_address("meta", 1)
        await metadata.refresh(["meta"])
        assert metadata.leader_address("meta", 1) == cluster.address
        with pytest.raises(UnknownTopicOrPartitionError):
            await metadata.topic_info("nope")
        # One channel per broker address, reused.
        assert metadata.stub(cluster.address) is metadata.stub(cluster.address)
    finally:
        await metadata.close()


# --- producing ------------------------------------------------------------------------------


async def test_records_arrive_in_order_and_callbacks_get_offsets(cluster: Cluster) -> None:
    await cluster.create_topic("orders")
    reports: list[tuple[BaseException | None, int, bytes | None]] = []

    def on_delivery(err: BaseException | None, msg: Message) -> None:
        assert msg.topic() == "orders"
        reports.append((err, msg.offset(), msg.value()))

    async with AsyncProducer(cluster.config(linger_ms=0)) as producer:
        futures = [
            producer.produce("orders", f"v{i}".encode(), on_delivery=on_delivery) for i in range(50)
        ]
        assert await producer.flush(10) == 0
        metadata = [f.result() for f in futures]
    assert [md.offset for md in metadata] == list(range(50))
    assert all(md.partition == 0 and md.topic == "orders" for md in metadata)
    assert reports == [(None, i, f"v{i}".encode()) for i in range(50)]
    assert await cluster.values("orders") == [f"v{i}".encode() for i in range(50)]


async def test_send_returns_metadata_and_keeps_key_headers_timestamp(cluster: Cluster) -> None:
    await cluster.create_topic("meta-data")
    async with AsyncProducer(cluster.config()) as producer:
        md = await producer.send(
            "meta-data", "value", key="key", headers={"h": "x", "n": None}, timestamp=1234
        )
    assert md == RecordMetadata("meta-data", 0, 0, 1234)
    [batch] = await cluster.batches("meta-data")
    [record] = batch.records()
    assert (record.key, record.value, record.timestamp) == (b"key", b"value", 1234)
    assert list(record.headers) == [("h", b"x"), ("n", None)]


async def test_a_negative_timestamp_is_refused_at_produce(cluster: Cluster) -> None:
    """As Kafka's ``ProducerRecord`` (IllegalArgumentException): a timestamp below 0 is
    refused before the record is queued, by every way of producing in Python."""
    await cluster.create_topic("negative-ts")
    async with AsyncProducer(cluster.config(linger_ms=1000)) as producer:
        # The Python produce(), which the compiled lane stands for.
        producer._lane = None
        producer.__dict__.pop("produce", None)
        producer.__dict__.pop("produce_without_handle", None)
        kept = producer.produce("negative-ts", b"ok", partition=0)  # its batch stays open
        for timestamp in (-5, -1):
            with pytest.raises(ValueError, match=f"Invalid timestamp: {timestamp}"):
                producer.produce("negative-ts", b"v", partition=0, timestamp=timestamp)
            with pytest.raises(ValueError, match="non-negative"):
                producer.produce_without_handle("negative-ts", b"v", timestamp=timestamp)
        with pytest.raises(ValueError, match="non-negative"):
            await producer.produce_batch("negative-ts", {"value": [b"v"]}, timestamp=-1)
        assert await producer.flush(10) == 0
        assert (await kept).offset == 0

    def blocking() -> None:
        with (
            Producer(cluster.config()) as blocking_producer,
            pytest.raises(ValueError, match="non-negative"),
        ):
            blocking_producer.produce("negative-ts", b"v", timestamp=-5)

    await asyncio.to_thread(blocking)
    assert await cluster.values("negative-ts") == [b"ok"]


async def test_keyed_records_go_to_the_murmur2_partition(cluster: Cluster) -> None:
    await cluster.create_topic("keyed", partitions=4)
    keys = [f"user-{i}".encode() for i in range(40)]
    async with AsyncProducer(cluster.config()) as producer:
        futures = [producer.produce("keyed", b"v", key=k) for k in keys]
        await producer.flush(10)
    for key, future in zip(keys, futures, strict=True):
        assert future.result().partition == partition_for_key(key, 4)
    for p in range(4):
        stored = [r.key for b in await cluster.batches("keyed", p) for r in b.records()]
        assert stored == [k for k in keys if partition_for_key(k, 4) == p]


async def test_explicit_partition_is_used_and_a_bad_one_is_reported(cluster: Cluster) -> None:
    await cluster.create_topic("explicit", partitions=2)
    async with AsyncProducer(cluster.config()) as producer:
        ok = producer.produce("explicit", b"x", partition=1)
        bad = producer.produce("explicit", b"y", partition=7)
        await producer.flush(10)
    assert ok.result().partition == 1
    with pytest.raises(UnknownPartitionError):
        bad.result()


async def test_records_produced_within_linger_share_a_batch(cluster: Cluster) -> None:
    await cluster.create_topic("lingering")
    # A long linger: nothing is sent before flush(), so all ten records share one batch.
    async with AsyncProducer(cluster.config(linger_ms=60000)) as producer:
        futures = [producer.produce("lingering", b"%d" % i) for i in range(10)]
        await asyncio.sleep(0)
        assert not any(f.done() for f in futures)
        await producer.flush(10)
    batches = await cluster.batches("lingering")
    assert [b.records_count for b in batches] == [10]


async def test_handles_resolve_lazily_and_batch_reports_cover_the_same_offsets(
    cluster: Cluster,
) -> None:
    """produce() returns a handle without a future: awaited before or after its delivery,
    read with result(), or gathered, it gives the offsets the per-record callbacks and the
    producer's per-batch reports give; a record that fails alone fails only its handle."""
    await cluster.create_topic("handles", partitions=2)
    reports: list[tuple[BaseException | None, BatchMetadata]] = []
    messages: list[Message] = []
    config = cluster.config(batch_size=400, linger_ms=60000)

    def report(error: BaseException | None, batch: BatchMetadata) -> None:
        reports.append((error, batch))

    async with AsyncProducer(config, on_delivery_batch=report) as producer:
        waited = asyncio.ensure_future(producer.produce("handles", b"first", partition=0))
        handles = [
            producer.produce(
                "handles",
                b"%03d" % i + b"." * 40,
                partition=i % 2,
                on_delivery=(lambda _e, msg: messages.append(msg)) if i % 3 == 0 else None,
            )
            for i in range(40)
        ]
        early = handles[5].future()  # a future made before the delivery
        bad = producer.produce("handles", b"x", partition=7)
        assert not handles[0].done() and not early.done()
        with pytest.raises(asyncio.InvalidStateError):
            handles[0].result()
        assert await producer.flush(10) == 0
        assert (await waited).offset == 0
        assert await early == handles[5].result()
        assert await asyncio.gather(*handles) == [h.result() for h in handles]
        done, _ = await asyncio.wait(handles[:3], timeout=5)  # takes handles as futures
        assert done == set(handles[:3])
        assert isinstance(bad.exception(), UnknownPartitionError) and bad.done()
        with pytest.raises(UnknownPartitionError):
            await bad
    results = [h.result() for h in handles]
    assert all(h.exception() is None and not h.cancelled() for h in handles)
    assert [r.offset for r in results if r.partition == 0] == list(range(1, 21))
    assert [r.offset for r in results if r.partition == 1] == list(range(20))
    assert all(isinstance(r, RecordMetadata) and r.topic == "handles" for r in results)
    by_record = {(m.partition(), m.offset()): m.value() for m in messages}
    assert by_record == {
        (results[i].partition, results[i].offset): b"%03d" % i + b"." * 40 for i in range(0, 40, 3)
    }
    failed = [(e, b) for e, b in reports if e is not None]
    assert len(failed) == 1 and isinstance(failed[0][0], UnknownPartitionError)
    assert (failed[0][1].partition, failed[0][1].record_count) == (7, 1)
    covered = sorted(
        (b.partition, offset)
        for e, b in reports
        if e is None
        for offset in range(b.offset, b.offset + b.record_count)
    )
    assert covered == sorted([(0, 0)] + [(r.partition, r.offset) for r in results])


async def test_batches_never_exceed_batch_size_except_for_one_large_record(
    cluster: Cluster,
) -> None:
    await cluster.create_topic("sized")
    async with AsyncProducer(cluster.config(batch_size=1000, linger_ms=60000)) as producer:
        for i in range(30):
            producer.produce("sized", bytes([i]) * 100)
        producer.produce("sized", b"L" * 5000)
        producer.produce("sized", b"after")
        await producer.flush(10)
    batches = await cluster.batches("sized")
    assert len(batches) > 3
    large = [b for b in batches if b.size > 1000]
    assert len(large) == 1 and large[0].records_count == 1
    assert [r.value for r in large[0].records()] == [b"L" * 5000]
    values = [r.value for b in batches for r in b.records()]
    assert values == [bytes([i]) * 100 for i in range(30)] + [b"L" * 5000, b"after"]


async def test_unkeyed_records_stick_to_one_partition_per_batch(cluster: Cluster) -> None:
    await cluster.create_topic("sticky", partitions=3)
    async with AsyncProducer(cluster.config(linger_ms=60000)) as producer:
        futures = [producer.produce("sticky", b"v") for _ in range(20)]
        await producer.flush(10)
    assert len({f.result().partition for f in futures}) == 1


async def test_produce_batch_encodes_columns_by_key_with_one_report_per_batch(
    cluster: Cluster,
) -> None:
    await cluster.create_topic("columns", partitions=3)
    keys = [None if i % 7 == 0 else f"key-{i}".encode() for i in range(300)]
    table = pa.table({"key": pa.array(keys, pa.binary()), "value": [f"v{i}" for i in range(300)]})
    reports: list[tuple[BaseException | None, BatchMetadata]] = []
    async with AsyncProducer(cluster.config(batch_size=1000, linger_ms=60000)) as producer:
        first = producer.produce("columns", b"first", partition=1)
        queued = await producer.produce_batch(
            "columns", table, timestamp=99, on_delivery_batch=lambda e, b: reports.append((e, b))
        )
        assert queued == 300
        assert await producer.produce_batch("columns", {"value": [b"a", None]}, partition=1) == 2
        with pytest.raises(ValueError, match="'headers'"):
            await producer.produce_batch("columns", {"value": [b"x"], "headers": [None]})
        with pytest.raises(TypeError, match="binary or string"):
            await producer.produce_batch("columns", pa.table({"value": [1, 2]}))
        with pytest.raises(UnknownTopicOrPartitionError):
            await producer.produce_batch("columns", {"value": [b"x"]}, partition=3)
        assert await producer.flush(10) == 0
    assert first.result().offset == 0
    assert all(e is None for e, _ in reports)
    assert sum(b.record_count for _, b in reports) == 300
    stored: dict[bytes | None, tuple[int, int, int]] = {}
    for p in range(3):
        for batch in await cluster.batches("columns", p):
            assert batch.size <= 1000
            for r in batch.records():
                stored[r.value] = (p, r.offset, r.timestamp)
    for i, key in enumerate(keys):
        p, offset, timestamp = stored[f"v{i}".encode()]
        assert timestamp == 99
        if key is not None:
            assert p == partition_for_key(key, 3)
        assert any(
            b.partition == p and b.offset <= offset < b.offset + b.record_count for _, b in reports
        )
    in_order = [r.value for b in await cluster.batches("columns", 1) for r in b.records()]
    assert in_order[0] == b"first" and in_order[-2:] == [b"a", None]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd", "none"])
async def test_compression_round_trips(cluster: Cluster, codec: str) -> None:
    await cluster.create_topic("squeezed")
    values = [(b"record %d " % i) * 20 for i in range(100)]
    async with AsyncProducer(cluster.config(compression_type=codec, linger_ms=60000)) as producer:
        for value in values:
            producer.produce("squeezed", value)
        assert await producer.flush(10) == 0
    batches = await cluster.batches("squeezed")
    assert {b.compression for b in batches} == {Compression.parse(codec)}
    assert [r.value for b in batches for r in b.records()] == values


async def test_acks_zero_and_one_deliver(cluster: Cluster) -> None:
    await cluster.create_topic("acks")
    async with AsyncProducer(cluster.config(acks=0)) as producer:
        assert producer.config.enable_idempotence is False
        assert (await producer.send("acks", b"a")).offset == -1
    async with AsyncProducer(cluster.config(acks="1")) as producer:
        assert (await producer.send("acks", b"b")).offset == 1
    assert await cluster.values("acks") == [b"a", b"b"]


# --- idempotence ----------------------------------------------------------------------------


async def test_idempotent_batches_carry_producer_id_and_growing_sequences(
    cluster: Cluster,
) -> None:
    await cluster.create_topic("idem")
    async with AsyncProducer(cluster.config(batch_size=300, linger_ms=60000)) as producer:
        for i in range(20):
            producer.produce("idem", b"%02d" % i + b"." * 50)
        await producer.flush(10)
        pid, epoch = producer.producer_id, producer.producer_epoch
    assert pid >= 0 and epoch >= 0
    batches = await cluster.batches("idem")
    assert len(batches) > 1
    assert {(b.producer_id, b.producer_epoch) for b in batches} == {(pid, epoch)}
    expected = 0
    for batch in batches:
        assert batch.base_sequence == expected
        expected += batch.records_count
    assert expected == 20


def answer_errors(producer: AsyncProducer, codes: Iterable[int]) -> deque[int]:
    """Make the producer read ``codes``, one per partition answer, in answers the broker gave
    with NONE: the batch was written, the producer hears of a failure (a lost reply, a
    leader that moved). Returns the codes not used yet."""
    pending = deque(codes)
    produce = producer.cluster.produce

    async def produce_with_errors(
        address: str, request: pb.ProduceRequest, timeout_s: float
    ) -> pb.ProduceResponse:
        reply = await produce(address, request, timeout_s)
        for topic in reply.topics:
            for answer in topic.partitions:
                if answer.error == ErrorCode.NONE and pending:
                    answer.error = pending.popleft()  # type: ignore[assignment]
        return reply

    producer.cluster.produce = produce_with_errors  # type: ignore[method-assign]
    return pending


async def test_a_batch_whose_reply_is_lost_is_resent_and_stored_once(cluster: Cluster) -> None:
    await cluster.create_topic("lost-reply")
    async with AsyncProducer(cluster.config(retry_backoff_ms=1)) as producer:
        first = await producer.send("lost-reply", b"zero")
        # The broker writes the batch, the producer never hears of it.
        answer_errors(producer, [ErrorCode.NETWORK_EXCEPTION])
        resent = await producer.send("lost-reply", b"one")
        last = await producer.send("lost-reply", b"two")
    assert (first.offset, resent.offset, last.offset) == (0, 1, 2)
    batches = await cluster.batches("lost-reply")
    assert [r.value for b in batches for r in b.records()] == [b"zero", b"one", b"two"]
    assert [b.base_sequence for b in batches] == [0, 1, 2]


async def test_a_batch_that_may_be_written_expires_without_giving_its_sequences_away(
    cluster: Cluster,
) -> None:
    """A batch whose reply is lost (the broker wrote it) and whose resends all fail until
    ``delivery.timeout.ms`` fails with DeliveryTimeoutError, as Kafka's does, although it
    may be in the log. The next batch must not take its sequence numbers: the broker would
    answer it as a duplicate of the expired one, and the producer would report as written
    records the log does not hold. It goes from sequence 0 under a new producer epoch."""
    await cluster.create_topic("expired")
    config = cluster.config(
        retry_backoff_ms=20, delivery_timeout_ms=600, request_timeout_ms=200, linger_ms=0
    )
    async with AsyncProducer(config) as producer:
        await producer.send("expired", b"zero")
        produce = producer.cluster.produce
        expired = producer.produce("expired", b"one")
        calls = 0

        async def lost_then_unreachable(
            address: str, request: pb.ProduceRequest, timeout_s: float
        ) -> pb.ProduceResponse:
            nonlocal calls
            calls += 1
            if expired.done():  # the broker is reachable again
                return await produce(address, request, timeout_s)
            if calls == 1:  # written, and the reply lost
                reply = await produce(address, request, timeout_s)
                reply.topics[0].partitions[0].error = ErrorCode.NETWORK_EXCEPTION
                return reply
            reply = pb.ProduceResponse()  # the leader is away: nothing written
            for topic in request.topics:
                answers = reply.topics.add(topic=topic.topic)
                for part in topic.partitions:
                    answers.partitions.add(
                        partition=part.partition, error=ErrorCode.NOT_LEADER_OR_FOLLOWER
                    )
            return reply

        producer.cluster.produce = lost_then_unreachable  # type: ignore[method-assign]
        await asyncio.sleep(0.3)
        after = producer.produce("expired", b"two")
        assert await producer.flush(10) == 0
    with pytest.raises(DeliveryTimeoutError):
        expired.result()
    assert calls > 2
    assert await cluster.values("expired") == [b"zero", b"one", b"two"]
    assert after.result().offset == 2
    batches = await cluster.batches("expired")
    assert [(b.producer_epoch - batches[0].producer_epoch, b.base_sequence) for b in batches] == [
        (0, 0),
        (0, 1),
        (1, 0),
    ]


async def test_a_restart_past_the_last_epoch_takes_a_new_producer_id(cluster: Cluster) -> None:
    """A partition whose sequences start again while its epoch is the last one (32767)
    waits for a new producer id from InitProducerId and starts from 0 under it."""
    await cluster.create_topic("last-epoch")
    async with AsyncProducer(cluster.config()) as producer:
        await producer.send("last-epoch", b"zero")
        first_id = producer.producer_id
        queue = producer._queues[("last-epoch", 0)]
        queue.producer_epoch, queue.restart_pending = MAX_PRODUCER_EPOCH, True
        after = await producer.send("last-epoch", b"one")
    assert after.offset == 1
    batches = await cluster.batches("last-epoch")
    assert [(b.producer_id == first_id, b.producer_epoch, b.base_sequence) for b in batches] == [
        (True, 0, 0),
        (False, 0, 0),
    ]


async def test_a_producer_the_broker_forgot_goes_on_under_a_new_epoch(cluster: Cluster) -> None:
    """The broker lost the producer's state of a partition (the topic was deleted and
    created again, so the new partition knows no producer) and answers its next batch,
    sequence 3, UNKNOWN_PRODUCER_ID: the batch is resent from sequence 0 under the next
    epoch, as Kafka's idempotent producer does (``TransactionManager.canRetry``), and
    nothing reaches the caller."""
    await cluster.create_topic("forgot")
    # batch.size=1: a batch per record, up to five in flight, all refused together.
    config = cluster.config(batch_size=1, linger_ms=0, retry_backoff_ms=10)
    async with AsyncProducer(config) as producer:
        for i in range(3):
            await producer.send("forgot", b"a%d" % i, partition=0)
        await cluster.delete_topic("forgot")
        await cluster.create_topic("forgot")
        futures = [producer.produce("forgot", b"b%d" % i, partition=0) for i in range(12)]
        assert await producer.flush(20) == 0
    assert [f.result().offset for f in futures] == list(range(12))
    assert await cluster.values("forgot") == [b"b%d" % i for i in range(12)]
    batches = await cluster.batches("forgot")
    epoch = batches[0].producer_epoch
    assert [(b.producer_epoch - epoch, b.base_sequence) for b in batches] == [
        (0, i) for i in range(12)
    ]
    assert epoch >= 1  # bumped: the old epoch's sequences 0.. are never reused


async def test_not_leader_refreshes_metadata_and_the_retry_is_deduplicated(
    cluster: Cluster,
) -> None:
    await cluster.create_topic("moved")
    async with AsyncProducer(cluster.config(retry_backoff_ms=1)) as producer:
        await producer.send("moved", b"zero")
        refreshes: list[set[str]] = []
        refresh = producer.cluster.refresh

        async def counting_refresh(topics: Iterable[str] | None = None) -> pb.MetadataResponse:
            refreshes.append(set(topics or ()))
            return await refresh(topics)

        producer.cluster.refresh = counting_refresh  # type: ignore[method-assign]
        # The batch is written, but the answer says the leader moved: refresh, resend.
        answer_errors(producer, [ErrorCode.NOT_LEADER_OR_FOLLOWER])
        moved = await producer.send("moved", b"one")
    assert moved.offset == 1
    assert {"moved"} in refreshes
    assert await cluster.values("moved") == [b"zero", b"one"]


async def test_retries_among_many_in_flight_batches_keep_order_without_duplicates(
    cluster: Cluster,
) -> None:
    await cluster.create_topic("flaky")
    config = cluster.config(batch_size=120, linger_ms=0, retry_backoff_ms=1)
    async with AsyncProducer(config) as producer:
        await producer.send("flaky", b"start")
        errors = answer_errors(
            producer, [ErrorCode.NETWORK_EXCEPTION, ErrorCode.NOT_LEADER_OR_FOLLOWER] * 4
        )
        futures = [producer.produce("flaky", b"%04d" % i + b"." * 40) for i in range(100)]
        assert await producer.flush(20) == 0
    assert not errors
    offsets = [f.result().offset for f in futures]
    assert offsets == list(range(1, 101))
    values = await cluster.values("flaky")
    assert values == [b"start"] + [b"%04d" % i + b"." * 40 for i in range(100)]
    sequences = [(b.base_sequence, b.records_count) for b in await cluster.batches("flaky")]
    expected = 0
    for base, count in sequences:
        assert base == expected
        expected += count


async def test_batches_in_flight_reach_the_broker_in_order_without_a_retry(
    cluster: Cluster,
) -> None:
    """Five batches in flight at a time go over one pipelined ProduceStream: the broker
    appends them in the order of their sequences, and none comes back out of order."""
    await cluster.create_topic("pipelined")
    config = cluster.config(batch_size=1, linger_ms=0)
    async with AsyncProducer(config) as producer:
        await producer.send("pipelined", b"start")
        failures: list[BaseException] = []
        on_failure = producer._on_failure

        def recording(batch: Any, error: BaseException, *, retriable: bool) -> None:
            failures.append(error)
            on_failure(batch, error, retriable=retriable)

        producer._on_failure = recording  # type: ignore[method-assign]
        futures = [producer.produce("pipelined", b"%04d" % i) for i in range(200)]
        assert await producer.flush(20) == 0
        assert producer.cluster._produce_streams[cluster.address].calls_opened == 1
    assert failures == []
    assert [f.result().offset for f in futures] == list(range(1, 201))
    assert await cluster.values("pipelined") == [b"start"] + [b"%04d" % i for i in range(200)]


async def test_the_batches_in_flight_after_a_refused_one_go_again_under_a_new_epoch(
    cluster: Cluster,
) -> None:
    """A batch refused for good leaves a gap in the partition's sequences: the batches
    sent after it are refused for their sequence, then numbered again from 0 under the
    next producer epoch and stored once each, in order."""
    await cluster.create_topic("gap", 1, **{"max.message.bytes": "300"})
    # batch.size=1: every record is a batch of its own, and up to five are in flight at once.
    config = cluster.config(batch_size=1, linger_ms=0, retry_backoff_ms=1)
    async with AsyncProducer(config) as producer:
        await producer.send("gap", b"warm")
        big = producer.produce("gap", b"x" * 1000)
        small = [producer.produce("gap", b"%d" % i) for i in range(8)]
        assert await producer.flush(10) == 0
    with pytest.raises(HighwaterError) as raised:
        big.result()
    assert raised.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert [f.result().offset for f in small] == list(range(1, 9))
    assert await cluster.values("gap") == [b"warm"] + [b"%d" % i for i in range(8)]
    batches = await cluster.batches("gap")
    epoch = batches[0].producer_epoch
    assert [(b.producer_epoch - epoch, b.base_sequence) for b in batches] == [(0, 0)] + [
        (1, i) for i in range(8)
    ]


async def test_the_same_built_batch_sent_twice_is_stored_once(cluster: Cluster) -> None:
    await cluster.create_topic("twice")
    async with AsyncProducer(cluster.config()) as producer:
        producer.produce("twice", b"a")
        producer.produce("twice", b"b")
        await producer.flush(10)
        [batch] = await cluster.batches("twice")
        # Send the producer's batch again, as a retry after a lost reply would.
        request = pb.ProduceRequest(acks=-1, timeout_ms=5000)
        request.topics.add(topic="twice").partitions.add(
            partition=0, record_batches=batch.to_bytes()
        )
        reply = await producer.cluster.stub(cluster.address).Produce(request)
        answer = reply.topics[0].partitions[0]
        assert (answer.error, answer.base_offset) == (ErrorCode.NONE, 0)
        after = await producer.send("twice", b"c")
    assert after.offset == 2
    assert await cluster.values("twice") == [b"a", b"b", b"c"]


async def test_many_in_flight_batches_keep_their_order(cluster: Cluster) -> None:
    await cluster.create_topic("pipeline", partitions=2)
    async with AsyncProducer(cluster.config(batch_size=200, linger_ms=0)) as producer:
        for i in range(300):
            producer.produce("pipeline", b"%04d" % i, partition=i % 2)
            if i % 50 == 0:
                await asyncio.sleep(0)
        assert await producer.flush(20) == 0
    for p in range(2):
        assert await cluster.values("pipeline", p) == [b"%04d" % i for i in range(p, 300, 2)]


async def test_at_linger_zero_the_sender_takes_one_turn_per_answer(cluster: Cluster) -> None:
    """A batch opened while its partition's request is in flight waits for the answer
    (Nagle's rule at linger.ms=0): the sender is not woken for it, and after a send it does
    not take another turn unless a queue holds more. Two requests, three sender turns: the
    first send, the second on the first answer, nothing on the second answer."""
    await cluster.create_topic("nagle")
    async with AsyncProducer(cluster.config(linger_ms=0)) as producer:
        await producer.send("nagle", b"start")
        await asyncio.sleep(0.05)  # the start's answer and the turns it wakes are over
        turns = 0
        drain = producer._drain

        def counted(now: float) -> float | None:
            nonlocal turns
            turns += 1
            return drain(now)

        producer._drain = counted  # type: ignore[method-assign]
        producer.produce("nagle", b"a")
        queue = producer._queues[("nagle", 0)]
        while not queue.in_flight:
            await asyncio.sleep(0)
        held = [producer.produce("nagle", b"%d" % i) for i in range(9)]
        assert len(queue.batches) == 1  # opened behind the request in flight, not sent
        assert (await held[-1]).offset == 10
        await asyncio.sleep(0.05)
    assert turns == 3
    assert [b.records_count for b in await cluster.batches("nagle")] == [1, 1, 9]


async def test_at_linger_zero_records_held_behind_a_failed_request_still_go(
    cluster: Cluster,
) -> None:
    """Records produced while their partition's only request is in flight wait for its
    answer (Nagle's rule at linger.ms=0), and the sender is not woken for them: an answer
    that fails the request (resent after the back-off) must still send them, after it and
    with the sequences after its own."""
    await cluster.create_topic("held")
    async with AsyncProducer(cluster.config(linger_ms=0, retry_backoff_ms=1)) as producer:
        await producer.send("held", b"start")
        answer_errors(producer, [ErrorCode.NETWORK_EXCEPTION])
        first = producer.produce("held", b"a")
        queue = producer._queues[("held", 0)]
        while not queue.in_flight:
            await asyncio.sleep(0)
        held = [producer.produce("held", b"%d" % i) for i in range(3)]
        assert len(queue.batches) == 1  # opened behind the request in flight, not sent
        async with asyncio.timeout(5):
            offsets = [(await handle).offset for handle in (first, *held)]
    assert offsets == [1, 2, 3, 4]
    batches = await cluster.batches("held")
    assert [r.value for b in batches for r in b.records()] == [b"start", b"a", b"0", b"1", b"2"]
    assert [b.base_sequence for b in batches] == [0, 1, 2]


async def test_at_linger_zero_flush_and_close_send_the_records_held_behind_a_request(
    cluster: Cluster,
) -> None:
    """A batch held behind its partition's request in flight (Nagle's rule at linger.ms=0)
    is delivered by a flush, and by close(), after the record before it."""
    await cluster.create_topic("held-flush")
    producer = AsyncProducer(cluster.config(linger_ms=0))
    try:
        await producer.send("held-flush", b"start")
        queue = producer._queues[("held-flush", 0)]
        for round_number in range(2):
            first = producer.produce("held-flush", b"%d-a" % round_number)
            while not queue.in_flight:
                await asyncio.sleep(0)
            held = producer.produce("held-flush", b"%d-b" % round_number)
            assert len(queue.batches) == 1 and not held.done()
            if round_number == 0:
                assert await producer.flush(5) == 0
                assert not queue.in_flight and not queue.batches
            else:
                assert await producer.close(5) == 0
            assert (await first).offset < (await held).offset
    finally:
        await producer.close()
    assert await cluster.values("held-flush") == [b"start", b"0-a", b"0-b", b"1-a", b"1-b"]


# --- errors ---------------------------------------------------------------------------------


async def test_an_unknown_topic_is_reported_not_hung(cluster: Cluster) -> None:
    errors: list[BaseException | None] = []
    config = cluster.config(**{"topic.metadata.propagation.max.ms": 300})
    async with AsyncProducer(config) as producer:
        future = producer.produce(
            "no-such-topic", b"x", on_delivery=lambda err, msg: errors.append(err)
        )
        assert await producer.flush(10) == 0
    with pytest.raises(UnknownTopicOrPartitionError):
        future.result()
    assert len(errors) == 1 and isinstance(errors[0], UnknownTopicOrPartitionError)
    assert errors[0].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_a_record_waits_for_its_topic_to_appear_in_the_metadata(cluster: Cluster) -> None:
    """A topic created just after the record was produced (or not yet known to the broker
    asked) is waited for, up to ``topic.metadata.propagation.max.ms`` (librdkafka's; Kafka's
    producer waits ``max.block.ms``), not failed at the first Metadata answer."""
    async with AsyncProducer(cluster.config(linger_ms=0, retry_backoff_ms=20)) as producer:
        handle = producer.produce("appears", b"early", partition=0)
        await asyncio.sleep(0.5)
        assert not handle.done()
        await cluster.create_topic("appears")
        assert (await handle).offset == 0
    assert await cluster.values("appears") == [b"early"]


def test_the_wait_for_an_unknown_topic_is_a_setting() -> None:
    base = {"bootstrap.servers": "localhost:1"}
    assert ProducerConfig.parse(base).topic_metadata_propagation_max_ms == 30000
    parsed = ProducerConfig.parse({**base, "topic.metadata.propagation.max.ms": 500})
    assert parsed.topic_metadata_propagation_max_ms == 500
    with pytest.raises(InvalidConfigError, match=r"topic\.metadata\.propagation\.max\.ms"):
        ProducerConfig.parse({**base, "topic.metadata.propagation.max.ms": -1})


async def test_a_record_too_large_for_the_topic_gets_the_brokers_error(cluster: Cluster) -> None:
    await cluster.create_topic("small", 1, **{"max.message.bytes": "200"})
    async with AsyncProducer(cluster.config()) as producer:
        big = producer.produce("small", b"x" * 1000)
        await producer.flush(10)
        ok = await producer.send("small", b"fits")
    with pytest.raises(HighwaterError) as raised:
        big.result()
    assert raised.value.code == ErrorCode.MESSAGE_TOO_LARGE
    # The failed batch's sequence numbers were given to the next one: nothing is stuck.
    assert ok.offset == 0


async def test_a_record_over_max_request_size_fails_at_produce_and_is_never_sent(
    cluster: Cluster,
) -> None:
    await cluster.create_topic("capped", partitions=3)
    limit = 2000
    # batch.size far above max.request.size: batches and requests are held to the latter.
    config = cluster.config(max_request_size=limit, batch_size=100_000, linger_ms=60_000)
    carried: list[int] = []  # the batch bytes of each Produce request sent
    errors: list[BaseException | None] = []
    reports: list[tuple[BaseException | None, BatchMetadata]] = []
    async with AsyncProducer(config) as producer:
        produce = producer.cluster.produce

        async def recording(
            address: str, request: pb.ProduceRequest, timeout_s: float
        ) -> pb.ProduceResponse:
            carried.append(sum(len(p.record_batches) for t in request.topics for p in t.partitions))
            return await produce(address, request, timeout_s)

        producer.cluster.produce = recording  # type: ignore[method-assign]
        await producer.cluster.refresh(["capped"])  # records are placed at produce()
        first = producer.produce("capped", b"first", partition=0)
        big = producer.produce(
            "capped", b"x" * limit, partition=0, on_delivery=lambda e, m: errors.append(e)
        )
        assert big.done()  # failed at produce(), before any request
        small = [producer.produce("capped", b"%03d" % i * 100, partition=i % 3) for i in range(30)]
        assert (
            await producer.produce_batch(
                "capped",
                {"value": [b"a", b"x" * limit, b"b"]},
                partition=1,
                on_delivery_batch=lambda e, b: reports.append((e, b)),
            )
            == 3
        )
        assert [e is None for e, _ in reports] == [False]  # the large one, at once
        assert await producer.flush(10) == 0
    with pytest.raises(RecordTooLargeError, match=r"larger than 2000.*max\.request\.size"):
        big.result()
    assert isinstance(errors[0], RecordTooLargeError) and len(errors) == 1
    assert errors[0].code == ErrorCode.MESSAGE_TOO_LARGE
    assert first.result().offset == 0
    assert [f.result().partition for f in small] == [i % 3 for i in range(30)]
    assert [(e is None, b.record_count) for e, b in reports] == [(False, 1), (True, 1), (True, 1)]
    stored = [await cluster.batches("capped", p) for p in range(3)]
    sizes = [len(b.to_bytes()) for batches in stored for b in batches]
    assert max(sizes) <= limit and len(stored[0]) > 1
    assert [r.value for b in stored[1] for r in b.records()][-2:] == [b"a", b"b"]
    # Every batch went alone: two would pass the limit (three ready at once, one broker).
    assert sorted(carried) == sorted(sizes) and max(carried) <= limit


async def test_no_reachable_broker_times_out_with_a_typed_error() -> None:
    config = {
        "bootstrap.servers": f"127.0.0.1:{free_port()}",
        "delivery.timeout.ms": 300,
        "request.timeout.ms": 200,
        "linger.ms": 0,
        "retry.backoff.ms": 20,
    }
    async with AsyncProducer(config) as producer:
        future = producer.produce("t", b"x")
        assert await producer.flush(10) == 0
    with pytest.raises(DeliveryTimeoutError):
        future.result()


async def test_produce_after_close_is_refused(cluster: Cluster) -> None:
    producer = AsyncProducer(cluster.config())
    await producer.close()
    with pytest.raises(ProducerClosedError):
        producer.produce("t", b"x")


async def test_close_without_waiting_fails_what_is_left_and_poll_waits_for_reports(
    cluster: Cluster,
) -> None:
    await cluster.create_topic("closing")
    producer = AsyncProducer(cluster.config(linger_ms=60000))
    sent = producer.produce("closing", b"a")
    await producer.flush(10)
    assert sent.result().offset == 0
    producer.produce("closing", b"b")
    assert await producer.poll(0) == 0
    left = producer.produce("closing", b"c", partition=0)
    errors: list[BaseException | None] = []
    producer.produce("closing", b"d", on_delivery=lambda err, msg: errors.append(err))
    assert len(producer) == 3
    assert await producer.close(timeout=0) == 3
    assert len(producer) == 0
    with pytest.raises(ProducerClosedError):
        left.result()
    assert len(errors) == 1 and isinstance(errors[0], ProducerClosedError)


# --- the blocking producer ------------------------------------------------------------------


def test_blocking_producer_works_from_sync_code(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    ready = threading.Event()
    stop: asyncio.Event | None = None
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        server = EmbeddedServer(listen=address, data_dir=tmp_path)
        await server.start()
        await server.broker.wait_unfenced()
        try:
            async with ControllerClient([address]) as admin:
                reply = await admin.create_topics(
                    m.CreateTopicsRequest((m.CreatableTopic("sync", 1, 1),))
                )
                assert reply.topics[0].error == ErrorCode.NONE
                while not leads(server.broker, "sync", 0):
                    await asyncio.sleep(0.02)
            ready.set()
            await stop.wait()
        finally:
            await server.stop()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    try:
        assert ready.wait(30)
        reports: list[tuple[BaseException | None, int, str]] = []
        caller = threading.get_ident()

        def on_delivery(err: BaseException | None, msg: Message) -> None:
            assert threading.get_ident() == caller  # served by poll/flush in this thread
            reports.append((err, msg.offset(), msg.topic()))

        batch_reports: list[tuple[BaseException | None, int]] = []

        def on_batch(err: BaseException | None, batch: BatchMetadata) -> None:
            assert threading.get_ident() == caller
            batch_reports.append((err, batch.record_count))

        config = {"bootstrap.servers": address, "topic.metadata.propagation.max.ms": 300}
        with Producer(config, on_delivery_batch=on_batch) as producer:
            for i in range(10):
                producer.produce("sync", value=b"%d" % i, key=b"k", on_delivery=on_delivery)
            # Bad records are refused in the caller's thread, before anything is queued.
            with pytest.raises(TypeError, match="value"):
                producer.produce("sync", value=3.5)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="topic"):
                producer.produce("", b"x")
            producer.poll(0)
            assert producer.flush(10) == 0
            assert len(producer) == 0
            # Records produced from several threads at once are all delivered.
            many = [threading.Thread(target=lambda t=t: [
                producer.produce("sync", b"%d-%d" % (t, i)) for i in range(500)
            ]) for t in range(4)]  # fmt: skip
            for thread_ in many:
                thread_.start()
            for thread_ in many:
                thread_.join()
            assert producer.flush(10) == 0 and len(producer) == 0
            producer.produce("missing", b"x", on_delivery=on_delivery)
            assert producer.flush(10) == 0
        assert reports[:10] == [(None, i, "sync") for i in range(10)]
        assert isinstance(reports[10][0], UnknownTopicOrPartitionError)
        assert reports[10][1] == -1
        # One report per batch, in the caller's thread; the record that never reached a
        # batch (an unknown topic) is a batch of one.
        failed = [(err, count) for err, count in batch_reports if err is not None]
        assert len(failed) == 1 and isinstance(failed[0][0], UnknownTopicOrPartitionError)
        assert sum(count for _, count in batch_reports) == 10 + 4 * 500 + 1
        with pytest.raises(ProducerClosedError):
            producer.produce("sync", b"late")
    finally:
        if stop is not None:
            loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


# --- configuration --------------------------------------------------------------------------


def test_defaults_are_kafkas() -> None:
    config = ProducerConfig.parse({"bootstrap.servers": "a:1,b:2"})
    assert config.bootstrap_servers == ("a:1", "b:2")
    assert (config.acks, config.linger_ms, config.batch_size) == (-1, 5, 16384)
    assert config.compression == Compression.NONE
    assert config.enable_idempotence is True
    assert config.max_in_flight == 5
    assert (config.delivery_timeout_ms, config.request_timeout_ms) == (120000, 30000)
    assert config.retry_backoff_ms == 100


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"bootstrap.servers": "a:1", "lingr.ms": 5}, "lingr.ms"),
        ({"bootstrap.servers": "a:1", "acks": "2"}, "acks"),
        ({"bootstrap.servers": "a:1", "batch.size": 0}, "batch.size"),
        ({"bootstrap.servers": "a:1", "max.request.size": 0}, "max.request.size"),
        # past what the brokers' gRPC message limit lets one request carry
        ({"bootstrap.servers": "a:1", "max.request.size": 64 << 20}, "max.request.size"),
        ({"bootstrap.servers": "a:1", "compression.type": "brotli"}, "compression.type"),
        ({"bootstrap.servers": "a:1", "linger.ms": "soon"}, "linger.ms"),
        ({"bootstrap.servers": "nohost"}, "bootstrap.servers"),
        ({}, "bootstrap.servers"),
        ({"bootstrap.servers": "a:1", "enable.idempotence": True, "acks": 1}, "idempotence"),
        (
            {"bootstrap.servers": "a:1", "delivery.timeout.ms": 1000, "request.timeout.ms": 5000},
            "delivery.timeout.ms",
        ),
    ],
)
def test_invalid_configuration_is_refused_naming_the_key(
    config: dict[str, object], named: str
) -> None:
    with pytest.raises(InvalidConfigError, match=named.replace(".", r"\.")):
        AsyncProducer(config)
    with pytest.raises(InvalidConfigError, match=named.replace(".", r"\.")):
        Producer(config)


def test_idempotence_left_at_its_default_yields_to_acks() -> None:
    config = ProducerConfig.parse({"bootstrap.servers": "a:1", "acks": "1"})
    assert (config.acks, config.enable_idempotence) == (1, False)


async def test_sticky_partitions_switch_after_batch_size_bytes_without_a_server() -> None:
    """The producer reuses the sticky partitioner's choice and reports bytes in bulk: it
    must still switch at the record where per-record reporting would have switched, also
    when the metadata is replaced in the middle of a run."""
    import itertools
    import random

    from highwater.client.cluster import PartitionInfo, TopicInfo

    def topic_info() -> TopicInfo:
        return TopicInfo("s", tuple(PartitionInfo(p, 1, 0) for p in range(4)))

    producer = AsyncProducer(
        {"bootstrap.servers": "127.0.0.1:1", "batch.size": 16384, "linger.ms": 60_000},
        rng=random.Random(3),
    )
    producer.cluster._topics["s"] = topic_info()
    producer._sender = asyncio.get_running_loop().create_future()  # no sender: keep batches
    placed: list[int] = []
    for i in range(120):
        if i == 40:  # fresh metadata, same leaders: the run goes on where it was
            producer.cluster._topics["s"] = topic_info()
        counts = {p: sum(b.count for b in q.batches) for (_, p), q in producer._queues.items()}
        producer.produce("s", b"x" * 1000, timestamp=1000)
        after = {p: sum(b.count for b in q.batches) for (_, p), q in producer._queues.items()}
        (partition,) = [p for p in after if after[p] != counts.get(p, 0)]
        placed.append(partition)
    # A record takes 1,009 bytes: the 17th brings a partition's bytes past batch.size.
    runs = [placed[i : i + 17] for i in range(0, 119, 17)]
    assert all(len(set(run)) == 1 for run in runs)
    assert all(a[0] != b[0] for a, b in itertools.pairwise(runs))
    producer._sender = None
    producer._closed = True


def test_docs_client_md_lists_every_producer_setting_with_its_default() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "client.md").read_text()
    rows = {
        cells[0].strip("`"): cells[1]
        for line in doc.splitlines()
        if line.startswith("| `")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    security = {key.name for key in SECURITY_CONFIG_KEYS}
    for key in PRODUCER_CONFIG_DEF:
        if key.name in security:
            continue
        default = key.default
        shown = (
            "(required)"
            if default is NO_DEFAULT
            else "empty"
            if default == ""
            else str(default).lower()
        )
        assert rows.get(key.name) == shown, key.name


async def test_a_close_cancelled_while_it_flushes_still_closes_the_connections() -> None:
    """A close cancelled in its flush (no broker answers: the record waits for its
    topic's metadata): the record fails, the producer is closed and so are its channels."""
    producer = AsyncProducer({"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    waiting = producer.produce("t", b"b")
    closing = asyncio.create_task(producer.close())
    await asyncio.sleep(0.3)
    assert not closing.done()  # flushing: the record waits for its topic
    channels = list(producer.cluster._channels.values())
    assert channels
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    with pytest.raises(ProducerClosedError):
        waiting.result()
    for channel in channels:
        with pytest.raises(grpc.aio.UsageError):
            await broker_pb2_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest())
    with pytest.raises(ProducerClosedError):
        producer.produce("t", b"c")
