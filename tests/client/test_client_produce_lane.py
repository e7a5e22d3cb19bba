"""The compiled ``produce()`` (``highwater.records._codec.ProduceLane``) against the Python
path it stands for: the same calls give the same batches (bytes), partitions, handles,
sticky-partitioner state and typed errors, with no broker (the producer's metadata is set
by hand and the sender never gets a turn).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
from compiled_codec import PURE_PYTHON_RUN, compiled_only, run_under_debug_allocator
from highwater.client.cluster import PartitionInfo, TopicInfo
from highwater.client.producer import AsyncProducer, Message, ProducerClosedError
from highwater.client.producer.handle import DeliveryHandle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

TOPICS = {"a": 3, "b": 1}
"""The topics with metadata; ``c`` has none (its records wait for it)."""


def set_metadata(producer: AsyncProducer) -> None:
    """``TOPICS``' metadata as a Metadata answer would set it (new objects each time)."""
    topics = producer._topics
    assert isinstance(topics, dict)  # the cluster's own table, which Metadata answers fill
    for name, count in TOPICS.items():
        topics[name] = TopicInfo(name, tuple(PartitionInfo(p, 1, 0) for p in range(count)))


def make_producer(seed: int, *, lane: bool, batch_size: int = 600) -> AsyncProducer:
    """A producer with ``TOPICS``' metadata, the compiled lane on or off."""
    producer = AsyncProducer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "batch.size": batch_size,
            "linger.ms": 1000,
            "enable.idempotence": False,
            "acks": "1",
        },
        rng=random.Random(seed),
    )
    set_metadata(producer)
    if not lane:  # the Python produce(), the reference
        producer._lane = None
        producer.__dict__.pop("produce", None)
        producer.__dict__.pop("produce_without_handle", None)
    return producer


def handle_state(handle: DeliveryHandle, batch_ids: dict[int, tuple[Any, ...]]) -> Any:
    """Where a handle points (its batch's queue and position, its index) and its error."""
    error = handle._error
    return (
        None if handle._batch is None else batch_ids[id(handle._batch)],
        handle._index,
        None if error is None else (type(error), str(error)),
    )


async def run_calls(calls: list[Any], seed: int, *, lane: bool) -> Any:
    """Everything observable after ``calls``: each call's outcome, each batch's bytes,
    the records that wait for metadata, the callbacks made, the partitioner's state."""
    producer = make_producer(seed, lane=lane)
    reports: list[Any] = []

    def report(error: BaseException | None, message: Message) -> None:
        reports.append((type(error), message.topic(), message.partition(), message.value()))

    outcomes: list[Any] = []
    try:
        for topic, value, key, partition, headers, timestamp, with_callback, handled in calls:
            if topic == "refresh":  # new metadata, the same partitions: sticky choices lapse
                set_metadata(producer)
                continue
            produce = producer.produce if handled else producer.produce_without_handle
            try:
                handle = produce(
                    topic,
                    value,
                    key,
                    partition,
                    headers,
                    timestamp,
                    report if with_callback else None,
                )
            except Exception as e:
                outcomes.append((type(e), str(e)))
            else:
                outcomes.append(handle)
        batch_ids: dict[int, tuple[Any, ...]] = {}
        batches: list[Any] = []
        for (topic, partition), q in sorted(producer._queues.items()):
            for position, batch in enumerate(q.batches):
                batch_ids[id(batch)] = (topic, partition, position)
                batches.append(
                    (
                        topic,
                        partition,
                        batch.closed,
                        batch.has_callbacks,
                        [c is not None for c in batch.callbacks],
                        batch.builder.estimated_size,
                        batch.builder.build(),
                    )
                )
        observed = [
            handle_state(o, batch_ids) if isinstance(o, DeliveryHandle) else o for o in outcomes
        ]
        waiting = {
            topic: [(w.partition, w.fields, w.on_delivery is not None) for w in records]
            for topic, records in producer._waiting.items()
        }
        sticky = {
            topic: (choice.partition, choice.threshold, choice.unreported)
            for topic, choice in producer._sticky_choices.items()
        }
        produced = {topic: producer._sticky.produced_bytes(topic) for topic in TOPICS}
        return observed, batches, waiting, reports, sticky, produced, len(producer)
    finally:
        if producer._sender is not None:
            producer._sender.cancel()
            await asyncio.gather(producer._sender, return_exceptions=True)


