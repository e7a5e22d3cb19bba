"""Where the Spark pipeline's CPU goes: each process's CPU per record, beside the floor's.

``python -m bench._spark_cpu [--records N] [--repeats R]`` runs, over one embedded server
and one local[2] session (as ``python -m bench spark`` does), the streaming queries of the
Spark suite alternated ``R`` times, and for each query prints its wall time per record and
the CPU per record of:

- ``jvm``: Spark's JVM (sampled from ``/proc``);
- ``broker``: the ``highwater server`` process;
- ``source task`` / ``sink task``: the Python workers running the source's ``read`` and the
  sink's ``write``, timed inside them (``time.process_time`` of the worker process, every
  thread, from the task's first batch to its last): the data sources are the Highwater and
  floor ones with that timing wrapped around them (``highwater-cpu``, ``floor-cpu``);
- ``other python``: every other Python process of the tree (the driver in this process,
  the stream's source runner, the forked planners);

and the utilisation of the 2 CPUs (the sum over wall time times 2). First it measures the
broker's CPU per record at its best: pre-built batches through the raw Produce RPC
(acks=-1, as the sink's idempotent producer) and read back through raw Fetch.

A measurement for docs/spark.md, not a suite: nothing is written to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType
from pyspark_highwater.source import HighwaterDataSource, StreamReader, StreamWriter

from bench._spark_floor import FloorReader, FloorSource, FloorWriter

#: Where the wrapped tasks append their CPU (a JSON object a line); set before Spark starts,
#: so that the JVM and its Python workers inherit it.
LOG_ENV = "HIGHWATER_SPARK_CPU_LOG"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _note(role: str, began_cpu: float, began_wall: float, rows: int) -> None:
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(
            json.dumps(
                {
                    "role": role,
                    "pid": os.getpid(),
                    "cpu": time.process_time() - began_cpu,
                    "wall": time.monotonic() - began_wall,
                    "rows": rows,
                }
            )
            + "\n"
        )


def _timed_read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    began_cpu, began_wall, rows = time.process_time(), time.monotonic(), 0
    for batch in batches:
        rows += batch.num_rows
        yield batch
    _note("source task", began_cpu, began_wall, rows)


def _timed_write(write: Callable[[Iterator[pa.RecordBatch]], Any], it: Iterator[Any]) -> Any:
    began_cpu, began_wall = time.process_time(), time.monotonic()
    rows = 0

    def counted() -> Iterator[pa.RecordBatch]:
        nonlocal rows
        for batch in it:
            rows += batch.num_rows
            yield batch

    result = write(counted())
    _note("sink task", began_cpu, began_wall, rows)
    return result


class TimedStreamReader(StreamReader):
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _timed_read(super().read(partition))


class TimedStreamWriter(StreamWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _timed_write(super().write, iterator)


class TimedHighwater(HighwaterDataSource):
    """``format("highwater-cpu")``: Highwater's source and sink, their tasks timed."""

    @classmethod
    def name(cls) -> str:
        return "highwater-cpu"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        reader = super().streamReader(schema)
        reader.__class__ = TimedStreamReader
        return reader

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        writer = super().streamWriter(schema, overwrite)
        writer.__class__ = TimedStreamWriter
        return writer


class TimedFloorReader(FloorReader):
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _timed_read(super().read(partition))


