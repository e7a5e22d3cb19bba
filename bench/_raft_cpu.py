"""CPU per committed write of the controller quorum: ``python -m bench._raft_cpu``.

Wall-clock rates mean little on a shared, loaded machine; the CPU each process spends per
committed write holds much better. This runs ``bench raft``'s write workload (one
``AlterConfigs`` of a ~100-byte ``ConfigRecord`` per write, 3 controller processes on
loopback, fsync on) for each number of writers, and reports per run: committed writes
and their rate, the CPU milliseconds per committed write of the leader, of each follower
(``/proc/PID/stat``: user and system time of all threads) and of the client (this
process), and how many writes each Raft batch held (the leader's log read back after the
run: the data batches appended during the measured window).

``--floor`` measures the same for ``bench._grpc_floor`` (the no-op Controller service of
the floor rows of ``bench raft``) with the same client and requests: the server CPU per
call that gRPC and the servicer's plumbing cost before any controller work;
``--floor-server project`` builds that server with the project's ``new_server`` (its
interceptors and options) instead of a bare ``grpc.aio.server()``, and ``--only-floor``
measures the floor alone.

``--profile`` runs the controllers under ``bench._profiled_server`` and profiles every
controller's event loop (CPU time) over each measured window; for the leader and for one
follower the functions with the most cumulative and own time are printed, per committed
write (the calls column counts messages, wake-ups and thread hand-offs per commit: e.g.
the driver's ``_step`` per message in, ``_dispatch`` per message out, ``to_thread`` per
fsync handed to a thread), and the raw profiles are kept beside the data.

Each run also prints how many writes each Raft batch held as a histogram, and the sum of
the CPU per write of every process that carries the workload with the rate it allows on
this machine's CPUs (throughput cannot pass the CPUs divided by that sum).

``--timeline`` runs the controllers under ``bench._raft_timeline`` instead and reports,
per Raft batch, how many requests, fsyncs, fetch answers and fetches each process handled
(whether concurrent writes share them), and with one writer the median time from the
client's send to each step of a commit on the leader and on the followers; with many,
where a write waits (each followed by its writer's number from its send to the leader's
servicer, its answer and back) and the median time from a Raft append to each step of
its round. ``--floor-delay-ms N`` makes the floor answer each call after N ms of waiting
(gRPC's intake with the calls held as a commit holds them, without the CPU);
``--append-pipeline-depth N`` runs the controllers with N batches in flight at most.
``--fsync N`` first times N ``fdatasync`` calls of 100-byte appends in the data
directory's file system: the disk's share of the physical floor of a commit.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import math
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench._etcd_peer import free_port, percentile
from bench._raft_timeline import Event, read_window
from bench.raft import (
    TOPIC_PREFIX,
    ControllerProcess,
    _Cluster,
    _wait_serving,
    controller_quorum,
    wait_for_leader,
)
from bench.report import profile_entry_name


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds process ``pid`` has used (all its threads)."""
    return _stat_cpu_s(Path(f"/proc/{pid}/stat"))


