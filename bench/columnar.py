"""Columnar client paths: records/s of the producer and the consumer
per record and by columns, and of the Spark tasks' read and write without Spark.

One ``highwater server`` subprocess; the clients run in the benchmark's process on the
compiled codec, and each row is followed by the same measurement on the pure-Python codec,
run in a child process (``bench._pure_python``) in the same run. Every phase is the median
of :data:`TRIALS` trials of :data:`RECORDS` records of 100 bytes, 1 partition, acks=1.

- producer, ``produce()`` per record (the broker suite's loop) and ``produce_batch()`` of an
  Arrow table (one delivery report per batch);
- consumer, ``consume()`` (a ``Message`` per record) and ``consume_columns()`` (Arrow
  buffers, no object per record);
- the Spark source's task (``read_range``: an offset range into Arrow record batches) and
  the sink's (``write_batches``: Arrow batches of keyed rows to a topic, acks=all,
  partitioned by key), without the JVM.

A cProfile table of ``produce()`` and of ``consume()`` closes the section: where the
client's per-record time goes outside the codec.
"""

from __future__ import annotations

import asyncio
import cProfile
import time
from collections.abc import Callable
from typing import Any

from bench._jetstream_peer import Counted
from bench._pure_python import run_pure
from bench.broker import (
    CONSUMER_TARGET,
    PAYLOAD,
    PRODUCER_CONFIG,
    PRODUCER_TARGETS,
    consume_with_client,
    create_topic,
    produce_with_client,
)
from bench.groups import embedded_server
from bench.report import Report, Row, SuiteSection, at_least, hotspots_text

RECORDS = 300_000
TRIALS = 3
TOPIC = "columnar"
SPARK_TOPIC = "columnar-spark"
SPARK_PARTITIONS = 2
#: Rows per produce_batch() call and per Arrow batch handed to the sink.
CHUNK = 50_000
SPARK_SOURCE_TARGET = 500_000.0
SPARK_SINK_TARGET = 300_000.0


async def produce_columns(bootstrap: str, topic: str, records: int) -> tuple[int, float]:
    """``records`` records through ``AsyncProducer.produce_batch`` of Arrow tables of
    :data:`CHUNK` rows; every batch report checked."""
    import pyarrow as pa
    from highwater.client.producer import AsyncProducer, BatchMetadata

    table = pa.table({"value": pa.array([PAYLOAD] * CHUNK, pa.binary())})
    producer = AsyncProducer({"bootstrap.servers": bootstrap, "acks": "1", **PRODUCER_CONFIG})
    failures: list[BaseException] = []

    def delivered(error: BaseException | None, _batch: BatchMetadata) -> None:
        if error is not None:
            failures.append(error)

    try:
        await producer.send(topic, PAYLOAD)  # metadata and producer id, not timed
        started = time.perf_counter()
        sent = 0
        while sent < records:
            count = min(CHUNK, records - sent)
            await producer.produce_batch(topic, table.slice(0, count), on_delivery_batch=delivered)
            sent += count
            await asyncio.sleep(0)
            while len(producer) > 4 * CHUNK:
                await producer.poll(0.01)
        left = await producer.flush()
        elapsed = time.perf_counter() - started
    finally:
        await producer.close(5)
    if failures or left:
        raise RuntimeError(f"{len(failures)} batches failed, {left} undelivered: {failures[:1]}")
    return records, elapsed


async def consume_columns(bootstrap: str, topic: str, records: int) -> tuple[int, float]:
    """Read ``records`` records from offset 0 with ``AsyncConsumer.consume_columns``, taking
    the Arrow buffers every 10,000 records."""
    from highwater.client.consumer import AsyncConsumer, TopicPartition
    from highwater.records.columnar import RecordColumns, finish_columns

    consumer = AsyncConsumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    columns = RecordColumns()
    seen = 0
    try:
        tp = TopicPartition(topic, 0, 0)
        consumer.assign([tp])
        started = time.perf_counter()
        while seen < records:
            error = await consumer.consume_columns(tp, columns, 10_000, timeout=5)
            if error is not None:
                raise RuntimeError(f"consumer error: {error}")
            seen += finish_columns(columns).length
        elapsed = time.perf_counter() - started
    finally:
        await consumer.close()
    return seen, elapsed