class TimedFloorWriter(FloorWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _timed_write(super().write, iterator)


class TimedFloor(FloorSource):
    """``format("floor-cpu")``: the floor's source and sink, their tasks timed."""

    @classmethod
    def name(cls) -> str:
        return "floor-cpu"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TimedFloorReader(int(self.options.get("records", "0")))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return TimedFloorWriter()


# --- /proc snapshots ---------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, str, float, float] | None:
    """(parent pid, command name, CPU seconds of the process, CPU seconds of its waited-for
    children) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    own = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    children = (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
    return int(fields[1]), name, own, children


def tree_cpu(server_pid: int) -> dict[str, float]:
    """CPU seconds so far of this process's tree (and the server's), by category: ``jvm``,
    ``broker`` and ``driver`` (this process) on their own, ``python`` every other process
    of the tree with what its ended children spent (each Python process Spark starts is
    waited for by its parent in the tree, the JVM or PySpark's daemon). The difference of
    two snapshots counts processes that started and ended between them too."""
    root = os.getpid()
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                stats[int(entry)] = stat
    out = {"jvm": 0.0, "broker": 0.0, "driver": 0.0, "python": 0.0}
    for pid, (_, name, own, children) in stats.items():
        ancestor = pid
        while ancestor not in (root, server_pid) and ancestor in stats and ancestor > 1:
            ancestor = stats[ancestor][0]
        if ancestor not in (root, server_pid):
            continue
        if pid == server_pid:
            out["broker"] += own
            out["python"] += children
        elif pid == root:
            out["driver"] += own  # its children (the JVM, the server) are alive and counted
        elif name == "java":
            out["jvm"] += own
            out["python"] += children
        else:
            out["python"] += own + children
    return out


# --- the broker at its best --------------------------------------------------------------


def broker_cpu_per_record(address: str, server_pid: int, batch_records: int) -> dict[str, float]:
    """The server's CPU µs per record producing pre-built batches of ``batch_records``
    100-byte keyed records through raw Produce (acks=-1) and fetching them back raw."""
    import bench.broker as broker

    topic = f"raw-{batch_records}"
    broker.RAW_BATCH_RECORDS = batch_records  # produce_raw and fetch_raw read it per call
    batches = max(20, 1_000_000 // batch_records)
    records = batches * batch_records

    def cpu() -> float:
        stat = _stat(server_pid)
        assert stat is not None
        return stat[2]

    async def run() -> dict[str, float]:
        await broker.create_topic(address, topic, partitions=1, timeout_s=60)
        before = cpu()
        produced = await broker.produce_raw(address, topic, -1, batches)
        middle = cpu()
        await broker.fetch_raw(address, topic, records + batch_records)
        after = cpu()
        return {
            "produce": (middle - before) * 1e6 / records,
            "fetch": (after - middle) * 1e6 / records,
            "produce wall": produced.seconds * 1e6 / records,
        }

    return asyncio.run(run())


# --- the queries -------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated query names")
    args = parser.parse_args()

    from bench.groups import embedded_server
    from bench.spark import _prepare, _session

    root = Path(tempfile.mkdtemp(prefix="spark-cpu-"))
    print(f"data and logs under {root}", flush=True)
    os.environ[LOG_ENV] = str(root / "tasks.jsonl")
    with embedded_server(root / "server", root / "server.log") as address:
        server = server_pid(address)
        for size in (1_000, 4_000, 1_000):
            figures = broker_cpu_per_record(address, server, size)
            print(f"broker, raw batches of {size}: {figures}", flush=True)
        outputs = [f"out-{i}" for i in range(args.repeats * 2 + 2)]
        asyncio.run(_prepare(address, ["in", *outputs], args.records, "in"))
        spark = _session()
        try:
            _queries(spark, address, root, server, args, iter(outputs))
        finally:
            spark.stop()


def server_pid(address: str) -> int:
    """The PID of the ``highwater server`` this process started listening at ``address``."""
    port = address.rsplit(":", 1)[1]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            stat = _stat(int(pid))
            ours = stat is not None and stat[0] == os.getpid()
            if ours and b"server" in cmdline and any(port.encode() in a for a in cmdline):
                return int(pid)
    raise RuntimeError("the server's process was not found")


def _queries(
    spark: Any, address: str, root: Path, server_pid: int, args: Any, outputs: Iterator[str]
) -> None:
    from bench.spark import Pipelines

    spark.dataSource.register(TimedHighwater)
    spark.dataSource.register(TimedFloor)
    p = Pipelines(spark, address, root)
    n = args.records

    def hw() -> Any:
        return (
            spark.readStream.format("highwater-cpu")
            .option("bootstrap.servers", address)
            .option("subscribe", "in")
            .option("startingOffsets", "earliest")
            .load()
        )

    def floor() -> Any:
        return spark.readStream.format("floor-cpu").option("records", str(n)).load()

    parquet = root / "records.parquet"
    (
        spark.read.format("highwater")
        .option("bootstrap.servers", address)
        .option("subscribe", "in")
        .load()
        .select("key", "value")
        .repartition(2)
        .write.parquet(str(parquet))
    )

    def hw_sink(df: Any, checkpoint: str) -> Any:
        return (
            p.transform(df)
            .writeStream.format("highwater-cpu")
            .option("bootstrap.servers", address)
            .option("topic", next(outputs))
            .option("checkpointLocation", checkpoint)
        )

    def other_sink(fmt: str) -> Callable[[Any, str], Any]:
        return lambda df, checkpoint: (
            p.transform(df).writeStream.format(fmt).option("checkpointLocation", checkpoint)
        )

    queries: dict[str, tuple[Callable[[], Any], Callable[[Any, str], Any]]] = {
        "parquet → noop": (lambda: p.parquet_stream(parquet), other_sink("noop")),
        "floor → floor": (floor, other_sink("floor-cpu")),
        "highwater → highwater": (hw, hw_sink),
        "floor → noop": (floor, other_sink("noop")),
        "highwater → noop": (hw, other_sink("noop")),
        "parquet → floor": (lambda: p.parquet_stream(parquet), other_sink("floor-cpu")),
        "parquet → highwater": (lambda: p.parquet_stream(parquet), hw_sink),
    }
    if args.only:
        queries = {k: v for k, v in queries.items() if k in args.only.split(",")}
    # warm-up: Spark's Python workers started, the JIT warm
    for name, (source, sink) in queries.items():
        if name != "parquet → noop":
            _run(spark, source, sink, root, server_pid)
            break
    results: dict[str, list[dict[str, float]]] = {name: [] for name in queries}
    for i in range(args.repeats):
        for name, (source, sink) in queries.items():
            figures = _run(spark, source, sink, root, server_pid)
            load = os.getloadavg()[0]
            per_record = {k: v * 1e6 / n for k, v in figures.items() if k != "util"}
            results[name].append({**per_record, "util": figures["util"], "load": load})
            print(f"{i + 1} {name}: " + _fmt(results[name][-1]), flush=True)
    print("\nmedians, µs per record (wall; CPU per process; util of 2 CPUs):")
    for name, runs in results.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name:24s} " + _fmt(medians))


def _fmt(figures: dict[str, float]) -> str:
    parts = [f"{k} {v:.2f}" for k, v in figures.items() if k not in ("util", "load")]
    return ", ".join(parts) + f", util {figures['util']:.2f}, load {figures['load']:.1f}"


def _run(
    spark: Any,
    source: Callable[[], Any],
    sink: Callable[[Any, str], Any],
    root: Path,
    server_pid: int,
) -> dict[str, float]:
    """Wall and CPU seconds of one AvailableNow query, per process category, and ``util``:
    the CPU's share of the 2 CPUs over the query."""
    log = Path(os.environ[LOG_ENV])
    log.write_text("")
    checkpoint = str(root / f"checkpoint-{time.monotonic_ns()}")
    before = tree_cpu(server_pid)
    began = time.monotonic()
    query = sink(source(), checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    wall = time.monotonic() - began
    after = tree_cpu(server_pid)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    cpu = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    tasks: dict[str, float] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        tasks[entry["role"]] = tasks.get(entry["role"], 0.0) + entry["cpu"]
    total = sum(cpu.values())
    figures = {
        "wall": wall,
        "jvm": cpu.get("jvm", 0.0),
        "broker": cpu.get("broker", 0.0),
        "driver": cpu.get("driver", 0.0),
        **tasks,
        "other python": cpu.get("python", 0.0) - sum(tasks.values()),
        "total cpu": total,
    }
    figures["util"] = total / (wall * 2)
    return figures


if __name__ == "__main__":
    main()
