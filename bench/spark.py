"""Spark benchmarks: records/s through streaming pipelines that read and write Highwater topics.

The server is ``highwater server`` as a subprocess; Spark is a local[2] session in this
process, its Python workers running this interpreter. Every pipeline is a streaming query
with Trigger.AvailableNow over the same records (100-byte values, keyed), timed from
``start()`` to the query's end (the median of 3 runs), after a warm-up query that starts
Spark's Python workers.
The transform is the same everywhere: ``upper(value)``, with the key kept.

- pipeline: Highwater topic → transform → Highwater topic (the source and the sink).
- source alone: Highwater topic → transform → the ``noop`` sink.
- sink alone: a Parquet file of the same records → transform → Highwater topic.
- batch read: ``spark.read.format("highwater")`` of the whole topic, counted.

The peer of each is the same query with Spark's built-in Parquet source (a stream over the
same records written as Parquet files) in place of Highwater, and the ``noop`` sink in place
of the Highwater sink: what Spark itself does on this machine with no Python data source in
the way. The floor of each is the same query with the trivial Python data source of
:mod:`bench._spark_floor` in place of Highwater (a source yielding prepared Arrow batches of
the same columns, a sink dropping the batches it is handed): what PySpark's Python Data
Source API costs on this machine with no Highwater code, client or server in the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from highwater.client.producer import AsyncProducer

from bench.broker import create_topic
from bench.groups import embedded_server
from bench.report import Report, Row, SuiteSection, at_least, ratio_at_least

PARTITIONS = 2
VALUE_BYTES = 100
#: Records per query: enough that a query's fixed cost (Spark starting and importing its Python
#: workers, planning: about 5 s through a Python data source) is a small part of it, so the
#: rows are throughput; at 300,000 even a trivial Python source made 105,000 records/s.
RECORDS = 3_000_000
#: Each figure is the median of this many runs.
REPEATS = 3
#: The format name of the floor's trivial Python data source (:mod:`bench._spark_floor`).
FLOOR = "highwater-floor"
#: How many times a streaming query is started when its source's Python process misses the
#: connect-back: Spark 4.3 waits a fixed 10 s for it (``PythonWorkerFactory.createSimpleWorker``,
#: no setting), which a loaded machine can miss as the query starts, before it reads anything.
START_ATTEMPTS = 3
#: How Spark reports that miss.
CONNECT_BACK_FAILED = "failed to connect back"
#: The peer's progress name.
PEER = "Parquet → noop (the peer)"


def _cpu_text(cpu: dict[str, float], seconds: float, records: int) -> str:
    """A query's CPU per record by process, and its share of the machine's 2 CPUs."""
    total = sum(cpu.values())
    python = cpu["python"] + cpu["driver"]
    return (
        f"CPU {total * 1e6 / records:.2f} µs/record (JVM {cpu['jvm'] * 1e6 / records:.2f}, "
        f"server {cpu['broker'] * 1e6 / records:.2f}, Python {python * 1e6 / records:.2f}), "
        f"{total / (seconds * 2):.0%} of 2 CPUs"
    )


async def _prepare(address: str, topics: list[str], records: int, source: str) -> None:
    """Create ``topics`` (waiting for the server to take them) and produce ``records`` keyed
    records to ``source``, as columns (``produce_batch``)."""
    import pyarrow as pa

    for topic in topics:
        await create_topic(address, topic, partitions=PARTITIONS, timeout_s=300)
    producer = AsyncProducer({"bootstrap.servers": address, "linger.ms": 20, "batch.size": 262144})
    padding = "x" * (VALUE_BYTES - 12)
    for start in range(0, records, 50_000):
        rows = range(start, min(start + 50_000, records))
        table = pa.table(
            {"key": [f"k{i}" for i in rows], "value": [f"{i:012d}{padding}" for i in rows]}
        )
        await producer.produce_batch(source, table)
        await producer.flush()
    await producer.close()


def _session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Spark's Python processes import the floor's data source (bench._spark_floor) by name.
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("highwater-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


class Pipelines:
    """The queries the suite times, over one server and one Spark session."""

    def __init__(self, spark: Any, address: str, root: Path) -> None:
        from bench._spark_cpu import server_pid

        self.spark = spark
        self.address = address
        self.root = root
        self.runs = 0
        self.server_pid = server_pid(address)
        #: CPU seconds of the last timed query, by process (:func:`bench._spark_cpu.cpu_between`).
        self.last_cpu: dict[str, float] = {}

    def highwater_stream(self, topic: str) -> Any:
        return (
            self.spark.readStream.format("highwater")
            .option("bootstrap.servers", self.address)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
        )

    def parquet_stream(self, path: Path) -> Any:
        schema = self.spark.read.parquet(str(path)).schema
        return self.spark.readStream.schema(schema).parquet(str(path))

    @staticmethod
    def transform(df: Any) -> Any:
        return df.selectExpr("key", "upper(cast(value as string)) as value")

    def floor_stream(self, records: int) -> Any:
        """The trivial Python source of :mod:`bench._spark_floor`: ``records`` rows."""
        return self.spark.readStream.format(FLOOR).option("records", str(records)).load()

    def timed(self, df: Any, sink: str | None) -> float:
        """Seconds from start() to the end of an AvailableNow query writing to ``sink``
        (a topic; :data:`FLOOR`: the floor's sink, which drops the rows) or, if None, to
        the noop sink. A query whose source process missed Spark's connect-back is started
        again (up to :data:`START_ATTEMPTS` times), and timed from its new start."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._timed_once(df, sink)
            except Exception as e:  # StreamingQueryException from awaitTermination
                if CONNECT_BACK_FAILED not in str(e) or attempt == START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _timed_once(self, df: Any, sink: str | None) -> float:
        self.runs += 1
        writer = self.transform(df).writeStream.option(
            "checkpointLocation", str(self.root / f"checkpoint-{self.runs}")
        )
        if sink is None:
            writer = writer.format("noop")
        elif sink == FLOOR:
            writer = writer.format(FLOOR)
        else:
            writer = (
                writer.format("highwater")
                .option("bootstrap.servers", self.address)
                .option("topic", sink)
            )
        from bench._spark_cpu import cpu_between, snapshot

        before = snapshot(self.server_pid)
        began = time.monotonic()
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        elapsed = time.monotonic() - began
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        self.last_cpu = cpu_between(before, snapshot(self.server_pid))
        return elapsed

    def timed_batch_count(self, df: Any, records: int) -> float:
        """Seconds to count the records and sum their values' lengths (every value is
        read: a plain count() of Parquet would read only its footers)."""
        began = time.monotonic()
        row = df.selectExpr("count(*) as n", "sum(length(value)) as bytes").collect()[0]
        elapsed = time.monotonic() - began
        if row.n != records:
            raise RuntimeError(f"read {row.n} of {records} records")
        return elapsed


def run(report: Report) -> None:
    records = max(10_000, int(RECORDS * report.scale))
    with (
        report.suite("spark", "Spark source and sink (`pyspark_highwater`, local[2])") as section,
        report.data_dir("spark") as root,
        embedded_server(root / "server", root / "server.log") as address,
    ):
        outputs = [f"bench-out-{i}" for i in range(REPEATS * 2)]
        topics = ["bench-in", *outputs, "bench-warm", "bench-warm-out"]
        report.progress(f"spark: producing {records:,} records")
        asyncio.run(_prepare(address, topics, records, "bench-in"))
        asyncio.run(_prepare(address, [], 2_000, "bench-warm"))
        spark = _session()
        try:
            _measure(report, section, Pipelines(spark, address, root), records, root)
        finally:
            spark.stop()
        _notes(section, records)


def _measure(report: Report, section: SuiteSection, p: Pipelines, records: int, root: Path) -> None:
    report.progress("spark: warm-up and the Parquet copy of the records")
    from bench._spark_floor import FloorSource

    p.spark.dataSource.register(FloorSource)
    p.timed(p.highwater_stream("bench-warm"), "bench-warm-out")
    with contextlib.suppress(Exception):  # a failing floor reports itself in its rows
        p.timed(p.floor_stream(2_000), FLOOR)
    parquet = root / "records.parquet"
    (
        p.spark.read.format("highwater")
        .option("bootstrap.servers", p.address)
        .option("subscribe", "bench-in")
        .load()
        .select("key", "value")
        .repartition(PARTITIONS)
        .write.parquet(str(parquet))
    )
    p.timed(p.parquet_stream(parquet), None)

    cpu_notes: dict[str, str] = {}

    def rate(name: str, query: Callable[[], float]) -> float:
        """Records/s of the median of :data:`REPEATS` runs of ``query``; the median run's
        CPU goes to ``cpu_notes``."""
        runs = []
        for i in range(REPEATS):
            report.progress(f"spark: {name} ({i + 1}/{REPEATS})")
            p.last_cpu = {}
            seconds = query()
            runs.append((seconds, p.last_cpu))
        seconds, cpu = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
        if cpu:
            cpu_notes[name] = _cpu_text(cpu, seconds, records)
        return records / seconds

    peer = rate(PEER, lambda: p.timed(p.parquet_stream(parquet), None))
    outputs = iter(range(REPEATS * 2))
    pipeline = rate(
        "Highwater → Highwater",
        lambda: p.timed(p.highwater_stream("bench-in"), f"bench-out-{next(outputs)}"),
    )
    source = rate("Highwater → noop", lambda: p.timed(p.highwater_stream("bench-in"), None))
    sink = rate(
        "Parquet → Highwater",
        lambda: p.timed(p.parquet_stream(parquet), f"bench-out-{next(outputs)}"),
    )

    def floor_rate(name: str, query: Callable[[], float]) -> float | str:
        """:func:`rate`, or why the floor's query failed (its row says so; the suite's
        other rows stand)."""
        try:
            return rate(name, query)
        except Exception as e:  # a floor is context: its failure must not lose the rest
            return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"

    floor_source = floor_rate("floor source → noop", lambda: p.timed(p.floor_stream(records), None))
    floor_sink = floor_rate(
        "Parquet → floor sink", lambda: p.timed(p.parquet_stream(parquet), FLOOR)
    )
    floor_pipeline = floor_rate(
        "floor source → floor sink", lambda: p.timed(p.floor_stream(records), FLOOR)
    )
    read_rate = rate(
        "batch read",
        lambda: p.timed_batch_count(
            p.spark.read.format("highwater")
            .option("bootstrap.servers", p.address)
            .option("subscribe", "bench-in")
            .load(),
            records,
        ),
    )
    parquet_read_rate = rate(
        "batch read of Parquet",
        lambda: p.timed_batch_count(p.spark.read.parquet(str(parquet)), records),
    )

    peer_name = "Parquet stream → same transform → noop, same records"
    section.add(
        Row(
            "streaming pipeline: Highwater topic → upper(value) → Highwater topic",
            pipeline,
            "records/s",
            peer_name=peer_name,
            peer_value=peer,
            target=ratio_at_least(0.35, "the Parquet → noop peer"),
            extra=f"{records:,} records of {VALUE_BYTES} B, {PARTITIONS} partitions; "
            + cpu_notes.get("Highwater → Highwater", ""),
            peer_extra=cpu_notes.get(PEER, ""),
        )
    )
    section.add(
        Row(
            "streaming source alone: Highwater topic → upper(value) → noop",
            source,
            "records/s",
            peer_name=peer_name,
            peer_value=peer,
            target=at_least(500_000, "records/s"),
            extra=cpu_notes.get("Highwater → noop", ""),
        )
    )
    section.add(
        Row(
            "streaming sink alone: Parquet → upper(value) → Highwater topic",
            sink,
            "records/s",
            peer_name=peer_name,
            peer_value=peer,
            target=at_least(300_000, "records/s"),
            extra=cpu_notes.get("Parquet → Highwater", ""),
        )
    )
    floors = (
        ("pipeline", "floor source → upper(value) → floor sink", floor_pipeline),
        ("source", "floor source → upper(value) → noop", floor_source),
        ("sink", "Parquet → upper(value) → floor sink", floor_sink),
    )
    for role, query, value in floors:
        name = query.replace(" → upper(value)", "")
        section.add(
            Row(
                f"floor of the {role}: {query} (a Python data source without Highwater)",
                value if isinstance(value, float) else None,
                "records/s",
                peer_name=peer_name,
                peer_value=peer,
                error=value if isinstance(value, str) else "",
                extra=cpu_notes.get(name, ""),
            )
        )
    section.add(
        Row(
            'batch read: spark.read.format("highwater"), count and sum(length(value))',
            read_rate,
            "records/s",
            peer_name="spark.read.parquet(…), the same aggregate over the same records",
            peer_value=parquet_read_rate,
        )
    )


def _notes(section: SuiteSection, records: int) -> None:
    section.note(
        "Each streaming figure is one Trigger.AvailableNow query over all "
        f"{records:,} records (one micro-batch), timed from start() to its end: planning, "
        f"the tasks and the commit included; the median of {REPEATS} runs. A warm-up query "
        "runs first, so Spark's Python workers are already up; the JVM, the server and the "
        "Python workers share the 2 CPUs."
    )
    section.note(
        "The source reads each offset range with the client library's blocking Consumer, "
        "decoding the fetched batches straight into Arrow buffers (`consume_columns`, the "
        "compiled codec's `RecordColumns`); the sink writes each Arrow batch's key and "
        "value buffers with the idempotent Producer's `produce_batch` (acks=all), encoded "
        "into RecordBatch v2 and partitioned by murmur2 of the key in C. The Parquet peer "
        "keeps the whole pipeline inside the JVM; the Highwater figures include the Python "
        "workers and the Arrow hand-over between the JVM and them. Targets: "
        "source 500,000 records/s, sink 300,000, the pipeline 35% of the Parquet peer. "
        "The pure-Python codec's figures for the same task code, without Spark, are in the "
        "columnar suite."
    )
    section.note(
        "The floor rows run the same queries with a trivial Python data source "
        "(`bench/_spark_floor.py`) in place of Highwater: a source yielding prepared Arrow "
        "batches of the same columns (10,000 rows each, 2 partitions) and a sink that drops "
        "what it is handed, importing nothing but PySpark and pyarrow. They are what "
        "PySpark's Python Data Source API costs on this machine: per query, Spark starts a "
        "Python process for the source's driver-side calls and forks Python workers that "
        "plan the read and the write, each importing PySpark and the data source afresh; "
        "the rows cross between the JVM and the Python workers as Arrow batches. A "
        "Highwater row cannot beat its floor: compare the targets with the floors."
    )
    section.note(
        "Under each streaming figure, the CPU of the median run per record, from /proc "
        "(`bench/_spark_cpu.py`): Spark's JVM, the server, and every Python process (the "
        "tasks' workers, the processes Spark starts per query, this one), and its share of "
        "the machine's 2 CPUs over the query's wall time. `python -m bench._spark_cpu` "
        "splits the Python part into the source's and the sink's tasks and the rest."
    )