byte_or_text = st.binary(max_size=150) | st.text(max_size=4)
call = st.tuples(
    st.sampled_from(["a", "a", "a", "b", "c", "refresh"]),
    st.none() | byte_or_text,
    st.none() | st.binary(max_size=6) | st.text(max_size=3) | st.integers(0, 2),
    st.none() | st.integers(-1, 4),
    st.none() | st.just([("h", b"v")]),
    st.integers(1, 1 << 44) | st.sampled_from([-5, 1 << 70]),
    st.booleans(),
    st.booleans(),  # produce(), or produce_without_handle() (which returns None)
)


@compiled_only
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(call, max_size=80), st.integers(0, 1 << 30))
def test_the_compiled_produce_gives_what_the_python_path_gives(calls: list[Any], seed: int) -> None:
    compiled = asyncio.run(run_calls(calls, seed, lane=True))
    reference = asyncio.run(run_calls(calls, seed, lane=False))
    assert compiled == reference


@compiled_only
async def test_the_lane_takes_plain_records_and_leaves_the_rest_to_python() -> None:
    producer = make_producer(1, lane=True, batch_size=16384)
    lane = producer._lane
    assert lane is not None and producer.__dict__["produce"] is lane
    try:
        producer.produce("a", b"first", partition=1, timestamp=5)  # opens the batch
        before = time.time_ns() // 1_000_000
        handle = lane.place("a", b"v", None, 1, None, None, None)
        after = time.time_ns() // 1_000_000
        assert handle is True
        batch = producer._queues["a", 1].batches[-1]
        record = batch.builder.records[1]
        assert record[:3] == (None, b"v", ()) and before <= record[3] <= after
        handle = producer.produce("a", on_delivery=None, timestamp=7, partition=1, value=b"w")
        assert isinstance(handle, DeliveryHandle) and handle._batch is batch
        assert handle._index == 2 and batch.builder.records[2] == (None, b"w", (), 7)
        assert len(producer) == 3
        # Not the lane's: a str value, headers, a partition without a batch, an unknown
        # topic; nothing is queued by the lane then.
        for args in (
            ("a", "text", None, 1, None, 7, None),
            ("a", b"v", None, 1, [("h", b"")], 7, None),
            ("a", b"v", None, 2, None, 7, None),
            ("c", b"v", None, 0, None, 7, None),
        ):
            assert lane.place(*args) is None
        assert len(producer) == 3
        with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
            producer.produce("a", b"v", colour=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="multiple values for argument 'value'"):
            producer.produce("a", b"v", value=b"w")  # type: ignore[misc]
        assert len(producer) == 3
    finally:
        if producer._sender is not None:
            producer._sender.cancel()


@compiled_only
async def test_the_lane_refuses_a_negative_timestamp() -> None:
    producer = make_producer(4, lane=True, batch_size=16384)
    try:
        producer.produce("a", b"first", partition=1, timestamp=5)  # opens the batch
        for produce in (producer.produce, producer.produce_without_handle):
            with pytest.raises(ValueError, match="Invalid timestamp: -5"):
                produce("a", b"v", partition=1, timestamp=-5)
    finally:
        if producer._sender is not None:
            producer._sender.cancel()


