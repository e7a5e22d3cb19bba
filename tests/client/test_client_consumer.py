"""The client Consumer against a real EmbeddedServer: assignment, polling, seeks, pauses,
offset resets, watermarks, offsets for times, errors and the blocking wrapper.

The server runs on its own event loop in a background thread (one per module), so that
the blocking :class:`Consumer` and :class:`Producer` can be used from plain sync tests;
each test uses topics of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import struct
import time
from collections.abc import AsyncIterator, Iterator

import grpc.aio
import pytest
from embedded_servers import ServerThread
from highwater.client.admin import AdminClient, NewTopic
from highwater.client.cluster import UnknownTopicOrPartitionError
from highwater.client.consumer import (
    OFFSET_BEGINNING,
    OFFSET_END,
    AsyncConsumer,
    Consumer,
    ConsumerClosedError,
    ConsumerConfig,
    NoOffsetForPartitionError,
    TopicPartition,
)
from highwater.client.producer import TIMESTAMP_CREATE_TIME, AsyncProducer, Message, Producer
from highwater.errors import CorruptRecordError, InvalidConfigError, OffsetOutOfRangeError
from highwater.records import SimpleRecord, build_batch
from highwater.records.columnar import RecordColumns, finish_columns
from highwater.records.header import ATTRIBUTES_OFFSET, CRC_OFFSET, crc32c
from highwater.v1 import broker_pb2 as pb
from highwater.v1 import broker_pb2_grpc
from highwater.v1.common_pb2 import ErrorCode

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One embedded server for the module."""
    thread = ServerThread(tmp_path_factory.mktemp("consumer"))
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


async def create_topic(address: str, name: str, partitions: int = 1) -> None:
    """Create a topic and wait until Metadata names a leader for each partition."""
    async with AdminClient(address, request_timeout_s=10) as admin:
        result = await admin.create_topics([NewTopic(name, partitions, 1)])
        result[name].raise_for_error()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        for _ in range(500):
            reply = await stub.Metadata(pb.MetadataRequest(topics=[name]))
            found = reply.topics[0].partitions
            if len(found) == partitions and all(p.leader_id >= 0 for p in found):
                return
            await asyncio.sleep(0.01)
    raise AssertionError(f"{name} got no leaders")


async def produce(
    address: str, topic: str, count: int, *, partition: int = 0, start: int = 0, **kw: object
) -> None:
    """Write ``count`` records ``k<i>``/``v<i>`` (i from ``start``) to one partition."""
    async with AsyncProducer({"bootstrap.servers": address, "linger.ms": 0}) as producer:
        futures = [
            producer.produce(
                topic, f"v{i}", f"k{i}", partition=partition, headers=[("h", f"{i}".encode())]
            )
            for i in range(start, start + count)
        ]
        await asyncio.gather(*futures)


@pytest.fixture
async def consumer(server: ServerThread) -> AsyncIterator[AsyncConsumer]:
    """An AsyncConsumer of the module's server, closed after the test."""
    async with AsyncConsumer({"bootstrap.servers": server.address, "fetch.max.wait.ms": 100}) as c:
        yield c


async def poll_n(consumer: AsyncConsumer, n: int, timeout: float = 10) -> list[Message]:
    """Exactly ``n`` messages (failing on an error message or a timeout)."""
    messages = await consumer.consume(n, timeout)
    for message in messages:
        assert message.error() is None, message.error()
    assert len(messages) == n, [repr(m) for m in messages]
    return messages


def values(messages: list[Message]) -> list[bytes | None]:
    """The values of ``messages``."""
    return [m.value() for m in messages]


# --- reading -----------------------------------------------------------------------------


async def test_assign_and_poll_return_every_record_in_order(
    server: ServerThread, consumer: AsyncConsumer
) -> None:
    await create_topic(server.address, "c-order", 2)
    before = int(time.time() * 1000)
    await produce(server.address, "c-order", 30, partition=0)
    await produce(server.address, "c-order", 5, partition=1, start=100)
    consumer.assign(
        [TopicPartition("c-order", 0, OFFSET_BEGINNING), TopicPartition("c-order", 1, 0)]
    )
    assert consumer.assignment() == [TopicPartition("c-order", 0), TopicPartition("c-order", 1)]
    messages = await poll_n(consumer, 35)
    by_partition = {p: [m for m in messages if m.partition() == p] for p in (0, 1)}
    assert values(by_partition[0]) == [f"v{i}".encode() for i in range(30)]
    assert values(by_partition[1]) == [f"v{i}".encode() for i in range(100, 105)]
    for p, expected in ((0, range(30)), (1, range(100, 105))):
        for offset, (i, m) in enumerate(zip(expected, by_partition[p], strict=True)):
            assert m.topic() == "c-order"
            assert m.offset() == offset
            assert m.key() == f"k{i}".encode()
            assert m.headers() == [("h", f"{i}".encode())]
            kind, ts = m.timestamp()
            assert kind == TIMESTAMP_CREATE_TIME
            assert before - 1000 <= ts <= int(time.time() * 1000) + 1000
    assert await consumer.poll(0.2) is None
    assert consumer.position([TopicPartition("c-order", 0), TopicPartition("c-order", 1)]) == [
        TopicPartition("c-order", 0, 30),
        TopicPartition("c-order", 1, 5),
    ]


