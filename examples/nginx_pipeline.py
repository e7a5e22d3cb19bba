"""A Spark pipeline over Highwater: nginx access-log lines to counts per status per minute.

``make pipeline`` runs it against an embedded server (``highwater server``, started here on
a free loopback port unless ``--bootstrap`` names a running cluster):

1. a producer thread writes synthetic nginx access-log lines (combined log format) to the
   topic ``nginx-access``, in chunks, while the pipeline runs;
2. a streaming query reads the topic (``format("highwater")``), parses each line with
   regular expressions, and counts requests per HTTP status per minute of the log's own
   time (a 1-minute tumbling window, 1-minute watermark);
3. the counts go to the topic ``nginx-status-counts`` (update mode, through foreachBatch:
   key ``<minute>|<status>``, a JSON value, a ``spark.batch`` header; the last record per
   key is the current count) and, once a minute is final (the watermark passed it), to
   Parquet files.

Progress is printed as the queries run; at the end the counts from the output topic are
checked against a batch recount of the input topic.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from highwater.client.admin import AdminClient, NewTopic
from highwater.client.producer import Producer

INPUT_TOPIC = "nginx-access"
OUTPUT_TOPIC = "nginx-status-counts"

#: The combined log format: ip, identity, user, [time], "request", status, size, referer, agent.
LOG_PATTERN = r'^(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+) [^"]*" (\d{3}) (\d+|-)'

_PATHS = ("/", "/index.html", "/api/orders", "/api/users/42", "/static/app.js", "/login")
_STATUSES = (200,) * 14 + (201, 204, 301, 304, 400, 401, 404, 404, 500, 503)
_AGENTS = ("curl/8.5.0", "Mozilla/5.0 (X11; Linux x86_64)", "python-requests/2.32")


def access_log_lines(count: int, start: datetime, seconds: float, seed: int) -> Iterator[str]:
    """``count`` synthetic access-log lines spread evenly over ``seconds`` from ``start``."""
    rng = random.Random(seed)
    for i in range(count):
        at = start + timedelta(seconds=seconds * i / count)
        ip = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        method = "POST" if rng.random() < 0.2 else "GET"
        yield (
            f"{ip} - - [{at.strftime('%d/%b/%Y:%H:%M:%S +0000')}] "
            f'"{method} {rng.choice(_PATHS)} HTTP/1.1" {rng.choice(_STATUSES)} '
            f'{rng.randrange(200, 20000)} "-" "{rng.choice(_AGENTS)}"'
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def embedded_server(data_dir: Path) -> Iterator[str]:
    """``highwater server`` on a free loopback port, its log in the data directory."""
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    address = f"127.0.0.1:{_free_port()}"
    with open(data_dir / "server.log", "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "highwater",
                "server",
                "--listen",
                address,
                "--data-dir",
                str(data_dir / "data"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield address
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def create_topics(address: str, partitions: int) -> None:
    """Create the input and output topics, waiting for the server to come up."""

    async def create() -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                async with AdminClient(address, request_timeout_s=5) as admin:
                    results = await admin.create_topics(
                        [NewTopic(INPUT_TOPIC, partitions, 1), NewTopic(OUTPUT_TOPIC, 2, 1)]
                    )
                    for name, result in results.items():
                        if result.error is not None and "exists" not in str(result.error):
                            raise RuntimeError(f"creating {name}: {result.error}")
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    asyncio.run(create())


def produce_in_chunks(address: str, lines: list[str], chunks: int, pause_s: float) -> None:
    """Write ``lines`` in ``chunks`` parts, ``pause_s`` apart (what a log shipper does)."""
    size = -(-len(lines) // chunks)
    with Producer({"bootstrap.servers": address, "linger.ms": 20}) as producer:
        for at in range(0, len(lines), size):
            for line in lines[at : at + size]:
                producer.produce(INPUT_TOPIC, line)
            producer.flush()
            time.sleep(pause_s)


def spark_session() -> Any:
    """A local[2] session bound to loopback; the workers run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("nginx-status-counts")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def parsed_requests(spark: Any, address: str) -> Any:
    """The input topic as a stream of parsed requests: time, method, path, status, bytes."""
    from pyspark.sql import functions as F

    lines = (
        spark.readStream.format("highwater")
        .option("bootstrap.servers", address)
        .option("subscribe", INPUT_TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "5000")
        .load()
        .select(F.col("value").cast("string").alias("line"))
    )
    return lines.select(
        F.to_timestamp(F.regexp_extract("line", LOG_PATTERN, 2), "dd/MMM/yyyy:HH:mm:ss Z").alias(
            "time"
        ),
        F.regexp_extract("line", LOG_PATTERN, 3).alias("method"),
        F.regexp_extract("line", LOG_PATTERN, 4).alias("path"),
        F.regexp_extract("line", LOG_PATTERN, 5).cast("int").alias("status"),
    ).where(F.col("time").isNotNull())