async def per_record_trials(bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    """``produce()`` and ``consume()`` of the broker suite, as ``(records, seconds)``."""
    produced = await produce_with_client(bootstrap, topic, "1", records)
    consumed = await consume_with_client(bootstrap, topic, records)
    return {
        "produce": (produced.records, produced.seconds),
        "consume": (consumed.records, consumed.seconds),
    }


async def columnar_trials(bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    """``produce_batch()`` and ``consume_columns()``, as ``(records, seconds)``."""
    return {
        "produce_batch": await produce_columns(bootstrap, topic, records),
        "consume_columns": await consume_columns(bootstrap, topic, records),
    }


def spark_tasks(bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    """The sink's task (``write_batches`` of keyed Arrow batches to ``topic``, acks=all)
    then the source's (``read_range`` of every partition), as ``(records, seconds)``."""
    import pyarrow as pa
    from highwater.client.consumer import Consumer, TopicPartition
    from pyspark_highwater.offsets import OffsetRange
    from pyspark_highwater.reading import read_range
    from pyspark_highwater.writing import write_batches

    batch = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([b"k%d" % i for i in range(CHUNK)], pa.binary()),
            "value": pa.array([PAYLOAD] * CHUNK, pa.binary()),
        }
    )
    with Consumer({"bootstrap.servers": bootstrap}) as consumer:
        starts = [
            consumer.get_watermark_offsets(TopicPartition(topic, p))[1]
            for p in range(SPARK_PARTITIONS)
        ]
    chunks = [batch.slice(0, min(CHUNK, records - sent)) for sent in range(0, records, CHUNK)]
    began = time.perf_counter()
    written = write_batches({"bootstrap.servers": bootstrap}, topic, chunks)
    wrote = time.perf_counter() - began
    config = {"bootstrap.servers": bootstrap, "auto.offset.reset": "none"}
    read = 0
    began = time.perf_counter()
    for p in range(SPARK_PARTITIONS):
        _low, high = written.ranges[(topic, p)]
        for arrow_batch in read_range(
            config,
            OffsetRange(topic, p, starts[p], high + 1),
            include_headers=False,
            fail_on_data_loss=True,
            poll_timeout_ms=10_000,
        ):
            read += arrow_batch.num_rows
    took = time.perf_counter() - began
    if written.records != records or read != records:
        raise RuntimeError(f"wrote {written.records} and read {read} of {records} records")
    return {"sink": (records, wrote), "source": (records, took)}


def _median(trials: list[tuple[int, float]]) -> Counted:
    counted = [Counted(records, seconds) for records, seconds in trials]
    return sorted(counted, key=lambda c: c.per_second)[len(counted) // 2]


def _runs(trials: list[tuple[int, float]]) -> str:
    rates = [Counted(r, s).per_second for r, s in trials]
    return "runs: " + " · ".join(f"{rate:,.0f}" for rate in rates) + " records/s"


async def _profile(bootstrap: str, records: int, section: SuiteSection) -> None:
    for title, action in (
        ("produce() per record", lambda: produce_with_client(bootstrap, TOPIC, "1", records)),
        ("consume() per record", lambda: consume_with_client(bootstrap, TOPIC, records)),
    ):
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            await action()
        finally:
            profiler.disable()
        section.add_profile(
            f"Where the client's time goes: {title}, {records:,} records, compiled codec "
            "(cProfile; the benchmark's own loop included)",
            hotspots_text(profiler, top=14),
        )


def run(report: Report) -> None:
    records = max(10_000, int(RECORDS * report.scale))
    with (
        report.suite("columnar", "Columnar client paths") as section,
        report.data_dir("columnar") as root,
        embedded_server(root / "server", root / "server.log") as address,
    ):
        asyncio.run(create_topic(address, TOPIC, timeout_s=300))
        asyncio.run(create_topic(address, SPARK_TOPIC, partitions=SPARK_PARTITIONS, timeout_s=300))
        results: dict[str, dict[str, list[tuple[int, float]]]] = {"compiled": {}, "pure": {}}

        def collect(kind: str, got: dict[str, Any]) -> None:
            for phase, trial in got.items():
                results[kind].setdefault(phase, []).append(tuple(trial))

        steps: list[tuple[str, Callable[[], Any]]] = []
        for i in range(TRIALS):
            steps += [
                (f"per record {i + 1}", lambda: per_record_trials(address, TOPIC, records)),
                (f"columns {i + 1}", lambda: columnar_trials(address, TOPIC, records)),
                (f"spark tasks {i + 1}", lambda: spark_tasks(address, SPARK_TOPIC, records)),
            ]
        for name, step in steps:
            report.progress(f"columnar: compiled: {name}")
            got = step()
            collect("compiled", asyncio.run(got) if asyncio.iscoroutine(got) else got)
            report.progress(f"columnar: pure-Python: {name}")
            function = {
                "per": "bench.columnar:per_record_trials",
                "col": "bench.columnar:columnar_trials",
                "spa": "bench.columnar:spark_tasks",
            }[name[:3]]
            topic = SPARK_TOPIC if name.startswith("spark") else TOPIC
            collect("pure", run_pure(function, address, topic, records // 3))
        report.progress("columnar: profiles")
        asyncio.run(_profile(address, records, section))
        _rows(section, results)
        _notes(section, records)


ROWS = [
    (
        "produce",
        "producer, produce() per record, 100-byte records, 1 broker, acks=1",
        PRODUCER_TARGETS[1],
    ),
    (
        "produce_batch",
        "producer, produce_batch() of Arrow tables (one report per batch), 1 broker, acks=1",
        PRODUCER_TARGETS[1],
    ),
    ("consume", "consumer, consume() (a Message per record), from offset 0", CONSUMER_TARGET),
    (
        "consume_columns",
        "consumer, consume_columns() (Arrow buffers, no object per record), from offset 0",
        CONSUMER_TARGET,
    ),
    (
        "source",
        "Spark source task without Spark: read_range into Arrow batches, 2 partitions",
        SPARK_SOURCE_TARGET,
    ),
    (
        "sink",
        "Spark sink task without Spark: write_batches of keyed Arrow batches, acks=all",
        SPARK_SINK_TARGET,
    ),
]


def _rows(section: SuiteSection, results: dict[str, dict[str, list[tuple[int, float]]]]) -> None:
    for phase, label, target in ROWS:
        compiled = results["compiled"].get(phase, [])
        pure = results["pure"].get(phase, [])
        ours = _median(compiled) if compiled else None
        section.add(
            Row(
                label,
                ours.per_second if ours else None,
                "records/s",
                target=at_least(target, "records/s"),
                extra=_runs(compiled) if compiled else "",
                error="did not run",
            )
        )
        theirs = _median(pure) if pure else None
        section.add(
            Row(
                "the same, pure-Python codec (`HIGHWATER_PURE_PYTHON=1`, a child process)",
                theirs.per_second if theirs else None,
                "records/s",
                peer_name="compiled codec, the row above",
                peer_value=ours.per_second if ours else None,
                extra=_runs(pure) if pure else "",
                error="did not run",
            )
        )


def _notes(section: SuiteSection, records: int) -> None:
    section.note(
        f"One `highwater server` (controller and broker in one process) on loopback; the "
        f"clients in the benchmark's process. Each phase: {TRIALS} trials, the median "
        f"counts; {records:,} records of 100 bytes per trial on the compiled codec, a third "
        "as many on the pure-Python one (its child process, alternating with the compiled "
        "trials). Producer settings: the broker suite's (linger.ms=5, batch.size=128 KiB); "
        f"produce_batch() takes Arrow tables of {CHUNK:,} rows, keyless (the sticky "
        "partitioner, one partition here). consume_columns() asks for 10,000 records at a "
        "time and takes the buffers each time. The Spark tasks: write_batches of "
        f"{CHUNK:,}-row Arrow batches with a key column to a topic of {SPARK_PARTITIONS} "
        "partitions (the idempotent producer, acks=all, the sink's batch.size of 512 KiB), "
        "then read_range of each partition "
        "(the blocking Consumer), timed apart. Targets: the producer's (1 M records/s, "
        "1 broker) and consumer (1.5 M), and its Spark source (500 k) and sink (300 k), "
        "which the Spark suite measures through Spark."
    )