async def test_poll_waits_for_new_records(server: ServerThread, consumer: AsyncConsumer) -> None:
    await create_topic(server.address, "c-wait")
    consumer.assign([TopicPartition("c-wait", 0, 0)])
    assert await consumer.poll(0.1) is None
    poller = asyncio.ensure_future(consumer.poll(10))
    await produce(server.address, "c-wait", 1)
    message = await poller
    assert message is not None and message.value() == b"v0" and message.offset() == 0


async def test_seek_and_position(server: ServerThread, consumer: AsyncConsumer) -> None:
    await create_topic(server.address, "c-seek")
    await produce(server.address, "c-seek", 10)
    tp = TopicPartition("c-seek", 0)
    consumer.assign([TopicPartition("c-seek", 0, 3)])
    assert consumer.position([tp]) == [TopicPartition("c-seek", 0, 3)]
    assert values(await poll_n(consumer, 2)) == [b"v3", b"v4"]
    assert consumer.position([tp])[0].offset == 5

    consumer.seek(TopicPartition("c-seek", 0, 8))
    assert consumer.position([tp])[0].offset == 8
    assert values(await poll_n(consumer, 2)) == [b"v8", b"v9"]

    consumer.seek(TopicPartition("c-seek", 0, 1))  # backwards, past buffered records
    assert values(await poll_n(consumer, 1)) == [b"v1"]

    consumer.seek(TopicPartition("c-seek", 0, OFFSET_BEGINNING))
    assert consumer.position([tp])[0].offset is None  # looked up on the next poll
    assert values(await poll_n(consumer, 1)) == [b"v0"]

    consumer.seek(TopicPartition("c-seek", 0, OFFSET_END))
    assert await consumer.poll(0.2) is None
    assert consumer.position([tp])[0].offset == 10

    with pytest.raises(ValueError, match="not assigned"):
        consumer.seek(TopicPartition("c-other", 0, 1))
    unassigned = consumer.position([TopicPartition("c-other", 0)])[0]
    assert unassigned.offset is None and unassigned.error is not None


async def test_a_position_inside_a_batch_skips_the_batch_records_before_it(
    server: ServerThread, consumer: AsyncConsumer
) -> None:
    await create_topic(server.address, "c-inside")
    async with AsyncProducer({"bootstrap.servers": server.address, "linger.ms": 200}) as producer:
        await asyncio.gather(
            *(producer.produce("c-inside", f"v{i}", partition=0) for i in range(10))
        )
    consumer.assign([TopicPartition("c-inside", 0, 4)])
    messages = await poll_n(consumer, 6)
    assert [m.offset() for m in messages] == list(range(4, 10))
    assert values(messages) == [f"v{i}".encode() for i in range(4, 10)]


async def test_poll_takes_a_decoded_batch_record_by_record(
    server: ServerThread, consumer: AsyncConsumer
) -> None:
    """``poll()`` one record at a time from one batch (its short way, no fetch between):
    each in order with the position after it; a pause or a seek in the middle of the
    batch holds at the next poll."""
    await create_topic(server.address, "c-poll-one")
    async with AsyncProducer({"bootstrap.servers": server.address, "linger.ms": 200}) as producer:
        await asyncio.gather(
            *(producer.produce("c-poll-one", f"v{i}", partition=0) for i in range(10))
        )
    tp = TopicPartition("c-poll-one", 0)

    async def next_offset() -> int:
        message = await consumer.poll(5)
        assert message is not None and message.error() is None
        assert message.value() == f"v{message.offset()}".encode()
        return message.offset()

    consumer.assign([TopicPartition("c-poll-one", 0, 0)])
    for i in range(4):
        assert await next_offset() == i
        assert consumer.position([tp])[0].offset == i + 1
    consumer.pause([tp])
    assert await consumer.poll(0.1) is None
    consumer.resume([tp])
    assert await next_offset() == 4
    consumer.seek(TopicPartition("c-poll-one", 0, 2))
    assert [await next_offset() for _ in range(8)] == list(range(2, 10))
    assert await consumer.poll(0.1) is None
    assert consumer.position([tp])[0].offset == 10


async def produce_four_batches_of_three(address: str, topic: str) -> None:
    """Records v0..v11 in partition 0 of ``topic``, as four batches of three."""
    async with AsyncProducer({"bootstrap.servers": address, "linger.ms": 0}) as producer:
        for i in range(4):
            await asyncio.gather(
                *(producer.produce(topic, f"v{3 * i + j}", partition=0) for j in range(3))
            )


