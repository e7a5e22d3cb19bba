"""Streaming reads through ``spark.readStream.format("highwater")``: checkpointed offsets,
restarts, read limits, Trigger.AvailableNow, new partitions and lost records."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from embedded_servers import ServerThread
from highwater.client.admin import AdminClient
from highwater.client.producer import Producer
from spark_queries import started
from spark_topics import create_topic, produce, unique_topic
from test_spark_batch import EXPECTED_SCHEMA


class KeyedSink:
    """A foreachBatch sink keyed by (topic, partition, offset), counting every delivery."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int, int], list[bytes]] = {}
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        rows = batch.select("topic", "partition", "offset", "value").collect()
        with self._lock:
            self.batch_sizes.append(len(rows))
            for row in rows:
                self.rows.setdefault((row.topic, row.partition, row.offset), []).append(row.value)

    def offsets(self) -> set[tuple[str, int, int]]:
        return set(self.rows)

    def duplicated(self) -> list[tuple[str, int, int]]:
        return [key for key, values in self.rows.items() if len(values) > 1]


def stream(spark: Any, server: ServerThread, topic: str, **options: str) -> Any:
    read = (
        spark.readStream.format("highwater")
        .option("bootstrap.servers", server.address)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for name, value in options.items():
        read = read.option(name, value)
    return read.load()


def run_available_now(df: Any, sink: KeyedSink, checkpoint: Path) -> None:
    query = started(
        lambda: (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
    )
    assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
    assert query.exception() is None


def expected(topic: str, partitions: int, count: int) -> set[tuple[str, int, int]]:
    return {(topic, i % partitions, i // partitions) for i in range(count)}


def test_available_now_honours_the_read_limit_and_restarts_from_the_checkpoint(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    topic = unique_topic("stream")
    create_topic(server.address, topic, 3)
    produce(server.address, topic, [f"v{i}" for i in range(300)], partitions=3)
    sink = KeyedSink()
    df = stream(spark, server, topic, maxOffsetsPerTrigger="70")
    assert df.isStreaming and df.schema == EXPECTED_SCHEMA
    run_available_now(df, sink, tmp_path / "checkpoint")
    assert sink.batch_sizes == [70, 70, 70, 70, 20]
    assert sink.offsets() == expected(topic, 3, 300)

    produce(server.address, topic, [f"v{i}" for i in range(300, 450)], partitions=3, start=300)
    # Trigger.AvailableNow reads up to its target without waiting for minOffsetsPerTrigger
    waiting = stream(spark, server, topic, minOffsetsPerTrigger="1000")
    run_available_now(waiting, sink, tmp_path / "checkpoint")
    assert sink.batch_sizes[5:] == [150]
    assert sink.offsets() == expected(topic, 3, 450)
    assert sink.duplicated() == []
    for (_, partition, offset), values in sink.rows.items():
        assert values == [f"v{offset * 3 + partition}".encode()]


def test_a_running_query_stopped_and_restarted_loses_nothing(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    topic = unique_topic("restart")
    create_topic(server.address, topic, 2)
    sink = KeyedSink()
    checkpoint = str(tmp_path / "checkpoint")

    def start() -> Any:
        return (
            stream(spark, server, topic, maxOffsetsPerTrigger="50")
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def wait_for(count: int) -> None:
        deadline = time.monotonic() + 90
        while len(sink.offsets()) < count:
            assert time.monotonic() < deadline, f"{len(sink.offsets())} of {count} records read"
            time.sleep(0.2)

    query = started(start)
    produce(server.address, topic, [f"v{i}" for i in range(200)], partitions=2)
    wait_for(100)
    query.stop()
    assert query.exception() is None
    produce(server.address, topic, [f"v{i}" for i in range(200, 300)], partitions=2, start=200)
    query = started(start)
    wait_for(300)
    query.stop()
    assert sink.offsets() == expected(topic, 2, 300)
    for (_, partition, offset), values in sink.rows.items():
        assert set(values) == {f"v{offset * 2 + partition}".encode()}


def test_partitions_added_to_a_topic_are_read_from_their_start(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    topic = unique_topic("grow")
    create_topic(server.address, topic, 1)
    produce(server.address, topic, [f"v{i}" for i in range(10)], partitions=1)
    sink = KeyedSink()
    run_available_now(stream(spark, server, topic), sink, tmp_path / "checkpoint")
    assert sink.offsets() == expected(topic, 1, 10)

    async def grow() -> None:
        async with AdminClient(server.address) as admin:
            (await admin.create_partitions({topic: 2}))[topic].raise_for_error()

    asyncio.run(grow())
    produce(server.address, topic, [f"w{i}" for i in range(10)], partitions=2)
    run_available_now(stream(spark, server, topic), sink, tmp_path / "checkpoint")
    assert {k for k in sink.offsets() if k[1] == 1} == {(topic, 1, o) for o in range(5)}
    assert {k for k in sink.offsets() if k[1] == 0} == {(topic, 0, o) for o in range(15)}
    assert sink.duplicated() == []


def test_a_pattern_picks_up_topics_created_after_the_query_started(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    prefix = unique_topic("pattern")
    create_topic(server.address, f"{prefix}-a", 1)
    produce(server.address, f"{prefix}-a", ["a0", "a1"], partitions=1)
    sink = KeyedSink()
    df = (
        spark.readStream.format("highwater")
        .option("bootstrap.servers", server.address)
        .option("subscribePattern", f"{prefix}-.*")
        .option("startingOffsets", "earliest")
        .load()
    )
    run_available_now(df, sink, tmp_path / "checkpoint")
    create_topic(server.address, f"{prefix}-b", 1)
    produce(server.address, f"{prefix}-b", ["b0", "b1", "b2"], partitions=1)
    run_available_now(df, sink, tmp_path / "checkpoint")
    assert sink.offsets() == {(f"{prefix}-a", 0, 0), (f"{prefix}-a", 0, 1)} | {
        (f"{prefix}-b", 0, o) for o in range(3)
    }
    assert sink.duplicated() == []


def test_records_removed_by_retention_before_they_were_read(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    topic = unique_topic("retention")
    create_topic(server.address, topic, 1)
    produce(server.address, topic, [f"v{i}" for i in range(10)], partitions=1)
    sink = KeyedSink()
    run_available_now(stream(spark, server, topic), sink, tmp_path / "checkpoint")
    produce(server.address, topic, [f"v{i}" for i in range(10, 30)], partitions=1, start=10)

    async def delete() -> None:
        async with AdminClient(server.address) as admin:
            await admin.delete_records({(topic, 0): 20})

    asyncio.run(delete())
    query = started(
        lambda: (
            stream(spark, server, topic)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
    )
    with pytest.raises(Exception, match="offsets 10 to 19 were removed"):
        query.awaitTermination(120)
    run_available_now(
        stream(spark, server, topic, failOnDataLoss="false"), sink, tmp_path / "checkpoint"
    )
    assert sink.offsets() == {(topic, 0, o) for o in [*range(10), *range(20, 30)]}


def test_a_stream_with_an_end_fails_as_it_starts(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    topic = unique_topic("ending")
    create_topic(server.address, topic, 1)
    query = started(
        lambda: (
            stream(spark, server, topic, endingOffsets="latest")
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
    )
    with pytest.raises(Exception, match="batch queries only"):
        query.awaitTermination(60)


def test_a_subscribed_topic_created_after_the_query_started_is_read_from_its_start(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    """As spark-sql-kafka: defining and starting a stream needs none of its topics; a topic
    that does not exist yet has no partitions until it appears."""
    prefix = unique_topic("later")
    present, later = f"{prefix}-a", f"{prefix}-b"
    create_topic(server.address, present, 1)
    produce(server.address, present, ["a0", "a1"], partitions=1)
    sink = KeyedSink()
    df = stream(spark, server, f"{present},{later}")
    run_available_now(df, sink, tmp_path / "checkpoint")
    assert sink.offsets() == {(present, 0, 0), (present, 0, 1)}

    create_topic(server.address, later, 2)
    produce(server.address, later, [f"b{i}" for i in range(6)], partitions=2)
    run_available_now(stream(spark, server, f"{present},{later}"), sink, tmp_path / "checkpoint")
    assert sink.offsets() == {(present, 0, 0), (present, 0, 1)} | expected(later, 2, 6)
    assert sink.duplicated() == []

    # a pattern that matches nothing yet, and an assignment of a topic not created yet
    pattern = f"{unique_topic('nothing')}-.*"
    nothing = (
        spark.readStream.format("highwater")
        .option("bootstrap.servers", server.address)
        .option("subscribePattern", pattern)
        .load()
    )
    run_available_now(nothing, KeyedSink(), tmp_path / "pattern")
    unassigned = unique_topic("unassigned")
    assigned = (
        spark.readStream.format("highwater")
        .option("bootstrap.servers", server.address)
        .option("assign", f'{{"{unassigned}": [0]}}')
        .option("startingOffsets", "earliest")
        .load()
    )
    assigned_sink = KeyedSink()
    run_available_now(assigned, assigned_sink, tmp_path / "assign")
    create_topic(server.address, unassigned, 1)
    produce(server.address, unassigned, ["u0"], partitions=1)
    run_available_now(assigned, assigned_sink, tmp_path / "assign")
    assert assigned_sink.offsets() == {(unassigned, 0, 0)}


def test_a_query_restarted_after_one_of_its_topics_was_deleted(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    """The restart defines the DataFrame again: that needs no topic; the checkpoint's
    partitions of the deleted topic are data loss, which failOnDataLoss judges."""
    prefix = unique_topic("deleted")
    kept, deleted = f"{prefix}-kept", f"{prefix}-gone"
    create_topic(server.address, kept, 1)
    create_topic(server.address, deleted, 1)
    produce(server.address, kept, ["k0"], partitions=1)
    produce(server.address, deleted, ["d0"], partitions=1)
    sink = KeyedSink()
    topics = f"{kept},{deleted}"
    run_available_now(stream(spark, server, topics), sink, tmp_path / "checkpoint")
    assert sink.offsets() == {(kept, 0, 0), (deleted, 0, 0)}

    async def delete() -> None:
        async with AdminClient(server.address) as admin:
            (await admin.delete_topics([deleted]))[deleted].raise_for_error()

    asyncio.run(delete())
    produce(server.address, kept, ["k1"], partitions=1, start=1)
    query = started(
        lambda: (
            stream(spark, server, topics)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
    )
    with pytest.raises(Exception, match=f"partitions {deleted}-0 no longer exist"):
        query.awaitTermination(120)
    run_available_now(
        stream(spark, server, topics, failOnDataLoss="false"), sink, tmp_path / "checkpoint"
    )
    assert sink.offsets() == {(kept, 0, 0), (kept, 0, 1), (deleted, 0, 0)}
    assert sink.duplicated() == []


def test_a_stream_starts_at_per_partition_times(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    topic = unique_topic("stream-times")
    create_topic(server.address, topic, 2)
    with Producer({"bootstrap.servers": server.address}) as producer:
        for partition in (0, 1):
            for timestamp in (1_000, 2_000, 3_000):
                producer.produce(topic, "v", partition=partition, timestamp=timestamp)
        assert producer.flush(30) == 0
    sink = KeyedSink()
    df = stream(
        spark,
        server,
        topic,
        startingOffsetsByTimestamp=f'{{"{topic}": {{"0": 2500, "1": 1500}}}}',
    )
    run_available_now(df, sink, tmp_path / "checkpoint")
    assert sink.offsets() == {(topic, 0, 2), (topic, 1, 1), (topic, 1, 2)}

    # no record at or after the time: the query fails as it starts (the strategy's default)
    query = started(
        lambda: (
            stream(spark, server, topic, startingTimestamp="3500")
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "late"))
            .start()
        )
    )
    with pytest.raises(Exception, match=f"{topic}-0 has no record at or after timestamp 3500"):
        query.awaitTermination(60)


def test_a_stream_refuses_starting_offsets_that_leave_a_partition_out(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    """spark-sql-kafka's rule: a stream's per-partition ``startingOffsets`` names every
    partition it reads; one left out fails the query as it starts, naming it."""
    topic = unique_topic("stream-partial")
    create_topic(server.address, topic, 2)
    query = started(
        lambda: (
            stream(spark, server, topic, startingOffsets=f'{{"{topic}": {{"1": -2}}}}')
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
    )
    with pytest.raises(Exception, match=f"startingOffsets gives no offset for {topic}-0"):
        query.awaitTermination(60)
