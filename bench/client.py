"""The broker suite's client rows alone: the Python producer and consumer against real brokers.

``python -m bench.client`` starts what the broker suite starts (one controller and one
broker, then three brokers for RF 3 with acks=all) and runs the suite's own client loops
from :mod:`bench.broker` (``produce_with_client``, ``consume_with_client``): the producer
with a delivery callback per record and with per-batch reports (``produce()``, and
``produce_without_handle()``, which makes no handle per record), the consumer's
``consume()`` and ``consume_batches()``, each ``--trials`` times, the median kept.

The producer rows run at each ``--batch-size``: by default the broker suite's 128 KiB, then
the 1,000,000 bytes the Kafka suite gives librdkafka (bench/kafka.py), a producer set up
for throughput. A batch costs the client, the leader and each follower a request whatever
its size, so the larger batch takes a half to two thirds of the CPU per record at RF 3.

Beside records/s it gives this process's CPU time per record (``time.process_time``: the
gRPC threads included), and each broker's and the controller's (``/proc/<pid>/stat``):
they share this machine's CPUs with the client, so theirs counts too. CPU time per record
moves far less with the machine's load than wall time. ``--profile`` adds a cProfile table
of each loop (compiled codec). It takes a few minutes where the whole broker suite takes
twenty; the figures go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from highwater.rpc.allocator import keep_large_buffers

from bench._highwater_cluster import HighwaterCluster, highwater_cluster
from bench.broker import (
    PRODUCER_CONFIG,
    TOPIC,
    consume_with_client,
    create_topic,
    leader_address,
    produce_with_client,
    wait_full_isr,
)
from bench.kafka import PRODUCER_CONFIG as PEER_PRODUCER_CONFIG
from bench.report import hotspots_text

__all__ = ["main"]

Run = Callable[[], Awaitable[object]]

_peer_batch_size = PEER_PRODUCER_CONFIG["batch.size"]
assert isinstance(_peer_batch_size, int)
PEER_BATCH_SIZE: int = _peer_batch_size
"""The batch.size the Kafka suite gives librdkafka's producer (bench/kafka.py): a producer
configured for throughput."""


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, its threads included) process ``pid`` has used, in
    clock ticks (10 ms: 0.03 µs a record over 300,000 records)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


async def _measure(
    label: str,
    run: Run,
    records: int,
    trials: int,
    profile: bool,
    others: dict[str, int],
) -> None:
    """``run`` ``trials`` times: the median records/s and CPU µs per record (this process's,
    and each of ``others``' by name -> pid), printed."""
    rates: list[float] = []
    cpu: list[float] = []
    cpu_of: dict[str, list[float]] = {name: [] for name in others}
    for _ in range(trials):
        before = {name: process_cpu_seconds(pid) for name, pid in others.items()}
        wall, started = time.perf_counter(), time.process_time()
        await run()
        cpu.append((time.process_time() - started) / records * 1e6)
        rates.append(records / (time.perf_counter() - wall))
        for name, pid in others.items():
            cpu_of[name].append((process_cpu_seconds(pid) - before[name]) / records * 1e6)
    elsewhere = "".join(
        f", {name} {statistics.median(spent):.2f}" for name, spent in cpu_of.items()
    )
    print(
        f"{label}: {statistics.median(rates):,.0f} records/s "
        f"(trials {', '.join(f'{r:,.0f}' for r in rates)}), "
        f"{statistics.median(cpu):.2f} CPU µs/record{elsewhere}",
        flush=True,
    )
    if profile:
        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        try:
            await run()
        finally:
            profiler.disable()
        print(hotspots_text(profiler, top=14), flush=True)


async def client_rows(
    cluster: HighwaterCluster, replication: int, args: argparse.Namespace
) -> None:
    """The suite's client loops against one cluster, on a topic made as the suite makes it."""
    bootstrap = cluster.bootstrap
    acks = "all" if replication > 1 else "1"
    config = {"min.insync.replicas": "2"} if replication > 1 else None
    await create_topic(bootstrap, TOPIC, replication_factor=replication, config=config)
    await wait_full_isr(await leader_address(cluster, TOPIC), TOPIC, 1, replication)
    records = args.records
    others = {p.name: p.pid for p in cluster.all_processes()}
    rows: list[tuple[str, Run]] = []
    for batch_size in args.batch_size:
        producer = {"batch.size": batch_size}
        rows += [
            (
                f"produce(), a callback per record, batch.size {batch_size:,}",
                partial(produce_with_client, bootstrap, TOPIC, acks, records, config=producer),
            ),
            (
                f"produce(), on_delivery_batch, batch.size {batch_size:,}",
                partial(
                    produce_with_client,
                    bootstrap,
                    TOPIC,
                    acks,
                    records,
                    per_batch=True,
                    config=producer,
                ),
            ),
            (
                f"produce_without_handle(), on_delivery_batch, batch.size {batch_size:,}",
                partial(
                    produce_with_client,
                    bootstrap,
                    TOPIC,
                    acks,
                    records,
                    per_batch=True,
                    handles=False,
                    config=producer,
                ),
            ),
        ]
    # The consumer reads the first records from offset 0: those of the first producer row.
    rows += [
        ("consume()", partial(consume_with_client, bootstrap, TOPIC, records)),
        (
            "consume_batches()",
            partial(consume_with_client, bootstrap, TOPIC, records, batches=True),
        ),
    ]
    selected = [
        (label, run)
        for label, run in rows
        if not args.only or any(part in label for part in args.only)
    ]
    if selected and not any(label.startswith("produce") for label, _ in selected):
        # the consumer rows read what the first producer row writes: written, not measured
        await rows[0][1]()
    for label, run in selected:
        await _measure(
            f"RF {replication}, {label}", run, records, args.trials, args.profile, others
        )


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the rows, print them."""
    parser = argparse.ArgumentParser(prog="python -m bench.client", description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--replication", type=int, nargs="+", default=[1, 3])
    parser.add_argument(
        "--batch-size",
        type=int,
        nargs="+",
        default=[int(PRODUCER_CONFIG["batch.size"]), PEER_BATCH_SIZE],
        help="the producer rows' batch.size (bytes), each in turn: by default the broker "
        "suite's, then the one bench/kafka.py gives librdkafka",
    )
    parser.add_argument(
        "--only", nargs="+", default=[], help="only the rows whose label contains one of these"
    )
    parser.add_argument("--profile", action="store_true", help="a cProfile table per loop")
    parser.add_argument(
        "--python-produce",
        action="store_true",
        help="the producer's produce() in Python (the compiled lane off; the codec stays "
        "compiled): the before of the C produce(), in the same conditions",
    )
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="leave this process's malloc thresholds at glibc's defaults (the brokers' are "
        "raised whatever this says): the before of highwater.rpc.allocator",
    )
    args = parser.parse_args(argv)
    if not args.default_malloc:
        keep_large_buffers()  # as `python -m bench` and the brokers do
    if args.python_produce:
        from highwater.client.producer import producer

        producer._ProduceLane = None
    print(f"load {os.getloadavg()[0]:.1f}; {args.records:,} records of 100 bytes", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        for replication in args.replication:
            root = Path(tmp) / f"rf{replication}"
            with highwater_cluster(root, replication) as cluster:
                asyncio.run(client_rows(cluster, replication, args))
            print(f"load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