async def test_the_next_fetch_is_sent_ahead_while_the_buffer_is_taken(
    server: ServerThread,
) -> None:
    """With records known to be on the broker past the buffered answer (its high
    watermark), taking from the buffer sends the next Fetch from the answer's end at once;
    its answer lands after the buffer, so the records come once each and in order, and a
    seek meanwhile drops it."""
    await create_topic(server.address, "c-ahead")
    await produce_four_batches_of_three(server.address, "c-ahead")
    tp = TopicPartition("c-ahead", 0)
    config = {"bootstrap.servers": server.address, "max.partition.fetch.bytes": 1}
    async with AsyncConsumer(config) as consumer:  # one batch per answer
        consumer.assign([TopicPartition("c-ahead", 0, 0)])
        state = consumer._states[tp.key()]
        assert values(await poll_n(consumer, 1)) == [b"v0"]
        assert consumer._ahead  # sent while two records of the first answer wait
        await asyncio.wait(consumer._ahead)
        assert state.fetched_end == 6 and len(state.batches) == 1
        assert consumer.position([tp])[0].offset == 1
        got = await consumer.consume_batches(11, timeout=5)
        offsets = [m.offset() for batch in got for m in batch]
        assert offsets == list(range(1, 12))
        assert consumer.position([tp])[0].offset == 12

        consumer.seek(TopicPartition("c-ahead", 0, 0))
        assert values(await poll_n(consumer, 1)) == [b"v0"]
        consumer.seek(TopicPartition("c-ahead", 0, 7))  # the fetch ahead from 3 is dropped
        await asyncio.wait(consumer._ahead)
        assert not state.buffered()
        assert values(await poll_n(consumer, 5)) == [f"v{i}".encode() for i in range(7, 12)]
        assert state.fetch_ahead_offset() is None  # the answer reached the high watermark


async def test_a_fetch_ahead_in_flight_is_dropped_when_the_assignment_changes(
    server: ServerThread,
) -> None:
    """An answer to a fetch ahead made under one assignment never fills the buffer of the
    next: re-assigning the partition from another offset, or dropping it and taking it back,
    while the fetch ahead is on its way, starts the records at the new assignment's offset."""
    await create_topic(server.address, "c-ahead-assign", partitions=2)
    await produce_four_batches_of_three(server.address, "c-ahead-assign")
    config = {"bootstrap.servers": server.address, "max.partition.fetch.bytes": 1}
    async with AsyncConsumer(config) as consumer:  # one batch per answer
        consumer.assign([TopicPartition("c-ahead-assign", 0, 0)])
        assert values(await poll_n(consumer, 1)) == [b"v0"]
        assert consumer._ahead  # from offset 3
        consumer.assign([TopicPartition("c-ahead-assign", 0, 7)])
        await asyncio.wait(consumer._ahead)
        assert values(await poll_n(consumer, 2)) == [b"v7", b"v8"]
        assert consumer._ahead  # from offset 9
        consumer.assign([TopicPartition("c-ahead-assign", 1, 0)])
        consumer.assign([TopicPartition("c-ahead-assign", 0, 1)])
        await asyncio.wait(consumer._ahead)
        assert values(await poll_n(consumer, 2)) == [b"v1", b"v2"]


async def test_a_fetch_ahead_answered_with_a_stale_leader_error_is_not_sent_again(
    server: ServerThread,
) -> None:
    """A fetch ahead answered with an error that says the leader is stale (here the topic
    is gone) forgets the partition's leader: the next records taken from the buffer send
    no fetch ahead to the same broker again, one per round trip, until the fetch at the
    buffer's end meets the error and acts on it."""
    await create_topic(server.address, "c-ahead-gone")
    await produce_four_batches_of_three(server.address, "c-ahead-gone")
    config = {"bootstrap.servers": server.address, "max.partition.fetch.bytes": 1}
    async with AsyncConsumer(config) as consumer:  # one batch per answer
        consumer.assign([TopicPartition("c-ahead-gone", 0, 0)])
        assert values(await poll_n(consumer, 1)) == [b"v0"]
        await asyncio.wait(consumer._ahead)  # 3..5 buffered behind 1 and 2
        async with AdminClient(server.address, request_timeout_s=10) as admin:
            (await admin.delete_topics(["c-ahead-gone"]))["c-ahead-gone"].raise_for_error()
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            for _ in range(500):
                reply = await stub.Metadata(pb.MetadataRequest(topics=["c-ahead-gone"]))
                if reply.topics[0].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    break
                await asyncio.sleep(0.01)
        assert values(await poll_n(consumer, 3)) == [b"v1", b"v2", b"v3"]
        assert consumer._ahead  # from 6, while 4 and 5 wait
        await asyncio.wait(consumer._ahead)  # answered UNKNOWN_TOPIC_OR_PARTITION
        assert values(await poll_n(consumer, 1)) == [b"v4"]
        assert not consumer._ahead
        last, gone = await consumer.consume(2, timeout=5)
        assert last.value() == b"v5"
        assert isinstance(gone.error(), UnknownTopicOrPartitionError)


