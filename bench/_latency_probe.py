"""The broker suite's end-to-end latency phase alone, on a fresh cluster, with every
process's event-loop stalls: where a loaded machine's p99 goes.

``python -m bench._latency_probe [--seconds 5] [--rate 10000] [--profile] [--no-stalls]
[--uvloop] [--trace] [--freeze] [--producer KEY=VALUE ...]``: one controller and three brokers
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

``--trace`` attributes the tail: every process notes with its ``perf_counter`` time (one
clock on the machine) each garbage collection and, in the brokers, each append, follower
fetch, high-watermark move and consumer read of the partition (bench/_loop_watch); the
benchmark's process notes each Produce request's departure and answer, each consumer
Fetch answer and each record ``poll()`` returned. Each record's path is then split into
its hops (:data:`HOPS`): the probe prints each hop's mean over all records, over the
records around the median (p45 to p55) and over p90 and p99, and each hop's own median;
for the records over p90 and over p99 it prints which
hop was the longest and what the process owning that hop did meanwhile: a loop stall of
its own CPU, a stall waiting for a CPU, a garbage collection, or none of them; and the
Produce requests' round trips and the gap from each answer to the next request's
departure. ``--freeze`` runs ``gc.collect()`` and ``gc.freeze()`` in the benchmark's
process before the phase.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import bisect
import contextlib
import cProfile
import gc
import itertools
import json
import os
import resource
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from highwater.v1 import broker_pb2 as pb

from bench import broker
from bench._highwater_cluster import HighwaterCluster, highwater_cluster

WATCH_DIR = Path(__file__).parent / "_loop_watch"
OWN_CPU_SHARE = 0.7
"""A stall the thread spent at least this share of on the CPU counts as our code's."""


def _watch_bench_stalls(stalls: list[tuple[float, float, float]]) -> asyncio.Future[None]:
    """Tick every 1 ms on the benchmark's loop (a timer callback, cheaper than a task
    asleep, since its CPU counts in the process's figure) and record in ``stalls`` each
    tick over 2 ms late (ms late, the thread's CPU ms in it, ``perf_counter`` at its end);
    until the returned future is cancelled."""
    loop = asyncio.get_running_loop()
    watching: asyncio.Future[None] = loop.create_future()
    last, last_cpu = time.perf_counter(), time.thread_time()

    def tick() -> None:
        nonlocal last, last_cpu
        if watching.done():
            return
        now, cpu = time.perf_counter(), time.thread_time()
        if now - last - 0.001 > 0.002:
            stalls.append(((now - last - 0.001) * 1e3, (cpu - last_cpu) * 1e3, now))
        last, last_cpu = now, cpu
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
    trace: bool = False,
    freeze: bool = False,
) -> None:
    bootstrap = cluster.bootstrap
    topic = broker.LATENCY_TOPIC
    await broker.create_topic(
        bootstrap, topic, replication_factor=3, config={"min.insync.replicas": "2"}
    )
    leader = await broker.leader_address(cluster, topic)
    await broker.wait_full_isr(leader, topic, 1, 3)
    stalls: list[tuple[float, float, float]] = []
    watch = _watch_bench_stalls(stalls) if tick else None
    for process in cluster.all_processes():
        os.kill(process.pid, signal.SIGUSR1)
    # The client's modules are imported before the CPU is counted: the phase's figure is
    # the records', not the interpreter's first import of the library.
    import highwater.client.consumer
    import highwater.client.producer  # noqa: F401

    if freeze:  # the start-up's objects out of every later collection
        gc.collect()
        gc.freeze()

    profiler = cProfile.Profile(time.thread_time) if profile else None
    if profiler is not None:
        profiler.enable()
    threads = _thread_cpu()
    rusage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = time.process_time()
    client_trace = ClientTrace() if trace else None
    gc_before = gc.get_stats()
    tracked_objects = len(gc.get_objects())
    with _counting_produce_requests(client_trace) as requests:
        latencies = await broker.latencies_with_client(
            bootstrap,
            topic,
            rate=rate,
            duration_s=seconds,
            warmup_s=1,
            producer_config=producer_config,
        )
    cpu = time.process_time() - cpu
    gc_counts = [
        a["collections"] - b["collections"] for a, b in zip(gc.get_stats(), gc_before, strict=True)
    ]
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
        f"{len(stalls)}, {sum(s[0] for s in stalls):.0f} ms in all, longest "
        f"{max((s[0] for s in stalls), default=0):.1f}"
    )
    print(
        f"  garbage collections by generation {gc_counts}; {tracked_objects:,} objects "
        "tracked by the collector at the start"
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
    servers: dict[str, ProcessTrace] = {}
    followers: dict[int, str] = {}
    leader_name = ""
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
            leader_name = process.name
        elif process.name.startswith("broker "):
            followers[int(process.name.split()[1])] = process.name
        if trace:
            events: dict[str, list[tuple[Any, ...]]] = {}
            for event in window.get("trace", []):
                events.setdefault(event[0], []).append(tuple(event))
            servers[process.name] = ProcessTrace(
                process.name,
                [(s[0], s[1], s[3]) for s in window["stalls"]],
                [tuple(g) for g in window.get("gcs", [])],  # type: ignore[misc]
                events,
            )
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
    if client_trace is not None and leader_name:
        _attribute(client_trace, stalls, servers, leader_name, followers)


HOPS = (
    ("sender", "produce() to its Produce request's departure", "bench"),
    ("produce in", "the request's departure to the leader's append", "leader"),
    ("to follower", "the leader's append to the later follower's append", "follower"),
    ("next fetch", "that follower's append to its next fetch at the leader", "follower"),
    ("high watermark", "that fetch to the high watermark passing the record", "leader"),
    ("consumer read", "the high watermark's move to the consumer's read at the leader", "leader"),
    ("fetch answer", "that read to the Fetch answer in the benchmark's process", "bench"),
    ("poll", "the Fetch answer to poll() returning the record", "bench"),
)
"""A record's path at acks=all (name, from/to, the process that owns the hop; "follower"
is the follower whose fetch moved the high watermark past the record)."""


@dataclass
class ProcessTrace:
    """One process's notes of a ``--trace`` window: its stalls (ms late, CPU ms in it,
    ``perf_counter`` at its end), garbage collections (start, seconds, generation) and,
    for a broker, its partition events by kind."""

    name: str
    stalls: list[tuple[float, float, float]]
    gcs: list[tuple[float, float, int]]
    events: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)

    def during(self, start: float, end: float) -> str:
        """What the process did in [start, end]: a garbage collection, a stall of its own
        CPU, a stall waiting for a CPU, or nothing of those ("-")."""
        for gc_start, pause, generation in self.gcs:
            if gc_start < end and gc_start + pause > start:
                return f"GC gen {generation}"
        for late_ms, cpu_ms, stall_end in self.stalls:
            if stall_end - (late_ms + 1) / 1e3 < end and stall_end > start:
                return "own stall" if cpu_ms >= OWN_CPU_SHARE * late_ms else "machine stall"
        return "-"


