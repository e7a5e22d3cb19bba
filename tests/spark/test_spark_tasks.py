"""What a Spark task does, without Spark: reading an offset range and writing rows, against a
real embedded server."""

from __future__ import annotations

import asyncio
import pickle
import socket
import time
from pathlib import Path

import pyarrow as pa
import pytest
from embedded_servers import ServerThread
from highwater.client.admin import AdminClient
from highwater.client.producer import Producer
from highwater.records import iter_batches
from highwater.records.partitioner import partition_for_key
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows
from pyspark_highwater.cluster import ClusterOffsets, UnknownTopicError
from pyspark_highwater.offsets import OffsetRange
from pyspark_highwater.options import HighwaterOptionError, Subscription, parse_read_options
from pyspark_highwater.reading import (
    BATCH_RECORDS,
    BATCH_RECORDS_MAX,
    DataLossError,
    ReadTimeoutError,
    read_range,
)
from pyspark_highwater.source import BatchReader, HighwaterDataSource, StreamReader
from pyspark_highwater.writing import SINK_BATCH_SIZE, DeliveryError, write_batches
from spark_topics import consume_all, create_topic, produce, unique_topic


def config(server: ServerThread) -> dict[str, object]:
    return {
        "bootstrap.servers": server.address,
        "auto.offset.reset": "none",
        "enable.auto.commit": False,
    }


def offsets(batches: list[pa.RecordBatch]) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


def test_a_range_is_read_exactly_in_arrow_batches(server: ServerThread) -> None:
    topic = unique_topic("task-read")
    create_topic(server.address, topic, 1)
    produce(server.address, topic, [f"v{i}" for i in range(12_000)], partitions=1)
    batches = list(
        read_range(
            config(server),
            OffsetRange(topic, 0, 100, 11_900),
            include_headers=False,
            fail_on_data_loss=True,
            poll_timeout_ms=10_000,
        )
    )
    assert offsets(batches) == list(range(100, 11_900))
    # a fetched batch's records past BATCH_RECORDS stay in the Arrow batch: no small batch
    # follows each full one (only the range's tail may be small)
    assert all(BATCH_RECORDS <= b.num_rows <= BATCH_RECORDS_MAX for b in batches[:-1])
    assert batches[-1].num_rows <= BATCH_RECORDS_MAX
    assert batches[0].column("value").to_pylist()[0] == b"v100"