async def test_a_fetch_ahead_leaves_before_the_records_go_back_to_the_caller(
    server: ServerThread,
) -> None:
    """A call answered from the buffer (no wait of its own) gives the event loop a turn
    before it returns when a fetch ahead is in flight: the fetch made while taking the
    records has sent its request when the caller gets them, so the broker works on the
    next answer while the caller works on these (not only once the buffer ran dry)."""
    await create_topic(server.address, "c-ahead-sent")
    await produce_four_batches_of_three(server.address, "c-ahead-sent")
    config = {"bootstrap.servers": server.address, "max.partition.fetch.bytes": 1}
    async with AsyncConsumer(config) as consumer:  # one batch per answer
        consumer.assign([TopicPartition("c-ahead-sent", 0, 0)])
        assert values(await consumer.consume(1, timeout=5)) == [b"v0"]
        assert consumer._ahead  # made while the records were taken: from offset 3
        states = {inspect.getcoroutinestate(task.get_coro()) for task in consumer._ahead}
        assert states == {inspect.CORO_SUSPENDED}  # started: awaiting its answer
        await asyncio.wait(consumer._ahead)
        consumer.seek(TopicPartition("c-ahead-sent", 0, 6))
        message = await consumer.poll(5)
        assert message is not None and message.value() == b"v6"
        states = {inspect.getcoroutinestate(task.get_coro()) for task in consumer._ahead}
        assert states == {inspect.CORO_SUSPENDED}  # poll() too: the one from 9 has left
        await asyncio.wait(consumer._ahead)


async def test_an_idle_partition_does_not_hold_back_the_records_fetched_ahead(
    server: ServerThread,
) -> None:
    """While a fetch ahead is on its way, the other partitions' fetches do not long-poll:
    the records of a busy partition come one answer after another, not one per
    fetch.max.wait.ms of its idle neighbour."""
    await create_topic(server.address, "c-ahead-idle", partitions=2)
    await produce_four_batches_of_three(server.address, "c-ahead-idle")  # partition 1 stays empty
    config = {
        "bootstrap.servers": server.address,
        "max.partition.fetch.bytes": 1,  # one batch per answer
        "fetch.max.wait.ms": 20_000,
    }
    async with AsyncConsumer(config) as consumer:
        consumer.assign([TopicPartition("c-ahead-idle", p, 0) for p in (0, 1)])
        started = time.monotonic()
        got = await poll_n(consumer, 12, timeout=40)
        assert values(got) == [f"v{i}".encode() for i in range(12)]
        assert time.monotonic() - started < 10  # each long poll of partition 1 is 20


async def test_a_fetch_answer_past_grpcs_default_4_mib_is_received(server: ServerThread) -> None:
    """At the default fetch sizes (fetch.max.bytes 50 MiB, max.partition.fetch.bytes 1 MiB)
    one answer for six partitions of 900 KB each is 5.4 MB, past gRPC's default 4 MiB
    receive limit: the consumer's channel takes what a broker may send, and the records
    come (with the default limit the Fetch failed and was sent again, for ever)."""
    topic, partitions, size = "c-large-answer", 6, 900_000
    await create_topic(server.address, topic, partitions)
    async with AsyncProducer({"bootstrap.servers": server.address, "linger.ms": 0}) as producer:
        await asyncio.gather(
            *(producer.produce(topic, bytes([p]) * size, partition=p) for p in range(partitions))
        )
    async with AsyncConsumer({"bootstrap.servers": server.address}) as consumer:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = await poll_n(consumer, partitions, timeout=10)
    assert sorted((m.partition(), m.value()) for m in got) == [
        (p, bytes([p]) * size) for p in range(partitions)
    ]


async def test_pause_and_resume(server: ServerThread, consumer: AsyncConsumer) -> None:
    await create_topic(server.address, "c-pause", 2)
    await produce(server.address, "c-pause", 3, partition=0)
    await produce(server.address, "c-pause", 3, partition=1, start=10)
    p0, p1 = TopicPartition("c-pause", 0, 0), TopicPartition("c-pause", 1, 0)
    consumer.assign([p0, p1])
    consumer.pause([p0])
    assert values(await poll_n(consumer, 3)) == [b"v10", b"v11", b"v12"]
    assert await consumer.poll(0.2) is None
    consumer.resume([p0])
    assert values(await poll_n(consumer, 3)) == [b"v0", b"v1", b"v2"]

    # Buffered records of a partition paused after its fetch wait for resume().
    await produce(server.address, "c-pause", 2, partition=0, start=3)
    first = await poll_n(consumer, 1)
    assert values(first) == [b"v3"]
    consumer.pause([p0])
    assert await consumer.poll(0.2) is None
    consumer.resume([p0])
    assert values(await poll_n(consumer, 1)) == [b"v4"]
    with pytest.raises(ValueError, match="not assigned"):
        consumer.pause([TopicPartition("c-pause", 7)])


# --- offset resets -----------------------------------------------------------------------


