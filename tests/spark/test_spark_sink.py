"""Writes through ``df.write.format("highwater")`` and ``writeStream``, read back with the
client library."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from embedded_servers import ServerThread
from spark_queries import started
from spark_topics import consume_all, create_topic, produce, unique_topic


def test_a_batch_write_produces_every_row_where_its_columns_say(
    spark: Any, server: ServerThread
) -> None:
    topic = unique_topic("write")
    create_topic(server.address, topic, 2)
    rows = [(f"k{i}", f"v{i}".encode(), topic, i % 2, [("n", str(i).encode())]) for i in range(200)]
    df = spark.createDataFrame(
        rows,
        "key string, value binary, topic string, partition int, "
        "headers array<struct<key: string, value: binary>>",
    )
    df.repartition(2).write.format("highwater").option("bootstrap.servers", server.address).mode(
        "append"
    ).save()
    messages = consume_all(server.address, topic, 2)
    assert len(messages) == 200
    for message in messages:
        i = int(message.key().decode()[1:])
        assert message.value() == f"v{i}".encode()
        assert message.partition() == i % 2
        assert message.headers() == [("n", str(i).encode())]


def test_the_topic_option_wins_over_a_topic_column(spark: Any, server: ServerThread) -> None:
    topic = unique_topic("option")
    create_topic(server.address, topic, 1)
    df = spark.createDataFrame([("elsewhere", "a"), (None, "b")], "topic string, value string")
    (
        df.write.format("highwater")
        .option("bootstrap.servers", server.address)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    assert sorted(m.value() for m in consume_all(server.address, topic, 1)) == [b"a", b"b"]


@pytest.mark.parametrize(
    ("schema", "options", "message"),
    [
        ("key string", {"topic": "t"}, "needs a 'value' column"),
        ("value int", {"topic": "t"}, "column 'value' must be string or binary"),
        ("value string", {}, "no topic to write to"),
        ("value string", {"topic": "no-such-topic"}, "Topic 'no-such-topic' does not exist"),
        ("value string", {"topic": "t", "lingerms": "5"}, "unknown option 'lingerms'"),
    ],
)
def test_bad_writes_fail_before_any_task_runs(
    spark: Any, server: ServerThread, schema: str, options: dict[str, str], message: str
) -> None:
    topic = unique_topic("bad-write")
    create_topic(server.address, topic, 1)
    options = {k: (topic if v == "t" else v) for k, v in options.items()}
    df = spark.createDataFrame([], schema)
    write = df.write.format("highwater").option("bootstrap.servers", server.address)
    for name, value in options.items():
        write = write.option(name, value)
    with pytest.raises(Exception) as raised:
        write.mode("append").save()
    assert message in str(raised.value)


def test_a_streaming_pipeline_reads_transforms_and_writes_a_topic(
    spark: Any, server: ServerThread, tmp_path: Path
) -> None:
    source, sink = unique_topic("pipe-in"), unique_topic("pipe-out")
    create_topic(server.address, source, 2)
    create_topic(server.address, sink, 2)
    produce(server.address, source, [f"v{i}" for i in range(120)], partitions=2)

    def run() -> None:
        query = started(
            lambda: (
                spark.readStream.format("highwater")
                .option("bootstrap.servers", server.address)
                .option("subscribe", source)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "50")
                .load()
                .selectExpr("key", "upper(cast(value as string)) as value", "partition")
                .writeStream.format("highwater")
                .option("bootstrap.servers", server.address)
                .option("topic", sink)
                .option("checkpointLocation", str(tmp_path / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
        )
        assert query.awaitTermination(120)
        assert query.exception() is None

    run()
    produce(server.address, source, [f"v{i}" for i in range(120, 150)], partitions=2, start=120)
    run()
    messages = consume_all(server.address, sink, 2)
    assert sorted(m.value() for m in messages) == sorted(f"V{i}".encode() for i in range(150))
    for message in messages:
        i = int(message.key().decode()[1:])
        assert message.partition() == i % 2


def test_a_topic_cannot_be_overwritten(spark: Any, server: ServerThread) -> None:
    topic = unique_topic("overwrite")
    create_topic(server.address, topic, 1)
    df = spark.createDataFrame([("a",)], "value string")
    write = df.write.format("highwater").option("bootstrap.servers", server.address)
    with pytest.raises(Exception) as raised:
        write.option("topic", topic).mode("overwrite").save()
    assert 'use mode("append")' in str(raised.value)