def test_a_fetched_batch_above_the_largest_arrow_batch_is_cut(server: ServerThread) -> None:
    topic = unique_topic("task-cut")
    create_topic(server.address, topic, 1)
    records = BATCH_RECORDS_MAX + BATCH_RECORDS // 2
    with Producer({"bootstrap.servers": server.address, "batch.size": 1 << 20}) as producer:
        producer.produce_batch(topic, {"value": [b"%d" % i for i in range(records)]}, partition=0)
        assert producer.flush(30) == 0
    batches = list(
        read_range(
            config(server),
            OffsetRange(topic, 0, 0, records),
            include_headers=False,
            fail_on_data_loss=True,
            poll_timeout_ms=10_000,
        )
    )
    assert offsets(batches) == list(range(records))
    assert [b.num_rows for b in batches] == [BATCH_RECORDS, BATCH_RECORDS, BATCH_RECORDS // 2]


def test_a_range_below_the_log_start_fails_or_skips_in_the_task(server: ServerThread) -> None:
    topic = unique_topic("task-lost")
    create_topic(server.address, topic, 1)
    produce(server.address, topic, [f"v{i}" for i in range(30)], partitions=1)

    async def delete() -> None:
        async with AdminClient(server.address) as admin:
            await admin.delete_records({(topic, 0): 12})

    asyncio.run(delete())
    planned = OffsetRange(topic, 0, 5, 20)
    with pytest.raises(DataLossError, match="offsets 5 to 11 were removed"):
        list(
            read_range(
                config(server),
                planned,
                include_headers=False,
                fail_on_data_loss=True,
                poll_timeout_ms=10_000,
            )
        )
    batches = read_range(
        config(server),
        planned,
        include_headers=False,
        fail_on_data_loss=False,
        poll_timeout_ms=10_000,
    )
    assert offsets(list(batches)) == list(range(12, 20))


def test_a_range_beyond_the_end_of_the_log_fails_or_is_skipped_as_data_loss(
    server: ServerThread,
) -> None:
    # planned when the partition held more records (the topic was recreated, or its log
    # truncated, since): what is missing is data loss, as in spark-sql-kafka, not a timeout
    topic = unique_topic("task-shorter")
    create_topic(server.address, topic, 1)
    produce(server.address, topic, ["a", "b", "c"], partitions=1)
    for planned, read in ((OffsetRange(topic, 0, 1, 8), [1, 2]), (OffsetRange(topic, 0, 6, 9), [])):
        with pytest.raises(
            DataLossError, match=f"{topic}-0: its offsets went back from {planned.end} to 3"
        ):
            list(
                read_range(
                    config(server),
                    planned,
                    include_headers=False,
                    fail_on_data_loss=True,
                    poll_timeout_ms=1500,
                )
            )
        batches = read_range(
            config(server),
            planned,
            include_headers=False,
            fail_on_data_loss=False,
            poll_timeout_ms=1500,
        )
        assert offsets(list(batches)) == read


def test_a_range_whose_leader_never_answers_times_out() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
    nobody = {"bootstrap.servers": address, "auto.offset.reset": "none"}
    with pytest.raises(ReadTimeoutError, match="no record arrived for 1500 ms at offset 0"):
        list(
            read_range(
                nobody,
                OffsetRange("unreachable", 0, 0, 5),
                include_headers=False,
                fail_on_data_loss=True,
                poll_timeout_ms=1500,
            )
        )


def test_rows_are_written_and_reported_per_partition(server: ServerThread) -> None:
    topic = unique_topic("task-write")
    create_topic(server.address, topic, 2)
    batch = pa.RecordBatch.from_pydict(
        {
            "value": [f"v{i}" for i in range(10)],
            "key": [f"k{i}".encode() for i in range(10)],
            "partition": pa.array([i % 2 for i in range(10)], pa.int32()),
        }
    )
    written = write_batches({"bootstrap.servers": server.address}, topic, [batch])
    assert written.records == 10
    assert written.ranges == {(topic, 0): (0, 4), (topic, 1): (0, 4)}
    assert sorted(m.value() for m in consume_all(server.address, topic, 2)) == sorted(
        f"v{i}".encode() for i in range(10)
    )


def test_null_keys_values_partitions_and_headers_are_written_as_absent(
    server: ServerThread,
) -> None:
    topic = unique_topic("task-nulls")
    create_topic(server.address, topic, 2)
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    rows = pa.RecordBatch.from_pydict(
        {
            "topic": [topic] * 3,
            "key": [None, "k1", None],
            "value": pa.array([b"v0", None, None], pa.binary()),
            "partition": pa.array([1, None, 1], pa.int32()),
            "headers": pa.array([[{"key": "h", "value": None}], None, []], header_type),
        }
    )
    columnar = pa.RecordBatch.from_pydict(
        {"key": ["k3", None], "value": pa.array([None, b"v4"], pa.binary())}
    )
    config = {"bootstrap.servers": server.address}
    assert write_batches(config, None, [rows]).records == 3
    assert write_batches(config, topic, [columnar]).records == 2
    got = {(m.key(), m.value()): m for m in consume_all(server.address, topic, 2)}
    assert set(got) == {(None, b"v0"), (b"k1", None), (None, None), (b"k3", None), (None, b"v4")}
    assert got[(None, b"v0")].partition() == 1 and got[(None, None)].partition() == 1
    assert got[(None, b"v0")].headers() == [("h", None)]
    assert not got[(b"k1", None)].headers()


def test_key_and_value_columns_are_written_as_batches_partitioned_by_key(
    server: ServerThread,
) -> None:
    topic = unique_topic("task-columns")
    create_topic(server.address, topic, 3)
    keys = [None if i % 5 == 0 else f"k{i}" for i in range(400)]
    batch = pa.RecordBatch.from_pydict(
        {"Key": keys, "value": [f"v{i}" for i in range(400)], "other": list(range(400))}
    )
    written = write_batches({"bootstrap.servers": server.address}, topic, [batch, batch])
    assert written.records == 800
    assert sum(high - low + 1 for low, high in written.ranges.values()) == 800
    got = consume_all(server.address, topic, 3)
    assert sorted(m.value() for m in got) == sorted(f"v{i % 400}".encode() for i in range(800))
    for m in got:
        key = m.key()
        if key is not None:
            assert m.partition() == partition_for_key(key, 3)
    with pytest.raises(DeliveryError, match="no-such-topic-for-columns"):
        write_batches({"bootstrap.servers": server.address}, "no-such-topic-for-columns", [batch])


def test_a_row_for_a_missing_topic_fails_the_task(server: ServerThread) -> None:
    batch = pa.RecordBatch.from_pydict({"value": ["a"], "topic": ["no-such-topic-anywhere"]})
    with pytest.raises(DeliveryError, match="no-such-topic-anywhere"):
        write_batches({"bootstrap.servers": server.address}, None, [batch])


def stored_batch_sizes(server: ServerThread, topic: str) -> list[int]:
    """The record count of each batch partition 0 of ``topic`` holds, read from its log."""
    logs = sorted(Path(server.data_dir).rglob(f"{topic}-0/*.log"))
    return [b.header.records_count for path in logs for b in iter_batches(path.read_bytes())]


def test_the_sink_writes_large_batches_unless_the_options_give_a_batch_size(
    server: ServerThread,
) -> None:
    rows = pa.RecordBatch.from_pydict({"value": [b"v" * 100] * 3000})  # about 330 KB
    assert SINK_BATCH_SIZE == 512 * 1024
    default = unique_topic("task-batch-size")
    create_topic(server.address, default, 1)
    write_batches({"bootstrap.servers": server.address}, default, [rows])
    assert stored_batch_sizes(server, default) == [3000]
    given = unique_topic("task-batch-size")
    create_topic(server.address, given, 1)
    write_batches({"bootstrap.servers": server.address, "batch.size": 16384}, given, [rows])
    sizes = stored_batch_sizes(server, given)
    assert sum(sizes) == 3000 and len(sizes) > 15 and max(sizes) < 150


def test_planning_calls_in_a_session_share_one_client_and_answer_the_same(
    server: ServerThread,
) -> None:
    topic = unique_topic("plan-session")
    create_topic(server.address, topic, 2)
    produce(server.address, topic, [f"v{i}" for i in range(6)], partitions=2)
    cluster = ClusterOffsets(server.address)
    subscription = Subscription("subscribe", topics=(topic,))
    alone = cluster.latest(cluster.partitions(subscription))
    with cluster.session():
        opened = cluster._session
        assert opened is not None
        partitions = cluster.partitions(subscription)
        assert partitions == [(topic, 0), (topic, 1)]
        assert cluster.latest(partitions) == alone
        assert cluster.earliest(partitions) == {(topic, 0): 0, (topic, 1): 0}
        with cluster.session():
            assert cluster._session is opened
        assert cluster._session is opened
        assert pickle.loads(pickle.dumps(cluster))._session is None
    assert cluster._session is None
    assert opened[0].is_closed()
    assert cluster.latest(partitions) == alone


def stream_reader(server: ServerThread, topic: str, **options: str) -> StreamReader:
    """The streaming source's driver side, as Spark's planning calls it (no Spark needed)."""
    return StreamReader(
        parse_read_options({"bootstrap.servers": server.address, "subscribe": topic, **options})
    )


def test_a_checkpoint_beyond_a_recreated_topic_fails_or_goes_on_from_its_offsets(
    server: ServerThread,
) -> None:
    topic = unique_topic("plan-recreated")
    create_topic(server.address, topic, 1)
    produce(server.address, topic, [f"v{i}" for i in range(10)], partitions=1)
    # the checkpoint of a query that read 40 records of the topic's previous life
    begin = {topic: {"0": 40}}
    strict = stream_reader(server, topic)
    end = strict.latestOffset(begin, ReadAllAvailable())
    assert end == {topic: {"0": 10}}
    with pytest.raises(DataLossError, match=f"{topic}-0: its offsets went back from 40 to 10"):
        strict.partitions(begin, end)
    lenient = stream_reader(server, topic, failOnDataLoss="false")
    assert lenient.partitions(begin, end) == []
    produce(server.address, topic, ["v10", "v11"], partitions=1, start=10)
    following = lenient.latestOffset(end, ReadAllAvailable())
    assert [p.range for p in lenient.partitions(end, following)] == [OffsetRange(topic, 0, 10, 12)]


def batch_reader(server: ServerThread, topic: str, **options: str) -> BatchReader:
    """The batch source's driver side, as Spark's planning calls it (no Spark needed)."""
    return BatchReader(
        parse_read_options({"bootstrap.servers": server.address, "subscribe": topic, **options})
    )


def test_offsets_for_a_partition_that_does_not_exist_are_refused(server: ServerThread) -> None:
    topic = unique_topic("plan-unknown")
    create_topic(server.address, topic, 2)
    options = {
        "bootstrap.servers": server.address,
        "subscribe": topic,
        "startingOffsets": f'{{"{topic}": {{"0": 0, "5": 0}}}}',
    }
    message = f"startingOffsets names {topic}-5, which does not exist"
    HighwaterDataSource(options).schema()  # defining the DataFrame asks no broker
    with pytest.raises(UnknownTopicError, match=message):
        BatchReader(parse_read_options(options)).partitions()
    with pytest.raises(UnknownTopicError, match=message):
        StreamReader(parse_read_options(options)).initialOffset()
    ending = f'{{"{topic}": {{"2": -1}}}}'
    with pytest.raises(UnknownTopicError, match=f"endingOffsets names {topic}-2, which does not"):
        batch_reader(server, topic, endingOffsets=ending).partitions()


def test_a_batch_starting_after_its_end_is_refused(server: ServerThread) -> None:
    topic = unique_topic("plan-inverted")
    create_topic(server.address, topic, 2)
    produce(server.address, topic, [f"v{i}" for i in range(20)], partitions=2)
    inverted = batch_reader(
        server,
        topic,
        startingOffsets=f'{{"{topic}": {{"0": 8, "1": 2}}}}',
        endingOffsets=f'{{"{topic}": {{"0": 5, "1": 9}}}}',
    )
    with pytest.raises(HighwaterOptionError, match=f"{topic}-0 starts at 8, after its end 5"):
        inverted.partitions()
    beyond = batch_reader(server, topic, startingOffsets=f'{{"{topic}": {{"0": 30, "1": 0}}}}')
    with pytest.raises(HighwaterOptionError, match=f"{topic}-0 starts at 30, after its end 10"):
        beyond.partitions()
    # no record at or after the start time: with the strategy latest, each partition starts
    # at its latest offset
    by_time = batch_reader(
        server,
        topic,
        startingTimestamp="9" * 13,
        endingTimestamp="0",
        startingOffsetsByTimestampStrategy="latest",
    )
    with pytest.raises(
        HighwaterOptionError,
        match=f"startingTimestamp: {topic}-0 starts at 10, after its end 0 \\(endingTimestamp",
    ):
        by_time.partitions()
    at_the_end = batch_reader(server, topic, startingOffsets=f'{{"{topic}": {{"0": 10, "1": 0}}}}')
    assert [p.range for p in at_the_end.partitions()] == [OffsetRange(topic, 1, 0, 10)]


def test_a_stream_starting_after_the_last_record_s_time_fails_or_starts_at_latest(
    server: ServerThread,
) -> None:
    topic = unique_topic("plan-time")
    create_topic(server.address, topic, 2)
    produce(server.address, topic, [f"v{i}" for i in range(6)], partitions=2)
    future = str(int(time.time() * 1000) + 3_600_000)
    strict = stream_reader(server, topic, startingTimestamp=future)
    with pytest.raises(
        HighwaterOptionError,
        match=f"startingTimestamp: {topic}-0 has no record at or after timestamp {future}",
    ):
        strict.initialOffset()
    lenient = stream_reader(
        server, topic, startingTimestamp=future, startingOffsetsByTimestampStrategy="latest"
    )
    assert lenient.initialOffset() == {topic: {"0": 3, "1": 3}}
    assert stream_reader(server, topic, startingTimestamp="0").initialOffset() == {
        topic: {"0": 0, "1": 0}
    }


def test_a_subscribed_topic_deleted_mid_stream_is_data_loss(server: ServerThread) -> None:
    prefix = unique_topic("plan-deleted")
    kept, deleted = f"{prefix}-kept", f"{prefix}-deleted"
    for topic in (kept, deleted):
        create_topic(server.address, topic, 1)
        produce(server.address, topic, ["a", "b", "c"], partitions=1)
    begin = {kept: {"0": 0}, deleted: {"0": 1}}

    async def delete() -> None:
        async with AdminClient(server.address) as admin:
            (await admin.delete_topics([deleted]))[deleted].raise_for_error()
            while deleted in {t.name for t in await admin.list_topics()}:
                await asyncio.sleep(0.05)

    asyncio.run(delete())
    both = f"{kept},{deleted}"
    strict = stream_reader(server, both)
    end = strict.latestOffset(begin, ReadAllAvailable())
    assert end == {kept: {"0": 3}}
    with pytest.raises(DataLossError, match=f"partitions {deleted}-0 no longer exist"):
        strict.partitions(begin, end)
    lenient = stream_reader(server, both, failOnDataLoss="false")
    assert lenient.latestOffset(begin, ReadAllAvailable()) == end
    assert [p.range for p in lenient.partitions(begin, end)] == [OffsetRange(kept, 0, 0, 3)]
    # created again under its name: a new topic, read from its beginning
    create_topic(server.address, deleted, 1)
    produce(server.address, deleted, ["x", "y"], partitions=1)
    following = lenient.latestOffset(end, ReadAllAvailable())
    assert following == {kept: {"0": 3}, deleted: {"0": 2}}
    assert [p.range for p in lenient.partitions(end, following)] == [OffsetRange(deleted, 0, 0, 2)]


def test_min_offsets_per_trigger_waits_for_records_or_the_max_trigger_delay(
    server: ServerThread,
) -> None:
    topic = unique_topic("plan-min")
    create_topic(server.address, topic, 2)
    produce(server.address, topic, [f"v{i}" for i in range(4)], partitions=2)
    start = {topic: {"0": 0, "1": 0}}
    waiting = stream_reader(server, topic, minOffsetsPerTrigger="10", maxTriggerDelay="1s")
    limit = waiting.getDefaultReadLimit()
    assert limit == ReadMinRows(10)
    # the first trigger runs whatever waits (as spark-sql-kafka's); then 10 must wait...
    first = waiting.latestOffset(start, limit)
    assert first == {topic: {"0": 2, "1": 2}}
    produce(server.address, topic, [f"v{i}" for i in range(4, 8)], partitions=2, start=4)
    assert waiting.latestOffset(first, limit) == first
    # ... or the delay pass
    time.sleep(1.1)
    assert waiting.latestOffset(first, limit) == {topic: {"0": 4, "1": 4}}
    capped = stream_reader(
        server, topic, minOffsetsPerTrigger="3", maxOffsetsPerTrigger="4", maxTriggerDelay="1h"
    )
    assert capped.getDefaultReadLimit() == ReadMaxRows(4)
    after = capped.latestOffset(start, ReadMaxRows(4))
    assert after == {topic: {"0": 2, "1": 2}}
    produce(server.address, topic, ["v8", "v9"], partitions=2, start=8)
    assert capped.latestOffset({topic: {"0": 4, "1": 4}}, ReadMaxRows(4)) == {
        topic: {"0": 4, "1": 4}
    }
    # everything is read when Spark asks for it (Trigger.Once), whatever the limits say
    assert capped.latestOffset(after, ReadAllAvailable()) == {topic: {"0": 5, "1": 5}}


def test_a_new_partition_whose_first_records_are_gone_is_data_loss(server: ServerThread) -> None:
    prefix = unique_topic("plan-new-lost")
    old, new = f"{prefix}-old", f"{prefix}-new"
    create_topic(server.address, old, 1)
    begin = {old: {"0": 0}}
    create_topic(server.address, new, 1)
    produce(server.address, new, [f"v{i}" for i in range(6)], partitions=1)

    async def delete() -> None:
        async with AdminClient(server.address) as admin:
            await admin.delete_records({(new, 0): 2})

    asyncio.run(delete())
    pattern = {"subscribePattern": f"{prefix}-.*"}
    strict = StreamReader(parse_read_options({"bootstrap.servers": server.address, **pattern}))
    end = strict.latestOffset(begin, ReadAllAvailable())
    assert end == {old: {"0": 0}, new: {"0": 6}}
    # as in spark-sql-kafka: a partition that appeared since the last micro-batch is read from
    # its first offset, 0; records removed below its log start were never read
    with pytest.raises(DataLossError, match=f"{new}-0: offsets 0 to 1 were removed"):
        strict.partitions(begin, end)
    lenient = StreamReader(
        parse_read_options(
            {"bootstrap.servers": server.address, "failOnDataLoss": "false", **pattern}
        )
    )
    assert [p.range for p in lenient.partitions(begin, end)] == [OffsetRange(new, 0, 2, 6)]


def test_a_stream_starting_beyond_a_partition_s_latest_offset_is_refused(
    server: ServerThread,
) -> None:
    topic = unique_topic("plan-start-beyond")
    create_topic(server.address, topic, 2)
    produce(server.address, topic, [f"v{i}" for i in range(20)], partitions=2)
    beyond = stream_reader(server, topic, startingOffsets=f'{{"{topic}": {{"0": 30, "1": 4}}}}')
    with pytest.raises(
        HighwaterOptionError, match=f"startingOffsets: {topic}-0 starts at 30, beyond its latest"
    ):
        beyond.initialOffset()
    at_the_end = stream_reader(
        server, topic, startingOffsets=f'{{"{topic}": {{"0": 10, "1": -2}}}}'
    )
    assert at_the_end.initialOffset() == {topic: {"0": 10, "1": 0}}