async def test_reset_earliest_latest_and_none(server: ServerThread) -> None:
    await create_topic(server.address, "c-reset")
    await produce(server.address, "c-reset", 4)
    tp = TopicPartition("c-reset", 0)
    base = {"bootstrap.servers": server.address, "fetch.max.wait.ms": 50}

    async with AsyncConsumer({**base, "auto.offset.reset": "earliest"}) as earliest:
        earliest.assign([tp])
        assert values(await poll_n(earliest, 4)) == [b"v0", b"v1", b"v2", b"v3"]

    async with AsyncConsumer(base) as latest:  # Kafka's default: latest
        latest.assign([tp])
        assert await latest.poll(0.3) is None
        assert latest.position([tp])[0].offset == 4
        await produce(server.address, "c-reset", 1, start=4)
        assert values(await poll_n(latest, 1)) == [b"v4"]

    async with AsyncConsumer({**base, "auto.offset.reset": "none"}) as none:
        none.assign([tp])
        message = await none.poll(5)
        assert message is not None
        assert isinstance(message.error(), NoOffsetForPartitionError)
        assert (message.topic(), message.partition()) == ("c-reset", 0)
        assert await none.poll(0.1) is None  # reported once; waits for a seek
        none.seek(TopicPartition("c-reset", 0, 2))
        assert values(await poll_n(none, 3)) == [b"v2", b"v3", b"v4"]


async def test_out_of_range_offsets_reset_or_fail(server: ServerThread) -> None:
    await create_topic(server.address, "c-range")
    await produce(server.address, "c-range", 6)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        request = pb.DeleteRecordsRequest(timeout_ms=5000)
        request.topics.add(topic="c-range").partitions.add(partition=0, offset=2)
        reply = await stub.DeleteRecords(request)
        assert reply.topics[0].partitions[0].error == ErrorCode.NONE
    base = {"bootstrap.servers": server.address, "fetch.max.wait.ms": 50}

    async with AsyncConsumer({**base, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("c-range", 0, 0)])  # below the log start
        assert values(await poll_n(c, 4)) == [b"v2", b"v3", b"v4", b"v5"]
        c.seek(TopicPartition("c-range", 0, 100))  # past the end
        assert values(await poll_n(c, 4)) == [b"v2", b"v3", b"v4", b"v5"]

    async with AsyncConsumer({**base, "auto.offset.reset": "latest"}) as c:
        c.assign([TopicPartition("c-range", 0, 100)])
        assert await c.poll(0.3) is None
        assert c.position([TopicPartition("c-range", 0)])[0].offset == 6

    async with AsyncConsumer({**base, "auto.offset.reset": "none"}) as c:
        c.assign([TopicPartition("c-range", 0, 1)])
        message = await c.poll(5)
        assert message is not None and isinstance(message.error(), OffsetOutOfRangeError)
        assert message.offset() == 1
        assert await c.poll(0.1) is None
        c.seek(TopicPartition("c-range", 0, 5))
        assert values(await poll_n(c, 1)) == [b"v5"]


# --- offsets -----------------------------------------------------------------------------


async def test_watermarks_and_offsets_for_times(
    server: ServerThread, consumer: AsyncConsumer
) -> None:
    await create_topic(server.address, "c-times")
    tp = TopicPartition("c-times", 0)
    assert await consumer.get_watermark_offsets(tp) == (0, 0)
    async with AsyncProducer({"bootstrap.servers": server.address, "linger.ms": 0}) as producer:
        for i, ts in enumerate((1000, 2000, 3000)):
            await producer.send("c-times", f"v{i}", partition=0, timestamp=ts)
    assert await consumer.get_watermark_offsets(tp) == (0, 3)

    answers = await consumer.offsets_for_times(
        [
            TopicPartition("c-times", 0, 0),
            TopicPartition("c-times", 0, 1500),
            TopicPartition("c-times", 0, 3000),
            TopicPartition("c-times", 0, 5000),
        ]
    )
    assert [a.offset for a in answers] == [0, 1, 2, -1]
    assert all(a.error is None for a in answers)

    consumer.assign([TopicPartition("c-times", 0, answers[1].offset)])
    messages = await poll_n(consumer, 2)
    assert [m.timestamp() for m in messages] == [
        (TIMESTAMP_CREATE_TIME, 2000),
        (TIMESTAMP_CREATE_TIME, 3000),
    ]
    assert await consumer.get_watermark_offsets(tp, cached=True) == (0, 3)

    with pytest.raises(UnknownTopicOrPartitionError):
        await consumer.get_watermark_offsets(TopicPartition("c-times-missing", 0))
    missing = await consumer.offsets_for_times([TopicPartition("c-times", 4, 0)])
    assert isinstance(missing[0].error, UnknownTopicOrPartitionError)


# --- errors ------------------------------------------------------------------------------


async def test_unknown_topic_and_partition_are_error_messages(
    server: ServerThread, consumer: AsyncConsumer
) -> None:
    await create_topic(server.address, "c-known")
    consumer.assign([TopicPartition("c-missing", 0, 0), TopicPartition("c-known", 3, 0)])
    errors = await consumer.consume(2, 5)
    assert len(errors) == 2
    assert {(m.topic(), m.partition()) for m in errors} == {("c-missing", 0), ("c-known", 3)}
    assert all(isinstance(m.error(), UnknownTopicOrPartitionError) for m in errors)
    assert await consumer.poll(0.1) is None
    with pytest.raises(UnknownTopicOrPartitionError):
        await consumer.partitions_for("c-missing")
    assert await consumer.partitions_for("c-known") == [0]