def status_counts(requests: Any) -> Any:
    """Requests per status per minute of log time."""
    from pyspark.sql import functions as F

    return (
        requests.withWatermark("time", "1 minute")
        .groupBy(F.window("time", "1 minute").alias("minute"), "status")
        .count()
        .select(
            F.date_format("minute.start", "yyyy-MM-dd'T'HH:mm").alias("minute"),
            "status",
            "count",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="a running cluster (default: start one here)")
    parser.add_argument("--work-dir", type=Path, default=Path(".run/pipeline"))
    parser.add_argument("--lines", type=int, default=30_000)
    parser.add_argument("--minutes", type=int, default=6, help="log time the lines span")
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        if args.bootstrap:
            address = args.bootstrap
        else:
            address = stack.enter_context(embedded_server(args.work_dir / "server"))
            print(f"embedded server on {address} (log: {args.work_dir / 'server' / 'server.log'})")
        create_topics(address, partitions=3)
        return run_pipeline(args, address)
    return 0


def run_pipeline(args: argparse.Namespace, address: str) -> int:
    """Start the queries, feed them, report progress, and check the results."""
    start = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    lines = list(access_log_lines(args.lines, start, args.minutes * 60, args.seed))
    checkpoints = args.work_dir / "checkpoints"
    parquet_dir = args.work_dir / "status-counts.parquet"
    shutil.rmtree(checkpoints, ignore_errors=True)
    shutil.rmtree(parquet_dir, ignore_errors=True)

    spark = spark_session()
    from pyspark.sql import functions as F

    counts = status_counts(parsed_requests(spark, address))

    # The Python data source sink writes in append mode only; a running count is an update,
    # so each micro-batch's changed cells are written with the batch writer (foreachBatch).
    def write_counts(batch: Any, batch_id: int) -> None:
        (
            batch.select(
                F.concat_ws("|", "minute", "status").alias("key"),
                F.to_json(F.struct("minute", "status", "count")).alias("value"),
                F.array(
                    F.struct(
                        F.lit("spark.batch").alias("key"),
                        F.lit(str(batch_id)).cast("binary").alias("value"),
                    )
                ).alias("headers"),
            )
            .write.format("highwater")
            .option("bootstrap.servers", address)
            .option("topic", OUTPUT_TOPIC)
            .mode("append")
            .save()
        )

    to_topic = (
        counts.writeStream.foreachBatch(write_counts)
        .queryName("counts-to-topic")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoints / "topic"))
        .trigger(processingTime="1 second")
        .start()
    )
    to_parquet = (
        counts.writeStream.format("parquet")
        .queryName("counts-to-parquet")
        .outputMode("append")
        .option("path", str(parquet_dir))
        .option("checkpointLocation", str(checkpoints / "parquet"))
        .trigger(processingTime="1 second")
        .start()
    )
    feeder = threading.Thread(
        target=produce_in_chunks, args=(address, lines, args.chunks, 2.0), daemon=True
    )
    began = time.monotonic()
    feeder.start()
    try:
        _show_progress([to_topic, to_parquet], feeder, args.lines, began)
    finally:
        to_topic.stop()
        to_parquet.stop()
    for query in (to_topic, to_parquet):
        if query.exception() is not None:
            print(f"{query.name} failed: {query.exception()}")
            return 1
    return _check(spark, address, parquet_dir, args.lines)