def _first_after(times: list[float], values: list[int], offset: int) -> float | None:
    """The time of the first event whose value (a log end, fetch offset or high watermark:
    each only grows) passes ``offset``."""
    i = bisect.bisect_right(values, offset)
    return times[i] if i < len(times) else None


def _series(events: list[tuple[Any, ...]], value_at: int = 2) -> tuple[list[float], list[int]]:
    times, values, top = [], [], -1
    for event in events:
        top = max(top, event[value_at])  # monotone, for bisect
        times.append(event[1])
        values.append(top)
    return times, values


def _attribute(
    trace: ClientTrace,
    bench_stalls: list[tuple[float, float, float]],
    servers: dict[str, ProcessTrace],
    leader: str,
    followers: dict[int, str],
    warmup_s: float = 1.0,
) -> None:
    """Split each record's path into :data:`HOPS` and print where the records over p90 and
    p99 waited (those of the first ``warmup_s`` left out, as the percentiles leave them;
    the times of generation-2 collections are printed from the first request's)."""
    from highwater.records import iter_batches

    produced: dict[int, tuple[float, float, float]] = {}  # offset -> (t0, sent, answered)
    for sent, answered, request, response in trace.produces:
        base = response.topics[0].partitions[0].base_offset
        data = request.topics[0].partitions[0].record_batches
        index = 0
        for batch in iter_batches(data, verify_crc=False):
            for record in batch.records():
                assert record.value is not None
                t0 = broker.SEND_TIME.unpack_from(record.value)[0] / 1e9
                produced[base + index] = (t0, sent, answered)
                index += 1
    fetched: dict[int, float] = {}
    for arrived, reply in trace.fetches:
        for topic in reply.topics:
            for partition in topic.partitions:
                for batch in iter_batches(partition.records, verify_crc=False):
                    for offset in range(batch.base_offset, batch.last_offset + 1):
                        fetched.setdefault(offset, arrived)
    polled = dict(zip(trace.poll_offsets, trace.poll_times, strict=True))
    lead = servers[leader].events
    appends = _series(lead.get("append", []))
    high_watermarks = _series(lead.get("high_watermark", []))
    reads = _series(lead.get("read", []), 3)
    follower_fetches = {
        replica: _series([e for e in lead.get("follower_fetch", []) if e[2] == replica], 3)
        for replica in followers
    }
    follower_appends = {
        replica: _series(servers[name].events.get("follower_append", []))
        for replica, name in followers.items()
        if name in servers
    }
    bench = ProcessTrace("bench", bench_stalls, trace.gcs)
    rows: list[tuple[float, list[float], list[str]]] = []
    in_flight_at_produce = 0
    sent_times = sorted(p[0] for p in trace.produces)
    answers = {p[0]: p[1] for p in trace.produces}
    started = min(p[0] for p in trace.produces)
    for offset, (t0, sent, _answered) in produced.items():
        if offset not in polled or offset not in fetched or t0 < started + warmup_s:
            continue  # the warm-up's records are not counted, as in the percentiles
        t_append = _first_after(*appends, offset)
        t_hw = _first_after(*high_watermarks, offset)
        t_read = _first_after(*reads, offset)
        by_follower = []
        for replica in followers:
            fetch_at = _first_after(*follower_fetches[replica], offset)
            append_at = (
                _first_after(*follower_appends[replica], offset)
                if replica in follower_appends
                else None
            )
            if fetch_at is not None and append_at is not None:
                by_follower.append((fetch_at, append_at, replica))
        if t_append is None or t_hw is None or t_read is None or not by_follower:
            continue
        fetch_at, append_at, replica = max(by_follower)
        stops = [t0, sent, t_append, append_at, fetch_at, t_hw, t_read, fetched[offset]]
        stops.append(polled[offset])
        hops = [(b - a) * 1e3 for a, b in itertools.pairwise(stops)]
        i = max(range(len(hops)), key=hops.__getitem__)
        owner = HOPS[i][2]
        process = (
            bench
            if owner == "bench"
            else servers[leader]
            if owner == "leader"
            else servers.get(followers[replica])
        )
        doing = process.during(stops[i], stops[i + 1]) if process is not None else "?"
        k = bisect.bisect_right(sent_times, t0) - 1
        if k >= 0 and answers[sent_times[k]] > t0:
            in_flight_at_produce += 1
        rows.append(((stops[-1] - t0) * 1e3, hops, [HOPS[i][0], doing]))
    if not rows:
        print("trace: no record could be followed along its path")
        return
    requests = sorted((sent, answered) for sent, answered, _request, _response in trace.produces)
    round_trips = sorted(answered - sent for sent, answered in requests)
    gaps = sorted(
        b[0] - a[1] for a, b in itertools.pairwise(requests) if b[0] >= a[1]
    )  # an answer to the next request's departure, when it waited for the answer
    print(
        f"trace: Produce round trips mean {sum(round_trips) / len(round_trips) * 1e3:.2f} ms, "
        f"p99 {_quantile(round_trips, 0.99) * 1e3:.2f}; from an answer to the next "
        f"request's departure ({len(gaps):,} of {len(requests):,}) mean "
        f"{sum(gaps) / max(len(gaps), 1) * 1e3:.3f} ms, p99 {_quantile(gaps, 0.99) * 1e3:.3f}"
        if gaps
        else "trace: no request waited for an answer"
    )
    rows.sort(key=lambda row: row[0])
    print(
        f"trace: {len(rows):,} records after the warm-up followed ({len(produced):,} "
        "produced); "
        f"{in_flight_at_produce / len(rows):.0%} were produced while a Produce request was "
        "in flight"
    )
    header = " | ".join(name for name, _what, _owner in HOPS)
    print(f"  mean hop ms: records | end to end | {header}")
    totals = [r[0] for r in rows]
    p45, p55 = _quantile(totals, 0.45), _quantile(totals, 0.55)
    p90, p99 = _quantile(totals, 0.9), _quantile(totals, 0.99)
    groups = {
        "all": rows,
        f"p45 to p55 ({p45:.1f} to {p55:.1f} ms)": [r for r in rows if p45 <= r[0] <= p55],
        f"over p90 ({p90:.1f} ms)": [r for r in rows if r[0] > p90],
        f"over p99 ({p99:.1f} ms)": [r for r in rows if r[0] > p99],
    }
    for label, group in groups.items():
        if not group:
            continue
        means = [sum(r[1][j] for r in group) / len(group) for j in range(len(HOPS))]
        print(
            f"  {label}: {len(group):,} | {sum(r[0] for r in group) / len(group):.2f} | "
            + " | ".join(f"{m:.2f}" for m in means)
        )
    medians = [_quantile(sorted(r[1][j] for r in rows), 0.5) for j in range(len(HOPS))]
    print(
        f"  each hop's own median: {len(rows):,} | {_quantile(totals, 0.5):.2f} | "
        + " | ".join(f"{m:.2f}" for m in medians)
    )
    for label, group in list(groups.items())[2:]:
        causes: dict[tuple[str, str], int] = {}
        for row in group:
            key = (row[2][0], row[2][1])
            causes[key] = causes.get(key, 0) + 1
        print(f"  {label}, the longest hop and what its process did meanwhile:")
        for (hop, doing), n in sorted(causes.items(), key=lambda item: -item[1]):
            print(f"    {hop}: {doing}: {n} ({n / len(group):.0%})")
    for name, process in [("bench", bench), *servers.items()]:
        gen2 = [(start, pause) for start, pause, generation in process.gcs if generation == 2]
        print(
            f"  {name}: {len(process.gcs)} collections, {len(gen2)} of generation 2"
            + "".join(f", {p * 1e3:.1f} ms at {s - started:.2f} s" for s, p in gen2)
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


@dataclass
class ClientTrace:
    """What the benchmark's process noted under ``--trace``, ``perf_counter`` times; the
    records' bytes are kept and decoded after the phase, not during it."""

    produces: list[tuple[float, float, pb.ProduceRequest, pb.ProduceResponse]] = field(
        default_factory=list
    )
    fetches: list[tuple[float, pb.FetchResponse]] = field(default_factory=list)
    poll_times: array.array[float] = field(default_factory=lambda: array.array("d"))
    poll_offsets: array.array[int] = field(default_factory=lambda: array.array("q"))
    """Kept in arrays: a tuple per record would be an object the garbage collector tracks,
    and the trace would add collections to the process it measures."""
    gcs: list[tuple[float, float, int]] = field(default_factory=list)


@contextlib.contextmanager
def _counting_produce_requests(trace: ClientTrace | None = None) -> Iterator[list[int]]:
    """Count the Produce and Fetch requests the client library sends meanwhile (their one
    way out: ``ClusterMetadata.produce`` and ``fetch``) in the list's first two items, and
    the Fetch answers without records in its third. With ``trace``, also note each
    request's times and each record ``AsyncConsumer.poll()`` returns, and the process's
    garbage collections."""
    from highwater.client.cluster import ClusterMetadata
    from highwater.client.consumer import AsyncConsumer

    count = [0, 0, 0]
    produce = ClusterMetadata.produce
    fetch = ClusterMetadata.fetch
    poll = AsyncConsumer.poll
    gc_started = [0.0]

    async def counted(
        self: ClusterMetadata, address: str, request: pb.ProduceRequest, timeout_s: float
    ) -> pb.ProduceResponse:
        count[0] += 1
        if trace is None:
            return await produce(self, address, request, timeout_s)
        sent = time.perf_counter()
        response = await produce(self, address, request, timeout_s)
        trace.produces.append((sent, time.perf_counter(), request, response))
        return response

    async def counted_fetch(
        self: ClusterMetadata, address: str, request: pb.FetchRequest, timeout_s: float
    ) -> pb.FetchResponse:
        count[1] += 1
        reply = await fetch(self, address, request, timeout_s)
        if not any(p.records for t in reply.topics for p in t.partitions):
            count[2] += 1
        elif trace is not None:
            trace.fetches.append((time.perf_counter(), reply))
        return reply

    async def traced_poll(self: AsyncConsumer, timeout: float | None = None) -> Any:
        message = await poll(self, timeout)
        if trace is not None and message is not None and message.error() is None:
            trace.poll_times.append(time.perf_counter())
            trace.poll_offsets.append(message.offset())
        return message

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        elif trace is not None:
            trace.gcs.append(
                (gc_started[0], time.perf_counter() - gc_started[0], info["generation"])
            )

    ClusterMetadata.produce = counted  # type: ignore[method-assign]
    ClusterMetadata.fetch = counted_fetch  # type: ignore[method-assign]
    if trace is not None:
        AsyncConsumer.poll = traced_poll  # type: ignore[method-assign]
        gc.callbacks.append(on_gc)
    try:
        yield count
    finally:
        ClusterMetadata.produce = produce  # type: ignore[method-assign]
        ClusterMetadata.fetch = fetch  # type: ignore[method-assign]
        if trace is not None:
            AsyncConsumer.poll = poll  # type: ignore[method-assign]
            gc.callbacks.remove(on_gc)


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
    parser.add_argument(
        "--trace",
        action="store_true",
        help="note each record's hops and every process's stalls and garbage collections, "
        "and print which hop the records over p90 and p99 waited on, and why",
    )
    parser.add_argument(
        "--freeze",
        action="store_true",
        help="gc.collect() and gc.freeze() in the benchmark's process before the phase: "
        "its start-up's objects are then left out of every collection",
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
    if args.trace:
        env["LOOP_WATCH_TRACE"] = "1"
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
                trace=args.trace,
                freeze=args.freeze,
            )
        )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