def test_config_errors_name_the_key() -> None:
    with pytest.raises(InvalidConfigError, match=r"partition\.assignment\.strategy"):
        ConsumerConfig.parse(
            {"bootstrap.servers": "localhost:1", "partition.assignment.strategy": "fair"}
        )
    with pytest.raises(InvalidConfigError, match=r"session\.timeout\.ms"):
        ConsumerConfig.parse({"bootstrap.servers": "localhost:1", "session.timeout.ms": 0})
    with pytest.raises(InvalidConfigError, match=r"auto\.offset\.reset"):
        ConsumerConfig.parse({"bootstrap.servers": "localhost:1", "auto.offset.reset": "first"})
    with pytest.raises(InvalidConfigError, match=r"fetch\.max\.wait\.ms"):
        ConsumerConfig.parse({"bootstrap.servers": "localhost:1", "fetch.max.wait.ms": -1})
    with pytest.raises(InvalidConfigError, match=r"bootstrap\.servers"):
        ConsumerConfig.parse({"bootstrap.servers": "nowhere"})
    with pytest.raises(InvalidConfigError, match=r"bootstrap\.servers"):
        ConsumerConfig.parse({})
    config = ConsumerConfig.parse({"bootstrap.servers": "localhost:1"})
    assert (config.auto_offset_reset, config.fetch_min_bytes, config.fetch_max_wait_ms) == (
        "latest",
        1,
        500,
    )
    assert (config.fetch_max_bytes, config.max_partition_fetch_bytes, config.check_crcs) == (
        52428800,
        1048576,
        True,
    )


async def test_closed_consumer_refuses_calls(server: ServerThread) -> None:
    consumer = AsyncConsumer({"bootstrap.servers": server.address})
    await consumer.close()
    await consumer.close()
    with pytest.raises(ConsumerClosedError):
        await consumer.poll(0)
    with pytest.raises(ConsumerClosedError):
        consumer.assign([TopicPartition("t", 0)])


async def test_closing_a_consumer_closes_its_channels_and_ends_their_calls(
    server: ServerThread,
) -> None:
    """When ``close`` returns, the consumer's channels are closed and gRPC has delivered the
    end of every call they had open: the status task gRPC keeps per streaming call (the
    consumer's fetch stream, idle between fetches) is done. Before, a loop closed right
    after ``close`` left that task's wake-up to fail on the closed loop, logged by another
    loop's thread as "Event loop is closed"."""
    await create_topic(server.address, "c-close")
    await produce(server.address, "c-close", 1)
    consumer = AsyncConsumer({"bootstrap.servers": server.address, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("c-close", 0)])
    await poll_n(consumer, 1)
    channels = list(consumer.cluster._channels.values())
    assert channels

    def grpc_status_tasks() -> list[asyncio.Task[object]]:
        return [
            task
            for task in asyncio.all_tasks()
            if not task.done()
            and getattr(task.get_coro(), "__qualname__", "")
            == "_AioCall._handle_status_once_received"
        ]

    assert grpc_status_tasks()  # the fetch stream's call is open
    await consumer.close()
    assert grpc_status_tasks() == []
    for channel in channels:
        with pytest.raises(grpc.aio.UsageError):
            await broker_pb2_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest())


# --- the blocking consumer ---------------------------------------------------------------


def test_blocking_consumer_from_sync_code(server: ServerThread) -> None:
    asyncio.run(create_topic(server.address, "c-sync", 2))
    with Producer({"bootstrap.servers": server.address}) as producer:
        for i in range(6):
            producer.produce("c-sync", f"v{i}", f"k{i}", partition=i % 2)
        assert producer.flush(10) == 0
    with Consumer(
        {"bootstrap.servers": server.address, "auto.offset.reset": "earliest"}
    ) as consumer:
        partitions = consumer.partitions_for("c-sync")
        assert partitions == [0, 1]
        consumer.assign([TopicPartition("c-sync", p) for p in partitions])
        messages = consumer.consume(6, 10)
        assert sorted(m.value() or b"" for m in messages) == [f"v{i}".encode() for i in range(6)]
        assert consumer.poll(0.1) is None
        consumer.seek(TopicPartition("c-sync", 1, 2))
        message = consumer.poll(10)
        assert message is not None and (message.partition(), message.value()) == (1, b"v5")
        assert consumer.position([TopicPartition("c-sync", 1)])[0].offset == 3
        assert consumer.get_watermark_offsets(TopicPartition("c-sync", 0)) == (0, 3)
        consumer.pause([TopicPartition("c-sync", 0)])
        consumer.resume([TopicPartition("c-sync", 0)])
        assert len(consumer.assignment()) == 2
        consumer.unassign()
        assert consumer.assignment() == []
    with pytest.raises(ConsumerClosedError):
        consumer.poll(0)