def main_thread_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid``'s main thread: a server's event
    loop, where all its Python runs; the rest is gRPC's own threads (its event engine,
    which polls the sockets and moves the bytes) and the fsyncs handed to worker threads."""
    return _stat_cpu_s(Path(f"/proc/{pid}/task/{pid}/stat"))


def _stat_cpu_s(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuRun:
    """One measured window of the write workload."""

    writers: int
    writes: int
    seconds: float
    p50_ms: float
    leader_id: int
    cpu_s: dict[int, float]
    loop_cpu_s: dict[int, float]
    """Of ``cpu_s``, each process's main thread's (its event loop)."""
    client_cpu_s: float
    batch_sizes: list[int]
    """Records of each data batch the leader appended in the window."""
    load: tuple[float, float]
    client_stamps: list[tuple[int, int]] = field(default_factory=list)
    """(sent, answered) ``time.monotonic_ns()`` of each write measured."""
    client_writers: list[int] = field(default_factory=list)
    """The writer (its topic's number) of each of ``client_stamps``."""

    @property
    def batches(self) -> int:
        return len(self.batch_sizes)

    @property
    def records(self) -> int:
        return sum(self.batch_sizes)

    def summary(self) -> str:
        if not self.writers:
            per_second = {n: 1000 * s / self.seconds for n, s in self.cpu_s.items()}
            return (
                f"  0 writers (idle) for {self.seconds:.1f} s: CPU ms per second: leader "
                f"{per_second[self.leader_id]:.1f}, followers "
                + " ".join(
                    f"{per_second[n]:.1f}" for n in sorted(per_second) if n != self.leader_id
                )
                + f"; load {self.load[0]:.1f} -> {self.load[1]:.1f}"
            )
        per_write = {n: 1000 * s / max(1, self.writes) for n, s in self.cpu_s.items()}
        followers = " ".join(
            f"{per_write[n]:.2f}" for n in sorted(per_write) if n != self.leader_id
        )
        leader_loop = 1000 * self.loop_cpu_s[self.leader_id] / max(1, self.writes)
        return (
            f"{self.writers:>3} writers: {self.writes:>6} writes in {self.seconds:.1f} s "
            f"({self.writes / self.seconds:,.0f}/s, p50 {self.p50_ms:.2f} ms); CPU ms per "
            f"write: leader {per_write[self.leader_id]:.2f} (event loop {leader_loop:.2f}), "
            f"followers {followers}, client "
            f"{1000 * self.client_cpu_s / max(1, self.writes):.2f}; {self.batches} Raft "
            f"batches, {self.records / max(1, self.batches):.2f} records per batch; "
            f"load {self.load[0]:.1f} -> {self.load[1]:.1f}\n"
            f"      records per Raft batch: {batch_histogram(self.batch_sizes)}\n"
            f"      {self.cpu_bound()}"
        )

    def cpu_bound(self) -> str:
        """The sum of every process's CPU per write, and the rate the machine's CPUs allow."""
        per_write = {
            f"node {n}" + (" (leader)" if n == self.leader_id else ""): 1000
            * s
            / max(1, self.writes)
            for n, s in self.cpu_s.items()
        }
        per_write["client"] = 1000 * self.client_cpu_s / max(1, self.writes)
        return cpu_bound_line(per_write)


def cpu_bound_line(per_write_ms: dict[str, float]) -> str:
    """``per_write_ms``: CPU ms per write of each process; their sum, the largest share and
    the rate ``os.cpu_count()`` CPUs allow at that cost."""
    total = sum(per_write_ms.values())
    name, most = max(per_write_ms.items(), key=lambda item: item[1])
    cpus = os.cpu_count() or 1
    return (
        f"sum of CPU per write {total:.2f} ms (largest: {name} {100 * most / total:.0f} %): "
        f"{cpus} CPUs allow at most {1000 * cpus / total:,.0f} writes/s"
    )


def batch_histogram(sizes: list[int]) -> str:
    """How many batches held 1, 2-3, 4-7, ... records, and the median."""
    if not sizes:
        return "none"
    counts: dict[int, int] = {}
    for size in sizes:
        bucket = 1 << int(math.log2(max(1, size)))
        counts[bucket] = counts.get(bucket, 0) + 1
    parts = [
        f"{low if low == 2 * low - 1 else f'{low}-{2 * low - 1}'}: {count}"
        for low, count in sorted(counts.items())
    ]
    return ", ".join(parts) + f" (median {percentile(sorted(sizes), 0.5):g})"


async def _measure(
    processes: list[ControllerProcess],
    writers: int,
    warmup_s: float,
    seconds: float,
    windowed: bool,
) -> CpuRun:
    """Warm up, then run ``writers`` writers for ``seconds`` and measure; ``windowed``:
    open and close a profile or timeline window of every controller around the
    measurement."""
    leader_id = await wait_for_leader(processes)
    leader = next(p for p in processes if p.node_id == leader_id)
    cluster = _Cluster([p.address for p in processes])
    try:
        await cluster.setup()
        await cluster.create_topics([f"{TOPIC_PREFIX}{i:03d}" for i in range(writers)])
        measuring = False
        latencies: list[float] = []
        stamps: list[tuple[int, int]] = []
        stamp_writers: list[int] = []
        stop_at = time.monotonic() + warmup_s + seconds

        async def writer(number: int) -> None:
            topic = f"{TOPIC_PREFIX}{number:03d}"
            value = 86_400_000 + 1_000_000 * writers
            while time.monotonic() < stop_at:
                started = time.monotonic_ns()
                counted = measuring
                await cluster.alter_config(topic, value)
                if counted and measuring:
                    answered = time.monotonic_ns()
                    latencies.append((answered - started) / 1e6)
                    stamps.append((started, answered))
                    stamp_writers.append(number)
                value += 1

        async def window() -> tuple[
            float, dict[int, float], dict[int, float], float, int, tuple[float, float]
        ]:
            nonlocal measuring
            await asyncio.sleep(warmup_s)
            start_offset = _log_end(leader)
            load_before = os.getloadavg()[0]
            if windowed:
                _signal_all(processes, signal.SIGUSR1)
            measuring = True
            cpu = {p.node_id: process_cpu_s(_pid(p)) for p in processes}
            loop_cpu = {p.node_id: main_thread_cpu_s(_pid(p)) for p in processes}
            client = time.process_time()
            started = time.monotonic()
            await asyncio.sleep(seconds)
            measuring = False
            elapsed = time.monotonic() - started
            cpu = {p.node_id: process_cpu_s(_pid(p)) - cpu[p.node_id] for p in processes}
            loop_cpu = {
                p.node_id: main_thread_cpu_s(_pid(p)) - loop_cpu[p.node_id] for p in processes
            }
            client = time.process_time() - client
            if windowed:
                _signal_all(processes, signal.SIGUSR2)
            load = (load_before, os.getloadavg()[0])
            return elapsed, cpu, loop_cpu, client, start_offset, load

        measured, *_ = await asyncio.gather(window(), *(writer(i) for i in range(writers)))
    finally:
        await cluster.close()
    elapsed, cpu, loop_cpu, client, start_offset, load = measured
    latencies.sort()
    return CpuRun(
        writers,
        len(latencies),
        elapsed,
        percentile(latencies, 0.5) if latencies else float("nan"),
        leader_id,
        cpu,
        loop_cpu,
        client,
        _batch_sizes_since(leader, start_offset),
        load,
        stamps,
        stamp_writers,
    )


async def _measure_floor(
    address: str, pid: int, writers: int, warmup_s: float, seconds: float, delay_ms: float = 0.0
) -> str:
    """The write workload against the no-op server at ``address`` (process ``pid``): its
    CPU per call."""
    cluster = _Cluster([address])
    try:
        await cluster.setup()
        calls = 0
        latencies: list[float] = []
        measuring = False
        stop_at = time.monotonic() + warmup_s + seconds

        async def writer(number: int) -> None:
            nonlocal calls
            value = 86_400_000
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                counted = measuring
                await cluster.alter_config(f"{TOPIC_PREFIX}{number:03d}", value)
                if counted and measuring:
                    calls += 1
                    latencies.append((time.perf_counter() - started) * 1000)
                value += 1

        async def window() -> tuple[float, float, float, tuple[float, float]]:
            nonlocal measuring
            await asyncio.sleep(warmup_s)
            load_before = os.getloadavg()[0]
            measuring = True
            cpu, loop_cpu, client = process_cpu_s(pid), main_thread_cpu_s(pid), time.process_time()
            started = time.monotonic()
            await asyncio.sleep(seconds)
            measuring = False
            elapsed = time.monotonic() - started
            cpu, loop_cpu = process_cpu_s(pid) - cpu, main_thread_cpu_s(pid) - loop_cpu
            client = time.process_time() - client
            return elapsed, cpu, loop_cpu, client, (load_before, os.getloadavg()[0])

        measured, *_ = await asyncio.gather(window(), *(writer(i) for i in range(writers)))
    finally:
        await cluster.close()
    elapsed, cpu, loop_cpu, client, load = measured
    latencies.sort()
    p50 = percentile(latencies, 0.5) if latencies else float("nan")
    return (
        f"{writers:>3} writers, no-op floor server"
        + (f" (answers after {delay_ms:g} ms)" if delay_ms else "")
        + f": {calls:>6} calls in {elapsed:.1f} s "
        f"({calls / elapsed:,.0f}/s, p50 {p50:.2f} ms); CPU ms per call: server "
        f"{1000 * cpu / max(1, calls):.2f} (event loop {1000 * loop_cpu / max(1, calls):.2f}), "
        f"client {1000 * client / max(1, calls):.2f}; load {load[0]:.1f} -> {load[1]:.1f}\n"
        "      "
        + cpu_bound_line(
            {"server": 1000 * cpu / max(1, calls), "client": 1000 * client / max(1, calls)}
        )
    )


def _run_floor(root: Path, args: argparse.Namespace) -> None:
    port = free_port()
    with open(root / "floor.log", "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench._grpc_floor",
                str(port),
                str(args.floor_delay_ms),
                args.floor_server,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    address = f"127.0.0.1:{port}"
    try:
        asyncio.run(_wait_serving(address))
        for _ in range(args.runs):
            for writers in args.writers:
                if writers:
                    summary = asyncio.run(
                        _measure_floor(
                            address,
                            process.pid,
                            writers,
                            args.warmup,
                            args.seconds,
                            args.floor_delay_ms,
                        )
                    )
                    print(summary, flush=True)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


_COUNTED: dict[str, tuple[str, ...]] = {
    "leader": (
        "request", "append", "fsync", "records_out", "empty_out", "fetch_in", "high_watermark",
    ),
    "follower": ("records_in", "empty_in", "fsync", "fetch_out", "apply"),
}  # fmt: skip


def timeline_counts(run: CpuRun, events: dict[int, list[Event]]) -> str:
    """Per Raft batch the leader appended in the window: each step's count on every
    process (1 fsync and 1 answer with records per follower per batch is group commit at
    work; more means a batch's writes did not share them)."""
    leader = events[run.leader_id]
    appends = [value for _, kind, value in leader if kind == "append"]
    batches = max(1, len(appends))
    lines = [
        f"timeline: {len(appends)} Raft appends of {sum(appends) / batches:.2f} records on "
        f"average in the window; per Raft batch:"
    ]
    for node_id in sorted(events):
        role = "leader" if node_id == run.leader_id else "follower"
        counts = dict.fromkeys(_COUNTED[role], 0)
        counts["fsync in the thread"] = 0
        for _, kind, value in events[node_id]:
            if kind in counts:
                counts[kind] += 1
            if kind == "fsync" and value:
                counts["fsync in the thread"] += 1
        lines.append(
            f"  node {node_id} ({role}): "
            + ", ".join(f"{kind} {count / batches:.2f}" for kind, count in counts.items())
        )
        handoffs = sorted(value for _, kind, value in events[node_id] if kind == "handoff")
        if handoffs:
            lines.append(
                f"    flush hand-offs to the thread: {len(handoffs)}, the loop waited p50 "
                f"{percentile(handoffs, 0.5):.0f} µs, p90 {percentile(handoffs, 0.9):.0f}, "
                f"max {handoffs[-1]} ({sum(handoffs) / 1000:.1f} ms in all)"
            )
    return "\n".join(lines)


def _first(events: list[Event], kind: str, after: int, until: int) -> int | None:
    for t, k, _ in events:
        if after <= t <= until and k == kind:
            return t
    return None


def _last(events: list[Event], kind: str, after: int, until: int) -> int | None:
    found = None
    for t, k, _ in events:
        if after <= t <= until and k == kind:
            found = t
    return found


def _first_follower(followers: list[list[Event]], after: int, until: int) -> dict[str, int] | None:
    """Of the followers that took a batch sent at ``after``, fsynced it and fetched again
    before ``until``, the first to fetch again (it makes the majority): the times of the
    batch's arrival, the fsync's start and end and that fetch, by step name; None if none
    did."""
    ends = []
    for events in followers:
        received = _first(events, "records_in", after, until)
        started = None if received is None else _first(events, "fsync", received, until)
        flushed = None if started is None else _first(events, "fsynced", started, until)
        fetched = None if flushed is None else _first(events, "fetch_out", flushed, until)
        if fetched is not None and received is not None and started is not None:
            assert flushed is not None  # fetched is looked for only after it
            read = _last(events, "records_read", after, received)
            written = _first(events, "fetch_write", fetched, until)
            ends.append((fetched, received, started, flushed, read, written))
    if not ends:
        return None
    fetched, received, started, flushed, read, written = min(ends)
    steps = {} if read is None else {"follower: records read from gRPC": read}
    steps |= {
        "follower: records in": received,
        "follower: fsync start": started,
        "follower: fsync end": flushed,
        "follower: next fetch out": fetched,
    }
    if written is not None:
        steps["follower: next fetch written to gRPC"] = written
    return steps


def _commit_steps(
    stamp: tuple[int, int], leader: list[Event], followers: list[list[Event]]
) -> dict[str, int] | None:
    """The times of one lone write's steps (None if one is missing, e.g. the write
    arrived while a leftover high-watermark answer was in flight)."""
    sent, answered = stamp
    steps: dict[str, int] = {"client send": sent}

    def take(name: str, events: list[Event], kind: str, after: int) -> int | None:
        t = _first(events, kind, after, answered)
        if t is not None:
            steps[name] = t
        return t

    if (t := take("leader: request in", leader, "request", sent)) is None:
        return None
    if (appended := take("leader: append", leader, "append", t)) is None:
        return None
    if (t := take("leader: fsync start", leader, "fsync", appended)) is not None:
        take("leader: fsync end", leader, "fsynced", t)
    if (out := take("leader: records out", leader, "records_out", appended)) is None:
        return None
    take("leader: records yielded to gRPC", leader, "records_yield", out)
    first = _first_follower(followers, appended, answered)
    if first is None:
        return None
    steps |= first
    fetched = first["follower: next fetch out"]
    if (t := take("leader: fetch read from gRPC", leader, "fetch_read", fetched)) is None:
        return None
    if (t := take("leader: high watermark moves", leader, "high_watermark", t)) is None:
        return None
    if (t := take("leader: apply", leader, "apply", t)) is None:
        return None
    if take("leader: answer", leader, "answer", t) is None:
        return None
    steps["client answered"] = answered
    return steps


def commit_timeline(run: CpuRun, events: dict[int, list[Event]]) -> str:
    """One writer: the median time from the client's send to each step of a commit."""
    leader = events[run.leader_id]
    followers = [e for n, e in sorted(events.items()) if n != run.leader_id]
    found = [
        s for s in (_commit_steps(stamp, leader, followers) for stamp in run.client_stamps) if s
    ]
    if not found:
        return "timeline: no write with every step found"
    names = list(found[0])
    lines = [
        f"timeline of a lone write ({len(found)} of {len(run.client_stamps)} writes had every "
        "step; median µs since the client's send, and since the step before):"
    ]
    before = 0.0
    for name in names:
        values = sorted((s[name] - s["client send"]) / 1000 for s in found if name in s)
        median = percentile(values, 0.5)
        lines.append(f"  {median:8.0f} {median - before:+8.0f}  {name}")
        before = median
    return "\n".join(lines)


def _round_steps(
    appended: int, until: int, leader: list[Event], followers: list[list[Event]]
) -> dict[str, int] | None:
    """The times of one Raft round's steps, from the leader's append at ``appended`` to
    the first answer after its apply (before ``until``, the next append but one)."""
    steps: dict[str, int] = {"leader: append": appended}
    out = _first(leader, "records_out", appended, until)
    if out is None:
        return None
    steps["leader: fetch answers out"] = out
    first = _first_follower(followers, out, until)
    if first is None:
        return None
    steps |= first
    for name, kind in (
        ("leader: that fetch in", "fetch_in"),
        ("leader: high watermark moves", "high_watermark"),
        ("leader: apply", "apply"),
        ("leader: first answer", "answer"),
    ):
        t = _first(leader, kind, steps[next(reversed(steps))], until)
        if t is None:
            return None
        steps[name] = t
    return steps


def round_timeline(run: CpuRun, events: dict[int, list[Event]]) -> str:
    """Many writers: the median time from each Raft append on the leader to each step of
    its round (the first follower whose next fetch comes back makes the majority)."""
    leader = events[run.leader_id]
    followers = [e for n, e in sorted(events.items()) if n != run.leader_id]
    appends = [t for t, kind, _ in leader if kind == "append"]
    found = [
        steps
        for appended, until in zip(appends, appends[2:], strict=False)
        if (steps := _round_steps(appended, until, leader, followers)) is not None
    ]
    if not found:
        return "timeline: no Raft round with every step found"
    lines = [
        f"a Raft round's steps ({len(found)} of {len(appends)} rounds had every step; "
        "median µs since the append, and since the step before):"
    ]
    before = 0.0
    for name in found[0]:
        median = percentile(sorted((s[name] - s["leader: append"]) / 1000 for s in found), 0.5)
        lines.append(f"  {median:8.0f} {median - before:+8.0f}  {name}")
        before = median
    flushed = sorted(
        (t - appended) / 1000
        for appended, until in zip(appends, appends[2:], strict=False)
        if (t := _first(leader, "fsynced", appended, until)) is not None
    )
    if flushed:
        lines.append(
            f"  the leader's own fsync ends {percentile(flushed, 0.5):,.0f} µs after the "
            "append (p50; the high watermark needs it or the second follower)"
        )
    return "\n".join(lines)


def where_writes_wait(run: CpuRun, events: dict[int, list[Event]]) -> str:
    """Many writers: where a write's time goes, each write followed by its writer's number
    from the client's send to the leader's servicer (``request``), to the servicer's
    answer, and back to the client.

    Before the servicer is the client's call, the bytes and gRPC's admission of the call
    on the leader; inside it the worker, the group's seal and the commit; after it the
    answer's way back. With Little's law, the writes on average in each stage; and the Raft
    rounds: from each append to the high watermark's next move on the leader, and from that
    move to the next append (the worker seals a group when the batch before it commits)."""
    leader = events[run.leader_id]
    requests: dict[int, list[int]] = {}
    answers: dict[int, list[int]] = {}
    for t, kind, value in leader:
        if kind == "request":
            requests.setdefault(value, []).append(t)
        elif kind == "answer":
            answers.setdefault(value, []).append(t)
    stages: dict[str, list[float]] = {"before": [], "inside": [], "after": []}
    for (sent, answered), writer in zip(run.client_stamps, run.client_writers, strict=True):
        ins, outs = requests.get(writer, []), answers.get(writer, [])
        i = bisect.bisect_left(ins, sent)
        if i == len(ins) or ins[i] > answered:
            continue
        j = bisect.bisect_left(outs, ins[i])
        if j == len(outs) or outs[j] > answered:
            continue
        stages["before"].append((ins[i] - sent) / 1000)
        stages["inside"].append((outs[j] - ins[i]) / 1000)
        stages["after"].append((answered - outs[j]) / 1000)
    followed = len(stages["before"])
    if not followed:
        return "timeline: no write followed from its send to its answer"
    window_us = run.seconds * 1e6 * followed / max(1, run.writes)
    lines = [
        f"where a write waits ({run.writers} writers; {followed} of {run.writes} writes "
        "followed; µs p50 and mean, and the writes in each stage on average):"
    ]
    for stage, label in (
        ("before", "sent, not yet in the leader's servicer"),
        ("inside", "in the leader's servicer"),
        ("after", "answered, not yet back at the client"),
    ):
        values = sorted(stages[stage])
        lines.append(
            f"  {label:40} p50 {percentile(values, 0.5):8,.0f}  mean "
            f"{sum(values) / len(values):8,.0f}  writes {sum(values) / window_us:5.1f}"
        )
    arrivals = [t for t, kind, _ in leader if kind == "request"]
    gaps = sorted((b - a) / 1000 for a, b in itertools.pairwise(arrivals))
    if gaps:
        lines.append(
            f"  calls entering the leader's servicer: one every {percentile(gaps, 0.5):,.0f} "
            f"µs p50, p90 {percentile(gaps, 0.9):,.0f}"
        )
    appends = [t for t, kind, _ in leader if kind == "append"]
    moves = [t for t, kind, _ in leader if kind == "high_watermark"]
    to_commit = sorted(
        (moves[i] - t) / 1000 for t in appends if (i := bisect.bisect_right(moves, t)) < len(moves)
    )
    to_seal = sorted(
        (appends[i] - t) / 1000
        for t in moves
        if (i := bisect.bisect_right(appends, t)) < len(appends)
    )
    if to_commit and to_seal:
        lines.append(
            f"  Raft rounds: append to the next high-watermark move p50 "
            f"{percentile(to_commit, 0.5):,.0f} µs, that move to the next append p50 "
            f"{percentile(to_seal, 0.5):,.0f} µs"
        )
    return "\n".join(lines)


def fsync_probe(directory: Path, count: int) -> str:
    """``count`` fdatasyncs of 100-byte appends to a file in ``directory``: the disk alone."""
    path = directory / "fsync-probe"
    latencies = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(count):
            os.write(fd, b"x" * 100)
            started = time.perf_counter()
            os.fdatasync(fd)
            latencies.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    latencies.sort()
    return (
        f"fdatasync of a 100-byte append, {count} times: p50 {percentile(latencies, 0.5):.2f} "
        f"ms, p90 {percentile(latencies, 0.9):.2f}, p99 {percentile(latencies, 0.99):.2f}; "
        f"load {os.getloadavg()[0]:.1f}"
    )


def _pid(process: ControllerProcess) -> int:
    assert process.process is not None
    return process.process.pid


def _segments(process: ControllerProcess) -> list[Path]:
    return sorted((process.data_dir / "__cluster_metadata-0").glob("*.log"))


def _log_end(process: ControllerProcess) -> int:
    """The next offset of the last batch in the leader's log files (what is written so far;
    a batch in the page cache counts)."""
    end = 0
    for _base, next_offset, _count, _control in _read_batches(process):
        end = next_offset
    return end


def _batch_sizes_since(process: ControllerProcess, offset: int) -> list[int]:
    """The records of each data batch (not control batches) at or after ``offset``."""
    return [
        count
        for base, _next, count, control in _read_batches(process)
        if base >= offset and not control
    ]


def _read_batches(process: ControllerProcess) -> list[tuple[int, int, int, bool]]:
    from highwater.records.batch import iter_batches

    found = []
    for path in _segments(process):
        for batch in iter_batches(path.read_bytes()):
            found.append(
                (batch.base_offset, batch.next_offset, batch.records_count, batch.is_control)
            )
    return found


def _profile_window(process: ControllerProcess, windows: dict[int, int]) -> Path:
    """Where ``process`` writes its current profile or timeline window (each numbers its
    own)."""
    out = process.profile_out or process.timeline_out
    assert out is not None
    return out.with_name(f"{out.name}.{windows.get(process.node_id, 0)}")


def _wait_done(out: Path, timeout_s: float = 60) -> bool:
    done = out.with_name(out.name + ".done")
    deadline = time.monotonic() + timeout_s
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return done.exists()


def _signal_all(processes: list[ControllerProcess], signum: int) -> None:
    for process in processes:
        assert process.process is not None
        process.process.send_signal(signum)


def _wait_profile(out: Path) -> pstats.Stats | None:
    return pstats.Stats(str(out)) if _wait_done(out) else None


def _top(stats: pstats.Stats, writes: int, limit: int, role: str) -> str:
    """The functions with the most cumulative and the most own CPU time, per write."""
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    lines = [
        f"profiled {total:.2f} s of the {role}'s event loop, "
        f"{1000 * total / max(1, writes):.3f} ms per write",
        f"{'cum ms/w':>9} {'own ms/w':>9} {'calls/w':>8}  function",
    ]

    for title, index in (("by cumulative time", 3), ("by own time", 2)):
        lines.append(f"-- {title}")
        ranked = sorted(raw.items(), key=lambda item: item[1][index], reverse=True)[:limit]
        for key, (_cc, calls, own, cumulative, _callers) in ranked:
            lines.append(
                f"{1000 * cumulative / max(1, writes):9.3f} {1000 * own / max(1, writes):9.3f} "
                f"{calls / max(1, writes):8.2f}  {profile_entry_name(key)}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._raft_cpu", description=__doc__)
    parser.add_argument("--writers", type=int, nargs="+", default=[64, 1])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--runs", type=int, default=1, help="runs per number of writers")
    parser.add_argument("--profile", action="store_true", help="cProfile the leader and a follower")
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="record each process's commit-path steps (not with --profile)",
    )
    parser.add_argument(
        "--fsync", type=int, default=0, metavar="N", help="first time N fdatasyncs of the disk"
    )
    parser.add_argument(
        "--floor", action="store_true", help="also measure the no-op gRPC floor server"
    )
    parser.add_argument(
        "--floor-delay-ms",
        type=float,
        default=0.0,
        help="the floor server answers each call after this long (gRPC's intake alone)",
    )
    parser.add_argument(
        "--floor-server",
        choices=("bare", "project"),
        default="bare",
        help="the floor's server: a bare grpc.aio.server() or the project's new_server()",
    )
    parser.add_argument(
        "--only-floor",
        action="store_true",
        help="measure the floor server alone (with --floor), not the quorum",
    )
    parser.add_argument(
        "--append-linger-ms",
        type=int,
        default=None,
        help="run the controllers with this --append-linger-ms (default: theirs)",
    )
    parser.add_argument(
        "--append-pipeline-depth",
        type=int,
        default=None,
        help="run the controllers with this --append-pipeline-depth (default: theirs)",
    )
    parser.add_argument("--top", type=int, default=30, help="functions listed per profile")
    parser.add_argument("--keep", type=Path, help="keep the data and profiles here")
    args = parser.parse_args(argv)
    if args.profile and args.timeline:
        parser.error("--profile and --timeline each wrap the controllers: give one")
    root = Path(tempfile.mkdtemp(prefix="raft-cpu-")) if args.keep is None else args.keep
    root.mkdir(parents=True, exist_ok=True)
    windows: dict[int, int] = {}
    try:
        if args.fsync:
            print(fsync_probe(root, args.fsync), flush=True)
        if args.floor:
            _run_floor(root, args)
            if args.only_floor:
                return 0
        extra: tuple[str, ...] = ()
        if args.append_linger_ms is not None:
            extra += ("--append-linger-ms", str(args.append_linger_ms))
        if args.append_pipeline_depth is not None:
            extra += ("--append-pipeline-depth", str(args.append_pipeline_depth))
        with controller_quorum(
            root, profiled=args.profile, timeline=args.timeline, extra_args=extra
        ) as processes:
            for _ in range(args.runs):
                for writers in args.writers:
                    run = asyncio.run(
                        _measure(
                            processes,
                            writers,
                            args.warmup,
                            args.seconds,
                            args.profile or args.timeline,
                        )
                    )
                    print(run.summary(), flush=True)
                    if args.timeline:
                        events = {}
                        for process in processes:
                            out = _profile_window(process, windows)
                            if _wait_done(out):
                                events[process.node_id] = read_window(out)
                        if run.leader_id in events:
                            print(timeline_counts(run, events), flush=True)
                            if run.writers == 1:
                                print(commit_timeline(run, events), flush=True)
                            else:
                                print(where_writes_wait(run, events), flush=True)
                                print(round_timeline(run, events), flush=True)
                    if args.profile:
                        follower = next(p for p in processes if p.node_id != run.leader_id)
                        for role, process in (
                            ("leader", next(p for p in processes if p.node_id == run.leader_id)),
                            ("follower", follower),
                        ):
                            stats = _wait_profile(_profile_window(process, windows))
                            if stats is not None:
                                print(_top(stats, run.writes, args.top, role), flush=True)
                    if args.profile or args.timeline:
                        for process in processes:  # every process numbers its own windows
                            windows[process.node_id] = windows.get(process.node_id, 0) + 1
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
