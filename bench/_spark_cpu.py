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
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


def _module(pid: int) -> str:
    """The module a Python process of Spark's runs (``-m pyspark.daemon <module>``, ``-m
    <module>``), or ``python``."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "python"
    names = [a for a in args if a.startswith("pyspark.")]
    return "python " + names[-1].rsplit(".", 1)[-1] if names else "python"


@dataclass(frozen=True)
class Process:
    """One process of the tree in a :func:`snapshot`."""

    parent: int
    category: str
    own: float
    children: float


def snapshot(server_pid: int, by_module: bool = False) -> dict[int, Process]:
    """The processes of this process's tree (and the server's) now: each with its CPU
    seconds and those of its ended children, and its category: ``jvm``, ``broker``,
    ``driver`` (this process), else ``python`` (with ``by_module``: ``python <module>``)."""
    root = os.getpid()
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                stats[int(entry)] = stat
    out = {}
    for pid, (parent, name, own, children) in stats.items():
        ancestor = pid
        while ancestor not in (root, server_pid) and ancestor in stats and ancestor > 1:
            ancestor = stats[ancestor][0]
        if ancestor not in (root, server_pid):
            continue
        if pid == server_pid:
            category = "broker"
        elif pid == root:
            category = "driver"
        elif name == "java":
            category = "jvm"
        else:
            category = _module(pid) if by_module else "python"
        out[pid] = Process(parent, category, own, children)
    return out


def cpu_between(before: dict[int, Process], after: dict[int, Process]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, by category (``python`` also holds every
    ``python <module>``). The JVM's, the server's and this process's own CPU count as
    theirs; what their ended children spent, and every other process with its ended
    children, as Python (each Python process Spark starts is waited for by its parent in
    the tree, the JVM or PySpark's daemon, whose children's CPU then holds it: so processes
    that started and ended between the snapshots count too). A process that left the tree
    alive (its parent ended first) counts by its own figures. The case this gets wrong: a
    process whose parent ended first and that ended itself before the second snapshot (a
    daemon stopped with its workers) is counted short by all it ever spent."""
    out = {"jvm": 0.0, "broker": 0.0, "driver": 0.0, "python": 0.0}

    def add(category: str, seconds: float) -> None:
        out[category] = out.get(category, 0.0) + seconds
        if category.startswith("python "):
            out["python"] += seconds

    for pid, now in after.items():
        then = before.get(pid, Process(now.parent, now.category, 0.0, 0.0))
        own, children = now.own - then.own, now.children - then.children
        if now.category in ("jvm", "broker", "driver"):
            add(now.category, own)
            add("python", children)
        else:
            add(now.category, own + children)
    for pid, then in before.items():
        if pid in after:
            continue
        stat = _stat(pid)
        if stat is not None:  # alive, but no longer in the tree (its parent ended first)
            add(then.category, stat[2] + stat[3] - then.own - then.children)
            continue
        ancestor = then.parent
        while ancestor in before and ancestor not in after:
            ancestor = before[ancestor].parent
        if ancestor in after:
            # it ended, and (through its ended parents) a process still in the tree waited
            # for it: that one's children's CPU holds all it ever spent, of which what it had
            # spent by the first snapshot is not this span's
            add("python", -(then.own + then.children))
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
    shutil.rmtree(root)  # kept, with the server's log, when the run failed


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
        keys = {k: None for r in runs for k in r}
        medians = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}
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
    before = snapshot(server_pid, by_module=True)
    began = time.monotonic()
    query = sink(source(), checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    wall = time.monotonic() - began
    after = snapshot(server_pid, by_module=True)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    cpu = cpu_between(before, after)
    modules = {k: v for k, v in cpu.items() if k.startswith("python ") and v > 0.05}
    tasks: dict[str, float] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        tasks[entry["role"]] = tasks.get(entry["role"], 0.0) + entry["cpu"]
    total = sum(v for k, v in cpu.items() if not k.startswith("python "))
    figures = {
        "wall": wall,
        "jvm": cpu.get("jvm", 0.0),
        "broker": cpu.get("broker", 0.0),
        "driver": cpu.get("driver", 0.0),
        **tasks,
        "other python": cpu.get("python", 0.0) - sum(tasks.values()),
        "total cpu": total,
        **modules,
    }
    figures["util"] = total / (wall * 2)
    return figures


if __name__ == "__main__":
    main()