def _offsets_read(query: Any) -> int:
    import json

    progress = query.lastProgress
    if not progress or not progress.get("sources"):
        return 0
    end = progress["sources"][0].get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    return sum(int(o) for partitions in (end or {}).values() for o in partitions.values())


def _show_progress(queries: list[Any], feeder: threading.Thread, total: int, began: float) -> None:
    """Print each query's progress every 2 s until both have read every line."""
    deadline = time.monotonic() + 600
    while True:
        time.sleep(2)
        parts = []
        for query in queries:
            progress = query.lastProgress or {}
            parts.append(
                f"{query.name}: batch {progress.get('batchId', '-')}, "
                f"{_offsets_read(query)}/{total} lines, "
                f"{progress.get('processedRowsPerSecond', 0.0):.0f} rows/s"
            )
        print(f"[{time.monotonic() - began:5.1f} s] " + "; ".join(parts), flush=True)
        done = all(_offsets_read(q) >= total for q in queries) and not feeder.is_alive()
        if done and all(not q.status["isDataAvailable"] for q in queries):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the pipeline did not catch up in 600 s")
        for query in queries:
            if not query.isActive and query.exception() is not None:
                return


def _check(spark: Any, address: str, parquet_dir: Path, total: int) -> int:
    """Compare the streamed counts with a batch recount of the input topic."""
    from pyspark.sql import functions as F

    recount = {
        (r.minute, r.status): r["count"]
        for r in status_counts(parsed_requests_batch(spark, address)).collect()
    }
    output = (
        spark.read.format("highwater")
        .option("bootstrap.servers", address)
        .option("subscribe", OUTPUT_TOPIC)
        .load()
        .select(
            F.from_json(
                F.col("value").cast("string"), "minute string, status int, count long"
            ).alias("c"),
            "partition",
            "offset",
        )
        .select("c.*", "partition", "offset")
        .collect()
    )
    latest: dict[tuple[str, int], tuple[int, int]] = {}
    for row in output:
        key = (row.minute, row.status)
        latest[key] = max(latest.get(key, (-1, 0)), (row.offset, row["count"]))
    streamed = {key: count for key, (_, count) in latest.items()}
    parquet = {
        (r.minute, r.status): r["count"] for r in spark.read.parquet(str(parquet_dir)).collect()
    }
    print(
        f"\n{sum(recount.values())} requests of {total} lines, {len(recount)} minute/status cells"
    )
    print(f"{'minute':<17} " + " ".join(f"{s:>5}" for s in sorted({s for _, s in recount})))
    for minute in sorted({m for m, _ in recount}):
        statuses = sorted({s for _, s in recount})
        print(f"{minute:<17} " + " ".join(f"{streamed.get((minute, s), 0):>5}" for s in statuses))
    print(f"\ncounts in topic {OUTPUT_TOPIC}: {len(output)} records, {len(streamed)} cells")
    print(
        f"Parquet files in {parquet_dir}: {len(parquet)} final cells (minutes the watermark passed)"
    )
    ok = streamed == recount and all(recount.get(k) == v for k, v in parquet.items())
    print("streamed counts match a batch recount" if ok else "MISMATCH with the batch recount")
    return 0 if ok else 1


def parsed_requests_batch(spark: Any, address: str) -> Any:
    """The input topic as a batch of parsed requests (the recount)."""
    from pyspark.sql import functions as F

    lines = (
        spark.read.format("highwater")
        .option("bootstrap.servers", address)
        .option("subscribe", INPUT_TOPIC)
        .load()
        .select(F.col("value").cast("string").alias("line"))
    )
    return lines.select(
        F.to_timestamp(F.regexp_extract("line", LOG_PATTERN, 2), "dd/MMM/yyyy:HH:mm:ss Z").alias(
            "time"
        ),
        F.regexp_extract("line", LOG_PATTERN, 5).cast("int").alias("status"),
    ).where(F.col("time").isNotNull())


if __name__ == "__main__":
    sys.exit(main())
