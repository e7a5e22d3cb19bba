"""gRPC clients without a codec: records/s read by the Node.js example through a consumer
session and through structured fetch (``RECORD_FORMAT_PLAIN``), beside the Python client's
batch fetch, and what PLAIN costs the broker (its CPU per record, PLAIN vs BATCHES).

The server is ``highwater server`` as a subprocess (its CPU time is read from
``/proc/PID/stat``); one partition holds :data:`RECORDS` records of 100 bytes with a
10-byte key, produced as pre-built batches of 1,000. Each reader starts at offset 0 and
stops once it has every record:

- Node.js, consumer session: ``examples/node/bench.js session`` (a fresh group each trial,
  earliest reset, credit 5,000 records / 4 MiB, each delivery acknowledged on arrival);
- Node.js, structured fetch: ``bench.js fetch`` (Fetch PLAIN, 4 MiB answers);
- Python client: ``AsyncConsumer.consume(500)`` (RecordBatch v2 decoded by the client).

Broker CPU per record: the Fetch RPC from this process reads the partition whole, 4 MiB
answers, once in BATCHES (the client counts records from batch headers) and once in PLAIN;
the server process's user+system CPU time over the read, divided by the records.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bench._etcd_peer import free_port
from bench.report import REPO_ROOT, Report, Row

TOPIC = "bench-thin"
RECORDS = 300_000
BATCH_RECORDS = 1_000
TRIALS = 3
NODE_BENCH = REPO_ROOT / "examples" / "node" / "bench.js"
ANSWER_BYTES = 4 << 20


@contextlib.contextmanager
def server_process(data_dir: Path, log_path: Path) -> Iterator[tuple[str, int]]:
    """``highwater server`` on a free loopback port: its address and PID; stopped by PID."""
    address = f"127.0.0.1:{free_port()}"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "highwater",
                "server",
                "--listen",
                address,
                "--data-dir",
                str(data_dir),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield address, process.pid
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def fill(address: str, records: int) -> None:
    import grpc.aio
    from highwater.client.admin import AdminClient, NewTopic
    from highwater.records import SimpleRecord, build_batch
    from highwater.v1 import broker_pb2 as pb
    from highwater.v1 import broker_pb2_grpc
    from highwater.v1.common_pb2 import ErrorCode

    admin = AdminClient({"bootstrap.servers": address})
    try:
        for _ in range(300):
            with contextlib.suppress(Exception):
                await admin.create_topics([NewTopic(TOPIC, 1, 1)])
                break
            await asyncio.sleep(0.1)
    finally:
        await admin.close()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        for i in range(0, records, BATCH_RECORDS):
            batch = build_batch(
                [
                    SimpleRecord(key=f"key-{j:06d}".encode(), value=b"x" * 100)
                    for j in range(i, i + BATCH_RECORDS)
                ]
            )
            request = pb.ProduceRequest(acks=1)
            request.topics.add(topic=TOPIC).partitions.add(partition=0, record_batches=batch)
            for _ in range(100):
                answer = (await stub.Produce(request)).topics[0].partitions[0]
                if answer.error == ErrorCode.NONE:
                    break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"Produce answered {ErrorCode.Name(answer.error)}")


def node(address: str, mode: str, records: int, group: str) -> float:
    """records/s of one ``bench.js`` run."""
    out = subprocess.run(
        ["node", str(NODE_BENCH), address, TOPIC, str(records), mode, group],
        check=True,
        capture_output=True,
        timeout=300,
    ).stdout
    result = json.loads(out)
    if result["records"] < records:
        raise RuntimeError(f"node {mode}: {result['records']} of {records} records")
    return float(result["records"]) / result["seconds"]


async def python_client(address: str, records: int) -> float:
    from highwater.client.consumer import AsyncConsumer, TopicPartition

    consumer = AsyncConsumer({"bootstrap.servers": address})
    seen = 0
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        started = time.perf_counter()
        while seen < records:
            seen += len(await consumer.consume(500, timeout=5))
        return seen / (time.perf_counter() - started)
    finally:
        await consumer.close()


async def broker_cpu_per_record(address: str, pid: int, records: int, plain: bool) -> float:
    """Microseconds of the server's CPU per record read by Fetch, in PLAIN or BATCHES."""
    import grpc.aio
    from highwater.records import iter_batches
    from highwater.v1 import broker_pb2 as pb
    from highwater.v1 import broker_pb2_grpc

    seen = offset = 0
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        before = cpu_seconds(pid)
        while seen < records:
            request = pb.FetchRequest(max_wait_ms=500, max_bytes=ANSWER_BYTES)
            request.record_format = pb.RECORD_FORMAT_PLAIN if plain else pb.RECORD_FORMAT_BATCHES
            request.topics.add(topic=TOPIC).partitions.add(
                partition=0, fetch_offset=offset, partition_max_bytes=ANSWER_BYTES
            )
            answer = (await stub.Fetch(request, timeout=30)).topics[0].partitions[0]
            if plain:
                if answer.plain_records:
                    seen += len(answer.plain_records)
                    offset = answer.plain_records[-1].offset + 1
            else:
                for batch in iter_batches(answer.records):
                    if batch.next_offset > offset:
                        seen += batch.next_offset - max(offset, batch.base_offset)
                        offset = batch.next_offset
        return (cpu_seconds(pid) - before) / seen * 1e6


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def run(report: Report) -> None:
    records = max(BATCH_RECORDS, int(RECORDS * report.scale) // BATCH_RECORDS * BATCH_RECORDS)
    title = "gRPC clients without a codec (consumer sessions, `RECORD_FORMAT_PLAIN`)"
    with (
        report.suite("thin_clients", title) as section,
        report.data_dir("thin_clients") as root,
        server_process(root / "server", root / "server.log") as (address, pid),
    ):
        report.progress(f"thin_clients: {records} records")
        asyncio.run(fill(address, records))
        if shutil.which("node") is None or not (NODE_BENCH.parent / "node_modules").is_dir():
            raise RuntimeError("make node-deps installs Node.js and the example's packages")
        python_rates = [asyncio.run(python_client(address, records)) for _ in range(TRIALS)]
        python_rate = median(python_rates)
        peer = "Python client, RecordBatch v2 decoded by the client"
        rows = {
            "session": "Node.js, consumer session (PLAIN records, acknowledged as they arrive)",
            "fetch": "Node.js, Fetch with RECORD_FORMAT_PLAIN",
        }
        for mode, name in rows.items():
            report.progress(f"thin_clients: node {mode}")
            rates = [
                node(address, mode, records, f"bench-{mode}-{trial}") for trial in range(TRIALS)
            ]
            section.add(
                Row(
                    f"{name}, from offset 0, 1 partition, {records:,} records of 100 bytes",
                    median(rates),
                    "records/s",
                    peer_name=peer,
                    peer_value=python_rate,
                    extra="runs: " + " · ".join(f"{r:,.0f}" for r in rates) + " records/s",
                    peer_extra="runs: " + " · ".join(f"{r:,.0f}" for r in python_rates),
                )
            )
        report.progress("thin_clients: broker CPU per record")
        batches = median(
            [
                asyncio.run(broker_cpu_per_record(address, pid, records, False))
                for _ in range(TRIALS)
            ]
        )
        plain = median(
            [asyncio.run(broker_cpu_per_record(address, pid, records, True)) for _ in range(TRIALS)]
        )
        section.add(
            Row(
                "broker CPU per record fetched, RECORD_FORMAT_PLAIN (decoded into messages)",
                plain,
                "µs",
                peer_name="RECORD_FORMAT_BATCHES, the same fetches",
                peer_value=batches,
                extra="server process user+system CPU over the read / records",
            )
        )
        section.note(
            "Server: `highwater server` as a subprocess; the readers in separate processes "
            "(Node.js) or in the benchmark's process (Python), all on the same CPUs. Each row "
            f"is the median of {TRIALS} runs; see bench/thin_clients.py for what each reads."
        )
        section.note(
            "The session row includes joining the group (no initial rebalance delay in "
            "`highwater server`) and each partition's committed-offset lookup."
        )
