"""The broker suite's end-to-end latency phase alone, on a fresh cluster, with every
process's event-loop stalls: where a loaded machine's p99 goes.

``python -m bench._latency_probe [--seconds 5] [--rate 10000] [--profile] [--no-stalls]
[--uvloop] [--producer KEY=VALUE ...]``: one controller and three brokers
(bench/_highwater_cluster.py) with :mod:`bench._loop_watch` in each, a topic of one partition (RF 3,
min.insync.replicas=2), then :func:`bench.broker.latencies_with_client` (acks=all,
linger.ms=0, ``poll()``, and each ``--producer`` setting over the suite's) after a 1 s
warm-up. It prints the latency percentiles; for the benchmark's process (producer and
consumer) its CPU seconds (also per Produce request and per record) and its loop's stalls;
and for each server process its CPU seconds, its stalls over 2 ms split into those its own
thread spent on the CPU (our code holding the loop) and the rest (the process waiting for
a CPU: the machine), and its garbage collections; and the Produce requests the producer
sent (and the consumer's Fetch requests), with each server's CPU per request and per record
over the phase. The stall tickers (one wake-up a millisecond in every process) cost each
process about 50 ms of CPU a second, which the CPU figures include; ``--no-stalls`` leaves
them out, for CPU figures of the work alone. ``--profile`` adds
a cProfile of each server's loop thread and of the benchmark's process (its overhead
inflates the latencies: read the profiles, not the percentiles, of such a run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import resource
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from highwater.v1 import broker_pb2 as pb

from bench import broker
from bench._highwater_cluster import HighwaterCluster, highwater_cluster

WATCH_DIR = Path(__file__).parent / "_loop_watch"
OWN_CPU_SHARE = 0.7
"""A stall the thread spent at least this share of on the CPU counts as our code's."""


def _watch_bench_stalls(stalls: list[float]) -> asyncio.Future[None]:
    """Tick every 1 ms on the benchmark's loop (a timer callback, cheaper than a task
    asleep, since its CPU counts in the process's figure) and record in ``stalls`` each
    tick over 2 ms late, in ms; until the returned future is cancelled."""
    loop = asyncio.get_running_loop()
    watching: asyncio.Future[None] = loop.create_future()
    last = time.perf_counter()

    def tick() -> None:
        nonlocal last
        if watching.done():
            return
        now = time.perf_counter()
        if now - last - 0.001 > 0.002:
            stalls.append((now - last - 0.001) * 1e3)
        last = now
        loop.call_later(0.001, tick)

    loop.call_later(0.001, tick)
    return watching


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


async def probe(
    cluster: HighwaterCluster,
    out: str,
    *,
    seconds: float,
    rate: float,
    profile: bool,
    producer_config: dict[str, object] | None = None,
    tick: bool = True,
) -> None:
    bootstrap = cluster.bootstrap
    topic = broker.LATENCY_TOPIC
    await broker.create_topic(
        bootstrap, topic, replication_factor=3, config={"min.insync.replicas": "2"}
    )
    leader = await broker.leader_address(cluster, topic)
    await broker.wait_full_isr(leader, topic, 1, 3)
    stalls: list[float] = []
    watch = _watch_bench_stalls(stalls) if tick else None
    for process in cluster.all_processes():
        os.kill(process.pid, signal.SIGUSR1)
    # The client's modules are imported before the CPU is counted: the phase's figure is
    # the records', not the interpreter's first import of the library.
    import highwater.client.consumer
    import highwater.client.producer  # noqa: F401

    profiler = cProfile.Profile(time.thread_time) if profile else None
    if profiler is not None:
        profiler.enable()
    threads = _thread_cpu()
    rusage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = time.process_time()
    with _counting_produce_requests() as requests:
        latencies = await broker.latencies_with_client(
            bootstrap,
            topic,
            rate=rate,
            duration_s=seconds,
            warmup_s=1,
            producer_config=producer_config,
        )
    cpu = time.process_time() - cpu
    rusage_after = resource.getrusage(resource.RUSAGE_SELF)
    threads_after = _thread_cpu()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(f"{out}.bench.prof")
    for process in cluster.all_processes():
        os.kill(process.pid, signal.SIGUSR2)
    if watch is not None:
        watch.cancel()
    await asyncio.sleep(1)  # the servers write their windows
    latencies.sort()
    sent = int(rate * (seconds + 1))  # the warm-up's records too, as the windows hold
    print(
        f"Produce requests: {requests[0]:,} for {sent:,} records "
        f"({sent / max(requests[0], 1):.1f} records a request); the consumer's Fetch "
        f"requests: {requests[1]:,} ({requests[2]:,} answered without records)"
    )
    print(
        f"{len(latencies):,} records: p50 {_quantile(latencies, 0.5):.1f} ms, "
        f"p90 {_quantile(latencies, 0.9):.1f}, p99 {_quantile(latencies, 0.99):.1f}, "
        f"p99.9 {_quantile(latencies, 0.999):.1f}, max {latencies[-1]:.1f}"
    )
    print(
        f"benchmark process (producer, consumer): CPU {cpu:.2f} s "
        f"({cpu / max(requests[0], 1) * 1e3:.3f} ms per Produce request, "
        f"{cpu / sent * 1e6:.1f} µs per record); loop stalls > 2 ms: "
        f"{len(stalls)}, {sum(stalls):.0f} ms in all, longest {max(stalls, default=0):.1f}"
    )
    user = rusage_after.ru_utime - rusage.ru_utime
    system = rusage_after.ru_stime - rusage.ru_stime
    by_thread: dict[str, float] = {}
    for tid, (name, seconds) in threads_after.items():
        by_thread[name] = by_thread.get(name, 0.0) + seconds - threads.get(tid, (name, 0.0))[1]
    print(
        f"  of it user {user:.2f} s, system {system:.2f} s; by thread: "
        + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in sorted(by_thread.items()))
    )
    for process in cluster.all_processes():
        path = Path(f"{out}.{process.pid}.json")
        if not path.exists():
            print(f"{process.name}: no loop window written")
            continue
        window = json.loads(path.read_text())
        name = process.name
        if (
            process.name.startswith("broker ")
            and cluster.broker_addresses.get(int(process.name.split()[1])) == leader
        ):
            name += " (leader)"
        all_stalls = window["stalls"]
        own = [s for s in all_stalls if s[1] >= OWN_CPU_SHARE * s[0]]
        print(
            f"{name}: CPU {window['cpu_s']:.2f} s in {window['window_s']:.1f} s; "
            f"stalls > 2 ms {len(all_stalls)} ({sum(s[0] for s in all_stalls):.0f} ms, "
            f"longest {max((s[0] for s in all_stalls), default=0):.1f}), of them on its own "
            f"CPU {len(own)} ({sum(s[0] for s in own):.0f} ms, longest "
            f"{max((s[0] for s in own), default=0):.1f}); GC by generation "
            f"{window['gc_count']}, {window['gc_s'] * 1e3:.1f} ms, longest "
            f"{window['gc_max_s'] * 1e3:.1f}; CPU per Produce request "
            f"{window['cpu_s'] / max(requests[0], 1) * 1e3:.3f} ms, per record "
            f"{window['cpu_s'] / sent * 1e6:.1f} µs"
        )


