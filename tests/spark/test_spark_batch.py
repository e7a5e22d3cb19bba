"""Batch reads through ``spark.read.format("highwater")`` against a real embedded server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from embedded_servers import ServerThread
from highwater.client.admin import AdminClient
from highwater.client.producer import Producer
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from spark_topics import create_topic, produce, unique_topic

EXPECTED_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)


def reader(spark: Any, server: ServerThread, **options: str) -> Any:
    read = spark.read.format("highwater").option("bootstrap.servers", server.address)
    for name, value in options.items():
        read = read.option(name, value)
    return read.load()


def test_a_batch_read_returns_every_record_with_its_coordinates(
    spark: Any, server: ServerThread
) -> None:
    topic = unique_topic("batch")
    create_topic(server.address, topic, 3)
    before = int(time.time() * 1000)
    produce(server.address, topic, [f"v{i}" for i in range(300)], partitions=3)
    df = reader(spark, server, subscribe=topic)
    assert df.schema == EXPECTED_SCHEMA
    rows = df.collect()
    assert len(rows) == 300
    for row in rows:
        i = int(row.value.decode()[1:])
        assert row.key == f"k{i}".encode()
        assert row.topic == topic
        assert row.partition == i % 3
        assert row.offset == i // 3
        assert row.timestampType == 0
        assert row.timestamp.timestamp() * 1000 >= before - 1000
    per_partition = {p: sorted(r.offset for r in rows if r.partition == p) for p in range(3)}
    assert per_partition == {p: list(range(100)) for p in range(3)}


def test_headers_come_as_an_array_of_key_value_structs(spark: Any, server: ServerThread) -> None:
    topic = unique_topic("headers")
    create_topic(server.address, topic, 1)
    with Producer({"bootstrap.servers": server.address}) as producer:
        producer.produce(topic, b"a", headers=[("trace", b"t1"), ("empty", None)])
        producer.produce(topic, b"b")
    df = reader(spark, server, subscribe=topic, includeHeaders="true")
    header_type = df.schema["headers"].dataType
    assert isinstance(header_type, ArrayType)
    assert df.schema.fieldNames() == [*EXPECTED_SCHEMA.fieldNames(), "headers"]
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [(h.key, h.value) for h in rows[0].headers] == [("trace", b"t1"), ("empty", None)]
    assert rows[1].headers == []


def test_offset_bounds_pattern_and_assign_choose_what_is_read(
    spark: Any, server: ServerThread
) -> None:
    prefix = unique_topic("bounds")
    first, second = f"{prefix}-x", f"{prefix}-y"
    create_topic(server.address, first, 2)
    create_topic(server.address, second, 1)
    produce(server.address, first, [f"v{i}" for i in range(40)], partitions=2)
    produce(server.address, second, [f"w{i}" for i in range(10)], partitions=1)

    pattern = reader(spark, server, subscribePattern=f"{prefix}-.*")
    assert pattern.count() == 50

    bounded = reader(
        spark,
        server,
        subscribe=first,
        startingOffsets=f'{{"{first}": {{"0": 5, "1": -2}}}}',
        endingOffsets=f'{{"{first}": {{"0": 15, "1": -1}}}}',
    )
    offsets = sorted(
        (r.partition, r.offset) for r in bounded.select("partition", "offset").collect()
    )
    assert offsets == [(0, o) for o in range(5, 15)] + [(1, o) for o in range(20)]
    # as in spark-sql-kafka, per-partition offsets name every partition read
    partial_start = reader(
        spark, server, subscribe=first, startingOffsets=f'{{"{first}": {{"0": 5}}}}'
    )
    with pytest.raises(Exception, match=f"startingOffsets gives no offset for {first}-1"):
        partial_start.collect()
    partial_end = reader(
        spark,
        server,
        subscribePattern=f"{prefix}-.*",
        endingOffsets=f'{{"{first}": {{"0": 15, "1": -1}}}}',
    )
    with pytest.raises(Exception, match=f"endingOffsets gives no offset for {second}-0"):
        partial_end.collect()

    assigned = reader(spark, server, assign=f'{{"{first}": [1]}}')
    assert {r.partition for r in assigned.select("partition").collect()} == {1}
    assert assigned.count() == 20


def test_min_partitions_splits_a_large_range_across_tasks(spark: Any, server: ServerThread) -> None:
    topic = unique_topic("split")
    create_topic(server.address, topic, 1)
    produce(server.address, topic, [f"v{i}" for i in range(1000)], partitions=1)
    df = reader(spark, server, subscribe=topic, minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(1000))


def test_starting_timestamp_starts_at_the_first_record_at_or_after_it(
    spark: Any, server: ServerThread
) -> None:
    topic = unique_topic("time")
    create_topic(server.address, topic, 1)
    with Producer({"bootstrap.servers": server.address}) as producer:
        for i, timestamp in enumerate((1_000, 2_000, 3_000, 4_000)):
            producer.produce(topic, f"v{i}", timestamp=timestamp)
    df = reader(spark, server, subscribe=topic, startingTimestamp="2500")
    assert [r.value for r in df.orderBy("offset").collect()] == [b"v2", b"v3"]


def produce_stamped(address: str, topic: str, stamped: dict[int, list[int]]) -> None:
    """Records ``v<offset>`` with the given timestamps, per partition."""
    with Producer({"bootstrap.servers": address}) as producer:
        for partition, timestamps in stamped.items():
            for offset, timestamp in enumerate(timestamps):
                producer.produce(topic, f"v{offset}", partition=partition, timestamp=timestamp)
        assert producer.flush(30) == 0


def read_offsets(df: Any) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())


def test_a_start_time_after_a_partition_s_last_record_fails_unless_told_to_start_at_latest(
    spark: Any, server: ServerThread
) -> None:
    """spark-sql-kafka's startingOffsetsByTimestampStrategy: ``error`` (the default) fails
    the query, ``latest`` starts such a partition at its latest offset; an end time with no
    record after it ends at the latest offset whatever the strategy."""
    topic = unique_topic("time-strategy")
    create_topic(server.address, topic, 2)
    produce_stamped(server.address, topic, {0: [1_000, 2_000, 3_000, 4_000], 1: [1_000, 1_500]})
    strict = reader(spark, server, subscribe=topic, startingTimestamp="2500")
    with pytest.raises(Exception, match=f"{topic}-1 has no record at or after timestamp 2500"):
        strict.collect()
    lenient = reader(
        spark,
        server,
        subscribe=topic,
        startingTimestamp="2500",
        startingOffsetsByTimestampStrategy="Latest",
    )
    assert read_offsets(lenient) == [(0, 2), (0, 3)]
    ending = reader(spark, server, subscribe=topic, endingTimestamp="1800")
    assert read_offsets(ending) == [(0, 0), (1, 0), (1, 1)]


def test_per_partition_times_bound_a_batch_read(spark: Any, server: ServerThread) -> None:
    """startingOffsetsByTimestamp / endingOffsetsByTimestamp as spark-sql-kafka's: every
    partition read needs its time, and a named partition must exist."""
    topic = unique_topic("partition-times")
    create_topic(server.address, topic, 2)
    produce_stamped(server.address, topic, {0: [1_000, 2_000, 3_000, 4_000], 1: [10, 20, 30]})
    bounded = reader(
        spark,
        server,
        subscribe=topic,
        startingOffsetsByTimestamp=f'{{"{topic}": {{"0": 1500, "1": 0}}}}',
        endingOffsetsByTimestamp=f'{{"{topic}": {{"0": 3500, "1": 25}}}}',
    )
    assert read_offsets(bounded) == [(0, 1), (0, 2), (1, 0), (1, 1)]
    # a partition without a record after its start time follows the strategy
    after = f'{{"{topic}": {{"0": 1500, "1": 99}}}}'
    strict = reader(spark, server, subscribe=topic, startingOffsetsByTimestamp=after)
    with pytest.raises(Exception, match=f"{topic}-1 has no record at or after timestamp 99"):
        strict.collect()
    lenient = reader(
        spark,
        server,
        subscribe=topic,
        startingOffsetsByTimestamp=after,
        startingOffsetsByTimestampStrategy="latest",
    )
    assert read_offsets(lenient) == [(0, 1), (0, 2), (0, 3)]
    partial = reader(
        spark, server, subscribe=topic, startingOffsetsByTimestamp=f'{{"{topic}": {{"0": 0}}}}'
    )
    with pytest.raises(Exception, match=f"startingOffsetsByTimestamp gives no time for {topic}-1"):
        partial.collect()
    unknown = reader(
        spark,
        server,
        subscribe=topic,
        endingOffsetsByTimestamp=f'{{"{topic}": {{"0": 0, "1": 0, "7": 0}}}}',
    )
    with pytest.raises(Exception, match=f"endingOffsetsByTimestamp names {topic}-7, which does"):
        unknown.collect()


def test_records_removed_before_the_start_fail_the_read_or_are_skipped(
    spark: Any, server: ServerThread
) -> None:
    topic = unique_topic("lost")
    create_topic(server.address, topic, 1)
    produce(server.address, topic, [f"v{i}" for i in range(20)], partitions=1)

    async def delete() -> None:
        async with AdminClient(server.address) as admin:
            await admin.delete_records({(topic, 0): 10})

    asyncio.run(delete())
    start = f'{{"{topic}": {{"0": 3}}}}'
    with pytest.raises(Exception, match="offsets 3 to 9 were removed"):
        reader(spark, server, subscribe=topic, startingOffsets=start).collect()
    skipped = reader(spark, server, subscribe=topic, startingOffsets=start, failOnDataLoss="false")
    assert sorted(r.offset for r in skipped.select("offset").collect()) == list(range(10, 20))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "x", "startingOfsets": "earliest"}, "unknown option 'startingofsets'"),
        ({"subscribe": "x", "startingOffsets": "{bad json"}, "startingOffsets: not valid JSON"),
        ({"assign": '{"x": "0"}'}, "non-empty list of partitions"),
    ],
)
def test_bad_input_fails_when_the_dataframe_is_defined(
    spark: Any, server: ServerThread, options: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception) as raised:
        reader(spark, server, **options)
    assert message in str(raised.value)


def test_a_missing_topic_fails_the_batch_when_it_is_read_not_when_it_is_defined(
    spark: Any, server: ServerThread
) -> None:
    """As spark-sql-kafka: ``load()`` asks no broker (the same call defines streams, which
    need no topic yet); reading the batch needs its topics."""
    topic = unique_topic("no-such-topic")
    df = reader(spark, server, subscribe=topic)
    with pytest.raises(Exception, match=f"Topic '{topic}' does not exist"):
        df.count()


def test_a_user_schema_is_refused(spark: Any, server: ServerThread) -> None:
    topic = unique_topic("schema")
    create_topic(server.address, topic, 1)
    read = (
        spark.read.format("highwater")
        .schema("value string")
        .option("bootstrap.servers", server.address)
        .option("subscribe", topic)
    )
    with pytest.raises(Exception) as raised:
        read.load().collect()
    assert "fixed schema" in str(raised.value)