def test_consume_columns_ahead_fetches_on_the_consumers_thread(server: ServerThread) -> None:
    """consume_columns_ahead() returns a future at once; the consumer's thread fetches and
    decodes into the columns meanwhile, so records produced after the call arrive in them,
    and the future's result is consume_columns()'s (None, no error)."""
    asyncio.run(create_topic(server.address, "c-columns-ahead", 1))
    with Consumer(
        {"bootstrap.servers": server.address, "auto.offset.reset": "earliest"}
    ) as consumer:
        t = TopicPartition("c-columns-ahead", 0)
        consumer.assign([t])
        columns = RecordColumns()
        future = consumer.consume_columns_ahead(t, columns, 4, timeout=20)
        assert not future.done()  # nothing to read yet: it waits on the consumer's thread
        with Producer({"bootstrap.servers": server.address}) as producer:
            for i in range(4):
                producer.produce("c-columns-ahead", f"v{i}", partition=0)
            assert producer.flush(10) == 0
        assert future.result(timeout=20) is None
        got = finish_columns(columns)
        assert struct.unpack(f"<{got.length}q", got.offsets) == (0, 1, 2, 3)
        assert got.value_data == b"v0v1v2v3"
        assert consumer.position([t])[0].offset == 4


# --- decoding fetched batches ------------------------------------------------------------


def _answer(data: bytes) -> pb.FetchPartitionResponse:
    """A successful Fetch answer for partition 0 carrying ``data``."""
    return pb.FetchPartitionResponse(
        partition=0, high_watermark=100, log_start_offset=0, records=data
    )


async def test_fetched_batches_skip_control_records_and_check_crcs() -> None:
    first = build_batch([SimpleRecord(b"k", f"v{i}".encode(), timestamp=5) for i in range(4)])
    control = build_batch([SimpleRecord(None, b"\x00")], base_offset=4, is_control=True)
    last = build_batch([SimpleRecord(None, b"v5", timestamp=6)], base_offset=5)
    async with AsyncConsumer({"bootstrap.servers": "127.0.0.1:1"}) as consumer:
        consumer.assign([TopicPartition("t", 0, 2)])
        state = consumer._states[("t", 0)]
        consumer._handle_answer(state, 2, _answer(first + control + last))
        messages = [consumer._next_message() for _ in range(3)]
        assert [m.offset() if m else None for m in messages] == [2, 3, 5]
        assert consumer._next_message() is None
        assert consumer.position([TopicPartition("t", 0)])[0].offset == 6
        assert await consumer.get_watermark_offsets(TopicPartition("t", 0), cached=True) == (
            0,
            100,
        )

        # Only a control batch: the position moves past it.
        consumer.seek(TopicPartition("t", 0, 4))
        consumer._handle_answer(state, 4, _answer(control))
        assert consumer._next_message() is None
        assert consumer.position([TopicPartition("t", 0)])[0].offset == 5

        corrupt = bytearray(last)
        corrupt[-2] ^= 0xFF  # a byte of the value "v5": the framing stays valid
        consumer.seek(TopicPartition("t", 0, 0))
        consumer._handle_answer(state, 0, _answer(first + bytes(corrupt)))
        got = [consumer._next_message() for _ in range(5)]
        assert [m.offset() for m in got[:4] if m] == [0, 1, 2, 3]
        assert got[4] is not None and isinstance(got[4].error(), CorruptRecordError)
        assert consumer._next_message() is None

    async with AsyncConsumer(
        {"bootstrap.servers": "127.0.0.1:1", "check.crcs": False}
    ) as unchecked:
        unchecked.assign([TopicPartition("t", 0, 5)])
        state = unchecked._states[("t", 0)]
        unchecked._handle_answer(state, 5, _answer(bytes(corrupt)))
        message = unchecked._next_message()
        assert message is not None and message.error() is None and message.offset() == 5
        assert message.value() == b"v" + bytes([ord("5") ^ 0xFF])


async def test_consume_takes_buffered_records_in_order_and_errors_after_them() -> None:
    """consume() moves whole buffers at once; the order, the positions, paused partitions
    and an error found after the records come out as from one poll() per message."""
    batches = [
        build_batch(
            [
                SimpleRecord(None, b"v%d" % (10 * b + i), (("h", b"x"),) if i == 2 else (), 7)
                for i in range(10)
            ],
            base_offset=10 * b,
        )
        for b in range(3)
    ]
    corrupt = bytearray(batches[2])
    corrupt[-2] ^= 0xFF
    async with AsyncConsumer({"bootstrap.servers": "127.0.0.1:1"}) as consumer:
        consumer.assign([TopicPartition("t", 0, 3), TopicPartition("u", 0, 0)])
        t, u = consumer._states[("t", 0)], consumer._states[("u", 0)]
        consumer._handle_answer(t, 3, _answer(batches[0] + batches[1] + bytes(corrupt)))
        consumer._handle_answer(u, 0, _answer(batches[0]))
        consumer.pause([TopicPartition("u", 0)])
        first = await consumer.consume(5, timeout=0)
        assert [(m.topic(), m.offset()) for m in first] == [("t", o) for o in range(3, 8)]
        assert consumer.position([TopicPartition("t", 0)])[0].offset == 8
        rest = await consumer.consume(100, timeout=0)
        assert [m.offset() for m in rest[:-1]] == list(range(8, 20))
        assert isinstance(rest[-1].error(), CorruptRecordError)
        assert [m.value() for m in rest[:2]] == [b"v8", b"v9"]
        assert rest[4].headers() == [("h", b"x")] and rest[3].headers() is None
        consumer.resume([TopicPartition("u", 0)])
        got = await consumer.consume(100, timeout=0)
        assert [(m.topic(), m.offset()) for m in got] == [("u", o) for o in range(10)]
        assert consumer.position([TopicPartition("u", 0)])[0].offset == 10