def _thread_cpu() -> dict[int, tuple[str, float]]:
    """This process's threads: id -> (name, CPU seconds so far), from /proc (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    threads: dict[int, tuple[str, float]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        threads[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / ticks)
    return threads


@contextlib.contextmanager
def _counting_produce_requests() -> Iterator[list[int]]:
    """Count the Produce and Fetch requests the client library sends meanwhile (their one
    way out: ``ClusterMetadata.produce`` and ``fetch``) in the list's first two items, and
    the Fetch answers without records in its third."""
    from highwater.client.cluster import ClusterMetadata

    count = [0, 0, 0]
    produce = ClusterMetadata.produce
    fetch = ClusterMetadata.fetch

    async def counted(
        self: ClusterMetadata, address: str, request: pb.ProduceRequest, timeout_s: float
    ) -> pb.ProduceResponse:
        count[0] += 1
        return await produce(self, address, request, timeout_s)

    async def counted_fetch(
        self: ClusterMetadata, address: str, request: pb.FetchRequest, timeout_s: float
    ) -> pb.FetchResponse:
        count[1] += 1
        reply = await fetch(self, address, request, timeout_s)
        if not any(p.records for t in reply.topics for p in t.partitions):
            count[2] += 1
        return reply

    ClusterMetadata.produce = counted  # type: ignore[method-assign]
    ClusterMetadata.fetch = counted_fetch  # type: ignore[method-assign]
    try:
        yield count
    finally:
        ClusterMetadata.produce = produce  # type: ignore[method-assign]
        ClusterMetadata.fetch = fetch  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=broker.LATENCY_RATE)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--uvloop",
        action="store_true",
        help="run the benchmark's process (producer, consumer, pacing) on uvloop, as the "
        "servers run, instead of asyncio's own loop (the suite's)",
    )
    parser.add_argument(
        "--no-stalls",
        action="store_true",
        help="no 1 ms ticker in any process (no stalls reported): each costs its process "
        "about 50 ms of CPU per second, which the CPU figures then leave out",
    )
    parser.add_argument(
        "--producer",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a producer setting over the suite's (e.g. max.in.flight.requests.per.connection=1)",
    )
    args = parser.parse_args()
    producer_config: dict[str, object] = {}
    for setting in args.producer:
        key, _, value = setting.partition("=")
        producer_config[key] = int(value) if value.lstrip("-").isdigit() else value
    root = Path(tempfile.mkdtemp(prefix="latency-probe-"))
    out = str(root / "loop")
    env = {
        "LOOP_WATCH_OUT": out,
        "PYTHONPATH": os.pathsep.join([str(WATCH_DIR), os.environ.get("PYTHONPATH", "")]),
    }
    if args.profile:
        env["LOOP_WATCH_PROFILE"] = "1"
    if args.no_stalls:
        env["LOOP_WATCH_TICK"] = "0"
    print(f"load average {os.getloadavg()[0]:.1f}; files under {root}")
    run = asyncio.run
    if args.uvloop:
        import uvloop

        run = uvloop.run  # type: ignore[assignment]
    with highwater_cluster(root, 3, env=env) as cluster:
        run(
            probe(
                cluster,
                out,
                seconds=args.seconds,
                rate=args.rate,
                profile=args.profile,
                producer_config=producer_config,
                tick=not args.no_stalls,
            )
        )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