@pytest.mark.parametrize("compiled", [True, False])
async def test_produce_without_handle_queues_the_record_and_returns_none(compiled: bool) -> None:
    producer = make_producer(3, lane=compiled, batch_size=16384)  # no lane in a pure run
    try:
        assert producer.produce_without_handle("a", b"first", partition=1, timestamp=5) is None
        assert producer.produce_without_handle("a", b"v", None, 1, None, 6, None) is None
        batch = producer._queues["a", 1].batches[-1]
        assert batch.builder.records == [(None, b"first", (), 5), (None, b"v", (), 6)]
        assert len(producer) == 2
        with pytest.raises(TypeError, match="value must be str, bytes or None"):
            producer.produce_without_handle("a", 12, partition=1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
            producer.produce_without_handle("a", b"v", colour=1)  # type: ignore[call-arg]
        producer._closed = True
        with pytest.raises(ProducerClosedError):
            producer.produce_without_handle("a", b"v", partition=1, timestamp=3)
        assert len(producer) == 2
    finally:
        if producer._sender is not None:
            producer._sender.cancel()


async def test_produce_keeps_its_typed_errors() -> None:
    producer = make_producer(2, lane=True)
    try:
        producer.produce("a", b"v", partition=0, timestamp=3)
        with pytest.raises(TypeError, match="value must be str, bytes or None"):
            producer.produce("a", 12, partition=0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="key must be str, bytes or None"):
            producer.produce("a", b"v", 12, partition=0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="topic must be a non-empty str"):
            producer.produce("", b"v")
        unknown = producer.produce("a", b"v", partition=7)
        assert "not in the range" in str(unknown.exception())
        producer._closed = True
        with pytest.raises(ProducerClosedError):
            producer.produce("a", b"v", partition=0, timestamp=3)
    finally:
        if producer._sender is not None:
            producer._sender.cancel()


@pytest.mark.parametrize("compiled", [True, False])
async def test_a_written_batch_reports_each_record_and_survives_a_raising_callback(
    compiled: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from highwater.client.producer import producer as producer_module

    if compiled and PURE_PYTHON_RUN:
        pytest.skip("the pure-Python run of the suite: the Python loop is the only one")
    if not compiled:
        monkeypatch.setattr(producer_module, "_deliver_records", None)
    producer = make_producer(4, lane=True, batch_size=16384)
    seen: list[tuple[Any, ...]] = []

    def report(error: BaseException | None, message: Message) -> None:
        seen.append(
            (error, message.key(), message.value(), message.offset(), message.timestamp()[1])
        )
        if message.value() == b"bad":
            raise ValueError("a caller's bug")

    try:
        for value in (b"one", b"bad", b"skip", b"three"):
            producer.produce("a", value, b"k", 1, None, 50, None if value == b"skip" else report)
        (batch,) = producer._queues["a", 1].batches
        with caplog.at_level("ERROR"):
            producer._succeed(batch, 10, -1)
        assert seen == [
            (None, b"k", b"one", 10, 50),
            (None, b"k", b"bad", 11, 50),
            (None, b"k", b"three", 13, 50),
        ]
        assert "a delivery callback of" in caplog.text and "a caller's bug" in caplog.text
        assert len(producer) == 0
    finally:
        if producer._sender is not None:
            producer._sender.cancel()


async def batches_of_partitions(lane: bool) -> Any:
    """Named and keyed records over three partitions, each call with a topic str made anew
    (an equal string, another object), then the same topic object again: the batches."""
    producer = make_producer(5, lane=lane, batch_size=16384)
    topics = producer._topics
    assert isinstance(topics, dict)
    topics["orders"] = TopicInfo("orders", tuple(PartitionInfo(p, 1, 0) for p in range(3)))
    try:
        for i in range(60):
            topic = "".join(["ord", "ers"]) if i % 3 else "orders"
            if i % 2:
                producer.produce(topic, b"v%d" % i, partition=i % 3, timestamp=100 + i)
            else:
                producer.produce(topic, b"w%d" % i, b"key-%d" % (i % 7), timestamp=100 + i)
        return [
            (key, [(b.builder.build(), len(b.callbacks)) for b in q.batches])
            for key, q in sorted(producer._queues.items())
        ]
    finally:
        if producer._sender is not None:
            producer._sender.cancel()


@compiled_only
async def test_the_lane_finds_each_partition_by_value_not_by_the_topic_object() -> None:
    # The lane remembers the last partition's queue for the topic object it was found by;
    # another object of the same name, or another partition, is looked up again.
    compiled = await batches_of_partitions(lane=True)
    assert compiled == await batches_of_partitions(lane=False)
    assert [key for key, _ in compiled] == [("orders", 0), ("orders", 1), ("orders", 2)]
    assert sum(count for _, batches in compiled for _, count in batches) == 60


@compiled_only
async def test_the_lane_sees_every_change_of_the_producers_state() -> None:
    """The lane remembers the producer's attributes, a topic's metadata and its sticky
    choice while their dicts are unchanged: any change is seen by the next call."""
    producer = make_producer(3, lane=True, batch_size=16384)
    try:
        producer.produce("a", b"v", partition=1, timestamp=5)
        producer.produce("a", b"v", partition=1, timestamp=5)
        batch = producer._queues["a", 1].batches[-1]
        assert not batch.closed and len(producer) == 2
        producer._batch_size = 10  # the next record closes the batch it goes into
        producer.produce("a", b"v", partition=1, timestamp=5)
        assert batch.closed and batch.builder.records_count == 3 and len(producer) == 3
        producer._pending = 10  # the lane counts on from what the producer holds
        producer.produce("a", b"v", partition=1, timestamp=5)
        assert len(producer) == 11
        sticky = producer.produce("b", b"v", timestamp=5)  # b's one partition, sticky
        assert sticky._batch is producer._queues["b", 0].batches[-1]
        del producer._topics["b"]  # no metadata now: the record waits for it
        waiting = producer.produce("b", b"w", timestamp=5)
        assert waiting._batch is None and [w.fields[1] for w in producer._waiting["b"]] == [b"w"]
        producer._closed = True
        with pytest.raises(ProducerClosedError):
            producer.produce("a", b"v", partition=1, timestamp=5)
    finally:
        if producer._sender is not None:
            producer._sender.cancel()


DEBUG_SCRIPT = """
import asyncio, random, sys
sys.path[:0] = sys.argv[1:]
from test_client_produce_lane import make_producer, set_metadata

async def main():
    rng = random.Random(5)
    reported = []
    producer = make_producer(5, lane=True, batch_size=700)
    produce, quiet = producer.produce, producer.produce_without_handle
    for i in range(1500):
        topic = rng.choice(["a", "a", "b", "c"])
        value = rng.choice([None, b"v" * rng.randrange(300), "text", 7])
        key = rng.choice([None, None, b"k%d" % i, "key"])
        partition = rng.choice([None, None, -1, 0, 2, 9])
        headers = rng.choice([None, None, [("h", b"v")]])
        timestamp = rng.choice([None, 0, 5, 1 << 70])
        on_delivery = rng.choice([None, lambda e, m: reported.append(e)])
        call = rng.choice([produce, quiet])
        try:
            if rng.random() < 0.5:
                call(topic, value, key, partition, headers, timestamp, on_delivery)
            else:
                call(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
        except (TypeError, ValueError):
            pass
        if i % 500 == 0:
            set_metadata(producer)
    producer._sender.cancel()
    await asyncio.gather(producer._sender, return_exceptions=True)

asyncio.run(main())
print("ok")
"""


@compiled_only
def test_the_lane_under_the_debug_allocator() -> None:
    """produce() and produce_without_handle() through the lane and its fallbacks in a
    child process under ``PYTHONMALLOC=debug`` (writes past a block, use after free)."""
    run_under_debug_allocator(DEBUG_SCRIPT, Path(__file__).parent)