async def test_batches_are_decoded_as_their_records_are_taken() -> None:
    """An answer's batches stay undecoded until consume() or poll() reaches them; a seek
    drops them undecoded; a corrupt record under a valid CRC ends the buffer after the
    records before it."""
    batches = [
        build_batch(
            [SimpleRecord(None, b"v%d" % (10 * b + i), (), 7) for i in range(10)],
            base_offset=10 * b,
        )
        for b in range(3)
    ]
    corrupt = bytearray(batches[1])
    corrupt[-1] = 0x02  # the last record (offset 19) claims a header it does not hold
    struct.pack_into(">I", corrupt, CRC_OFFSET, crc32c(memoryview(corrupt)[ATTRIBUTES_OFFSET:]))
    async with AsyncConsumer({"bootstrap.servers": "127.0.0.1:1"}) as consumer:
        consumer.assign([TopicPartition("t", 0, 0)])
        state = consumer._states[("t", 0)]
        consumer._handle_answer(state, 0, _answer(batches[0] + batches[2]))
        assert len(state.batches) == 2 and not state.records
        first = await consumer.consume(3, timeout=0)
        assert [m.offset() for m in first] == [0, 1, 2]
        assert len(state.batches) == 1  # only the first batch was decoded
        consumer.seek(TopicPartition("t", 0, 0))
        assert not state.buffered() and not state.batches

        consumer._handle_answer(state, 0, _answer(batches[0] + bytes(corrupt) + batches[2]))
        got = await consumer.consume(100, timeout=0)
        assert [m.offset() for m in got[:-1]] == list(range(19))
        assert [m.value() for m in got[9:11]] == [b"v9", b"v10"]
        error = got[-1].error()
        assert isinstance(error, CorruptRecordError) and str(error).startswith("t-0: ")
        assert got[-1].offset() == 19
        assert consumer.position([TopicPartition("t", 0)])[0].offset == 19
        assert not state.buffered()


async def test_consume_columns_decodes_one_partitions_batches_into_arrow_buffers() -> None:
    """consume_columns() appends a partition's records to the columns whole batches at a
    time, after what poll() had decoded already, moves the position, returns the error
    found after the records, and leaves other partitions' records buffered."""
    batches = [
        build_batch(
            [SimpleRecord(b"k", b"v%d" % (10 * b + i), (), 7) for i in range(10)],
            base_offset=10 * b,
        )
        for b in range(3)
    ]
    corrupt = bytearray(batches[2])
    corrupt[-1] = 0x02  # the last record (offset 29) claims a header it does not hold
    struct.pack_into(">I", corrupt, CRC_OFFSET, crc32c(memoryview(corrupt)[ATTRIBUTES_OFFSET:]))
    async with AsyncConsumer({"bootstrap.servers": "127.0.0.1:1"}) as consumer:
        t = TopicPartition("t", 0)
        consumer.assign([TopicPartition("t", 0, 3), TopicPartition("u", 0, 0)])
        state = consumer._states[("t", 0)]
        consumer._handle_answer(state, 3, _answer(batches[0] + batches[1] + bytes(corrupt)))
        consumer._handle_answer(consumer._states[("u", 0)], 0, _answer(batches[0]))
        polled = await consumer.consume(2, timeout=0)
        assert [(m.topic(), m.offset()) for m in polled] == [("t", 3), ("t", 4)]
        columns = RecordColumns()
        assert await consumer.consume_columns(t, columns, 6, timeout=0) is None
        assert len(columns) == 15  # 5..9 decoded before, then the whole batch 10..19
        assert consumer.position([t])[0].offset == 20
        error = await consumer.consume_columns(t, columns, 100, timeout=0)
        assert isinstance(error, CorruptRecordError) and str(error).startswith("t-0: ")
        got = finish_columns(columns)
        assert struct.unpack(f"<{got.length}q", got.offsets) == tuple(range(5, 29))
        assert got.value_data == b"".join(b"v%d" % i for i in range(5, 29))
        assert got.key_data == b"k" * 24 and got.key_validity == b"\xff\xff\xff"
        assert struct.unpack(f"<{got.length}q", got.timestamps) == (7,) * 24
        assert consumer.position([t])[0].offset == 29
        rest = await consumer.consume(100, timeout=0)
        assert [(m.topic(), m.offset()) for m in rest] == [("u", o) for o in range(10)]
        with pytest.raises(ValueError, match="not assigned"):
            await consumer.consume_columns(TopicPartition("v", 0), columns, 1, timeout=0)
